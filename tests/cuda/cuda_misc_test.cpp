// CUDA norms, mHC, compressor pooling, Engram update and the bf16 scalar multiply vs the CPU backend
// (docs/MODEL.md 4.0, 4.5, 4.6.1, 4.8, 5.5, 8.2), at the V4.1 shapes (D 5120, hc 4) and odd tails, with
// poisoned outputs, batch invariance (a row alone == the row inside 130 rows, bitwise) and
// determinism. Measured agreement is printed as "[stats]" lines.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_misc_helpers.h"
#include "cuda_test_util.h"
#include "ds4r/error.h"
#include "ds4r/numeric.h"

using namespace ds4r;
using namespace ds4r::test;
using namespace ds4r::test::misc;

namespace {

int64_t model_dim() {
    return sanitizer_run() ? 512 : 5120;
}
constexpr int64_t kHc = 4;
constexpr int64_t kMix = (2 + kHc) * kHc;

// Rows checked alone for batch invariance.
std::vector<int64_t> probe_rows(int64_t M) {
    return {0, M / 2, M - 1};
}

}  // namespace

// ---------------------------------------------------------------------------- rms_norm

namespace {
struct NormCase {
    int64_t M, N;
    float scale, eps;
    bool inplace;
};
}  // namespace

TEST(CudaMisc, RmsNormMatchesCpu) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = model_dim();
    const NormCase cases[] = {
        {1, D, 1.0f, 1e-20f, false},     {3, D, 20.0f, 1e-20f, true},      {17, 1280, 1.0f, 1e-20f, false},
        {130, 512, 1.0f, 1e-20f, true},  {130, 128, 0.05f, 1e-20f, false}, {5, 256, 1.0f, 1e-6f, false},
        {17, 1000, 3.0f, 1e-20f, false}, {2, 77, 1.0f, 1e-20f, true},
    };
    for (const NormCase& c : cases) {
        const std::string what =
            "rms_norm M" + std::to_string(c.M) + " N" + std::to_string(c.N) + (c.inplace ? " in place" : "");
        SCOPED_TRACE(what);
        Pair x = random_bf16({c.M, c.N}, c.scale, 10 + c.M + c.N);
        const Pair w = random_bf16({c.N}, 1.0f, 20 + c.N);
        const std::vector<uint8_t> input = to_host(cpu(), x.c);
        Pair y = c.inplace ? x : make_output(DType::BF16, {c.M, c.N});
        cpu().rms_norm(x.c, w.c, c.eps, y.c);
        cuda()->rms_norm(x.g, w.g, c.eps, y.g);
        bf16_stats(y, what);
        // fixed-order fp32 sum + rsqrtf (CUDA) vs exact sum + exactly rounded rsqrt (CPU)
        expect_bf16_close(y, 1.0, 0.99, what);
        const std::vector<uint8_t> out = to_host(*cuda(), y.g);
        // determinism
        Tensor x2 = cuda_tensor(DType::BF16, {c.M, c.N}, input.data());
        Tensor y2 = c.inplace ? x2 : cuda()->alloc(DType::BF16, {c.M, c.N});
        cuda()->rms_norm(x2, w.g, c.eps, y2);
        expect_bytes_equal(out, to_host(*cuda(), y2), 2, what + " determinism");
        // batch invariance
        const size_t rb = static_cast<size_t>(c.N * 2);
        for (int64_t r : probe_rows(c.M)) {
            Tensor one = cuda_tensor(DType::BF16, {1, c.N}, &input[static_cast<size_t>(r) * rb]);
            Tensor o1 = c.inplace ? one : cuda()->alloc(DType::BF16, {1, c.N});
            cuda()->rms_norm(one, w.g, c.eps, o1);
            expect_bytes_equal(row_bytes(out, rb, r, r + 1), to_host(*cuda(), o1), 2,
                               what + " batch invariance row " + std::to_string(r));
        }
    }
}

// ---------------------------------------------------------------------------- hc_mixes

namespace {

struct MixesInputs {
    Pair X, fn, scale, base;
};

MixesInputs mixes_inputs(int64_t M, int64_t D, float x_scale, uint64_t seed) {
    const int64_t K = kHc * D;
    // Magnitudes like the golden checkpoint's: fn rms ~ 1/sqrt(K), scale ~ 0.6-0.9, base rms ~ 0.4.
    MixesInputs in{random_bf16({M, kHc, D}, x_scale, seed),
                   random_f32({kMix, K}, 1.0f / std::sqrt(float(K)), seed + 1), Pair{},
                   random_f32({kMix}, 0.4f, seed + 2)};
    const float scale[3] = {0.7353f, 0.8912f, 0.5672f};
    in.scale = make_pair(DType::F32, {3}, scale);
    return in;
}

struct MixesOut {
    Pair pre, post, comb;
};

MixesOut mixes_outputs(int64_t M) {
    return {make_output(DType::F32, {M, kHc}), make_output(DType::F32, {M, kHc}),
            make_output(DType::F32, {M, kHc, kHc})};
}

}  // namespace

TEST(CudaMisc, HcMixesMatchesCpu) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = model_dim();
    struct Case {
        int64_t M, D;
        float x_scale;
    };
    const Case cases[] = {{1, D, 1.0f},   {3, D, 20.0f},  {17, D, 1.0f},
                          {130, D, 1.0f}, {5, 256, 1.0f}, {6, 250, 0.3f}};
    const float norm_eps = 1e-20f, hc_eps = 1e-6f;
    const int iters = 20;
    for (const Case& c : cases) {
        const std::string what = "hc_mixes M" + std::to_string(c.M) + " D" + std::to_string(c.D);
        SCOPED_TRACE(what);
        const MixesInputs in = mixes_inputs(c.M, c.D, c.x_scale, 300 + c.M);
        MixesOut out = mixes_outputs(c.M);
        cpu().hc_mixes(in.X.c, in.fn.c, in.scale.c, in.base.c, norm_eps, hc_eps, iters, out.pre.c, out.post.c,
                       out.comb.c);
        cuda()->hc_mixes(in.X.g, in.fn.g, in.scale.g, in.base.g, norm_eps, hc_eps, iters, out.pre.g,
                         out.post.g, out.comb.g);
        // fp32 FFMA dot in a fixed order + rsqrtf + libdevice expf (CUDA) vs exact dot, exact rsqrt,
        // glibc expf (CPU): a few fp32 ulps after the Sinkhorn iterations.
        f32_stats(out.pre, what + " pre");
        f32_stats(out.post, what + " post");
        f32_stats(out.comb, what + " comb");
        expect_f32_close(out.pre, 1e-5, 1e-7, what + " pre");
        expect_f32_close(out.post, 1e-5, 1e-7, what + " post");
        expect_f32_close(out.comb, 1e-5, 1e-7, what + " comb");
        const auto pre = to_host(*cuda(), out.pre.g), post = to_host(*cuda(), out.post.g),
                   comb = to_host(*cuda(), out.comb.g);
        // determinism
        {
            MixesOut again = mixes_outputs(c.M);
            cuda()->hc_mixes(in.X.g, in.fn.g, in.scale.g, in.base.g, norm_eps, hc_eps, iters, again.pre.g,
                             again.post.g, again.comb.g);
            expect_bytes_equal(pre, to_host(*cuda(), again.pre.g), 4, what + " determinism pre");
            expect_bytes_equal(post, to_host(*cuda(), again.post.g), 4, what + " determinism post");
            expect_bytes_equal(comb, to_host(*cuda(), again.comb.g), 4, what + " determinism comb");
        }
        // batch invariance (the kernels pack 2 or 32 tokens per block: a row alone sits in slot 0)
        const std::vector<uint8_t> xs = to_host(cpu(), in.X.c);
        const size_t rb = static_cast<size_t>(kHc * c.D * 2);
        for (int64_t r : probe_rows(c.M)) {
            Tensor x1 = cuda_tensor(DType::BF16, {1, kHc, c.D}, &xs[static_cast<size_t>(r) * rb]);
            Tensor p1 = cuda()->alloc(DType::F32, {1, kHc}), q1 = cuda()->alloc(DType::F32, {1, kHc}),
                   c1 = cuda()->alloc(DType::F32, {1, kHc, kHc});
            cuda()->hc_mixes(x1, in.fn.g, in.scale.g, in.base.g, norm_eps, hc_eps, iters, p1, q1, c1);
            const std::string tag = what + " batch invariance row " + std::to_string(r);
            expect_bytes_equal(row_bytes(pre, kHc * 4, r, r + 1), to_host(*cuda(), p1), 4, tag + " pre");
            expect_bytes_equal(row_bytes(post, kHc * 4, r, r + 1), to_host(*cuda(), q1), 4, tag + " post");
            expect_bytes_equal(row_bytes(comb, kHc * kHc * 4, r, r + 1), to_host(*cuda(), c1), 4,
                               tag + " comb");
        }
    }
}

TEST(CudaMisc, HcMixesRejectsUnsupportedShapes) {
    DS4R_REQUIRE_CUDA();
    // The kernel is built for hc = 4; other widths are refused with a clear error, not miscomputed.
    const int64_t hc = 3, D = 64, mix = (2 + hc) * hc;
    Tensor X = cuda()->alloc(DType::BF16, {2, hc, D}), fn = cuda()->alloc(DType::F32, {mix, hc * D}),
           scale = cuda()->alloc(DType::F32, {3}), base = cuda()->alloc(DType::F32, {mix}),
           pre = cuda()->alloc(DType::F32, {2, hc}), post = cuda()->alloc(DType::F32, {2, hc}),
           comb = cuda()->alloc(DType::F32, {2, hc, hc});
    EXPECT_THROW(cuda()->hc_mixes(X, fn, scale, base, 1e-20f, 1e-6f, 20, pre, post, comb), Error);
    // A partially overlapping in-place rms_norm is refused (identical or disjoint only).
    Tensor a = cuda()->alloc(DType::BF16, {4, 64}), w = cuda()->alloc(DType::BF16, {64});
    EXPECT_THROW(cuda()->rms_norm(a.rows(0, 3), w, 1e-6f, a.rows(1, 4)), Error);
}

// ---------------------------------------------------------------------------- hc_pre / hc_post

TEST(CudaMisc, HcPreMatchesCpuBitwise) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = model_dim();
    for (int64_t M : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{130}}) {
        // D % 8 != 0 (M = 3): the one-element kernel; else the 8-element one
        const int64_t d = M == 17 ? 256 : (M == 3 ? 100 : D);
        const std::string what = "hc_pre M" + std::to_string(M) + " D" + std::to_string(d);
        SCOPED_TRACE(what);
        const Pair X = random_bf16({M, kHc, d}, 1.0f, 500 + M);
        const Pair mix = random_f32({M, kHc}, 0.5f, 600 + M);
        Pair y = make_output(DType::BF16, {M, d});
        cpu().hc_pre(X.c, mix.c, y.c);
        cuda()->hc_pre(X.g, mix.g, y.g);
        // Same products and the same sequential sum from 0 on both sides: bit exact.
        expect_bitwise_equal(y, what);
        const auto out = to_host(*cuda(), y.g);
        Tensor y2 = cuda()->alloc(DType::BF16, {M, d});
        cuda()->hc_pre(X.g, mix.g, y2);
        expect_bytes_equal(out, to_host(*cuda(), y2), 2, what + " determinism");
        const auto xs = to_host(cpu(), X.c), ms = to_host(cpu(), mix.c);
        for (int64_t r : probe_rows(M)) {
            Tensor x1 = cuda_tensor(DType::BF16, {1, kHc, d}, &xs[static_cast<size_t>(r * kHc * d * 2)]);
            Tensor m1 = cuda_tensor(DType::F32, {1, kHc}, &ms[static_cast<size_t>(r * kHc * 4)]);
            Tensor y1 = cuda()->alloc(DType::BF16, {1, d});
            cuda()->hc_pre(x1, m1, y1);
            expect_bytes_equal(row_bytes(out, static_cast<size_t>(d * 2), r, r + 1), to_host(*cuda(), y1), 2,
                               what + " batch invariance row " + std::to_string(r));
        }
    }
}

TEST(CudaMisc, HcPostMatchesCpuBitwise) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = model_dim();
    for (int64_t M : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{130}}) {
        for (bool inplace : {false, true}) {
            // D % 8 != 0 (M = 3): the one-element kernel; else the 8-element one
            const int64_t d = M == 17 ? 256 : (M == 3 ? 100 : D);
            const std::string what = "hc_post M" + std::to_string(M) + " D" + std::to_string(d) +
                                     (inplace ? " in place (out = R)" : "");
            SCOPED_TRACE(what);
            const Pair x = random_bf16({M, d}, 1.0f, 700 + M);
            Pair R = random_bf16({M, kHc, d}, 2.0f, 800 + M);
            const Pair post = random_f32({M, kHc}, 1.0f, 900 + M);
            const Pair comb = random_f32({M, kHc, kHc}, 0.5f, 1000 + M);
            const auto rs = to_host(cpu(), R.c);
            Pair out = inplace ? R : make_output(DType::BF16, {M, kHc, d});
            cpu().hc_post(x.c, R.c, post.c, comb.c, out.c);
            cuda()->hc_post(x.g, R.g, post.g, comb.g, out.g);
            expect_bitwise_equal(out, what);  // identical operation order on both sides
            const auto o = to_host(*cuda(), out.g);
            Tensor R2 = cuda_tensor(DType::BF16, {M, kHc, d}, rs.data());
            Tensor o2 = inplace ? R2 : cuda()->alloc(DType::BF16, {M, kHc, d});
            cuda()->hc_post(x.g, R2, post.g, comb.g, o2);
            expect_bytes_equal(o, to_host(*cuda(), o2), 2, what + " determinism");
            const auto xs = to_host(cpu(), x.c), ps = to_host(cpu(), post.c), cs = to_host(cpu(), comb.c);
            for (int64_t r : probe_rows(M)) {
                Tensor x1 = cuda_tensor(DType::BF16, {1, d}, &xs[static_cast<size_t>(r * d * 2)]);
                Tensor R1 = cuda_tensor(DType::BF16, {1, kHc, d}, &rs[static_cast<size_t>(r * kHc * d * 2)]);
                Tensor p1 = cuda_tensor(DType::F32, {1, kHc}, &ps[static_cast<size_t>(r * kHc * 4)]);
                Tensor c1 =
                    cuda_tensor(DType::F32, {1, kHc, kHc}, &cs[static_cast<size_t>(r * kHc * kHc * 4)]);
                Tensor o1 = inplace ? R1 : cuda()->alloc(DType::BF16, {1, kHc, d});
                cuda()->hc_post(x1, R1, p1, c1, o1);
                expect_bytes_equal(row_bytes(o, static_cast<size_t>(kHc * d * 2), r, r + 1),
                                   to_host(*cuda(), o1), 2,
                                   what + " batch invariance row " + std::to_string(r));
            }
        }
    }
}

// ---------------------------------------------------------------------------- compress_pool2

TEST(CudaMisc, CompressPool2MatchesCpu) {
    DS4R_REQUIRE_CUDA();
    const int64_t hd = 512;
    for (int64_t rows : {int64_t{2}, int64_t{3}, int64_t{35}, int64_t{261}}) {
        const int64_t n = rows / 2;  // a trailing odd row is ignored
        const std::string what = "compress_pool2 rows " + std::to_string(rows);
        SCOPED_TRACE(what);
        const Pair kv = random_f32({rows, hd}, 1.0f, 1100 + rows);
        const Pair sc = random_f32({rows, hd}, 3.0f, 1200 + rows);
        Pair out = make_output(DType::BF16, {n, hd});
        cpu().compress_pool2(kv.c, sc.c, out.c);
        cuda()->compress_pool2(kv.g, sc.g, out.g);
        bf16_stats(out, what);
        expect_bf16_close(out, 1.0, 0.99, what);  // libdevice vs glibc expf: <= 1 fp32 ulp apart
        const auto o = to_host(*cuda(), out.g);
        Tensor o2 = cuda()->alloc(DType::BF16, {n, hd});
        cuda()->compress_pool2(kv.g, sc.g, o2);
        expect_bytes_equal(o, to_host(*cuda(), o2), 2, what + " determinism");
        const auto ks = to_host(cpu(), kv.c), ss = to_host(cpu(), sc.c);
        for (int64_t j : probe_rows(n)) {
            const size_t gb = static_cast<size_t>(2 * hd * 4);
            Tensor k1 = cuda_tensor(DType::F32, {2, hd}, &ks[static_cast<size_t>(j) * gb]);
            Tensor s1 = cuda_tensor(DType::F32, {2, hd}, &ss[static_cast<size_t>(j) * gb]);
            Tensor o1 = cuda()->alloc(DType::BF16, {1, hd});
            cuda()->compress_pool2(k1, s1, o1);
            expect_bytes_equal(row_bytes(o, static_cast<size_t>(hd * 2), j, j + 1), to_host(*cuda(), o1), 2,
                               what + " batch invariance group " + std::to_string(j));
        }
    }
}

// ---------------------------------------------------------------------------- engram_update

TEST(CudaMisc, EngramUpdateMatchesCpu) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = model_dim();
    struct Case {
        int64_t M, D;
        float x_scale;
    };
    const Case cases[] = {{1, D, 1.0f},   {3, D, 8.0f},   {17, D, 1.0f},
                          {130, D, 1.0f}, {5, 256, 1.0f}, {4, 300, 0.5f}};
    const float eps = 1e-20f;
    for (const Case& c : cases) {
        const std::string what = "engram_update M" + std::to_string(c.M) + " D" + std::to_string(c.D);
        SCOPED_TRACE(what);
        Pair X = random_bf16({c.M, kHc, c.D}, c.x_scale, 1300 + c.M);
        const Pair kv = random_bf16({c.M, (kHc + 1) * c.D}, 1.0f, 1400 + c.M);
        const Pair qw = random_bf16({kHc, c.D}, 1.0f, 1500);
        const Pair kw = random_bf16({kHc, c.D}, 1.0f, 1600);
        const auto xs = to_host(cpu(), X.c);
        cpu().engram_update(X.c, kv.c, qw.c, kw.c, eps);
        cuda()->engram_update(X.g, kv.g, qw.g, kw.g, eps);
        bf16_stats(X, what);
        // fixed-order fp32 sums + rsqrtf + libdevice expf vs exact sums, exact rsqrt, glibc expf
        // out = h + gate * value: a cancelling sum is compared in ulps of its operands (~x_scale).
        expect_bf16_close(X, 1.0, 0.99, what, std::max(1.0f, c.x_scale));
        const auto o = to_host(*cuda(), X.g);
        Tensor X2 = cuda_tensor(DType::BF16, {c.M, kHc, c.D}, xs.data());
        cuda()->engram_update(X2, kv.g, qw.g, kw.g, eps);
        expect_bytes_equal(o, to_host(*cuda(), X2), 2, what + " determinism");
        const auto ks = to_host(cpu(), kv.c);
        for (int64_t r : probe_rows(c.M)) {
            Tensor x1 = cuda_tensor(DType::BF16, {1, kHc, c.D}, &xs[static_cast<size_t>(r * kHc * c.D * 2)]);
            Tensor k1 = cuda_tensor(DType::BF16, {1, (kHc + 1) * c.D},
                                    &ks[static_cast<size_t>(r * (kHc + 1) * c.D * 2)]);
            cuda()->engram_update(x1, k1, qw.g, kw.g, eps);
            expect_bytes_equal(row_bytes(o, static_cast<size_t>(kHc * c.D * 2), r, r + 1),
                               to_host(*cuda(), x1), 2, what + " batch invariance row " + std::to_string(r));
        }
    }
}

// ---------------------------------------------------------------------------- mul_scalar_bf16

TEST(CudaMisc, MulScalarBf16MatchesCpuBitwise) {
    DS4R_REQUIRE_CUDA();
    // The indexer's weight scale (docs/MODEL.md 4.6.2 step 3) and an arbitrary factor; an odd element count.
    const float factors[] = {static_cast<float>(std::pow(128.0, -0.5) * std::pow(64.0, -0.5)), -3.3f};
    for (float f : factors) {
        for (const Shape& s : {Shape{130, 64}, Shape{17, 3}, Shape{1, 1}}) {
            const std::string what = "mul_scalar_bf16 " + shape_str(s) + " x " + std::to_string(f);
            Pair x = random_bf16(s, 2.0f, 1700 + s[0]);
            const auto xs = to_host(cpu(), x.c);
            cpu().mul_scalar_bf16(x.c, f);
            cuda()->mul_scalar_bf16(x.g, f);
            expect_bitwise_equal(x, what);  // one fp32 multiply, one bf16 rounding
            const auto o = to_host(*cuda(), x.g);
            Tensor x2 = cuda_tensor(DType::BF16, s, xs.data());
            cuda()->mul_scalar_bf16(x2, f);
            expect_bytes_equal(o, to_host(*cuda(), x2), 2, what + " determinism");
            const size_t rb = static_cast<size_t>(s[1] * 2);
            for (int64_t r : probe_rows(s[0])) {
                Tensor one = cuda_tensor(DType::BF16, {1, s[1]}, &xs[static_cast<size_t>(r) * rb]);
                cuda()->mul_scalar_bf16(one, f);
                expect_bytes_equal(row_bytes(o, rb, r, r + 1), to_host(*cuda(), one), 2,
                                   what + " batch invariance row " + std::to_string(r));
            }
        }
    }
}

// ---------------------------------------------------------------------------- empty inputs

TEST(CudaMisc, EmptyInputsAreNoOps) {
    DS4R_REQUIRE_CUDA();
    const int64_t D = 64;
    Tensor x = cuda()->alloc(DType::BF16, {0, D}), w = cuda()->alloc(DType::BF16, {D});
    cuda()->fill(w, 0);
    EXPECT_NO_THROW(cuda()->rms_norm(x, w, 1e-6f, x));
    Tensor X = cuda()->alloc(DType::BF16, {0, kHc, D}), fn = cuda()->alloc(DType::F32, {kMix, kHc * D}),
           scale = cuda()->alloc(DType::F32, {3}), base = cuda()->alloc(DType::F32, {kMix}),
           pre = cuda()->alloc(DType::F32, {0, kHc}), post = cuda()->alloc(DType::F32, {0, kHc}),
           comb = cuda()->alloc(DType::F32, {0, kHc, kHc});
    EXPECT_NO_THROW(cuda()->hc_mixes(X, fn, scale, base, 1e-20f, 1e-6f, 20, pre, post, comb));
    EXPECT_NO_THROW(cuda()->hc_pre(X, pre, x));
    EXPECT_NO_THROW(cuda()->hc_post(x, X, post, comb, X));
    Tensor kv1 = cuda()->alloc(DType::F32, {1, D}), out0 = cuda()->alloc(DType::BF16, {0, D});
    EXPECT_NO_THROW(cuda()->compress_pool2(kv1, kv1, out0));  // 1 row: no group (s < 2)
    Tensor ekv = cuda()->alloc(DType::BF16, {0, (kHc + 1) * D}), qw = cuda()->alloc(DType::BF16, {kHc, D});
    EXPECT_NO_THROW(cuda()->engram_update(X, ekv, qw, qw, 1e-20f));
    EXPECT_NO_THROW(cuda()->mul_scalar_bf16(x, 2.0f));
    Tensor t = cuda()->alloc(DType::F32, {0, 32, 2});
    EXPECT_NO_THROW(cuda()->rope_table(10000.0, 1.0, 0, 32, 1, 64, t));
    cuda()->synchronize();
}
