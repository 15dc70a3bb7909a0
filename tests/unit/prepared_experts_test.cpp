// The prepared experts (Backend::prepare_experts / release_experts; CudaBackend's e5m2 or fp16 copy of a
// layer's routed experts for the Hopper kernels, whose bits the CUDA tests check) as the pass runs them, on
// the CPU through a backend that records the calls:
//  - plan_prepared_experts picks the widest layout (up to --prepared-experts' choice) whose copy takes at
//    most half of the arena room, and none with --prepared-experts off or on a backend that prepares
//    nothing (the CPU backend);
//  - PassRunner prepares each layer before its chunks and releases it after, so that every moe call
//    reads the copy of its own layer's weights (a later layer may reuse an earlier one's addresses);
//    the copy is released when a layer throws too;
//  - the scores are the same bytes with and without preparation.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cli_run_util.h"
#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/engram_io.h"
#include "ds4r/error.h"
#include "ds4r/io_settings.h"
#include "ds4r/replay.h"
#include "ds4r/weights.h"

namespace ds4r {
namespace {

// The CPU backend, "preparing" the experts as a GPU backend would: it records which layer's weights are
// prepared and checks every moe call against them.
class PreparingBackend : public CpuBackend {
public:
    uint64_t prepared_experts_bytes(int64_t experts, int64_t dim, int64_t hidden,
                                    ExpertLayout layout) const override {
        const int64_t per_value = layout == ExpertLayout::F16 ? 2 : layout == ExpertLayout::E5m2 ? 1 : 0;
        return static_cast<uint64_t>(per_value * experts * 3 * dim * hidden);
    }
    void set_prepared_experts(ExpertLayout layout) override {
        on_ = layout != ExpertLayout::None;
        layout_ = layout;
    }
    ExpertLayout prepared_experts() const override { return layout_; }
    void prepare_experts(const MoeWeights& w) override {
        EXPECT_EQ(current_, nullptr) << "a layer prepared before the previous one was released";
        if (!on_ || w.experts.empty()) return;
        current_ = w.experts[0].w1.w.data;
        ++prepares;
    }
    void release_experts() override {
        if (current_) ++releases;
        current_ = nullptr;
    }
    void moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
             const Tensor& route_idx, const Tensor& route_w) override {
        if (on_) {
            EXPECT_EQ(current_, w.experts[0].w1.w.data) << "moe of a layer that is not the prepared one";
            ++moe_calls;
            if (moe_calls == throw_at) throw RuntimeError("moe failed (test)");
        }
        CpuBackend::moe(x, w, p, y, route_idx, route_w);
    }
    const void* current() const { return current_; }
    int prepares = 0, releases = 0, moe_calls = 0, throw_at = -1;

private:
    bool on_ = false;
    ExpertLayout layout_ = ExpertLayout::None;
    const void* current_ = nullptr;
};

std::vector<std::vector<int32_t>> sequences() {
    std::vector<std::vector<int32_t>> seqs;
    for (int s = 0; s < 3; ++s) {
        std::vector<int32_t> t;
        for (int i = 0; i < 20 + 9 * s; ++i) t.push_back((i * 37 + s * 11) % 200 + 3);
        seqs.push_back(t);
    }
    return seqs;
}

std::unique_ptr<EngramResources> engram(const Checkpoint& ck) {
    return load_engram_resources(ck, IoSettings{});
}

ReplayOptions chunks_of_16() {
    ReplayOptions ro;
    ro.chunk_rows = 16;
    return ro;
}

TEST(PreparedExperts, PlannedWhereTheCopyTakesAtMostHalfTheArenaRoom) {
    using L = ExpertLayout;
    const ModelConfig cfg = Checkpoint::open(test::tiny_model_dir()).config();
    PreparingBackend be;
    const uint64_t bytes = be.prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, L::E5m2);
    const uint64_t wide = be.prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, L::F16);
    ASSERT_GT(bytes, 0u);
    ASSERT_EQ(wide, 2 * bytes);
    // --prepared-experts fp16 (F16 the widest allowed): fp16 where it takes at most half of the room, else
    // e5m2, else none
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * wide, L::F16), wide);
    EXPECT_EQ(be.prepared_experts(), L::F16);
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * wide - 1, L::F16), bytes);
    EXPECT_EQ(be.prepared_experts(), L::E5m2);
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * bytes, L::F16), bytes);
    EXPECT_EQ(be.prepared_experts(), L::E5m2);
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * bytes - 1, L::F16), 0u);
    EXPECT_EQ(be.prepared_experts(), L::None);
    // --prepared-experts auto: as fp16 (kAutoExpertLayout)
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * wide, kAutoExpertLayout), wide);
    EXPECT_EQ(be.prepared_experts(), L::F16);
    EXPECT_EQ(plan_prepared_experts(be, cfg, 2 * wide - 1, kAutoExpertLayout), bytes);
    EXPECT_EQ(be.prepared_experts(), L::E5m2);
    // --prepared-experts e5m2: never the fp16 copy, however much room
    EXPECT_EQ(plan_prepared_experts(be, cfg, 100 * wide, L::E5m2), bytes);
    EXPECT_EQ(be.prepared_experts(), L::E5m2);
    EXPECT_EQ(plan_prepared_experts(be, cfg, 100 * bytes, L::None), 0u) << "--prepared-experts off";
    EXPECT_EQ(be.prepared_experts(), L::None);
    // a backend without a prepared layout: never on, and asking for one is an error
    auto cpu = make_cpu_backend();
    for (L l : {L::E5m2, L::F16})
        EXPECT_EQ(cpu->prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, l), 0u);
    EXPECT_EQ(plan_prepared_experts(*cpu, cfg, uint64_t{1} << 50, L::F16), 0u);
    EXPECT_EQ(cpu->prepared_experts(), L::None);
    EXPECT_THROW(cpu->set_prepared_experts(L::E5m2), RuntimeError);
    EXPECT_THROW(cpu->set_prepared_experts(L::F16), RuntimeError);
    EXPECT_NO_THROW(cpu->set_prepared_experts(L::None));
}

// The default chunk of 16,384 rows drops to 8,192 where its larger working set would cost the prepared
// experts their widest layout (which the grouped GEMMs gain more from than from the chunk).
TEST(PreparedExperts, LargeChunksDoNotCostTheWiderLayout) {
    using L = ExpertLayout;
    const ModelConfig cfg = Checkpoint::open(test::tiny_model_dir()).config();
    PreparingBackend be;
    const uint64_t wide = be.prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, L::F16);
    const uint64_t B = static_cast<uint64_t>(chunk_row_budget_bytes(cfg));
    // free memory whose default is the large chunk
    size_t free_b = size_t{1} << 20;
    while (default_chunk_rows(cfg, free_b) != kLargeChunkRows) free_b *= 2;
    ASSERT_GT(free_b, 16384 * B + 2 * wide);
    // reserved so that 8,192-row chunks leave exactly the fp16 copy's room (twice its bytes), 16,384-row
    // ones less: 8,192
    const uint64_t tight = free_b - 8192 * B - 2 * wide;
    EXPECT_EQ(pick_prepared_experts(be, cfg, 2 * wide, L::F16), L::F16);
    EXPECT_NE(pick_prepared_experts(be, cfg, 2 * wide - 1, L::F16), L::F16);
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b, tight, L::F16), kChunkRowsCap);
    // room for fp16 beside the larger chunks too: 16,384
    const uint64_t ample = free_b - 16384 * B - 2 * wide;
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b, ample, L::F16), kLargeChunkRows);
    // the same with e5m2 the widest allowed (its copy: half the fp16 one's bytes)
    const uint64_t narrow = wide / 2;
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b, free_b - 8192 * B - 2 * narrow, L::E5m2), kChunkRowsCap);
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b, free_b - 16384 * B - 2 * narrow, L::E5m2), kLargeChunkRows);
    // --prepared-experts off: nothing to lose
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b, tight, L::None), kLargeChunkRows);
    // --max-batch-tokens wins; a default under the cap stays
    EXPECT_EQ(plan_chunk_rows(20000, be, cfg, free_b, tight, L::F16), 20000);
    EXPECT_EQ(plan_chunk_rows(0, be, cfg, free_b / 8, 0, L::F16), default_chunk_rows(cfg, free_b / 8));
    // a backend that prepares nothing keeps the large chunk
    auto cpu = make_cpu_backend();
    EXPECT_EQ(plan_chunk_rows(0, *cpu, cfg, free_b, tight, L::F16), kLargeChunkRows);
}

TEST(PreparedExperts, EachLayerPreparedBeforeItsChunksReleasedAfterSameScores) {
    const Checkpoint ck = Checkpoint::open(test::tiny_model_dir());
    const auto seqs = sequences();
    std::vector<SequenceScores> plain, prepared;
    {
        auto be = make_cpu_backend();
        auto ws = make_sync_weight_source(*be, ck);
        const auto eng = engram(ck);
        PassRunner runner(*be, ck, *ws, eng.get(), chunks_of_16());
        plain = runner.run(seqs, nullptr);
    }
    PreparingBackend be;
    be.set_prepared_experts(ExpertLayout::E5m2);
    auto ws = make_sync_weight_source(be, ck);
    const auto eng = engram(ck);
    PassRunner runner(be, ck, *ws, eng.get(), chunks_of_16());
    prepared = runner.run(seqs, nullptr);
    const int layers = static_cast<int>(ck.config().n_layers);
    EXPECT_EQ(be.prepares, layers);
    EXPECT_EQ(be.releases, layers);
    EXPECT_GT(be.moe_calls, layers) << "several chunks per layer read the prepared copy";
    EXPECT_EQ(be.current(), nullptr);
    ASSERT_EQ(plain.size(), prepared.size());
    for (size_t s = 0; s < plain.size(); ++s) {
        EXPECT_EQ(plain[s].logprob, prepared[s].logprob) << "sequence " << s;
        EXPECT_EQ(plain[s].rank, prepared[s].rank) << "sequence " << s;
    }
}

TEST(PreparedExperts, ReleasedWhenALayerThrows) {
    const Checkpoint ck = Checkpoint::open(test::tiny_model_dir());
    PreparingBackend be;
    be.set_prepared_experts(ExpertLayout::E5m2);
    be.throw_at = 2;
    auto ws = make_sync_weight_source(be, ck);
    const auto eng = engram(ck);
    PassRunner runner(be, ck, *ws, eng.get(), chunks_of_16());
    EXPECT_THROW(runner.run(sequences(), nullptr), RuntimeError);
    EXPECT_EQ(be.prepares, 1);
    EXPECT_EQ(be.releases, 1);
    EXPECT_EQ(be.current(), nullptr);
}

}  // namespace
}  // namespace ds4r
