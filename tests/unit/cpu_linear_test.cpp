// CPU linears (docs/MODEL.md 4.0, 5.3, 4.6 f): the block-scaled fp8 / fp4 GEMM model, dense GEMMs with
// fp64 accumulation, and the grouped wo_a projection.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

// The dequantized activation of one row: unscaled e4m3 values and per-32 scales.
void quantize_row(const uint16_t* x, int64_t K, std::vector<float>& v, std::vector<float>& s) {
    v.assign(static_cast<size_t>(K), 0.0f);
    s.assign(static_cast<size_t>(K / 32), 0.0f);
    for (int64_t b = 0; b < K / 32; ++b) {
        uint8_t q[32];
        s[static_cast<size_t>(b)] = cpuref::fp8_quant_block(x + b * 32, 32, q, nullptr);
        for (int i = 0; i < 32; ++i) v[static_cast<size_t>(b * 32 + i)] = e4m3_to_f32(q[i]);
    }
}

// Weight value getter for the reference: (unscaled value, scale) of W[n, k].
struct FpW {
    virtual ~FpW() = default;
    virtual float value(int64_t n, int64_t k) const = 0;
    virtual float scale(int64_t n, int64_t kb) const = 0;
};
struct Fp8W : FpW {
    const Fp8Linear& l;
    explicit Fp8W(const Fp8Linear& l_) : l(l_) {}
    float value(int64_t n, int64_t k) const override {
        return e4m3_to_f32(l.w.ptr<uint8_t>()[n * l.w.dim(1) + k]);
    }
    float scale(int64_t n, int64_t kb) const override {
        return e8m0_to_f32(l.s.ptr<uint8_t>()[(n / 32) * l.s.dim(1) + kb]);
    }
};
struct Fp4W : FpW {
    const Fp4Linear& l;
    explicit Fp4W(const Fp4Linear& l_) : l(l_) {}
    float value(int64_t n, int64_t k) const override {
        const uint8_t byte = l.w.ptr<uint8_t>()[n * l.w.dim(1) + k / 2];
        return e2m1_to_f32(k % 2 == 0 ? byte & 15 : byte >> 4);
    }
    float scale(int64_t n, int64_t kb) const override {
        return e8m0_to_f32(l.s.ptr<uint8_t>()[n * l.s.dim(1) + kb]);
    }
};

// Round a double directly to bf16 (RNE), without passing through fp32.
uint16_t bf16_of_double(double v) {
    if (v == 0.0 || !std::isfinite(v)) return f32_to_bf16(static_cast<float>(v));
    const double ulp = std::ldexp(1.0, std::ilogb(v) - 7);
    return f32_to_bf16(static_cast<float>(std::nearbyint(v / ulp) * ulp));
}

// blockwise: docs/MODEL.md 5.3 (fp32 partial per block, scaled, added in K order); exact: one dot in double.
void reference(const Tensor& x, const FpW& w, int64_t N, std::vector<uint16_t>& blockwise,
               std::vector<uint16_t>& exact) {
    const int64_t M = x.dim(0), K = x.dim(1);
    blockwise.resize(static_cast<size_t>(M * N));
    exact.resize(static_cast<size_t>(M * N));
    std::vector<float> v, s;
    for (int64_t m = 0; m < M; ++m) {
        quantize_row(x.ptr<uint16_t>() + m * K, K, v, s);
        for (int64_t n = 0; n < N; ++n) {
            float acc = 0.0f;
            double all = 0.0;
            for (int64_t kb = 0; kb < K / 32; ++kb) {
                double p = 0.0;
                for (int64_t k = kb * 32; k < kb * 32 + 32; ++k) p += double(v[size_t(k)]) * w.value(n, k);
                acc += (static_cast<float>(p) * s[size_t(kb)]) * w.scale(n, kb);
                all += p * s[size_t(kb)] * w.scale(n, kb);
            }
            blockwise[size_t(m * N + n)] = f32_to_bf16(acc);
            exact[size_t(m * N + n)] = bf16_of_double(all);
        }
    }
}

}  // namespace

TEST(CpuLinear, Fp8MatchesBlockwiseModelAndStaysWithinOneUlpOfExactDot) {
    CpuBackend be(3);
    Rng rng(11);
    const int64_t M = 5, K = 160, N = 70;  // N not a multiple of 32: a partial weight-scale tile
    Tensor x = random_bf16(be, {M, K}, rng);
    Fp8Linear w = random_fp8_linear(be, N, K, rng);
    Tensor y = make(be, DType::BF16, {M, N});
    be.linear_fp8(x, w, y);
    std::vector<uint16_t> blockwise, exact;
    reference(x, Fp8W(w), N, blockwise, exact);
    int far = 0;
    for (int64_t i = 0; i < M * N; ++i) {
        EXPECT_EQ(y.ptr<uint16_t>()[i], blockwise[size_t(i)]) << i;
        far += std::abs(int(y.ptr<uint16_t>()[i]) - int(exact[size_t(i)])) > 1;
    }
    EXPECT_EQ(far, 0);
}

TEST(CpuLinear, Fp8BlockPartialRoundingIsModelledNotASingleDot) {
    // K = 64: block 0 sums exactly to 21 * 448^2 + 0.25 = 4214784.25, which rounds (tie, to even)
    // to 4214784 in fp32; block 1 adds -4096. The fp32 accumulator lands exactly on a bf16
    // midpoint (tie -> 4194304) while the exact dot is just above it (-> 4227072).
    CpuBackend be(1);
    std::vector<float> xr(64, 0.0f), wr(64, 0.0f);
    for (int k = 0; k < 21; ++k) xr[size_t(k)] = wr[size_t(k)] = 448.0f;
    xr[21] = wr[21] = 0.5f;
    xr[32] = 64.0f;
    wr[32] = -64.0f;
    std::vector<float> xv;
    for (int m = 0; m < 3; ++m) xv.insert(xv.end(), xr.begin(), xr.end());  // the row inside a batch
    Tensor x = bf16_from(be, {3, 64}, xv);
    Fp8Linear w;
    w.w = be.alloc(DType::F8_E4M3, {1, 64});
    w.s = be.alloc(DType::F8_E8M0, {1, 2});
    for (int k = 0; k < 64; ++k) w.w.ptr<uint8_t>()[k] = f32_to_e4m3(wr[size_t(k)]);
    w.s.ptr<uint8_t>()[0] = w.s.ptr<uint8_t>()[1] = 127;
    Tensor y = make(be, DType::BF16, {3, 1});
    be.linear_fp8(x, w, y);
    std::vector<uint16_t> blockwise, exact;
    reference(x, Fp8W(w), 1, blockwise, exact);
    ASSERT_NE(blockwise[0], exact[0]);  // the crafted input does discriminate
    for (int m = 0; m < 3; ++m) {
        EXPECT_EQ(bf16_to_f32(y.ptr<uint16_t>()[m]), 4194304.0f);
        EXPECT_EQ(y.ptr<uint16_t>()[m], blockwise[0]);
    }
    EXPECT_EQ(bf16_to_f32(exact[0]), 4227072.0f);
}

TEST(CpuLinear, Fp4NibbleOrderAndBlockwiseModel) {
    CpuBackend be(2);
    // Nibble order: byte 0x71 holds element 0 = code 1 (0.5) in the low nibble, element 1 = code 7 (6).
    Fp4Linear w;
    w.w = be.alloc(DType::I8, {1, 16});
    w.s = be.alloc(DType::F8_E8M0, {1, 1});
    be.fill(w.w, 0);
    w.w.ptr<uint8_t>()[0] = 0x71;
    w.s.ptr<uint8_t>()[0] = 127 + 1;  // weight scale 2
    std::vector<float> xv(64, 0.0f);
    xv[0] = 1.0f;   // row 0 picks element 0
    xv[33] = 1.0f;  // row 1 picks element 1
    Tensor x = bf16_from(be, {2, 32}, xv);
    Tensor y = make(be, DType::BF16, {2, 1});
    be.linear_fp4(x, w, y);
    EXPECT_EQ(bf16_to_f32(y.ptr<uint16_t>()[0]), 0.5f * 2.0f);
    EXPECT_EQ(bf16_to_f32(y.ptr<uint16_t>()[1]), 6.0f * 2.0f);

    Rng rng(5);
    const int64_t M = 4, K = 128, N = 40;
    Tensor xr = random_bf16(be, {M, K}, rng);
    Fp4Linear wr = random_fp4_linear(be, N, K, rng);
    Tensor yr = make(be, DType::BF16, {M, N});
    be.linear_fp4(xr, wr, yr);
    std::vector<uint16_t> blockwise, exact;
    reference(xr, Fp4W(wr), N, blockwise, exact);
    for (int64_t i = 0; i < M * N; ++i) {
        EXPECT_EQ(yr.ptr<uint16_t>()[i], blockwise[size_t(i)]) << i;
        EXPECT_LE(std::abs(int(yr.ptr<uint16_t>()[i]) - int(exact[size_t(i)])), 1) << i;
    }
}

TEST(CpuLinear, DenseGemmsAccumulateInFp64WithoutTf32) {
    CpuBackend be(2);
    // fp32 inputs with 21 significant bits: TF32 (10 bits) would lose them.
    Tensor x = f32_from(be, {1, 3}, {1.0f + std::ldexp(1.0f, -20), 0.0f, 0.0f});
    Tensor w = f32_from(be, {2, 3}, {1, 0, 0, 0, 0, 0});
    Tensor y = make(be, DType::F32, {1, 2});
    be.linear_f32(x, w, y);
    EXPECT_EQ(y.ptr<float>()[0], 1.0f + std::ldexp(1.0f, -20));
    // fp64 accumulation: 2^24 + 1 - 2^24 is 1, not the 0 a sequential fp32 sum gives.
    Tensor x2 = f32_from(be, {1, 3}, {16777216.0f, 1.0f, -16777216.0f});
    Tensor w2 = f32_from(be, {1, 3}, {1, 1, 1});
    Tensor y2 = make(be, DType::F32, {1, 1});
    be.linear_f32(x2, w2, y2);
    EXPECT_EQ(y2.ptr<float>()[0], 1.0f);

    // Random bf16 x bf16: every combination of input dtypes against a long double reference.
    Rng rng(3);
    const int64_t M = 3, K = 300, N = 17;
    Tensor xb = random_bf16(be, {M, K}, rng), wb = random_bf16(be, {N, K}, rng);
    Tensor xf = f32_from(be, {M, K}, values(xb)), wf = f32_from(be, {N, K}, values(wb));
    std::vector<float> ref(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            long double s = 0;
            for (int64_t k = 0; k < K; ++k)
                s += (long double)bf16_to_f32(xb.ptr<uint16_t>()[m * K + k]) *
                     bf16_to_f32(wb.ptr<uint16_t>()[n * K + k]);
            ref[size_t(m * N + n)] = static_cast<float>(s);
        }
    for (const Tensor* xa : {&xb, &xf})
        for (const Tensor* wa : {&wb, &wf}) {
            Tensor yf = make(be, DType::F32, {M, N});
            be.linear_f32(*xa, *wa, yf);
            for (int64_t i = 0; i < M * N; ++i) EXPECT_EQ(yf.ptr<float>()[i], ref[size_t(i)]) << i;
        }
    Tensor yb = make(be, DType::BF16, {M, N});
    be.linear_bf16(xb, wb, yb);
    for (int64_t i = 0; i < M * N; ++i) EXPECT_EQ(yb.ptr<uint16_t>()[i], f32_to_bf16(ref[size_t(i)])) << i;
}

TEST(CpuLinear, WoAIsGroupedAndUsesTheExactBf16Dequantization) {
    CpuBackend be(2);
    Rng rng(8);
    const int64_t M = 3, G = 2, R = 40, Kg = 64;
    Tensor o = random_bf16(be, {M, G * Kg}, rng);
    Fp8Linear w = random_fp8_linear(be, G * R, Kg, rng);
    Tensor y = make(be, DType::BF16, {M, G * R});
    be.linear_wo_a(o, w, G, y);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t r = 0; r < R; ++r) {
                const int64_t row = g * R + r;
                double s = 0.0;
                for (int64_t d = 0; d < Kg; ++d) {
                    const float wv = e4m3_to_f32(w.w.ptr<uint8_t>()[row * Kg + d]) *
                                     e8m0_to_f32(w.s.ptr<uint8_t>()[(row / 32) * w.s.dim(1) + d / 32]);
                    ASSERT_EQ(round_bf16(wv), wv);  // the dequantization to bf16 is exact
                    s += double(bf16_to_f32(o.ptr<uint16_t>()[m * G * Kg + g * Kg + d])) * wv;
                }
                EXPECT_EQ(y.ptr<uint16_t>()[m * G * R + row], f32_to_bf16(static_cast<float>(s)));
            }
    // Group 0's outputs never read group 1's columns.
    Tensor o2 = clone(be, o);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t d = 0; d < Kg; ++d) o2.ptr<uint16_t>()[m * G * Kg + Kg + d] = f32_to_bf16(1e4f);
    Tensor y2 = make(be, DType::BF16, {M, G * R});
    be.linear_wo_a(o2, w, G, y2);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < R; ++r)
            EXPECT_EQ(y2.ptr<uint16_t>()[m * G * R + r], y.ptr<uint16_t>()[m * G * R + r]);
}

TEST(CpuLinear, ShapeErrorsNameTheOpAndArgument) {
    CpuBackend be(1);
    Rng rng(1);
    Tensor x = random_bf16(be, {2, 64}, rng);
    Fp8Linear w = random_fp8_linear(be, 8, 96, rng);  // K mismatch
    Tensor y = make(be, DType::BF16, {2, 8});
    try {
        be.linear_fp8(x, w, y);
        FAIL() << "expected an error";
    } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find("linear_fp8"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("x"), std::string::npos) << e.what();
    }
}
