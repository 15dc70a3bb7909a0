// CUDA indexer ops vs the CPU backend (docs/MODEL.md 4.6.2, 8.1, 8.2): index scores (bit exact on
// fp4-grid inputs, <= 2 bf16 ulps on random ones), candidate blocks, the candidate mask and the
// top-K_c selection (identical, including tie-heavy rows), plus batch invariance and determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

Pair i32_pair(const std::vector<int32_t>& v, const Shape& shape) {
    return make_pair(DType::I32, shape, v.data());
}
Pair bf16_pair(const std::vector<uint16_t>& v, const Shape& shape) {
    return make_pair(DType::BF16, shape, v.data());
}

template <class T>
std::vector<T> gpu_values(const Tensor& t) {
    auto b = to_host(*cuda(), t);
    std::vector<T> v(b.size() / sizeof(T));
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
}

// Row r of a [rows, n] GPU result equals `want` (the same row computed alone) bit for bit.
template <class T>
void expect_row_equal(const std::vector<T>& all, int64_t r, int64_t n, const std::vector<T>& want,
                      const std::string& what) {
    ASSERT_EQ(static_cast<int64_t>(want.size()), n) << what;
    size_t bad = 0;
    for (int64_t c = 0; c < n; ++c)
        if (std::memcmp(&all[static_cast<size_t>(r * n + c)], &want[static_cast<size_t>(c)], sizeof(T)) !=
            0) {
            if (bad < 5)
                ADD_FAILURE() << what << ": row " << r << " column " << c << " differs when computed alone";
            ++bad;
        }
    EXPECT_EQ(bad, 0u) << what << ": row " << r;
}

// Values on the fp4 (e2m1) grid with one power-of-two scale per 32: every product and every partial
// sum of a 128-long dot product is exact in fp32, so the dot does not depend on summation order.
std::vector<uint16_t> fp4_grid_bf16(int64_t n, uint64_t seed) {
    static const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    std::mt19937_64 rng(seed);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    float scale = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) scale = std::ldexp(1.0f, -static_cast<int>(rng() % 4));
        const uint64_t code = rng();
        const float x = kE2m1[code & 7] * scale * ((code & 8) ? -1.0f : 1.0f);
        v[static_cast<size_t>(i)] = f32_to_bf16(x);
    }
    return v;
}

std::vector<uint16_t> normal_bf16(int64_t n, float sd, uint64_t seed, bool positive = false) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = f32_to_bf16(positive ? std::fabs(nd(rng)) : nd(rng));
    return v;
}

// Query positions: a few near 0, one at the end, the rest spread over [0, max_pos).
std::vector<int32_t> make_qpos(int64_t m, int64_t max_pos, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> p(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
        int64_t v;
        if (r < 3)
            v = r;
        else if (r == 3)
            v = max_pos - 1;
        else
            v = static_cast<int64_t>(rng() % static_cast<uint64_t>(max_pos));
        p[static_cast<size_t>(r)] = static_cast<int32_t>(std::min<int64_t>(v, max_pos - 1));
    }
    return p;
}

// index_scores on both backends; *gpu gets the GPU score.
struct ScoresCase {
    int64_t m, nh, ihd, T;
    int ratio;
};
Pair run_index_scores(const ScoresCase& c, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k,
                      const std::vector<uint16_t>& w, const std::vector<int32_t>& qpos) {
    Pair pq = bf16_pair(q, {c.m, c.nh, c.ihd}), pk = bf16_pair(k, {c.T, c.ihd}),
         pw = bf16_pair(w, {c.m, c.nh});
    Pair pp = i32_pair(qpos, {c.m});
    Pair out = make_output(DType::BF16, {c.m, c.T});
    cpu().index_scores(pq.c, pk.c, pw.c, pp.c, c.ratio, out.c);
    cuda()->index_scores(pq.g, pk.g, pw.g, pp.g, c.ratio, out.g);
    return out;
}

// bf16 comparison for the random index-score case: every element within max_ulps, at most
// max_frac_beyond_1 of them beyond one ulp, at least min_equal bitwise equal. -inf must match exactly.
void expect_scores_close(const Pair& p, double max_ulps, double max_frac_beyond_1, double min_equal,
                         const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    ASSERT_EQ(a.size(), b.size());
    const size_t n = a.size() / 2;
    size_t equal = 0, beyond1 = 0, bad = 0;
    for (size_t i = 0; i < n; ++i) {
        uint16_t x, y;
        std::memcpy(&x, &a[2 * i], 2);
        std::memcpy(&y, &b[2 * i], 2);
        if (x == y) {
            ++equal;
            continue;
        }
        const float fx = bf16_to_f32(x), fy = bf16_to_f32(y);
        double ulps = INFINITY;
        if (std::isfinite(fx) && std::isfinite(fy)) {
            int e;
            std::frexp(std::max(std::fabs(fx), std::fabs(fy)), &e);
            ulps = std::fabs(static_cast<double>(fx) - fy) / std::ldexp(1.0, e - 8);
        }
        if (ulps > 1.0) ++beyond1;
        if (ulps > max_ulps) {
            if (bad < 5) ADD_FAILURE() << what << ": element " << i << " cpu " << fx << " cuda " << fy;
            ++bad;
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " beyond " << max_ulps << " ulps";
    EXPECT_LE(static_cast<double>(beyond1), max_frac_beyond_1 * n)
        << what << ": " << beyond1 << " beyond 1 ulp";
    EXPECT_GE(static_cast<double>(equal), min_equal * n)
        << what << ": " << equal << " of " << n << " bitwise equal";
    std::printf("[ info ] %s: %.4f%% bitwise equal, %zu beyond 1 ulp\n", what.c_str(),
                n ? 100.0 * equal / n : 100.0, beyond1);
}

}  // namespace

// ---------------------------------------------------------------------------- index_scores

TEST(CudaIndexer, ScoresExactOnFp4Grid) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    const std::vector<ScoresCase> cases = {
        {small ? 9 : 130, 32, 128, small ? 300 : 4096, 1},  // real index shape (layer 20+, ratio 1)
        {17, 32, 128, 1001, 2},                             // ratio 2, T not a multiple of the tiles
        {3, 4, 64, 37, 2},                                  // tiny preset
        {1, 4, 64, 5, 1},
        {5, 20, 32, 70, 1},  // head count not a multiple of 16
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const ScoresCase& c = cases[i];
        const std::string what = "index_scores fp4 case " + std::to_string(i);
        auto q = fp4_grid_bf16(c.m * c.nh * c.ihd, 11 + i), k = fp4_grid_bf16(c.T * c.ihd, 12 + i);
        auto w = normal_bf16(c.m * c.nh, 0.05f, 13 + i);  // either sign: the sum is still exact per order
        auto qpos = make_qpos(c.m, c.T * c.ratio, 14 + i);
        Pair out = run_index_scores(c, q, k, w, qpos);
        expect_bitwise_equal(out, what);
    }
}

TEST(CudaIndexer, ScoresRandomWithinTwoUlps) {
    DS4R_REQUIRE_CUDA();
    // q, k ~ N(0, 1): the GPU's fp32 MMA dot may round S to the other bf16 neighbour where the
    // CPU's exactly rounded dot does not; positive head weights keep the head sum free of
    // cancellation, so such a flip moves the score by at most ~1 ulp (2 in the worst case).
    const ScoresCase c{sanitizer_run() ? 8 : 64, 32, 128, sanitizer_run() ? 256 : 4096, 1};
    auto q = normal_bf16(c.m * c.nh * c.ihd, 1.0f, 21), k = normal_bf16(c.T * c.ihd, 1.0f, 22);
    auto w = normal_bf16(c.m * c.nh, 0.1f, 23, true);
    auto qpos = make_qpos(c.m, c.T, 24);
    Pair out = run_index_scores(c, q, k, w, qpos);
    expect_scores_close(out, 2.0, 1e-3, 0.99, "index_scores random");
}

TEST(CudaIndexer, ScoresBatchInvariantAndDeterministic) {
    DS4R_REQUIRE_CUDA();
    const ScoresCase c{13, 32, 128, 777, 1};
    auto q = normal_bf16(c.m * c.nh * c.ihd, 1.0f, 31), k = normal_bf16(c.T * c.ihd, 1.0f, 32);
    auto w = normal_bf16(c.m * c.nh, 0.1f, 33);
    auto qpos = make_qpos(c.m, c.T, 34);
    Pair pq = bf16_pair(q, {c.m, c.nh, c.ihd}), pk = bf16_pair(k, {c.T, c.ihd}),
         pw = bf16_pair(w, {c.m, c.nh});
    Pair pp = i32_pair(qpos, {c.m});
    Pair a = make_output(DType::BF16, {c.m, c.T}), b = make_output(DType::BF16, {c.m, c.T});
    cuda()->index_scores(pq.g, pk.g, pw.g, pp.g, c.ratio, a.g);
    cuda()->index_scores(pq.g, pk.g, pw.g, pp.g, c.ratio, b.g);
    EXPECT_EQ(to_host(*cuda(), a.g), to_host(*cuda(), b.g)) << "index_scores: two runs differ";
    const auto all = gpu_values<uint16_t>(a.g);
    for (int64_t r : {int64_t{0}, int64_t{5}, c.m - 1}) {
        const int64_t sz = c.nh * c.ihd;
        std::vector<uint16_t> q1(q.begin() + r * sz, q.begin() + (r + 1) * sz);
        std::vector<uint16_t> w1(w.begin() + r * c.nh, w.begin() + (r + 1) * c.nh);
        Pair pq1 = bf16_pair(q1, {1, c.nh, c.ihd}), pw1 = bf16_pair(w1, {1, c.nh});
        Pair pp1 = i32_pair({qpos[static_cast<size_t>(r)]}, {1});
        Pair o1 = make_output(DType::BF16, {1, c.T});
        cuda()->index_scores(pq1.g, pk.g, pw1.g, pp1.g, c.ratio, o1.g);
        expect_row_equal(all, r, c.T, gpu_values<uint16_t>(o1.g), "index_scores batch invariance");
    }
}

// ---------------------------------------------------------------------------- top-k

namespace {

// Score rows in several tie-heavy styles (docs/MODEL.md 8.1: ties at the K-th value are the normal case).
std::vector<uint16_t> topk_scores(int64_t m, int64_t T, const std::vector<int32_t>& qpos, int ratio,
                                  uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> s(static_cast<size_t>(m * T));
    for (int64_t r = 0; r < m; ++r) {
        const int64_t n_t = (qpos[static_cast<size_t>(r)] + 1) / ratio;
        const int style = static_cast<int>(r % 7);
        for (int64_t j = 0; j < T; ++j) {
            float v;
            switch (style) {
                case 0:
                    v = nd(rng);
                    break;  // bf16 rounding ties
                case 1:
                    v = 1.0f;
                    break;  // all equal
                case 2:
                    v = static_cast<float>(static_cast<int>(rng() % 4) - 1);
                    break;  // 4 values
                case 3:
                    v = (rng() % 2) ? 0.0f : -0.0f;
                    break;  // +0 / -0 (distinct keys)
                case 4:
                    v = (j % 3 == 0) ? 2.0f : nd(rng) * 0.01f;
                    break;
                case 5:
                    v = static_cast<float>(static_cast<int>(rng() % 3));
                    break;
                default:
                    v = nd(rng) * 3.0f;
                    break;
            }
            // rows of style 5 keep finite scores past n_t: those picks must still map to -1
            if (j >= n_t && style != 5) v = -INFINITY;
            s[static_cast<size_t>(r * T + j)] = f32_to_bf16(v);
        }
    }
    return s;
}

void check_topk_case(int64_t m, int64_t T, int64_t K, int ratio, int64_t offset, uint64_t seed,
                     const std::string& what) {
    auto qpos = make_qpos(m, T * ratio, seed);
    auto sc = topk_scores(m, T, qpos, ratio, seed + 1);
    Pair ps = bf16_pair(sc, {m, T}), pp = i32_pair(qpos, {m});
    Pair idx = make_output(DType::I32, {m, K});
    cpu().index_topk(ps.c, pp.c, ratio, offset, idx.c);
    cuda()->index_topk(ps.g, pp.g, ratio, offset, idx.g);
    expect_bitwise_equal(idx, what);
}

}  // namespace

TEST(CudaIndexer, TopkIdenticalRealSize) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    check_topk_case(small ? 14 : 130, small ? 1024 : 4096, 512, 1, 8192, 41,
                    "index_topk T=4096 K=512 ratio 1");
    check_topk_case(small ? 7 : 35, small ? 600 : 5000, 512, 2, 10000, 42, "index_topk T=5000 K=512 ratio 2");
    if (!small) check_topk_case(7, 40000, 512, 1, 40000, 43, "index_topk T=40000 K=512");
}

TEST(CudaIndexer, TopkIdenticalTinyAndTails) {
    DS4R_REQUIRE_CUDA();
    check_topk_case(17, 37, 8, 2, 75, 51, "index_topk tiny T=37 K=8");
    check_topk_case(3, 8, 8, 1, 8, 52, "index_topk K == T");
    check_topk_case(1, 1, 1, 1, 1, 53, "index_topk T=1");
    check_topk_case(21, 513, 512, 1, 513, 54, "index_topk T=513 K=512");
    check_topk_case(14, 300, 300, 2, 601, 55, "index_topk K == T = 300 ratio 2");
}

TEST(CudaIndexer, TopkBatchInvariantAndDeterministic) {
    DS4R_REQUIRE_CUDA();
    const int64_t m = 14, T = 2000, K = 512;
    auto qpos = make_qpos(m, T, 61);
    auto sc = topk_scores(m, T, qpos, 1, 62);
    Pair ps = bf16_pair(sc, {m, T}), pp = i32_pair(qpos, {m});
    Pair a = make_output(DType::I32, {m, K}), b = make_output(DType::I32, {m, K});
    cuda()->index_topk(ps.g, pp.g, 1, T, a.g);
    cuda()->index_topk(ps.g, pp.g, 1, T, b.g);
    EXPECT_EQ(to_host(*cuda(), a.g), to_host(*cuda(), b.g)) << "index_topk: two runs differ";
    const auto all = gpu_values<int32_t>(a.g);
    for (int64_t r = 0; r < m; r += 3) {
        std::vector<uint16_t> s1(sc.begin() + r * T, sc.begin() + (r + 1) * T);
        Pair ps1 = bf16_pair(s1, {1, T}), pp1 = i32_pair({qpos[static_cast<size_t>(r)]}, {1});
        Pair o1 = make_output(DType::I32, {1, K});
        cuda()->index_topk(ps1.g, pp1.g, 1, T, o1.g);
        expect_row_equal(all, r, K, gpu_values<int32_t>(o1.g), "index_topk batch invariance");
    }
}

// ---------------------------------------------------------------------------- candidate blocks

namespace {

void check_candidates(int64_t m, int64_t T, int ratio, int64_t block, int64_t topk_blocks,
                      int64_t extra_words, uint64_t seed, const std::string& what,
                      std::vector<int32_t> qpos = {}) {
    if (qpos.empty()) qpos = make_qpos(m, T * ratio, seed);
    auto sc = topk_scores(m, T, qpos, ratio, seed + 1);
    const int64_t nb = (T + block - 1) / block, words = (nb + 31) / 32 + extra_words;
    Pair ps = bf16_pair(sc, {m, T}), pp = i32_pair(qpos, {m});
    Pair mask = make_output(DType::I32, {m, words});
    cpu().candidate_blocks(ps.c, pp.c, ratio, block, topk_blocks, mask.c);
    cuda()->candidate_blocks(ps.g, pp.g, ratio, block, topk_blocks, mask.g);
    expect_bitwise_equal(mask, what);
    // and the mask applied to the scores
    cpu().apply_candidate_mask(ps.c, mask.c, block);
    cuda()->apply_candidate_mask(ps.g, mask.g, block);
    expect_bitwise_equal(ps, what + " + apply_candidate_mask");
}

}  // namespace

TEST(CudaIndexer, CandidateBlocksIdentical) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    // real: block 8, 2048 blocks kept of 4096 (only bites past 16,384 positions)
    check_candidates(small ? 7 : 21, small ? 4096 : 32768, 1, 8, small ? 256 : 2048, 0, 71,
                     "candidates real");
    // n_blocks < topk_blocks: every reachable block kept, -inf blocks dropped; partial last block
    check_candidates(15, 1001, 1, 8, 2048, 0, 72, "candidates T=1001");
    // n_t = 0 rows (ratio 2, qpos 0): no block pinned (arange(nb) == -1 matches none)
    check_candidates(4, 64, 2, 8, 3, 0, 73, "candidates n_t = 0", {0, 0, 1, 5});
    // tiny preset (block 4, 3 blocks) and a mask wider than needed (extra words zeroed)
    check_candidates(17, 37, 1, 4, 3, 2, 74, "candidates tiny");
    check_candidates(9, 37, 2, 4, 3, 0, 75, "candidates tiny ratio 2");
}

TEST(CudaIndexer, ApplyCandidateMaskRandomBits) {
    DS4R_REQUIRE_CUDA();
    const int64_t m = 19, T = 333, block = 8, nb = (T + block - 1) / block, words = (nb + 31) / 32 + 1;
    auto sc = normal_bf16(m * T, 1.0f, 81);
    std::mt19937_64 rng(82);
    std::vector<int32_t> mk(static_cast<size_t>(m * words));
    for (auto& x : mk) x = static_cast<int32_t>(rng());
    Pair ps = bf16_pair(sc, {m, T}), pm = i32_pair(mk, {m, words});
    cpu().apply_candidate_mask(ps.c, pm.c, block);
    cuda()->apply_candidate_mask(ps.g, pm.g, block);
    expect_bitwise_equal(ps, "apply_candidate_mask random bits");
}

TEST(CudaIndexer, CandidateBlocksBatchInvariantAndDeterministic) {
    DS4R_REQUIRE_CUDA();
    const int64_t m = 9, T = 9000, block = 8, topk = 500, nb = (T + block - 1) / block,
                  words = (nb + 31) / 32;
    auto qpos = make_qpos(m, T, 91);
    auto sc = topk_scores(m, T, qpos, 1, 92);
    Pair ps = bf16_pair(sc, {m, T}), pp = i32_pair(qpos, {m});
    Pair a = make_output(DType::I32, {m, words}), b = make_output(DType::I32, {m, words});
    cuda()->candidate_blocks(ps.g, pp.g, 1, block, topk, a.g);
    cuda()->candidate_blocks(ps.g, pp.g, 1, block, topk, b.g);
    EXPECT_EQ(to_host(*cuda(), a.g), to_host(*cuda(), b.g)) << "candidate_blocks: two runs differ";
    const auto all = gpu_values<int32_t>(a.g);
    for (int64_t r = 0; r < m; r += 2) {
        std::vector<uint16_t> s1(sc.begin() + r * T, sc.begin() + (r + 1) * T);
        Pair ps1 = bf16_pair(s1, {1, T}), pp1 = i32_pair({qpos[static_cast<size_t>(r)]}, {1});
        Pair o1 = make_output(DType::I32, {1, words});
        cuda()->candidate_blocks(ps1.g, pp1.g, 1, block, topk, o1.g);
        expect_row_equal(all, r, words, gpu_values<int32_t>(o1.g), "candidate_blocks batch invariance");
    }
}
