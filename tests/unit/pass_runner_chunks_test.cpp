// The pass runner's chunks (include/ds4r/replay.h), on the golden tiny-a checkpoint:
//  - the chunk state ring: chunk uploads and downloads run on copy queues, overlapping the compute of
//    neighbouring chunks, and must never change a result. Scored on a backend whose copy queue
//    completes copies late, in a worker thread, after random delays (prefetch_fake_backend.h), with
//    chunks of a few rows so that every ring buffer is reused many times per layer, the scores equal
//    the plain CPU backend's bit for bit;
//  - running out of memory (docs/DESIGN.md section 6): a backend that refuses chunk-sized allocations above
//    a row count makes the runner halve its chunks and run the pass again; scores and captured hidden
//    rows equal an unconstrained run's, also when the refusal comes in the middle of a chunk with
//    copies in flight; below kMinChunkRows the error reaches the caller.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/replay.h"
#include "prefetch_fake_backend.h"
#include "score_compare.h"
#include "test_util.h"

namespace ds4r {
namespace {

using test::expect_identical;

std::vector<std::vector<int32_t>> sequences(int64_t vocab) {
    std::mt19937 rng(77);
    std::vector<std::vector<int32_t>> seqs;
    for (int len : {1, 2, 5, 17, 31, 64, 9}) {
        std::vector<int32_t> s(static_cast<size_t>(len));
        for (auto& t : s) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        seqs.push_back(s);
    }
    return seqs;
}

// Captured rows by (layer, sequence); counts the restarts the runner announces.
struct RowSink : HiddenSink {
    std::map<std::pair<int, int>, std::vector<uint16_t>> rows;
    int restarts = 0;
    void add_rows(int layer, int seq, const uint16_t* d, int64_t n, int64_t e) override {
        auto& r = rows[{layer, seq}];
        EXPECT_TRUE(r.empty()) << "layer " << layer << " seq " << seq << " captured twice in one pass";
        r.assign(d, d + n * e);
    }
    void restart_pass() override {
        ++restarts;
        rows.clear();
    }
};

struct RunResult {
    std::vector<SequenceScores> scores;
    int64_t chunk_rows = 0;  // after the run
    int retries = 0;
};

RunResult score(Backend& be, const Checkpoint& ck, int64_t chunk_rows,
                const std::vector<std::vector<int32_t>>& seqs, RowSink* sink = nullptr) {
    auto eng = load_engram_resources(ck);
    auto ws = make_sync_weight_source(be, ck);
    ReplayOptions ro;
    ro.chunk_rows = chunk_rows;
    if (sink) ro.capture_layers = {2, 6};
    PassRunner runner(be, ck, *ws, eng.get(), ro);
    RunResult r;
    r.scores = runner.run(seqs, sink);
    r.chunk_rows = runner.chunk_rows();
    r.retries = runner.out_of_memory_retries();
    return r;
}

// The asynchronous fake, short of memory: BF16 allocations of more than `max_rows` rows whose rows
// are chunk state ([rows, hc, D]: the state ring) or the compressor's input ([rows, (hc + 1) * D]: in
// the middle of a chunk's compute, with its copies queued) are refused with OutOfMemoryError.
class ShortOfMemoryBackend : public test::FakeAsyncBackend {
public:
    ShortOfMemoryBackend(const ModelConfig& c, int64_t max_rows, bool state_rows, bool compressor_rows)
        : FakeAsyncBackend(17, 200), max_rows_(max_rows) {
        if (state_rows) widths_.push_back(c.hc_mult * c.dim);
        if (compressor_rows) widths_.push_back((c.hc_mult + 1) * c.dim);
    }
    Tensor alloc(DType t, const Shape& shape) override {
        if (t == DType::BF16 && !shape.empty() && shape[0] > max_rows_) {
            const int64_t width = shape[0] ? shape_numel(shape) / shape[0] : 0;
            for (int64_t w : widths_)
                if (width == w) {
                    ++refusals_;
                    throw OutOfMemoryError(
                        strfmt("fake: %lld rows of %lld refused", (long long)shape[0], (long long)width));
                }
        }
        return FakeAsyncBackend::alloc(t, shape);
    }
    int refusals() const { return refusals_; }

private:
    int64_t max_rows_;
    std::vector<int64_t> widths_;
    int refusals_ = 0;
};

TEST(ChunkRing, LateAsynchronousCopiesGiveTheSynchronousScores) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const auto seqs = sequences(ck.config().vocab_size);
    auto cpu = make_cpu_backend();
    const std::vector<SequenceScores> want = score(*cpu, ck, 4096, seqs).scores;
    for (const auto& [chunk_rows, delay_us] :
         {std::pair<int64_t, int>{8, 300}, {2, 50}, {30, 1000}, {4, 4000}}) {
        test::FakeAsyncBackend fake(static_cast<unsigned>(chunk_rows), delay_us);
        const std::vector<SequenceScores> got = score(fake, ck, chunk_rows, seqs).scores;
        expect_identical(want, got,
                         "chunks of " + std::to_string(chunk_rows) +
                             " rows, copies delayed <= " + std::to_string(delay_us) + " us");
    }
}

TEST(ChunkRetry, OutOfMemoryHalvesTheChunksAndRunsThePassAgain) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const auto seqs = sequences(ck.config().vocab_size);
    auto cpu = make_cpu_backend();
    RowSink want_rows;
    const RunResult want = score(*cpu, ck, 4096, seqs, &want_rows);
    ASSERT_EQ(want.retries, 0);
    for (const auto& [state, compressor] : {std::pair<bool, bool>{true, false}, {false, true}}) {
        const std::string what = state ? "state ring refused" : "compressor input refused mid-chunk";
        ShortOfMemoryBackend be(ck.config(), 20, state, compressor);
        RowSink rows;
        const RunResult got = score(be, ck, 4096, seqs, &rows);
        // 4096 -> 2048 -> ... -> 16: the first size whose chunks (<= 16 rows) fit
        EXPECT_EQ(got.chunk_rows, 16) << what;
        EXPECT_EQ(got.retries, 8) << what;
        EXPECT_EQ(rows.restarts, 8) << what;
        EXPECT_GE(be.refusals(), 8) << what;
        expect_identical(want.scores, got.scores, what);
        EXPECT_EQ(rows.rows, want_rows.rows) << what << ": captured hidden rows differ";
    }
}

TEST(ChunkRetry, BelowTheSmallestChunkTheErrorReachesTheCaller) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const auto seqs = sequences(ck.config().vocab_size);
    ShortOfMemoryBackend be(ck.config(), PassRunner::kMinChunkRows / 2, true, false);
    EXPECT_THROW(score(be, ck, 64, seqs), OutOfMemoryError);
    EXPECT_GE(be.refusals(), 4);  // 64, 32, 16, 8
}

TEST(ChunkRing, DefaultChunkRowsStayWithinBounds) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const ModelConfig& c = ck.config();
    EXPECT_EQ(default_chunk_rows(c, 0), 64);
    EXPECT_EQ(default_chunk_rows(c, size_t{1} << 50), kLargeChunkRows);
    // Half the memory over the per-row footprint (activations + the ring's 2 extra buffers + two chunks'
    // dequantized Engram rows, which run_block's ring holds beside them).
    ASSERT_FALSE(c.engram_layer_ids.empty());
    const int64_t per_row = (14 + c.hc_mult) * c.dim * 4 + c.n_heads * c.head_dim * 8 +
                            2 * c.hc_mult * (c.dim * 2 + 4) +
                            2 * c.engram_hash_cols() * c.engram_head_dim * 2;
    const size_t free_bytes = static_cast<size_t>(per_row) * 2 * 1000;
    EXPECT_EQ(default_chunk_rows(c, free_bytes), 1000);
    EXPECT_EQ(default_chunk_rows(c, free_bytes - 1), 999);
    // up to the 8,192 cap; 16,384 rows only where half the memory holds twice as many (the pass's arenas
    // keep ample room beside the larger working set)
    const size_t large = static_cast<size_t>(per_row) * 2 * 2 * kLargeChunkRows;
    EXPECT_EQ(default_chunk_rows(c, static_cast<size_t>(per_row) * 2 * (kLargeChunkRows + 5)), kChunkRowsCap);
    EXPECT_EQ(default_chunk_rows(c, large - 1), kChunkRowsCap);
    EXPECT_EQ(default_chunk_rows(c, large), kLargeChunkRows);
    EXPECT_EQ(resolve_chunk_rows(300, c, large), 300) << "--max-batch-tokens wins";
}

}  // namespace
}  // namespace ds4r
