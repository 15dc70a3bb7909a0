// The Hopper wgmma GEMMs (kernels/gemm_sm90.cuh, `--kernels hopper`) against the portable mma.sync
// kernels (their oracle) and the CPU backend: per GEMM family and shape, the fraction of outputs
// bitwise equal and the largest distance in units in the last place (ulp of the output dtype), with
// the bounds measured on an H200 (docs/PERFORMANCE.md "Hopper kernels: numerics"). Batch invariance is
// exact: a row's bits do not depend on M. Skips on GPUs other than compute capability 9.0.
//
// Shapes: odd M (1, 7, 129, 8193), N off the 128-column tile, K = 32 (one block), the model's shapes at
// modest M, extreme block scales (the three-rounding form), grouped experts with empty experts, one
// expert holding every row, and 384 experts; grouped on 64-row, 128-row and mixed tiles (each expert's
// short last tile on 64 rows: the routing plan split by launch_moe_tile_split, checked against a host
// copy of the split).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/numeric.h"

#ifdef DS4R_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "gemm_sm90.cuh"
#include "moe.cuh"
#include "quant.cuh"
#endif

using namespace ds4r;
using namespace ds4r::test;

#ifdef DS4R_HAVE_CUDA

namespace {

#define DS4R_REQUIRE_HOPPER()                                                                            \
    do {                                                                                                 \
        DS4R_REQUIRE_CUDA();                                                                             \
        if (!kern::sm90_gemm_usable(0))                                                                  \
            GTEST_SKIP() << "device 0 is not a compute capability 9.0 GPU: Hopper kernel tests skipped"; \
    } while (0)

// Measured bounds (H200, CUDA 13.0; see the file comment). The default block-scaled kernels widen the
// codes to fp16 (Sm90Partials::Fp16Widened) and must equal the portable kernels bit for bit, as the
// bf16 GEMMs do. The fp8-wgmma partials (Sm90Partials::Fp8Wgmma) are the tensor core's own fp8 sum:
// a fraction of outputs differ (by up to a few percent of the row's rms: the fp8 tensor core's sum).
// Measured: 93.5% (fp8, M = 1) .. 99.8% (fp4) bitwise; max |d| / rms 3.3e-2 (fp4, M = 8193).
constexpr double kFp8WgmmaMinBitwise = 0.93;  // fraction of outputs bitwise equal to the portable kernels
constexpr double kFp8WgmmaMaxRel = 4e-2;      // max |difference| / rms of the portable output row

CudaBackend& hop() {
    static CudaBackend b(0, size_t{24} << 30, GpuKernels::Hopper);
    return b;
}
CudaBackend& port() {
    static CudaBackend b(0, size_t{24} << 30, GpuKernels::Portable);
    return b;
}

Tensor upload(Backend& be, DType t, const Shape& shape, const void* host) {
    Tensor d = be.alloc(t, shape);
    if (d.nbytes()) be.upload(d, 0, host, d.nbytes());
    return d;
}
Tensor poisoned(Backend& be, DType t, const Shape& shape) {
    Tensor d = be.alloc(t, shape);
    be.fill(d, 0xA5);
    return d;
}
std::vector<uint8_t> host(Backend& be, const Tensor& t) {
    std::vector<uint8_t> v(t.nbytes());
    if (!v.empty()) be.download(v.data(), t, 0, v.size());
    return v;
}

std::vector<uint16_t> rand_x(int64_t M, int64_t K, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<uint16_t> h(static_cast<size_t>(M * K));
    for (auto& v : h) v = f32_to_bf16(nd(rng));
    return h;
}
uint8_t scale_byte(std::mt19937_64& rng, bool extreme) {
    return extreme ? static_cast<uint8_t>(rng() % 255) : static_cast<uint8_t>(113 + rng() % 11);
}
// fp4 weight scales [rows, kb] whose exponents the Hopper widened kernels take into B (bytes 114..128,
// gemm_sm90_tile.cuh sw_foldable), except column 0 of every K block kb % 5 == 3 (byte 129, still inside the
// fused window): stages that take the scales in and stages that do not, in one problem.
std::vector<uint8_t> foldable_fp4_scales(int64_t rows, int64_t kb, std::mt19937_64& rng) {
    std::vector<uint8_t> s(static_cast<size_t>(rows * kb));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < kb; ++b)
            s[static_cast<size_t>(r * kb + b)] =
                r == 0 && b % 5 == 3 ? 129 : static_cast<uint8_t>(114 + rng() % 15);
    return s;
}
std::vector<uint8_t> rand_fp8_codes(size_t n, std::mt19937_64& rng) {
    std::vector<uint8_t> w(n);
    for (auto& b : w) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    }
    return w;
}

// Distance in ulps between two values of the same dtype (2: bf16, 4: f32) via their ordered integers;
// both NaN: 0; one NaN: a large distance.
int64_t ulp_distance(const uint8_t* a, const uint8_t* b, size_t es) {
    auto ordered = [es](const uint8_t* p, bool* nan) -> int64_t {
        if (es == 2) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            *nan = (h & 0x7fff) > 0x7f80;
            return (h & 0x8000) ? -static_cast<int64_t>(h & 0x7fff) : static_cast<int64_t>(h);
        }
        uint32_t u;
        std::memcpy(&u, p, 4);
        *nan = (u & 0x7fffffffu) > 0x7f800000u;
        return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
    };
    bool na, nb;
    const int64_t x = ordered(a, &na), y = ordered(b, &nb);
    if (na || nb) return na && nb ? 0 : (int64_t{1} << 40);
    return x > y ? x - y : y - x;
}

double value_of(const uint8_t* p, size_t es) {
    if (es == 2) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, p, 4);
    return f;
}

// Outputs a (under test) and b (reference) of `cols` columns: bitwise fraction, max ulp distance, and
// max |a - b| / rms(b's row) (the ulp distance is large for tiny values near a sign change).
struct Agreement {
    size_t n = 0, equal = 0;
    int64_t max_ulp = 0;
    double max_rel = 0;
    double fraction() const { return n ? static_cast<double>(equal) / static_cast<double>(n) : 1.0; }
};
Agreement agreement(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t es, int64_t cols) {
    Agreement g;
    EXPECT_EQ(a.size(), b.size());
    const size_t row = static_cast<size_t>(cols) * es;
    for (size_t r0 = 0; r0 + row <= std::min(a.size(), b.size()); r0 += row) {
        double ss = 0;
        for (size_t i = r0; i < r0 + row; i += es) ss += value_of(&b[i], es) * value_of(&b[i], es);
        const double rms = std::sqrt(ss / static_cast<double>(cols));
        for (size_t i = r0; i < r0 + row; i += es) {
            ++g.n;
            if (std::memcmp(&a[i], &b[i], es) == 0) {
                ++g.equal;
                continue;
            }
            g.max_ulp = std::max(g.max_ulp, ulp_distance(&a[i], &b[i], es));
            const double d = std::fabs(value_of(&a[i], es) - value_of(&b[i], es));
            // rows whose rms is 0 or not finite (extreme scales) have no relative measure
            if (rms > 0 && std::isfinite(rms) && std::isfinite(d)) g.max_rel = std::max(g.max_rel, d / rms);
        }
    }
    return g;
}
void report(const std::string& what, const char* against, const Agreement& g) {
    std::printf("[sm90] %-52s vs %-8s bitwise %9.5f%% of %9zu, max %lld ulp, max |d|/rms %.2e\n",
                what.c_str(), against, 100.0 * g.fraction(), g.n, static_cast<long long>(g.max_ulp),
                g.max_rel);
}
void expect_equal(const std::string& what, const char* against, const Agreement& g) {
    report(what, against, g);
    EXPECT_EQ(g.equal, g.n) << what << " vs " << against << ": not bitwise equal";
}
void expect_fp8_wgmma(const std::string& what, const Agreement& g) {
    report(what, "portable", g);
    EXPECT_GE(g.fraction(), kFp8WgmmaMinBitwise) << what;
    EXPECT_LE(g.max_rel, kFp8WgmmaMaxRel) << what;
}

// The fp8-wgmma variant of a block-scaled linear on the Hopper backend's activation codes.
std::vector<uint8_t> fp8_wgmma_linear(bool fp4, const Tensor& x, const Tensor& w, const Tensor& s, int64_t M,
                                      int64_t N, int64_t K) {
    CudaBackend& be = hop();
    // the fp8 wgmma reads the codes in K order (the widened default reads them fragment-ordered)
    const CudaBackend::GemmActs a =
        be.quantize_gemm_acts(x, M, K, kern::sm90_act_order(kern::Sm90Partials::Fp8Wgmma));
    Tensor y = poisoned(be, DType::BF16, {M, N});
    auto fn = fp4 ? kern::launch_gemm_fp4_sm90_partials : kern::launch_gemm_fp8_sm90_partials;
    DS4R_CUDA_CHECK(fn(kern::Sm90Partials::Fp8Wgmma, a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.ptr<uint8_t>(),
                       s.ptr<uint8_t>(), y.ptr<uint16_t>(), N, M, N, K, be.stream(), kern::Sm90Loads::Auto));
    return host(be, y);
}

// ---------------------------------------------------------------- block-scaled linears
void check_fp8(int64_t M, int64_t N, int64_t K, uint64_t seed, bool extreme, bool vs_cpu) {
    const std::string what = "linear_fp8 M=" + std::to_string(M) + " N=" + std::to_string(N) +
                             " K=" + std::to_string(K) + (extreme ? " extreme scales" : "");
    std::mt19937_64 rng(seed);
    const auto xh = rand_x(M, K, seed + 1, extreme ? 300.0f : 1.0f);
    const auto wh = rand_fp8_codes(static_cast<size_t>(N * K), rng);
    std::vector<uint8_t> sh(static_cast<size_t>(((N + 31) / 32) * (K / 32)));
    for (auto& b : sh) b = scale_byte(rng, extreme);
    std::vector<uint8_t> wg;
    auto run = [&](Backend& be) {
        Fp8Linear w{upload(be, DType::F8_E4M3, {N, K}, wh.data()),
                    upload(be, DType::F8_E8M0, {(N + 31) / 32, K / 32}, sh.data())};
        Tensor x = upload(be, DType::BF16, {M, K}, xh.data());
        Tensor y = poisoned(be, DType::BF16, {M, N});
        be.linear_fp8(x, w, y);
        if (&be == &hop()) wg = fp8_wgmma_linear(false, x, w.w, w.s, M, N, K);
        return host(be, y);
    };
    const auto h = run(hop()), p = run(port());
    expect_equal(what, "portable", agreement(h, p, 2, N));
    expect_fp8_wgmma(what + " fp8-wgmma", agreement(wg, p, 2, N));
    if (vs_cpu) {
        const auto c = run(cpu());
        report(what, "cpu", agreement(h, c, 2, N));
        report(what + " fp8-wgmma", "cpu", agreement(wg, c, 2, N));
    }
}

// scales: 0 typical, 1 extreme (outside the fused window), 2 foldable_fp4_scales
void check_fp4(int64_t M, int64_t N, int64_t K, uint64_t seed, int scales, bool vs_cpu) {
    const bool extreme = scales == 1;
    const std::string what = "linear_fp4 M=" + std::to_string(M) + " N=" + std::to_string(N) +
                             " K=" + std::to_string(K) + (extreme ? " extreme scales" : "") +
                             (scales == 2 ? " foldable scales" : "");
    std::mt19937_64 rng(seed);
    const auto xh = rand_x(M, K, seed + 1, extreme ? 300.0f : 1.0f);
    std::vector<uint8_t> wh(static_cast<size_t>(N * K / 2)), sh(static_cast<size_t>(N * (K / 32)));
    for (auto& b : wh) b = static_cast<uint8_t>(rng());
    for (auto& b : sh) b = scale_byte(rng, extreme);
    if (scales == 2) sh = foldable_fp4_scales(N, K / 32, rng);
    std::vector<uint8_t> wg;
    auto run = [&](Backend& be) {
        Fp4Linear w{upload(be, DType::I8, {N, K / 2}, wh.data()),
                    upload(be, DType::F8_E8M0, {N, K / 32}, sh.data())};
        Tensor x = upload(be, DType::BF16, {M, K}, xh.data());
        Tensor y = poisoned(be, DType::BF16, {M, N});
        linear_fp4(be, x, w, y);
        if (&be == &hop()) wg = fp8_wgmma_linear(true, x, w.w, w.s, M, N, K);
        return host(be, y);
    };
    const auto h = run(hop()), p = run(port());
    expect_equal(what, "portable", agreement(h, p, 2, N));
    expect_fp8_wgmma(what + " fp8-wgmma", agreement(wg, p, 2, N));
    if (vs_cpu) {
        const auto c = run(cpu());
        report(what, "cpu", agreement(h, c, 2, N));
        report(what + " fp8-wgmma", "cpu", agreement(wg, c, 2, N));
    }
}

TEST(CudaGemmSm90, Fp8AgreesWithPortableAndCpu) {
    DS4R_REQUIRE_HOPPER();
    check_fp8(257, 1536, 4096, 11, false, !sanitizer_run());  // wq_a-like
    check_fp8(129, 4096, 1024, 12, false, false);
    for (int64_t M : {1, 7, 129})
        check_fp8(M, 200, 96, 13 + static_cast<uint64_t>(M), false, true);  // N off tile
    check_fp8(7, 128, 32, 14, false, true);                                 // K = 32
    if (!sanitizer_run()) check_fp8(8193, 256, 256, 15, false, false);
    check_fp8(130, 300, 256, 16, true, true);  // scales outside the fused window
}

TEST(CudaGemmSm90, Fp4AgreesWithPortableAndCpu) {
    DS4R_REQUIRE_HOPPER();
    check_fp4(257, 2048, 4096, 21, false, !sanitizer_run());  // expert w1-like
    for (int64_t M : {1, 7, 129}) check_fp4(M, 200, 96, 22 + static_cast<uint64_t>(M), false, true);
    check_fp4(7, 128, 32, 23, false, true);
    if (!sanitizer_run()) check_fp4(8193, 256, 256, 24, false, false);
    check_fp4(130, 300, 256, 25, true, true);
    // column scales the widened kernels take into B (and stages where they cannot), vs the CPU too
    check_fp4(257, 2048, 4096, 26, 2, !sanitizer_run());
    for (int64_t M : {1, 129}) check_fp4(M, 200, 96, 27 + static_cast<uint64_t>(M), 2, true);
    check_fp4(7, 128, 32, 28, 2, true);
}

// ---------------------------------------------------------------- grouped experts
// The routing plan's tiles split by height as launch_moe_tile_split does it (kernels/moe.cuh): each
// expert's tiles of 128 pairs in `full` but its last one when that holds 1 .. 64 pairs, which goes to
// `tail`.
struct TileSplit {
    std::vector<int32_t> full_expert, full_start, full_begin, tail_expert, tail_start, tail_begin;
};
TileSplit split_plan(const std::vector<int>& counts) {
    TileSplit s;
    int32_t pos = 0;
    for (int e = 0; e < static_cast<int>(counts.size()); ++e) {
        const int n = counts[static_cast<size_t>(e)];
        const bool tail = n % 128 >= 1 && n % 128 <= 64;
        const int nf = (n + 127) / 128 - (tail ? 1 : 0);
        s.full_begin.push_back(static_cast<int32_t>(s.full_expert.size()));
        s.tail_begin.push_back(static_cast<int32_t>(s.tail_expert.size()));
        for (int i = 0; i < nf; ++i) {
            s.full_expert.push_back(e);
            s.full_start.push_back(pos + 128 * i);
        }
        if (tail) {
            s.tail_expert.push_back(e);
            s.tail_start.push_back(pos + 128 * nf);
        }
        pos += n;
    }
    s.full_begin.push_back(static_cast<int32_t>(s.full_expert.size()));
    s.tail_begin.push_back(static_cast<int32_t>(s.tail_expert.size()));
    return s;
}

// The grouped kernel on both families with the same routing plan: experts with `counts[e]` pairs, the
// activation rows gathered through a random permutation (as w1 / w3 run), one projection. scales: 0
// typical, 1 extreme (weight scales anywhere in e8m0, activations 300x: the scale windows' slow forms),
// 2 foldable_fp4_scales.
void check_grouped(const std::vector<int>& counts, int64_t N, int64_t K, uint64_t seed,
                   const std::string& what, int scales = 0) {
    const bool foldable = scales == 2, extreme = scales == 1;
    std::mt19937_64 rng(seed);
    const int E = static_cast<int>(counts.size());
    int64_t P = 0;
    for (int c : counts) P += c;
    ASSERT_GT(P, 0);
    const auto xh = rand_x(P, K, seed + 1, extreme ? 300.0f : 1.0f);
    std::vector<int32_t> rows(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) rows[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<int32_t> tile_expert, tile_start, tile_begin, expert_end;
    int64_t pos = 0;
    for (int e = 0; e < E; ++e) {
        tile_begin.push_back(static_cast<int32_t>(tile_expert.size()));
        for (int r = 0; r < counts[static_cast<size_t>(e)]; r += 128) {
            tile_expert.push_back(e);
            tile_start.push_back(static_cast<int32_t>(pos + r));
        }
        pos += counts[static_cast<size_t>(e)];
        expert_end.push_back(static_cast<int32_t>(pos));
    }
    tile_begin.push_back(static_cast<int32_t>(tile_expert.size()));
    std::vector<std::vector<uint8_t>> wh(static_cast<size_t>(E)), sh(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        wh[static_cast<size_t>(e)].resize(static_cast<size_t>(N * K / 2));
        sh[static_cast<size_t>(e)].resize(static_cast<size_t>(N * K / 32));
        for (auto& b : wh[static_cast<size_t>(e)]) b = static_cast<uint8_t>(rng());
        for (auto& b : sh[static_cast<size_t>(e)]) b = scale_byte(rng, extreme);
        if (foldable) sh[static_cast<size_t>(e)] = foldable_fp4_scales(N, K / 32, rng);
    }
    const int max_rows = *std::max_element(counts.begin(), counts.end());
    std::vector<uint8_t> wg;
    // the Hopper kernels with each tile shape forced (Sm90GroupedRows): [partials][64 rows, 128 rows,
    // mixed: each expert's short last tile on 64 rows]
    std::vector<uint8_t> tiles[2][3];
    std::vector<uint8_t> tiles_e5m2[3];  // widened partials on the weights as e5m2 bytes
    // and as fp16 with the scales folded in (B by TMA): the three shapes (the 128-row tiles in 128-wide K
    // stages) and the 128-row tiles in 64-wide stages (Rows128Narrow)
    std::vector<uint8_t> tiles_f16[4];
    const kern::Sm90GroupedRows f16_shapes[4] = {kern::Sm90GroupedRows::Rows64,
                                                 kern::Sm90GroupedRows::Rows128, kern::Sm90GroupedRows::Mixed,
                                                 kern::Sm90GroupedRows::Rows128Narrow};
    const TileSplit split = split_plan(counts);
    auto i32 = [](CudaBackend& be, const std::vector<int32_t>& v) {
        return upload(be, DType::I32, {static_cast<int64_t>(v.size())}, v.data());
    };
    auto run = [&](CudaBackend& be) {
        Tensor x = upload(be, DType::BF16, {P, K}, xh.data());
        const CudaBackend::GemmActs a = be.quantize_gemm_acts(x, P, K);
        // the Hopper variants' own code orders (the backend's family reads sm90_act_order(default))
        CudaBackend::GemmActs av[2];
        if (&be == &hop())
            for (int v = 0; v < 2; ++v)
                av[v] = be.quantize_gemm_acts(
                    x, P, K,
                    kern::sm90_act_order(v ? kern::Sm90Partials::Fp16Widened : kern::Sm90Partials::Fp8Wgmma));
        std::vector<Tensor> wt, st;
        std::vector<const uint8_t*> wp, sp;
        for (int e = 0; e < E; ++e) {
            wt.push_back(upload(be, DType::I8, {N, K / 2}, wh[static_cast<size_t>(e)].data()));
            st.push_back(upload(be, DType::F8_E8M0, {N, K / 32}, sh[static_cast<size_t>(e)].data()));
            wp.push_back(wt.back().ptr<uint8_t>());
            sp.push_back(st.back().ptr<uint8_t>());
        }
        const Tensor d_rows = i32(be, rows), d_te = i32(be, tile_expert), d_ts = i32(be, tile_start),
                     d_tb = i32(be, tile_begin), d_ee = i32(be, expert_end);
        Tensor y = poisoned(be, DType::BF16, {P, N});
        kern::GroupedFp4Gemm g{};
        g.q = a.q.ptr<uint8_t>();
        g.sa = a.s.ptr<uint8_t>();
        g.a_rows = d_rows.ptr<int32_t>();
        g.tile_expert = d_te.ptr<int32_t>();
        g.tile_start = d_ts.ptr<int32_t>();
        g.tile_begin = d_tb.ptr<int32_t>();
        g.expert_end = d_ee.ptr<int32_t>();
        g.max_tiles = static_cast<int64_t>(tile_expert.size()) + 3;  // an upper bound, as the MoE passes it
        g.max_rows_per_expert = max_rows;
        g.n_experts = E;
        g.n_proj = 1;
        g.N = N;
        g.K = K;
        g.w[0] = wp.data();
        g.s[0] = sp.data();
        g.y[0] = y.ptr<uint16_t>();
        DS4R_CUDA_CHECK(be.gemm().grouped_fp4(g, be.stream()));
        std::vector<uint8_t> out = host(be, y);
        if (&be == &hop()) {
            be.fill(y, 0xA5);
            g.q = av[0].q.ptr<uint8_t>();
            g.sa = av[0].s.ptr<uint8_t>();
            DS4R_CUDA_CHECK(
                kern::launch_grouped_gemm_fp4_sm90_partials(kern::Sm90Partials::Fp8Wgmma, g, be.stream()));
            wg = host(be, y);
            // the split plan (GroupedFp4Gemm::full / tail), with upper bounds as the MoE passes them
            const Tensor f_e = i32(be, split.full_expert), f_s = i32(be, split.full_start),
                         f_b = i32(be, split.full_begin), t_e = i32(be, split.tail_expert),
                         t_s = i32(be, split.tail_start), t_b = i32(be, split.tail_begin);
            kern::GroupedFp4Gemm gm = g;
            gm.full = {f_e.ptr<int32_t>(), f_s.ptr<int32_t>(), f_b.ptr<int32_t>(), g.max_tiles};
            gm.tail = {t_e.ptr<int32_t>(), t_s.ptr<int32_t>(), t_b.ptr<int32_t>(), E};
            const kern::Sm90GroupedRows shapes[3] = {
                kern::Sm90GroupedRows::Rows64, kern::Sm90GroupedRows::Rows128, kern::Sm90GroupedRows::Mixed};
            for (int v = 0; v < 2; ++v)
                for (int t = 0; t < 3; ++t) {
                    be.fill(y, 0x5A);
                    gm.q = av[v].q.ptr<uint8_t>();
                    gm.sa = av[v].s.ptr<uint8_t>();
                    DS4R_CUDA_CHECK(kern::launch_grouped_gemm_fp4_sm90_tiles(
                        v ? kern::Sm90Partials::Fp16Widened : kern::Sm90Partials::Fp8Wgmma, shapes[t], gm,
                        be.stream()));
                    tiles[v][t] = host(be, y);
                }
            // the prepared experts: the same weights as e5m2 bytes (launch_fp4_to_e5m2), widened
            // partials, each tile shape; other partials and the portable kernels refuse them
            std::vector<Tensor> w8;
            std::vector<const uint8_t*> w8p;
            for (int e = 0; e < E; ++e) {
                w8.push_back(be.alloc(DType::I8, {N, K}));
                DS4R_CUDA_CHECK(kern::launch_fp4_to_e5m2(wp[static_cast<size_t>(e)], N * K / 2,
                                                         w8.back().ptr<uint8_t>(), be.stream()));
                w8p.push_back(w8.back().ptr<uint8_t>());
            }
            kern::GroupedFp4Gemm g8 = gm;
            g8.w[0] = w8p.data();
            g8.w_e5m2 = true;
            g8.q = av[1].q.ptr<uint8_t>();
            g8.sa = av[1].s.ptr<uint8_t>();
            for (int t = 0; t < 3; ++t) {
                be.fill(y, 0x77);
                DS4R_CUDA_CHECK(kern::launch_grouped_gemm_fp4_sm90_tiles(kern::Sm90Partials::Fp16Widened,
                                                                         shapes[t], g8, be.stream()));
                tiles_e5m2[t] = host(be, y);
            }
            EXPECT_EQ(
                kern::launch_grouped_gemm_fp4_sm90_partials(kern::Sm90Partials::Fp8Wgmma, g8, be.stream()),
                cudaErrorInvalidValue);
            EXPECT_EQ(kern::launch_grouped_gemm_fp4(g8, be.stream()), cudaErrorInvalidValue);
            // the fp16 prepared experts (launch_fp4_to_f16_folded), every expert at one stride in one
            // buffer as prepare_experts lays them out: each tile shape; refused by the other partials, the
            // portable kernels, with e5m2 at once, and where the experts do not lie at one stride
            Tensor w16 = be.alloc(DType::I8, {static_cast<int64_t>(E) * N * K * 2});
            std::vector<const uint8_t*> w16p;
            for (int e = 0; e < E; ++e) {
                uint8_t* dst = w16.ptr<uint8_t>() + static_cast<int64_t>(e) * N * K * 2;
                DS4R_CUDA_CHECK(kern::launch_fp4_to_f16_folded(wp[static_cast<size_t>(e)],
                                                               sp[static_cast<size_t>(e)], N * K / 2,
                                                               reinterpret_cast<uint16_t*>(dst), be.stream()));
                w16p.push_back(dst);
            }
            kern::GroupedFp4Gemm g16 = g8;
            g16.w[0] = w16p.data();
            g16.w_e5m2 = false;
            g16.w_f16 = true;
            for (int t = 0; t < 4; ++t) {
                be.fill(y, 0x3B);
                DS4R_CUDA_CHECK(kern::launch_grouped_gemm_fp4_sm90_tiles(kern::Sm90Partials::Fp16Widened,
                                                                         f16_shapes[t], g16, be.stream()));
                tiles_f16[t] = host(be, y);
            }
            // the same experts with the activation rows first copied into pair order (gather_pair_rows, as
            // the MoE passes w1 / w3 to them; w2's rows are in that order already): A by TMA where the pair
            // count is known, else the loaders copy the contiguous rows; the bits of the gathered rows
            for (int known = 0; known < 2; ++known) {
                kern::GroupedFp4Gemm gp = g16;
                gp.pairs = P;
                const std::vector<Tensor> pair_rows = gather_pair_rows(be, gp, be.stream());
                EXPECT_EQ(pair_rows.size(), 2u) << what;
                EXPECT_EQ(gp.a_rows, nullptr) << what;
                if (!known) gp.pairs = 0;
                for (int t = 0; t < 4; ++t) {
                    be.fill(y, 0x4D);
                    DS4R_CUDA_CHECK(kern::launch_grouped_gemm_fp4_sm90_tiles(kern::Sm90Partials::Fp16Widened,
                                                                             f16_shapes[t], gp, be.stream()));
                    EXPECT_EQ(host(be, y), tiles_f16[t])
                        << what << ": fp16 experts, rows in pair order, "
                        << (known ? "A by TMA" : "the loaders") << ", tile shape " << t;
                }
            }
            EXPECT_EQ(
                kern::launch_grouped_gemm_fp4_sm90_partials(kern::Sm90Partials::Fp8Wgmma, g16, be.stream()),
                cudaErrorInvalidValue);
            EXPECT_EQ(kern::launch_grouped_gemm_fp4(g16, be.stream()), cudaErrorInvalidValue);
            kern::GroupedFp4Gemm both = g16;
            both.w_e5m2 = true;
            EXPECT_EQ(kern::launch_grouped_gemm_fp4_sm90_partials(kern::Sm90Partials::Fp16Widened, both,
                                                                  be.stream()),
                      cudaErrorInvalidValue);
            if (E > 1) {
                std::vector<const uint8_t*> reversed(w16p.rbegin(), w16p.rend());
                kern::GroupedFp4Gemm scattered = g16;
                scattered.w[0] = reversed.data();
                EXPECT_EQ(kern::launch_grouped_gemm_fp4_sm90_partials(kern::Sm90Partials::Fp16Widened,
                                                                      scattered, be.stream()),
                          cudaErrorNotSupported);
            }
            // the MoE's calls (the family's activations, the pair count known: Auto picks by rows per
            // expert), with the split plan (Hopper) and without
            auto auto_call = [&](kern::GroupedFp4Gemm& x, uint8_t poison, const char* how) {
                x.q = a.q.ptr<uint8_t>();
                x.sa = a.s.ptr<uint8_t>();
                x.pairs = P;
                be.fill(y, poison);
                DS4R_CUDA_CHECK(be.gemm().grouped_fp4(x, be.stream()));
                EXPECT_EQ(host(be, y), out) << what << ": --kernels auto " << how;
            };
            auto_call(gm, 0x66, "with the split plan");
            auto_call(g, 0x3C, "with the pair count given");
        }
        return out;
    };
    const auto h = run(hop()), p = run(port());
    expect_equal(what, "portable", agreement(h, p, 2, N));
    // the fp8-wgmma bounds were measured on typical scales; with the foldable scales (15 exponents wide,
    // for the widened kernels' folding) the opt-in, inexact variant is only reported (H200: one expert
    // holding 700 rows, max |d| / rms 4.6e-2 against the 4e-2 bound; 99.28% bitwise)
    if (foldable || extreme)
        report(what + " fp8-wgmma", "portable", agreement(wg, p, 2, N));
    else
        expect_fp8_wgmma(what + " fp8-wgmma", agreement(wg, p, 2, N));
    // 64 x 256 tiles (two blocks per plan tile, the warpgroups splitting the columns) give the bits of
    // the 128 x 128 tiles, in both partial variants; the widened ones are the portable kernels' bits
    for (int v = 0; v < 2; ++v) {
        const std::string var = v ? " widened" : " fp8-wgmma";
        EXPECT_EQ(tiles[v][0], tiles[v][1]) << what << var << ": 64-row tiles differ from 128-row tiles";
        EXPECT_EQ(tiles[v][2], tiles[v][1]) << what << var << ": mixed tiles differ from 128-row tiles";
    }
    expect_equal(what + " 64-row tiles", "portable", agreement(tiles[1][0], p, 2, N));
    for (int t = 0; t < 3; ++t) {
        EXPECT_EQ(tiles_e5m2[t], tiles[1][t])
            << what << ": e5m2 weights differ from fp4 weights, tile shape " << t;
        EXPECT_EQ(tiles_f16[t], tiles[1][t])
            << what << ": fp16 prepared experts differ from fp4 weights, tile shape " << t;
    }
    EXPECT_EQ(tiles_f16[3], tiles[1][1]) << what << ": fp16 prepared experts in 64-wide K stages";
}

TEST(CudaGemmSm90, Fp4ToE5m2KeepsEveryValue) {
    // launch_fp4_to_e5m2 (the prepared experts' weights): every packed byte -> two e5m2 bytes whose
    // values are the two e2m1 values (signed zeros included); unaligned pointers and sizes refused
    DS4R_REQUIRE_CUDA();
    CudaBackend& be = port();
    std::vector<uint8_t> in(512);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 37 + i / 256);
    const Tensor d_in = upload(be, DType::I8, {512}, in.data());
    Tensor d_out = be.alloc(DType::I8, {1024 + 16});
    DS4R_CUDA_CHECK(kern::launch_fp4_to_e5m2(d_in.ptr<uint8_t>(), 512, d_out.ptr<uint8_t>(), be.stream()));
    const std::vector<uint8_t> out = host(be, d_out);
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    auto e5m2 = [](uint8_t b) {  // sign, 5 exponent bits (bias 15), 2 mantissa bits
        const int e = (b >> 2) & 31, m = b & 3;
        const float v = e == 0 ? std::ldexp(m / 4.0f, -14) : std::ldexp(1.0f + m / 4.0f, e - 15);
        return (b & 0x80) ? -v : v;
    };
    std::vector<bool> seen(256, false);
    for (size_t i = 0; i < in.size(); ++i) {
        seen[in[i]] = true;
        for (int h = 0; h < 2; ++h) {
            const int nib = (in[i] >> (4 * h)) & 15;
            const float want = (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
            const uint8_t got = out[2 * i + static_cast<size_t>(h)];
            EXPECT_EQ(e5m2(got), want) << "byte " << i << " nibble " << h;
            EXPECT_EQ(got >> 7, nib >> 3) << "sign of byte " << i << " nibble " << h;
        }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
    EXPECT_EQ(kern::launch_fp4_to_e5m2(d_in.ptr<uint8_t>() + 1, 16, d_out.ptr<uint8_t>(), be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_fp4_to_e5m2(d_in.ptr<uint8_t>(), 24, d_out.ptr<uint8_t>(), be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_fp4_to_e5m2(d_in.ptr<uint8_t>(), 16, d_out.ptr<uint8_t>() + 8, be.stream()),
              cudaErrorInvalidValue);
}

TEST(CudaGemmSm90, Fp4ToF16FoldedKeepsEveryValue) {
    // launch_fp4_to_f16_folded (the fp16 prepared experts): every packed byte under every scale byte ->
    // two fp16 values e2m1 * 2^(byte - 127) where the byte folds (114 .. 128), else the e2m1 values
    // (signed zeros included); unaligned pointers and sizes refused
    DS4R_REQUIRE_CUDA();
    CudaBackend& be = port();
    // 256 scale bytes x one K block each: block b holds the 16 packed bytes 7 i + i / 256 (i = 16 b + j),
    // every byte value under 16 different scales
    const int64_t blocks = 256, bytes = 16 * blocks;
    std::vector<uint8_t> in(static_cast<size_t>(bytes)), sc(static_cast<size_t>(blocks));
    for (int64_t i = 0; i < bytes; ++i) in[static_cast<size_t>(i)] = static_cast<uint8_t>(i * 7 + i / 256);
    for (int64_t b = 0; b < blocks; ++b) sc[static_cast<size_t>(b)] = static_cast<uint8_t>(b);
    const Tensor d_in = upload(be, DType::I8, {bytes}, in.data());
    const Tensor d_sc = upload(be, DType::F8_E8M0, {blocks}, sc.data());
    Tensor d_out = be.alloc(DType::I8, {4 * bytes + 16});
    DS4R_CUDA_CHECK(kern::launch_fp4_to_f16_folded(d_in.ptr<uint8_t>(), d_sc.ptr<uint8_t>(), bytes,
                                                   d_out.ptr<uint16_t>(), be.stream()));
    const std::vector<uint8_t> out = host(be, d_out);
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    std::vector<bool> seen(256, false);
    int folded = 0;
    for (int64_t i = 0; i < bytes; ++i) {
        const uint8_t byte = in[static_cast<size_t>(i)];
        const int s = sc[static_cast<size_t>(i / 16)];
        const bool fold = s >= 114 && s <= 128;
        folded += fold && i % 16 == 0;
        seen[byte] = true;
        for (int h = 0; h < 2; ++h) {
            const int nib = (byte >> (4 * h)) & 15;
            const float v = std::ldexp(mag[nib & 7], fold ? s - 127 : 0);
            const float want = (nib & 8) ? -v : v;
            uint16_t bits;
            std::memcpy(&bits, out.data() + 4 * i + 2 * h, 2);
            EXPECT_EQ(f16_to_f32(bits), want) << "byte " << i << " nibble " << h << " scale " << s;
            EXPECT_EQ(bits >> 15, nib >> 3) << "sign of byte " << i << " nibble " << h;
        }
    }
    EXPECT_EQ(folded, 15);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
    EXPECT_EQ(kern::launch_fp4_to_f16_folded(d_in.ptr<uint8_t>() + 1, d_sc.ptr<uint8_t>(), 16,
                                             d_out.ptr<uint16_t>(), be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_fp4_to_f16_folded(d_in.ptr<uint8_t>(), d_sc.ptr<uint8_t>(), 24, d_out.ptr<uint16_t>(),
                                             be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_fp4_to_f16_folded(d_in.ptr<uint8_t>(), d_sc.ptr<uint8_t>(), 16,
                                             d_out.ptr<uint16_t>() + 4, be.stream()),
              cudaErrorInvalidValue);
}

TEST(CudaGemmSm90, E4m3ToF16KeepsEveryValue) {
    // launch_e4m3_to_f16 (the fp16 weights): every code -> the fp16 of its value (signed zeros and
    // subnormals included), the NaN codes -> +-480 as the GEMMs' converters widen them; unaligned
    // pointers and sizes refused
    DS4R_REQUIRE_CUDA();
    CudaBackend& be = port();
    std::vector<uint8_t> in(512);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 37 + i / 256);
    const Tensor d_in = upload(be, DType::F8_E4M3, {512}, in.data());
    Tensor d_out = be.alloc(DType::BF16, {512 + 8});
    DS4R_CUDA_CHECK(kern::launch_e4m3_to_f16(d_in.ptr<uint8_t>(), 512, d_out.ptr<uint16_t>(), be.stream()));
    const std::vector<uint8_t> out = host(be, d_out);
    auto e4m3 = [](uint8_t b) {  // sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7f / 0xff NaN
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
        return (b & 0x80) ? -v : v;
    };
    std::vector<bool> seen(256, false);
    for (size_t i = 0; i < in.size(); ++i) {
        seen[in[i]] = true;
        uint16_t h = 0;
        std::memcpy(&h, out.data() + 2 * i, 2);
        const bool nan = (in[i] & 0x7f) == 0x7f;
        const float want = nan ? ((in[i] & 0x80) ? -480.0f : 480.0f) : e4m3(in[i]);
        EXPECT_EQ(f16_to_f32(h), want) << "code " << static_cast<int>(in[i]);
        EXPECT_EQ(h >> 15, in[i] >> 7) << "sign of code " << static_cast<int>(in[i]);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
    EXPECT_EQ(kern::launch_e4m3_to_f16(d_in.ptr<uint8_t>() + 1, 16, d_out.ptr<uint16_t>(), be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_e4m3_to_f16(d_in.ptr<uint8_t>(), 24, d_out.ptr<uint16_t>(), be.stream()),
              cudaErrorInvalidValue);
    EXPECT_EQ(kern::launch_e4m3_to_f16(d_in.ptr<uint8_t>(), 16, d_out.ptr<uint16_t>() + 4, be.stream()),
              cudaErrorInvalidValue);
}

// The fp8 linears on their weights widened to fp16 beforehand (Op::Fp8F16: B by TMA, in 64- or 128-wide K
// stages, or the loaders straight into the MMA tile, no converters) against the fp8 weights (the converters
// widen them): the same bits, with M / N / K tails, scales outside the fused window and NaN weight codes; and
// the backend's linear_fp8 with the fp16 weights on for every M against off.
TEST(CudaGemmSm90, Fp16WeightsEqualFp8Weights) {
    DS4R_REQUIRE_HOPPER();
    struct Case {
        int64_t M, N, K;
        bool extreme;
    };
    // (K = 96, 160, 224: the 128-wide stages' last stage partial, with and without its second B half)
    const Case cases[] = {{1, 200, 96, false},     {7, 1024, 32, false},  {129, 300, 5120, false},
                          {257, 384, 1280, false}, {130, 300, 256, true}, {8193, 256, 512, false},
                          {65, 136, 224, false},   {3, 64, 160, true}};
    CudaBackend& be = hop();
    std::mt19937_64 rng(81);
    for (const Case& c : cases) {
        if (sanitizer_run() && c.M > 300) continue;
        const std::string what = "fp8 on fp16 weights M=" + std::to_string(c.M) +
                                 " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                 (c.extreme ? " extreme scales" : "");
        const auto xh = rand_x(c.M, c.K, 82, c.extreme ? 300.0f : 1.0f);
        std::vector<uint8_t> wh = rand_fp8_codes(static_cast<size_t>(c.N * c.K), rng);
        for (size_t i = 0; i < wh.size(); i += 997) wh[i] = (i & 1) ? 0xff : 0x7f;  // NaN codes: 480
        std::vector<uint8_t> sh(static_cast<size_t>(((c.N + 31) / 32) * (c.K / 32)));
        for (auto& b : sh) b = scale_byte(rng, c.extreme);
        Tensor x = upload(be, DType::BF16, {c.M, c.K}, xh.data());
        Fp8Linear w{upload(be, DType::F8_E4M3, {c.N, c.K}, wh.data()),
                    upload(be, DType::F8_E8M0, {(c.N + 31) / 32, c.K / 32}, sh.data())};
        Tensor w16 = be.alloc(DType::BF16, {c.N, c.K});
        DS4R_CUDA_CHECK(
            kern::launch_e4m3_to_f16(w.w.ptr<uint8_t>(), c.N * c.K, w16.ptr<uint16_t>(), be.stream()));
        const CudaBackend::GemmActs a =
            be.quantize_gemm_acts(x, c.M, c.K, kern::sm90_act_order(kern::Sm90Partials::Fp16Widened));
        Tensor y = poisoned(be, DType::BF16, {c.M, c.N});
        DS4R_CUDA_CHECK(kern::launch_gemm_fp8_sm90_partials(
            kern::Sm90Partials::Fp16Widened, a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.w.ptr<uint8_t>(),
            w.s.ptr<uint8_t>(), y.ptr<uint16_t>(), c.N, c.M, c.N, c.K, be.stream(), kern::Sm90Loads::Auto));
        const auto ref = host(be, y);
        for (const auto loads : {kern::Sm90Loads::Tma, kern::Sm90Loads::TmaWideK, kern::Sm90Loads::CpAsync,
                                 kern::Sm90Loads::Auto}) {
            Tensor y16 = poisoned(be, DType::BF16, {c.M, c.N});
            DS4R_CUDA_CHECK(kern::launch_gemm_fp8_sm90_f16w(
                a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w16.ptr<uint16_t>(), w.s.ptr<uint8_t>(),
                y16.ptr<uint16_t>(), c.N, c.M, c.N, c.K, be.stream(), loads));
            expect_equal(what + " loads " + std::to_string(static_cast<int>(loads)), "fp8 w",
                         agreement(host(be, y16), ref, 2, c.N));
        }
        // the backend: fp16 weights for every M (rows threshold 0) vs off
        auto linear = [&](bool on) {
            be.set_fp16_weights(on);
            Tensor yl = poisoned(be, DType::BF16, {c.M, c.N});
            be.linear_fp8(x, w, yl);
            return host(be, yl);
        };
        const int64_t rows = be.fp16_weight_rows();
        be.set_fp16_weight_rows(0);
        const auto on = linear(true), off = linear(false);
        be.set_fp16_weights(true);
        be.set_fp16_weight_rows(rows);
        expect_equal(what + " linear_fp8", "off", agreement(on, off, 2, c.N));
        EXPECT_EQ(off, ref) << what << ": linear_fp8 without fp16 weights differs from the kernel";
    }
    EXPECT_EQ(kern::launch_gemm_fp8_sm90_f16w(nullptr, nullptr, nullptr, nullptr, nullptr, 64, 8, 64, 48,
                                              be.stream()),
              cudaErrorInvalidValue);  // K % 32 != 0
}

TEST(CudaGemmSm90, TileSplitOfTheRoutingPlan) {
    // launch_moe_tile_split against split_plan: counts around every boundary (0, 1, 64, 65, 127, 128,
    // 129, 192, 193, 256, 257) and random ones
    DS4R_REQUIRE_CUDA();
    std::vector<int> counts = {0, 1, 64, 65, 127, 128, 129, 192, 193, 256, 257, 0, 700};
    std::mt19937_64 rng(41);
    for (int i = 0; i < 371; ++i) counts.push_back(static_cast<int>(rng() % 300));
    const int E = static_cast<int>(counts.size());
    std::vector<int32_t> begin;
    int32_t pos = 0, tiles = 0;
    for (int c : counts) {
        begin.push_back(pos);
        pos += c;
        tiles += (c + 127) / 128;
    }
    CudaBackend& be = port();  // the plan kernels are the same on every device
    auto i32 = [&](const std::vector<int32_t>& v) {
        return upload(be, DType::I32, {static_cast<int64_t>(v.size())}, v.data());
    };
    const Tensor d_counts = i32(std::vector<int32_t>(counts.begin(), counts.end())), d_begin = i32(begin);
    const int64_t max_tiles = tiles + 5;
    Tensor fb = poisoned(be, DType::I32, {E + 1}), fe = poisoned(be, DType::I32, {max_tiles}),
           fs = poisoned(be, DType::I32, {max_tiles}), tb = poisoned(be, DType::I32, {E + 1}),
           te = poisoned(be, DType::I32, {E}), ts = poisoned(be, DType::I32, {E});
    DS4R_CUDA_CHECK(kern::launch_moe_tile_split(
        d_counts.ptr<int32_t>(), d_begin.ptr<int32_t>(), E, fb.ptr<int32_t>(), fe.ptr<int32_t>(),
        fs.ptr<int32_t>(), max_tiles, tb.ptr<int32_t>(), te.ptr<int32_t>(), ts.ptr<int32_t>(), be.stream()));
    const TileSplit want = split_plan(counts);
    auto got = [&](const Tensor& t, size_t n) {
        const std::vector<uint8_t> b = host(be, t);
        std::vector<int32_t> v(n);
        std::memcpy(v.data(), b.data(), n * 4);
        return v;
    };
    EXPECT_EQ(got(fb, E + 1), want.full_begin);
    EXPECT_EQ(got(tb, E + 1), want.tail_begin);
    EXPECT_EQ(got(fe, want.full_expert.size()), want.full_expert);
    EXPECT_EQ(got(fs, want.full_start.size()), want.full_start);
    EXPECT_EQ(got(te, want.tail_expert.size()), want.tail_expert);
    EXPECT_EQ(got(ts, want.tail_start.size()), want.tail_start);
    EXPECT_EQ(want.full_expert.size() + want.tail_expert.size(), static_cast<size_t>(tiles));
}

// Small problems (also the compute-sanitizer runs' grouped case): empty experts, partial tiles, N off the
// tile, typical and extreme scales.
TEST(CudaGemmSm90, GroupedExpertsSmallAgreeWithPortable) {
    DS4R_REQUIRE_HOPPER();
    check_grouped({0, 5, 0, 130, 64, 1}, 320, 128, 41, "grouped small: empty experts, partial tiles");
    check_grouped({2, 0, 70, 129}, 160, 128, 42, "grouped small: extreme scales", 1);
    // K off the fp16 experts' 128-wide stages: the last stage partial, with and without its second B half
    // (foldable scales: the fold test of 4-block stages; extreme ones: their window test)
    check_grouped({3, 0, 66}, 136, 224, 43, "grouped small: K = 224, foldable scales", 2);
    check_grouped({1, 130}, 64, 160, 44, "grouped small: K = 160, extreme scales", 1);
}

TEST(CudaGemmSm90, GroupedExpertsAgreeWithPortable) {
    DS4R_REQUIRE_HOPPER();
    check_grouped({0, 5, 0, 300, 128, 1, 0}, 320, 256, 31, "grouped: empty experts, partial tiles");
    check_grouped({0, 0, 700, 0}, 256, 512, 32, "grouped: one expert holds every row");
    std::mt19937_64 rng(33);
    std::vector<int> counts(384);
    for (auto& c : counts) c = static_cast<int>(rng() % 41);
    check_grouped(counts, 256, 256, 34, "grouped: 384 experts");
    // workload b's chunks: ~38 rows per expert (Auto takes the 64-row tiles), N off the 256-column tile
    for (auto& c : counts) c = 20 + static_cast<int>(rng() % 37);
    check_grouped(counts, 320, 256, 35, "grouped: 384 experts of 20-56 rows");
    // the MoE's chunks on the 22 GB budget: ~128 rows per expert (Auto: the mixed tiles), remainders on
    // both sides of 64
    for (auto& c : counts) c = 96 + static_cast<int>(rng() % 96);
    check_grouped(counts, 256, 256, 38, "grouped: 384 experts of 96-191 rows");
    // column scales taken into B (gemm_sm90_producers.cuh stage_scales), mixed with stages that cannot
    check_grouped(counts, 320, 512, 36, "grouped: 384 experts of 20-56 rows, foldable scales", 2);
    check_grouped({0, 0, 700, 0}, 256, 512, 37, "grouped: one expert holds every row, foldable scales", 2);
    // scales outside the fused windows and outside the foldable range (the prepared fp16 experts' stages
    // that take their partials back column by column)
    check_grouped({3, 0, 200, 77, 129}, 320, 512, 39, "grouped: extreme scales", 1);
}

// ---------------------------------------------------------------- bf16 GEMMs
TEST(CudaGemmSm90, Bf16AgreesWithPortable) {
    DS4R_REQUIRE_HOPPER();
    struct Case {
        int64_t M, N, K;
        bool f32;
    };
    const Case cases[] = {{1, 200, 96, false},
                          {7, 1024, 520, true},
                          {129, 1024, 1024, false},
                          {257, 4096, 1024, true},
                          {8193, 256, 256, false}};
    for (const Case& c : cases) {
        if (sanitizer_run() && c.M > 300) continue;
        const std::string what = std::string(c.f32 ? "linear_f32(bf16)" : "linear_bf16") +
                                 " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                                 " K=" + std::to_string(c.K);
        const auto xh = rand_x(c.M, c.K, 41), wh = rand_x(c.N, c.K, 42, 0.05f);
        auto run = [&](Backend& be) {
            Tensor x = upload(be, DType::BF16, {c.M, c.K}, xh.data()),
                   w = upload(be, DType::BF16, {c.N, c.K}, wh.data());
            Tensor y = poisoned(be, c.f32 ? DType::F32 : DType::BF16, {c.M, c.N});
            if (c.f32)
                be.linear_f32(x, w, y);
            else
                be.linear_bf16(x, w, y);
            return host(be, y);
        };
        expect_equal(what, "portable", agreement(run(hop()), run(port()), c.f32 ? 4 : 2, c.N));
    }
    // wo_a: 8 groups of [R = 64, Kg = 512] (grouped along z)
    {
        const int64_t M = 130, G = 8, R = 64, Kg = 512;
        std::mt19937_64 rng(43);
        const auto oh = rand_x(M, G * Kg, 44);
        const auto wh = rand_fp8_codes(static_cast<size_t>(G * R * Kg), rng);
        std::vector<uint8_t> sh(static_cast<size_t>((G * R / 32) * (Kg / 32)));
        for (auto& b : sh) b = scale_byte(rng, false);
        auto run = [&](Backend& be) {
            Fp8Linear w{upload(be, DType::F8_E4M3, {G * R, Kg}, wh.data()),
                        upload(be, DType::F8_E8M0, {G * R / 32, Kg / 32}, sh.data())};
            Tensor o = upload(be, DType::BF16, {M, G * Kg}, oh.data());
            Tensor y = poisoned(be, DType::BF16, {M, G * R});
            be.linear_wo_a(o, w, G, y);
            return host(be, y);
        };
        expect_equal("linear_wo_a M=130 8 groups", "portable", agreement(run(hop()), run(port()), 2, G * R));
    }
    // the head's logits (f32), against the portable head kernel
    {
        const int64_t M = 77, V = 1000, D = 512;
        const auto xh = rand_x(M, D, 45), wh = rand_x(V, D, 46, 0.05f);
        auto run = [&](CudaBackend& be) {
            Tensor x = upload(be, DType::BF16, {M, D}, xh.data()),
                   w = upload(be, DType::BF16, {V, D}, wh.data());
            Tensor y = poisoned(be, DType::F32, {M, V});
            be.head_logits(x.ptr<uint16_t>(), w.ptr<uint16_t>(), y.ptr<float>(), M, V, D);
            return host(be, y);
        };
        expect_equal("head logits M=77 V=1000 D=512", "portable", agreement(run(hop()), run(port()), 4, V));
    }
}

// The bf16 kernel's two ways of filling its stages (TMA boxes from one thread, or the cp.async loaders)
// feed the same wgmma sequence: outputs equal bit for bit, including zero-filled row / column / K tails
// and problems grouped along z (wo_a's layout: the groups side by side in x's rows).
TEST(CudaGemmSm90, Bf16TmaLoadsEqualCpAsyncLoads) {
    DS4R_REQUIRE_HOPPER();
    struct Case {
        int64_t M, N, K, groups;
        bool f32;
    };
    const Case cases[] = {{1, 200, 96, 1, false},     {7, 1024, 520, 1, true},    {129, 300, 32, 1, false},
                          {257, 4096, 1024, 1, true}, {8193, 256, 256, 1, false}, {130, 64, 512, 8, false},
                          {33, 200, 72, 3, true}};
    CudaBackend& be = hop();
    for (const Case& c : cases) {
        if (sanitizer_run() && c.M > 300) continue;
        const std::string what = "bf16 M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
                                 " K=" + std::to_string(c.K) + " groups=" + std::to_string(c.groups) +
                                 (c.f32 ? " f32 out" : " bf16 out");
        // x [M, groups * K] (group g at column g K), w [groups * N, K], y [M, groups * N]
        const int64_t G = c.groups;
        const auto xh = rand_x(c.M, G * c.K, 61), wh = rand_x(G * c.N, c.K, 62, 0.05f);
        Tensor x = upload(be, DType::BF16, {c.M, G * c.K}, xh.data()),
               w = upload(be, DType::BF16, {G * c.N, c.K}, wh.data());
        // the outputs, or empty when the launch says the loads cannot be used (cudaErrorNotSupported)
        auto run = [&](kern::Sm90Loads loads) {
            Tensor y = poisoned(be, c.f32 ? DType::F32 : DType::BF16, {c.M, G * c.N});
            const cudaError_t err = kern::launch_gemm_bf16_sm90_loads(
                loads, x.ptr<uint16_t>(), G * c.K, c.K, w.ptr<uint16_t>(), c.K, c.N * c.K, y.data, c.f32,
                G * c.N, c.N, c.M, c.N, c.K, G, be.stream());
            if (err == cudaErrorNotSupported) return std::vector<uint8_t>{};
            DS4R_CUDA_CHECK(err);
            return host(be, y);
        };
        const auto tma = run(kern::Sm90Loads::Tma), cp = run(kern::Sm90Loads::CpAsync),
                   automatic = run(kern::Sm90Loads::Auto);
        ASSERT_FALSE(cp.empty()) << what;
        EXPECT_EQ(automatic, cp) << what << ": Auto (TMA where possible) differs from the cp.async loaders";
        if (G == 1) {
            EXPECT_FALSE(tma.empty()) << what << ": no tensor map for a plain aligned problem";
        } else if (tma.empty()) {
            // TMA describes groups as a third dimension; a stride below the row pitch may be refused
            std::printf("[ note ] %s: TMA refused the grouped layout; the cp.async loaders ran\n",
                        what.c_str());
        }
        if (!tma.empty()) {
            EXPECT_EQ(tma, cp) << what << ": TMA loads differ from the cp.async loaders";
        }
    }
}

// The block-scaled kernels' A and B tiles by TMA (swizzled MMA tiles, the widened variant's raw A rows
// in the 64-byte swizzle, the converters' raw B rows unswizzled) or by the cp.async loaders: the same
// bits, in both partial variants, with M / N / K tails (K = 32: one block in a 64- or 128-wide stage).
TEST(CudaGemmSm90, ScaledTmaLoadsEqualCpAsyncLoads) {
    DS4R_REQUIRE_HOPPER();
    struct Case {
        int64_t M, N, K;
    };
    const Case cases[] = {{1, 200, 96}, {7, 1024, 32}, {129, 300, 5120}, {257, 384, 1280}, {8193, 256, 512}};
    CudaBackend& be = hop();
    std::mt19937_64 rng(71);
    for (const Case& c : cases) {
        if (sanitizer_run() && c.M > 300) continue;
        const auto xh = rand_x(c.M, c.K, 72);
        Tensor x = upload(be, DType::BF16, {c.M, c.K}, xh.data());
        for (const bool fp4 : {false, true}) {
            const int64_t wb = fp4 ? c.N * c.K / 2 : c.N * c.K, srows = fp4 ? c.N : (c.N + 31) / 32;
            std::vector<uint8_t> wh = rand_fp8_codes(static_cast<size_t>(wb), rng);
            std::vector<uint8_t> sh(static_cast<size_t>(srows * (c.K / 32)));
            for (auto& b : sh) b = scale_byte(rng, false);
            Tensor w = upload(be, fp4 ? DType::I8 : DType::F8_E4M3, {wb}, wh.data()),
                   sw = upload(be, DType::F8_E8M0, {srows, c.K / 32}, sh.data());
            for (const auto partials : {kern::Sm90Partials::Fp16Widened, kern::Sm90Partials::Fp8Wgmma}) {
                const std::string what =
                    std::string(fp4 ? "fp4" : "fp8") +
                    (partials == kern::Sm90Partials::Fp8Wgmma ? " fp8-wgmma" : " widened") +
                    " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K);
                const CudaBackend::GemmActs a =
                    be.quantize_gemm_acts(x, c.M, c.K, kern::sm90_act_order(partials));
                auto run = [&](kern::Sm90Loads loads) {
                    Tensor y = poisoned(be, DType::BF16, {c.M, c.N});
                    auto fn = fp4 ? kern::launch_gemm_fp4_sm90_partials : kern::launch_gemm_fp8_sm90_partials;
                    DS4R_CUDA_CHECK(fn(partials, a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.ptr<uint8_t>(),
                                       sw.ptr<uint8_t>(), y.ptr<uint16_t>(), c.N, c.M, c.N, c.K, be.stream(),
                                       loads));
                    return host(be, y);
                };
                const auto tma = run(kern::Sm90Loads::Tma), cp = run(kern::Sm90Loads::CpAsync),
                           automatic = run(kern::Sm90Loads::Auto);
                EXPECT_EQ(tma, cp) << what << ": TMA loads differ from the cp.async loaders";
                EXPECT_EQ(automatic, tma) << what << ": Auto differs from TMA";
            }
        }
    }
}

// ---------------------------------------------------------------- batch invariance
// Rows computed in a batch of 8193 equal the same rows computed alone or in a batch of 7.
TEST(CudaGemmSm90, RowsDoNotDependOnM) {
    DS4R_REQUIRE_HOPPER();
    const int64_t M = sanitizer_run() ? 300 : 8193, N = 384, K = 512;
    std::mt19937_64 rng(51);
    const auto xh = rand_x(M, K, 52);
    const auto wh = rand_fp8_codes(static_cast<size_t>(N * K), rng);
    std::vector<uint8_t> sh(static_cast<size_t>((N / 32) * (K / 32)));
    for (auto& b : sh) b = scale_byte(rng, false);
    const auto bh = rand_x(N, K, 53, 0.05f);
    CudaBackend& be = hop();
    Fp8Linear w{upload(be, DType::F8_E4M3, {N, K}, wh.data()),
                upload(be, DType::F8_E8M0, {N / 32, K / 32}, sh.data())};
    Tensor wb = upload(be, DType::BF16, {N, K}, bh.data());
    auto rows_of = [&](int64_t r0, int64_t m, bool bf16) {
        Tensor x = upload(be, DType::BF16, {m, K}, xh.data() + r0 * K);
        Tensor y = poisoned(be, bf16 ? DType::F32 : DType::BF16, {m, N});
        if (bf16)
            be.linear_f32(x, wb, y);
        else
            be.linear_fp8(x, w, y);
        return host(be, y);
    };
    for (const bool bf16 : {false, true}) {
        const size_t row = static_cast<size_t>(N) * (bf16 ? 4 : 2);
        const auto all = rows_of(0, M, bf16);
        for (const int64_t r0 : {int64_t{0}, M / 2, M - 7}) {
            const auto one = rows_of(r0, 1, bf16), seven = rows_of(r0, 7, bf16);
            EXPECT_EQ(0, std::memcmp(one.data(), all.data() + static_cast<size_t>(r0) * row, row))
                << (bf16 ? "bf16" : "fp8") << " row " << r0 << " alone";
            EXPECT_EQ(0, std::memcmp(seven.data(), all.data() + static_cast<size_t>(r0) * row, 7 * row))
                << (bf16 ? "bf16" : "fp8") << " rows " << r0 << ".. in a batch of 7";
        }
    }
}

}  // namespace

#else

TEST(CudaGemmSm90, NeedsTheCudaBuild) {
    GTEST_SKIP() << "built without CUDA: the Hopper kernel comparisons run on the GPU machine only";
}

#endif
