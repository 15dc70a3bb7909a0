// The pass runner's chunk state ring (replay.h StateRing): chunk uploads and downloads run on copy
// queues, overlapping the compute of neighbouring chunks, and must never change a result. The golden
// tiny-a checkpoint is scored on a backend whose copy queue completes copies late, in a worker thread,
// after random delays (prefetch_fake_backend.h), with chunks of a few rows so that every ring buffer is
// reused many times per layer; the scores must equal the plain CPU backend's bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ds4r/checkpoint.h"
#include "ds4r/replay.h"
#include "prefetch_fake_backend.h"
#include "test_util.h"

namespace ds4r {
namespace {

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

std::vector<SequenceScores> score(Backend& be, const Checkpoint& ck, int64_t chunk_rows,
                                  const std::vector<std::vector<int32_t>>& seqs) {
    auto eng = load_engram_resources(ck);
    auto ws = make_sync_weight_source(be, ck);
    ReplayOptions ro;
    ro.max_batch_tokens = chunk_rows;
    PassRunner runner(be, ck, *ws, eng.get(), ro);
    return runner.run(seqs, nullptr);
}

void expect_identical(const std::vector<SequenceScores>& a, const std::vector<SequenceScores>& b,
                      const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
        const auto same = [](const auto& x, const auto& y) {
            return x.size() == y.size() &&
                   (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
        };
        EXPECT_EQ(a[i].n, b[i].n) << what << " seq " << i;
        EXPECT_TRUE(same(a[i].logprob, b[i].logprob)) << what << " seq " << i << ": logprob";
        EXPECT_TRUE(same(a[i].rank, b[i].rank)) << what << " seq " << i << ": rank";
        EXPECT_TRUE(same(a[i].entropy, b[i].entropy)) << what << " seq " << i << ": entropy";
        EXPECT_TRUE(same(a[i].topk_ids, b[i].topk_ids)) << what << " seq " << i << ": top-k ids";
        EXPECT_TRUE(same(a[i].topk_logprobs, b[i].topk_logprobs)) << what << " seq " << i << ": top-k";
    }
}

TEST(ChunkRing, LateAsynchronousCopiesGiveTheSynchronousScores) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const auto seqs = sequences(ck.config().vocab_size);
    auto cpu = make_cpu_backend();
    const std::vector<SequenceScores> want = score(*cpu, ck, 4096, seqs);
    for (const auto& [chunk_rows, delay_us] : {std::pair<int64_t, int>{8, 300}, {2, 50}, {30, 1000}}) {
        test::FakeAsyncBackend fake(static_cast<unsigned>(chunk_rows), delay_us);
        const std::vector<SequenceScores> got = score(fake, ck, chunk_rows, seqs);
        expect_identical(want, got,
                         "chunks of " + std::to_string(chunk_rows) +
                             " rows, copies delayed <= " + std::to_string(delay_us) + " us");
    }
}

TEST(ChunkRing, DefaultChunkRowsStayWithinBounds) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    const ModelConfig& c = ck.config();
    EXPECT_EQ(default_chunk_rows(c, 0), 64);
    EXPECT_EQ(default_chunk_rows(c, size_t{1} << 50), 8192);
    // A quarter of the memory over the per-row footprint (activations + the ring's 2 extra buffers).
    const int64_t per_row =
        (14 + c.hc_mult) * c.dim * 4 + c.n_heads * c.head_dim * 8 + 2 * c.hc_mult * (c.dim * 2 + 4);
    const size_t free_bytes = static_cast<size_t>(per_row) * 4 * 1000;
    EXPECT_EQ(default_chunk_rows(c, free_bytes), 1000);
}

}  // namespace
}  // namespace ds4r
