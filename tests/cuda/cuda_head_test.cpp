// CUDA output-head statistics vs the CPU backend (docs/MODEL.md 4.9, docs/DESIGN.md 2): lse / entropy within
// rel 1e-6, target logit, rank and top-k identical. Most cases use integer-grid inputs whose logits
// are exact in fp32 on both backends (so ranks and top-k are bit-comparable, with many exact ties
// that the lower-id rule must break); one random case checks the fp32 GEMM path with tolerances.
// Plus batch invariance across the 256-row logits chunks and determinism. The row-statistics kernel's
// paths (kernels/head.cu: the candidate list, its rank / bitonic orderings, the exact radix fallback)
// are reached through head_stats and, for logits a GEMM of bf16 inputs cannot make (NaN, +-inf,
// misaligned rows), through launch_head_row_stats against a host reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/numeric.h"

#ifdef DS4R_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "head.cuh"
#endif

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

TEST(CudaHead, RowStatsPaths) {
    DS4R_REQUIRE_CUDA();
    // All logits equal, V above the kernel's 4,096-entry candidate list: the exact fallback for every k
    // (TinyExactTopkVariants' all-tie rows, V = 512, fit the list: 512 candidates, the rank ordering).
    {
        const int64_t V = 5000, D = 64, M = 5;
        auto x = int_grid_bf16(M * D, 2, 0, 41);
        auto h = int_grid_bf16(D, 3, -6, 42);
        std::vector<uint16_t> rows(static_cast<size_t>(V * D));
        for (int64_t v = 0; v < V; ++v) std::memcpy(&rows[v * D], h.data(), D * 2);
        HeadCase hc = make_case(x, rows, some_targets(M, V, 43), M, V, D);
        for (int k : {1, 8, 300, 512, 513})
            check_exact(hc, k, "head_stats all-equal V=5000 k=" + std::to_string(k));
    }
    // Integer-grid rows: x of span xs, head of span hs (x 2^-6), seeds from `seed`, each k checked.
    auto grid_case = [](int64_t V, int64_t D, int64_t M, int xs, int hs, uint64_t seed,
                        std::initializer_list<int> ks, const std::string& what) {
        auto x = int_grid_bf16(M * D, xs, 0, seed);
        auto h = int_grid_bf16(V * D, hs, -6, seed + 1);
        HeadCase hc = make_case(x, h, some_targets(M, V, seed + 2), M, V, D);
        for (int k : ks) check_exact(hc, k, what + " k=" + std::to_string(k));
    };
    // Few distinct logits (D = 8 of a narrow grid): exact ties at the k-th value across the whole row,
    // thousands of candidates (the bitonic ordering) or more than the list holds (the fallback).
    grid_case(20000, 8, 6, 1, 2, 51, {1, 8, 20, 512, 1024}, "head_stats few-valued");
    // k = 512 (the largest the candidate path takes), 513 and 1024 (the fallback) with V = 4096.
    grid_case(4096, 64, 4, 2, 3, 61, {100, 512, 513, 1024}, "head_stats V=4096");
    // V % 4 != 0 (rows after the first are not 16-byte aligned), k up to V.
    for (int64_t V : {1, 3, 7, 1001, 4097}) {
        const int64_t D = 32, M = 9;
        auto x = int_grid_bf16(M * D, 2, 0, 70 + V);
        auto h = int_grid_bf16(V * D, 3, -6, 80 + V);
        HeadCase hc = make_case(x, h, some_targets(M, V, 90 + V), M, V, D);
        for (int k : {1, 3, 8, 512, 1024})
            if (k <= V) check_exact(hc, k, "head_stats V=" + std::to_string(V) + " k=" + std::to_string(k));
        if (V <= 1024) check_exact(hc, static_cast<int>(V), "head_stats V=" + std::to_string(V) + " k=V");
    }
}

#ifdef DS4R_HAVE_CUDA
namespace {

// Host reference of one row (head.cuh's contract): sums in long double, top-k by a stable sort.
struct RowRef {
    double lse, ent;
    float tl;
    int32_t rank;
    std::vector<int32_t> ids;
};
RowRef row_reference(const float* l, int64_t V, int32_t t, int k) {
    long double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
        if (!std::isnan(l[v])) mx = std::max(mx, static_cast<long double>(l[v]));
    long double se = 0, sel = 0;
    for (int64_t v = 0; v < V; ++v) {
        const long double e = std::exp(static_cast<long double>(l[v]) - mx);  // NaN for +-inf - +-inf
        se += e;
        sel += e * static_cast<long double>(l[v]);  // 0 * -inf = NaN, as the CPU's sum
    }
    RowRef o;
    o.lse = static_cast<double>(mx + std::log(se));
    o.ent = static_cast<double>(mx + std::log(se) - sel / se);
    o.tl = t >= 0 ? l[t] : 0.0f;
    int64_t above = 0;
    if (t >= 0)
        for (int64_t v = 0; v < V; ++v) above += l[v] > l[t] ? 1 : 0;
    o.rank = t >= 0 ? static_cast<int32_t>(1 + above) : 0;
    std::vector<int32_t> ord(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ord[static_cast<size_t>(v)] = static_cast<int32_t>(v);
    auto above_nan_aware = [](float a, float b) { return !std::isnan(a) && (std::isnan(b) || a > b); };
    std::stable_sort(ord.begin(), ord.end(),
                     [&](int32_t a, int32_t b) { return above_nan_aware(l[a], l[b]); });
    o.ids.assign(ord.begin(), ord.begin() + k);
    return o;
}

struct DirectOut {
    std::vector<double> lse, ent;
    std::vector<float> tl, logit;
    std::vector<int32_t> rank, ids;
};

// launch_head_row_stats on R rows of V logits placed `offset` floats past a 256-byte aligned buffer.
DirectOut run_row_stats(const std::vector<float>& logits, const std::vector<int32_t>& targets, int64_t R,
                        int64_t V, int k, int64_t offset) {
    auto& be = dynamic_cast<CudaBackend&>(*cuda());
    Tensor buf = be.alloc(DType::F32, {R * V + offset});
    be.upload(buf, static_cast<size_t>(offset) * 4, logits.data(), logits.size() * 4);
    Tensor tg = be.alloc(DType::I32, {R});
    be.upload(tg, 0, targets.data(), targets.size() * 4);
    HeadOuts o(R, std::max(k, 1));
    DS4R_CUDA_CHECK(kern::launch_head_row_stats(
        buf.ptr<float>() + offset, tg.ptr<int32_t>(), R, V, k, o.lse.g.ptr<double>(), o.ent.g.ptr<double>(),
        o.tl.g.ptr<float>(), o.rank.g.ptr<int32_t>(), k > 0 ? o.ids.g.ptr<int32_t>() : nullptr,
        k > 0 ? o.logit.g.ptr<float>() : nullptr, be.stream()));
    DirectOut d;
    auto get = [&](auto& v, const Tensor& t, size_t n) {
        v.resize(n);
        if (n) be.download(v.data(), t, 0, n * sizeof(v[0]));
    };
    get(d.lse, o.lse.g, static_cast<size_t>(R));
    get(d.ent, o.ent.g, static_cast<size_t>(R));
    get(d.tl, o.tl.g, static_cast<size_t>(R));
    get(d.rank, o.rank.g, static_cast<size_t>(R));
    get(d.ids, o.ids.g, static_cast<size_t>(R * k));
    get(d.logit, o.logit.g, static_cast<size_t>(R * k));
    return d;
}

void expect_close_or_nan(double got, double want, const std::string& what) {
    if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << what << ": " << got << ", want NaN";
    } else {
        EXPECT_NEAR(got, want, 1e-9 * std::fabs(want) + 1e-12) << what;
    }
}

bool same_bits(const DirectOut& a, const DirectOut& b, int64_t ra, int64_t rb, int k) {
    auto eq = [](const void* x, const void* y, size_t n) { return std::memcmp(x, y, n) == 0; };
    return eq(&a.lse[ra], &b.lse[rb], 8) && eq(&a.ent[ra], &b.ent[rb], 8) && eq(&a.tl[ra], &b.tl[rb], 4) &&
           a.rank[ra] == b.rank[rb] && eq(&a.ids[ra * k], &b.ids[rb * k], 4 * static_cast<size_t>(k)) &&
           eq(&a.logit[ra * k], &b.logit[rb * k], 4 * static_cast<size_t>(k));
}

}  // namespace

// NaN, +-inf, +-0 and denormal logits, rows not 16-byte aligned (V % 4 != 0 and an offset buffer),
// every top-k path; each row's bits also equal when computed alone at another alignment.
TEST(CudaHead, RowStatsSpecialValuesAndAlignment) {
    DS4R_REQUIRE_CUDA();
    for (int64_t V : {int64_t{3001}, int64_t{6000}}) {
        const int64_t R = 12;
        std::mt19937_64 rng(static_cast<uint64_t>(V));
        std::normal_distribution<float> nd(0.0f, 3.0f);
        std::vector<float> L(static_cast<size_t>(R * V));
        for (auto& v : L) v = nd(rng);
        auto at = [&](int64_t r, int64_t v) -> float& { return L[static_cast<size_t>(r * V + v)]; };
        for (int64_t v = 0; v < V; v += 7) at(0, v) = NAN;        // NaNs among numbers
        for (int64_t v = 0; v < V; v += 5) at(1, v) = -INFINITY;  // -inf among numbers
        at(2, 17) = INFINITY;                                     // one +inf
        for (int64_t v = 0; v < V; ++v) {
            at(3, v) = NAN;                                           // all NaN
            at(4, v) = -INFINITY;                                     // all -inf
            at(5, v) = v < V / 2 ? NAN : -INFINITY;                   // no number
            if (v % 2) at(6, v) = NAN;                                // half NaN
            if (v < V - 3) at(7, v) = NAN;                            // 3 numbers, at the end
            at(8, v) = v % 3 ? 0.0f : -0.0f;                          // +0 == -0 ties
            at(9, v) = 1e-42f * static_cast<float>(v % 13) - 5e-42f;  // denormals
            at(10, v) = static_cast<float>(static_cast<int>(v % 5));  // 5 values, V / 5 ties each
        }
        at(11, V - 1) = 40.0f;  // a peaked row: the max in the last (partial) group
        at(11, 0) = 40.0f;
        std::vector<int32_t> targets(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r)
            targets[static_cast<size_t>(r)] = r % 4 == 3 ? -1 : static_cast<int32_t>((r * 997) % V);
        targets[0] = 7;  // a NaN target: rank 1 (nothing compares greater)
        for (int k : {0, 1, 3, 8, 100, 512, 600, 1024}) {
            const std::string what = "row_stats V=" + std::to_string(V) + " k=" + std::to_string(k);
            const DirectOut d = run_row_stats(L, targets, R, V, k, 0);
            for (int64_t r = 0; r < R; ++r) {
                const RowRef want =
                    row_reference(&L[static_cast<size_t>(r * V)], V, targets[static_cast<size_t>(r)], k);
                const std::string w = what + " row " + std::to_string(r);
                expect_close_or_nan(d.lse[static_cast<size_t>(r)], want.lse, w + " lse");
                expect_close_or_nan(d.ent[static_cast<size_t>(r)], want.ent, w + " entropy");
                EXPECT_EQ(0, std::memcmp(&d.tl[static_cast<size_t>(r)], &want.tl, 4)) << w << " target_logit";
                EXPECT_EQ(d.rank[static_cast<size_t>(r)], want.rank) << w << " rank";
                for (int i = 0; i < k; ++i) {
                    const size_t j = static_cast<size_t>(r * k + i);
                    ASSERT_EQ(d.ids[j], want.ids[static_cast<size_t>(i)]) << w << " topk_ids[" << i << "]";
                    const float lv = L[static_cast<size_t>(r * V + want.ids[static_cast<size_t>(i)])];
                    EXPECT_EQ(0, std::memcmp(&d.logit[j], &lv, 4)) << w << " topk_logit[" << i << "]";
                }
            }
            if (k == 0) continue;
            // the same rows at another address (offset by 1 float) and rows alone: the same bits
            const DirectOut d1 = run_row_stats(L, targets, R, V, k, 1);
            for (int64_t r = 0; r < R; ++r)
                EXPECT_TRUE(same_bits(d, d1, r, r, k)) << what << " row " << r << " moved";
            for (int64_t r : {int64_t{0}, int64_t{5}, R - 1}) {
                std::vector<float> one(L.begin() + r * V, L.begin() + (r + 1) * V);
                const DirectOut a = run_row_stats(one, {targets[static_cast<size_t>(r)]}, 1, V, k, 3);
                EXPECT_TRUE(same_bits(d, a, r, 0, k)) << what << " row " << r << " alone";
            }
        }
    }
}
#endif  // DS4R_HAVE_CUDA
