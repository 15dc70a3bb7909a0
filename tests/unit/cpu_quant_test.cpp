// CPU activation quantization: bit exactness against DeepSeek's kernels' known answers
// (tests/data/tiny-a/quant, docs/MODEL.md 5.1 / 5.2) and exhaustive checks of the narrow formats.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"
#include "ds4r/npy.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

std::string quant_path(const std::string& name) {
    return test::data_dir() + "/tiny-a/quant/" + name + ".npy";
}

struct GoldenInput {
    NpyArray x;  // bf16 bits [48, 256]
    int64_t M, K;
};
GoldenInput golden_x() {
    GoldenInput g{load_npy(quant_path("x_bf16")), 0, 0};
    EXPECT_EQ(g.x.descr, "<u2");
    g.M = g.x.shape.at(0);
    g.K = g.x.shape.at(1);
    return g;
}
Tensor golden_x_tensor(CpuBackend& be, const GoldenInput& g) {
    Tensor x = be.alloc(DType::BF16, {g.M, g.K});
    std::memcpy(x.data, g.x.data.data(), x.nbytes());
    return x;
}

}  // namespace

TEST(CpuQuant, ActQuantFp8MatchesGoldenBitExact) {
    CpuBackend be(2);
    const GoldenInput g = golden_x();
    Tensor x = golden_x_tensor(be, g);
    Tensor q = be.alloc(DType::F8_E4M3, {g.M, g.K});
    Tensor s = be.alloc(DType::F8_E8M0, {g.M, g.K / 32});
    be.act_quant_fp8(x, q, s);
    const NpyArray gq = load_npy(quant_path("act_quant_q_e4m3"));
    const NpyArray gs = load_npy(quant_path("act_quant_s_e8m0"));
    ASSERT_EQ(gq.data.size(), q.nbytes());
    ASSERT_EQ(gs.data.size(), s.nbytes());
    int bad_q = 0, bad_s = 0;
    for (size_t i = 0; i < gq.data.size(); ++i) bad_q += q.ptr<uint8_t>()[i] != gq.data[i];
    for (size_t i = 0; i < gs.data.size(); ++i) bad_s += s.ptr<uint8_t>()[i] != gs.data[i];
    EXPECT_EQ(bad_q, 0);
    EXPECT_EQ(bad_s, 0);

    be.act_quant_fp8_inplace(x);
    const NpyArray gi = load_npy(quant_path("act_quant_inplace_bf16"));
    ASSERT_EQ(gi.data.size(), x.nbytes());
    EXPECT_EQ(std::memcmp(gi.data.data(), x.data, x.nbytes()), 0);
}

TEST(CpuQuant, Fp4BothScaleKindsMatchGoldenBitExact) {
    CpuBackend be(2);
    const GoldenInput g = golden_x();
    for (Fp4Scale kind : {Fp4Scale::E8M0_32, Fp4Scale::E4M3_16}) {
        const std::string tag = kind == Fp4Scale::E8M0_32 ? "fp4_e8m0" : "fp4_e4m3";
        SCOPED_TRACE(tag);
        const int64_t bs = cpuref::fp4_block_size(kind);
        const NpyArray packed = load_npy(quant_path(tag + "_packed"));
        const NpyArray scales = load_npy(quant_path(tag + "_s"));
        const NpyArray inplace = load_npy(quant_path(tag + "_inplace_bf16"));
        ASSERT_EQ(packed.numel(), g.M * g.K / 2);
        ASSERT_EQ(scales.numel(), g.M * g.K / bs);
        // The block quantizer: codes packed two per byte (even element in the low nibble) and scales.
        int bad_codes = 0, bad_scales = 0;
        const uint16_t* xs = g.x.as<uint16_t>();
        for (int64_t r = 0; r < g.M; ++r)
            for (int64_t b = 0; b < g.K / bs; ++b) {
                uint8_t codes[32], sbyte = 0;
                cpuref::fp4_quant_block(xs + r * g.K + b * bs, bs, kind, codes, &sbyte);
                bad_scales += sbyte != scales.data[static_cast<size_t>(r * (g.K / bs) + b)];
                for (int64_t i = 0; i < bs; i += 2) {
                    const uint8_t byte = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
                    bad_codes += byte != packed.data[static_cast<size_t>((r * g.K + b * bs + i) / 2)];
                }
            }
        EXPECT_EQ(bad_codes, 0);
        EXPECT_EQ(bad_scales, 0);
        // The backend op (in place).
        Tensor x = golden_x_tensor(be, g);
        be.fp4_quant_inplace(x, kind);
        ASSERT_EQ(inplace.data.size(), x.nbytes());
        EXPECT_EQ(std::memcmp(inplace.data.data(), x.data, x.nbytes()), 0);
    }
}

TEST(CpuQuant, E4m3ExhaustiveRoundTripAndTiesToEven) {
    // Every finite code round-trips; -0 keeps its sign; NaN codes map to NaN.
    for (int c = 0; c < 256; ++c) {
        const float v = e4m3_to_f32(static_cast<uint8_t>(c));
        if ((c & 0x7f) == 0x7f) {
            EXPECT_TRUE(std::isnan(v)) << c;
            continue;
        }
        EXPECT_EQ(f32_to_e4m3(v), c) << c;
    }
    // Midpoints between neighbouring positive codes round to the even code (RNE); just above
    // rounds up, just below rounds down; beyond 448 saturates.
    for (int c = 0; c < 0x7e; ++c) {
        const float lo = e4m3_to_f32(static_cast<uint8_t>(c)), hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
        const float mid = (lo + hi) / 2;  // exact in fp32
        const int even = (c % 2 == 0) ? c : c + 1;
        EXPECT_EQ(f32_to_e4m3(mid), even) << c;
        EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1e9f)), c + 1) << c;
        EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, -1e9f)), c) << c;
        EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | even) << c;
    }
    EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // the midpoint 448..(512) saturates, no NaN
    EXPECT_EQ(f32_to_e4m3(1e30f), 0x7e);
    EXPECT_EQ(f32_to_e4m3(-1e30f), 0xfe);
}

TEST(CpuQuant, E2m1ExhaustiveRoundTripAndTiesToEvenCode) {
    for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c) << c;
    for (int c = 0; c < 7; ++c) {
        const float lo = e2m1_to_f32(static_cast<uint8_t>(c)), hi = e2m1_to_f32(static_cast<uint8_t>(c + 1));
        const float mid = (lo + hi) / 2;
        const int even = (c % 2 == 0) ? c : c + 1;  // ties go to the even CODE (docs/MODEL.md 5.2)
        EXPECT_EQ(f32_to_e2m1(mid), even) << mid;
        EXPECT_EQ(f32_to_e2m1(-mid), 8 | even) << mid;
        EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, 10.0f)), c + 1) << mid;
        EXPECT_EQ(f32_to_e2m1(std::nextafter(mid, -10.0f)), c) << mid;
    }
    EXPECT_EQ(f32_to_e2m1(-0.0f), 8);
}

TEST(CpuQuant, CeilPow2ScaleKeepsExactPowersAndRoundsUp) {
    // amax * fp32(1/448) with a zero mantissa stays; anything else goes to the next power of two.
    EXPECT_EQ(ceil_pow2_scale(2.0f, 0.5f), 1.0f);
    EXPECT_EQ(ceil_pow2_scale(3.0f, 0.5f), 2.0f);
    EXPECT_EQ(ceil_pow2_scale(0.75f, 1.0f), 1.0f);
    EXPECT_EQ(ceil_pow2_scale(448.0f, kFp8MaxInv),
              f32_bits(448.0f * kFp8MaxInv) == f32_bits(1.0f) ? 1.0f : 2.0f);
    // The e8m0 byte is the scale's biased exponent.
    EXPECT_EQ(e8m0_of_pow2(1.0f), 127);
    EXPECT_EQ(e8m0_of_pow2(std::ldexp(1.0f, -20)), 107);
    // An all-zero block: the 1e-4 floor gives the scale 2^ceil(log2(1e-4 / 448)) = 2^-22.
    uint16_t zeros[32] = {};
    uint8_t q[32], sb = 0;
    const float s = cpuref::fp8_quant_block(zeros, 32, q, &sb);
    EXPECT_EQ(s, std::ldexp(1.0f, -22));
    EXPECT_EQ(sb, 127 - 22);
    for (uint8_t c : q) EXPECT_EQ(c, 0);
}

TEST(CpuQuant, E4m3ScaleDivisionEqualsReciprocalMultiplyForEveryBf16Amax) {
    // docs/MODEL.md 5.2 leaves open whether the E4M3 scale is e4m3(amax / 6) or e4m3(amax * fp32(1/6))
    // (CUDA torch turns `tensor / 6.0` into the latter). For every positive finite bf16 amax the two
    // give the same e4m3 scale, so the choice cannot change a bit.
    int differ = 0;
    for (uint32_t b = 1; b < 0x7f80; ++b) {
        float amax = bf16_to_f32(static_cast<uint16_t>(b));
        if (amax < kFp4E4m3AmaxFloor) amax = kFp4E4m3AmaxFloor;
        const uint8_t by_div = f32_to_e4m3(std::min(amax / 6.0f, 448.0f));
        const uint8_t by_mul = f32_to_e4m3(std::min(amax * kFp4MaxInv, 448.0f));
        differ += by_div != by_mul;
    }
    EXPECT_EQ(differ, 0);
}

TEST(CpuQuant, Fp4E4m3AllZeroBlockGetsMinimumScaleAndClampMatters) {
    // amax floor 6 * 2^-9: an all-zero block gets the scale 2^-9 (the smallest e4m3 subnormal).
    uint16_t zeros[16] = {};
    uint8_t codes[16], sb = 0;
    EXPECT_EQ(cpuref::fp4_quant_block(zeros, 16, Fp4Scale::E4M3_16, codes, &sb), std::ldexp(1.0f, -9));
    EXPECT_EQ(sb, 0x01);
    // A scale rounded below amax / 6 pushes |x / s| above 6: the clamp keeps the code at 6.
    // amax = 6.25 -> amax / 6 = 1.0417 -> e4m3 1.0 (RNE) -> 6.25 / 1.0 = 6.25 -> clamped to 6.
    uint16_t blk[16] = {};
    blk[3] = f32_to_bf16(6.25f);
    EXPECT_EQ(cpuref::fp4_quant_block(blk, 16, Fp4Scale::E4M3_16, codes, &sb), 1.0f);
    EXPECT_EQ(codes[3], 7);  // magnitude 6
}
