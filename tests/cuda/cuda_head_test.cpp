// CUDA output-head statistics vs the CPU backend (docs/MODEL.md 4.9, docs/DESIGN.md 2): lse / entropy within
// rel 1e-6, target logit, rank and top-k identical. Most cases use integer-grid inputs whose logits
// are exact in fp32 on both backends (so ranks and top-k are bit-comparable, with many exact ties
// that the lower-id rule must break); one random case checks the fp32 GEMM path with tolerances.
// Plus batch invariance across the 256-row logits chunks and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/numeric.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Integers in [-span, span] times 2^exp2 as bf16: with |x| <= 2 and |head| <= 3 * 2^-6, every logit
// of D <= 5120 terms is a multiple of 2^-6 below 2^15, exact in fp32 in any summation order.
std::vector<uint16_t> int_grid_bf16(int64_t n, int span, int exp2, uint64_t seed) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    const float s = std::ldexp(1.0f, exp2);
    for (int64_t i = 0; i < n; ++i) {
        const int k = static_cast<int>(splitmix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i)) %
                                       static_cast<uint64_t>(2 * span + 1)) -
                      span;
        v[static_cast<size_t>(i)] = f32_to_bf16(static_cast<float>(k) * s);
    }
    return v;
}

std::vector<uint16_t> normal_bf16(int64_t n, float sd, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = f32_to_bf16(nd(rng));
    return v;
}

struct HeadOuts {
    Pair lse, ent, tl, rank, ids, logit;
    HeadOuts(int64_t M, int k)
        : lse(make_output(DType::F64, {M})),
          ent(make_output(DType::F64, {M})),
          tl(make_output(DType::F32, {M})),
          rank(make_output(DType::I32, {M})),
          ids(make_output(DType::I32, {M, k})),
          logit(make_output(DType::F32, {M, k})) {}
    HeadStatsOut c() const { return {lse.c, ent.c, tl.c, rank.c, ids.c, logit.c}; }
    HeadStatsOut g() const { return {lse.g, ent.g, tl.g, rank.g, ids.g, logit.g}; }
};

struct HeadCase {
    Pair x, head, targets;
    int64_t M, V, D;
};

HeadCase make_case(const std::vector<uint16_t>& x, const std::vector<uint16_t>& head,
                   std::vector<int32_t> targets, int64_t M, int64_t V, int64_t D) {
    return {make_pair(DType::BF16, {M, D}, x.data()),
            make_pair(DType::BF16, {V, D}, head.data()),
            make_pair(DType::I32, {M}, targets.data()),
            M,
            V,
            D};
}

std::vector<int32_t> some_targets(int64_t M, int64_t V, uint64_t seed) {
    std::vector<int32_t> t(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r)
        t[static_cast<size_t>(r)] = r % 4 == 1 ? -1 : static_cast<int32_t>(splitmix64(seed + r) % V);
    return t;
}

// Runs both backends; compares everything (exact: logits exact on both sides).
void check_exact(const HeadCase& hc, int k, const std::string& what) {
    HeadOuts o(hc.M, k);
    cpu().head_stats(hc.x.c, hc.head.c, hc.targets.c, k, o.c());
    cuda()->head_stats(hc.x.g, hc.head.g, hc.targets.g, k, o.g());
    expect_f64_close(o.lse, 1e-6, 1e-9, what + " lse");
    expect_f64_close(o.ent, 1e-6, 1e-9, what + " entropy");
    expect_bitwise_equal(o.tl, what + " target_logit");
    expect_bitwise_equal(o.rank, what + " rank");
    expect_bitwise_equal(o.ids, what + " topk_ids");
    expect_bitwise_equal(o.logit, what + " topk_logit");
}

std::vector<uint8_t> all_outputs(const HeadOuts& o) {
    std::vector<uint8_t> v;
    for (const Pair* p : {&o.lse, &o.ent, &o.tl, &o.rank, &o.ids, &o.logit}) {
        auto b = to_host(*cuda(), p->g);
        v.insert(v.end(), b.begin(), b.end());
    }
    return v;
}

// GPU batch invariance: rows computed inside M rows (several 256-row chunks) == computed alone.
void check_rows_alone(const std::vector<uint16_t>& x, const Pair& head, const std::vector<int32_t>& targets,
                      int64_t M, int64_t D, int k, const std::vector<int64_t>& rows,
                      const std::string& what) {
    Pair px = make_pair(DType::BF16, {M, D}, x.data()), pt = make_pair(DType::I32, {M}, targets.data());
    HeadOuts all(M, k), again(M, k);
    cuda()->head_stats(px.g, head.g, pt.g, k, all.g());
    cuda()->head_stats(px.g, head.g, pt.g, k, again.g());
    EXPECT_EQ(all_outputs(all), all_outputs(again)) << what << ": two runs differ";
    auto host = [](const Tensor& t) { return to_host(*cuda(), t); };
    const auto lse = host(all.lse.g), ent = host(all.ent.g), tl = host(all.tl.g), rank = host(all.rank.g),
               ids = host(all.ids.g), lg = host(all.logit.g);
    for (int64_t r : rows) {
        std::vector<uint16_t> x1(x.begin() + r * D, x.begin() + (r + 1) * D);
        Pair px1 = make_pair(DType::BF16, {1, D}, x1.data());
        Pair pt1 = make_pair(DType::I32, {1}, &targets[static_cast<size_t>(r)]);
        HeadOuts one(1, k);
        cuda()->head_stats(px1.g, head.g, pt1.g, k, one.g());
        auto same = [&](const std::vector<uint8_t>& a, const Tensor& t, size_t row_bytes, const char* name) {
            const auto b = host(t);
            EXPECT_EQ(0, std::memcmp(a.data() + r * row_bytes, b.data(), row_bytes))
                << what << ": " << name << " of row " << r << " differs when computed alone";
        };
        same(lse, one.lse.g, 8, "lse");
        same(ent, one.ent.g, 8, "entropy");
        same(tl, one.tl.g, 4, "target_logit");
        same(rank, one.rank.g, 4, "rank");
        if (k > 0) {
            same(ids, one.ids.g, 4 * static_cast<size_t>(k), "topk_ids");
            same(lg, one.logit.g, 4 * static_cast<size_t>(k), "topk_logit");
        }
    }
}

}  // namespace

TEST(CudaHead, RealVocabularyExact) {
    DS4R_REQUIRE_CUDA();
    const int64_t V = sanitizer_run() ? 4096 : 129280, D = 5120, M = 5;
    auto x = int_grid_bf16(M * D, 2, 0, 1);
    auto head = int_grid_bf16(V * D, 3, -6, 2);
    HeadCase hc = make_case(x, head, some_targets(M, V, 3), M, V, D);
    head.clear();
    head.shrink_to_fit();
    check_exact(hc, 8, "head_stats V=" + std::to_string(V));
    if (!sanitizer_run()) {
        // 260 rows: two logits chunks (256 + 4); rows at both sides of the chunk edge alone
        const int64_t M2 = 260;
        auto x2 = int_grid_bf16(M2 * D, 2, 0, 4);
        check_rows_alone(x2, hc.head, some_targets(M2, V, 5), M2, D, 8, {0, 255, 256, 259},
                         "head_stats real V batch invariance");
    }
}

TEST(CudaHead, TinyExactTopkVariants) {
    DS4R_REQUIRE_CUDA();
    const int64_t V = 512, D = 256, M = 17;
    auto x = int_grid_bf16(M * D, 2, 0, 11);
    auto head = int_grid_bf16(V * D, 3, -6, 12);
    HeadCase hc = make_case(x, head, some_targets(M, V, 13), M, V, D);
    for (int k : {0, 1, 8, 300, 512}) check_exact(hc, k, "head_stats tiny k=" + std::to_string(k));
    // all logits equal in every row (head rows identical): ties everywhere, lower ids first
    std::vector<uint16_t> same_rows(static_cast<size_t>(V * D));
    for (int64_t v = 0; v < V; ++v) std::memcpy(&same_rows[v * D], head.data(), D * 2);
    HeadCase tie = make_case(x, same_rows, some_targets(M, V, 14), M, V, D);
    check_exact(tie, 8, "head_stats all-tie rows");
    // k = 1024, V = 4096, D = 64
    const int64_t V2 = 4096, D2 = 64;
    auto x2 = int_grid_bf16(3 * D2, 2, 0, 15);
    auto head2 = int_grid_bf16(V2 * D2, 3, -6, 16);
    check_exact(make_case(x2, head2, some_targets(3, V2, 17), 3, V2, D2), 1024, "head_stats k=1024");
}

TEST(CudaHead, RandomWithinTolerance) {
    DS4R_REQUIRE_CUDA();
    // N(0, 1) rows and head: fp32 logits differ from the CPU's exactly rounded ones by accumulation
    // order (a few fp32 ulps), far below the gaps between the top logits of 512 values, so the
    // top-8 ids agree; targets are chosen among each row's top 8 so ranks are tie-free too.
    const int64_t V = 512, D = 256, M = 17;
    const int k = 8;
    auto x = normal_bf16(M * D, 1.0f, 21);
    auto head = normal_bf16(V * D, 0.0625f, 22);
    HeadCase probe = make_case(x, head, std::vector<int32_t>(static_cast<size_t>(M), -1), M, V, D);
    HeadOuts first(M, k);
    cpu().head_stats(probe.x.c, probe.head.c, probe.targets.c, k, first.c());
    std::vector<int32_t> top(static_cast<size_t>(M * k)), targets(static_cast<size_t>(M));
    cpu().download(top.data(), first.ids.c, 0, top.size() * 4);
    for (int64_t r = 0; r < M; ++r)
        targets[static_cast<size_t>(r)] = r % 5 == 4 ? -1 : top[static_cast<size_t>(r * k + r % k)];
    HeadCase hc = make_case(x, head, targets, M, V, D);
    HeadOuts o(M, k);
    cpu().head_stats(hc.x.c, hc.head.c, hc.targets.c, k, o.c());
    cuda()->head_stats(hc.x.g, hc.head.g, hc.targets.g, k, o.g());
    expect_f64_close(o.lse, 1e-6, 0.0, "head_stats random lse");
    expect_f64_close(o.ent, 1e-6, 0.0, "head_stats random entropy");
    expect_f32_close(o.tl, 1e-5, 1e-6, "head_stats random target_logit");
    expect_bitwise_equal(o.rank, "head_stats random rank");
    expect_bitwise_equal(o.ids, "head_stats random topk_ids");
    expect_f32_close(o.logit, 1e-5, 1e-6, "head_stats random topk_logit");
}

TEST(CudaHead, BatchInvariantAcrossChunksAndDeterministic) {
    DS4R_REQUIRE_CUDA();
    const int64_t V = 1000, D = 256, M = 300;  // V not a multiple of the 128-wide vocab tile
    auto x = normal_bf16(M * D, 1.0f, 31);
    auto head = normal_bf16(V * D, 0.0625f, 32);
    Pair ph = make_pair(DType::BF16, {V, D}, head.data());
    std::vector<int32_t> targets(static_cast<size_t>(M));
    for (int64_t r = 0; r < M; ++r)
        targets[static_cast<size_t>(r)] = r % 3 == 0 ? -1 : static_cast<int32_t>(r * 7 % V);
    check_rows_alone(x, ph, targets, M, D, 8, {0, 1, 128, 255, 256, 299}, "head_stats batch invariance");
}
