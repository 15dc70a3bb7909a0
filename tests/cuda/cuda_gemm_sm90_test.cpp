// The Hopper wgmma GEMMs (kernels/gemm_sm90.cuh, `--kernels hopper`) against the portable mma.sync
// kernels (their oracle) and the CPU backend: per GEMM family and shape, the fraction of outputs
// bitwise equal and the largest distance in units in the last place (ulp of the output dtype), with
// the bounds measured on an H200 (docs/PERFORMANCE.md "Hopper kernels: numerics"). Batch invariance is
// exact: a row's bits do not depend on M. Skips on GPUs other than compute capability 9.0.
//
// Shapes: odd M (1, 7, 129, 8193), N off the 128-column tile, K = 32 (one block), the model's shapes at
// modest M, extreme block scales (the three-rounding form); fp16 weights in 64- and 128-wide K stages.
// The grouped experts: cuda_gemm_sm90_grouped_test.cpp; shared helpers: cuda_sm90_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_sm90_test_util.h"
#include "cuda_test_util.h"
#include "ds4r/numeric.h"

#ifdef DS4R_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "gemm_sm90.cuh"
#include "quant.cuh"
#endif

using namespace ds4r;
using namespace ds4r::test;

#ifdef DS4R_HAVE_CUDA

namespace {

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
        return to_host(be, y);
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
        return to_host(be, y);
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
    const std::vector<uint8_t> out = to_host(be, d_out);
    auto e4m3 = [](uint8_t b) {  // sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7f / 0xff NaN
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
        return (b & 0x80) ? -v : v;
    };
    expect_every_byte_value(in);
    for (size_t i = 0; i < in.size(); ++i) {
        uint16_t h = 0;
        std::memcpy(&h, out.data() + 2 * i, 2);
        const bool nan = (in[i] & 0x7f) == 0x7f;
        const float want = nan ? ((in[i] & 0x80) ? -480.0f : 480.0f) : e4m3(in[i]);
        EXPECT_EQ(f16_to_f32(h), want) << "code " << static_cast<int>(in[i]);
        EXPECT_EQ(h >> 15, in[i] >> 7) << "sign of code " << static_cast<int>(in[i]);
    }
    expect_refuses_misaligned([&](int in_off, int64_t n, int out_off) {
        return kern::launch_e4m3_to_f16(d_in.ptr<uint8_t>() + in_off, n, d_out.ptr<uint16_t>() + out_off / 2,
                                        be.stream());
    });
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
        const auto ref = to_host(be, y);
        for (const auto loads : {kern::Sm90Loads::Tma, kern::Sm90Loads::TmaWideK, kern::Sm90Loads::CpAsync,
                                 kern::Sm90Loads::Auto}) {
            Tensor y16 = poisoned(be, DType::BF16, {c.M, c.N});
            DS4R_CUDA_CHECK(kern::launch_gemm_fp8_sm90_f16w(
                a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w16.ptr<uint16_t>(), w.s.ptr<uint8_t>(),
                y16.ptr<uint16_t>(), c.N, c.M, c.N, c.K, be.stream(), loads));
            expect_equal(what + " loads " + std::to_string(static_cast<int>(loads)), "fp8 w",
                         agreement(to_host(be, y16), ref, 2, c.N));
        }
        // the backend: fp16 weights for every M (rows threshold 0) vs off
        auto linear = [&](bool on) {
            be.set_fp16_weights(on);
            Tensor yl = poisoned(be, DType::BF16, {c.M, c.N});
            be.linear_fp8(x, w, yl);
            return to_host(be, yl);
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
            return to_host(be, y);
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
            return to_host(be, y);
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
            return to_host(be, y);
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
            return to_host(be, y);
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
                    return to_host(be, y);
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
        return to_host(be, y);
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
