// CPU RoPE tables and rotation (docs/MODEL.md 4.0, 8.3) and RMSNorm (4.0).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "cpu_test_util.h"
#include "ds4r/npy.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

struct UlpHistogram {
    int64_t exact = 0, one = 0, more = 0, max = 0;
    void add(int64_t d) {
        (d == 0 ? exact : d == 1 ? one : more) += 1;
        max = std::max(max, d);
    }
};

// Compares a table with a golden one; returns the ulp histogram over all (cos, sin) entries.
UlpHistogram compare(const float* got, const NpyArray& golden) {
    UlpHistogram h;
    const float* g = golden.as<float>();
    for (int64_t i = 0; i < golden.numel(); ++i) h.add(ulp_distance(got[i], g[i]));
    return h;
}

}  // namespace

TEST(CpuRope, TablesMatchTheGoldenTablesBitForBit) {
    // tiny-a: rd = 16; plain = base 1e4 without YaRN, yarn = base 1.6e5, orig 32, factor 16, beta 32/1.
    CpuBackend be(2);
    struct Case {
        const char* file;
        double base;
        int64_t orig;
    } cases[] = {{"rope_plain.npy", 10000.0, 0}, {"rope_yarn.npy", 160000.0, 32}};
    for (const Case& c : cases) {
        SCOPED_TRACE(c.file);
        const NpyArray golden = load_npy(test::data_dir() + "/tiny-a/" + c.file);
        ASSERT_EQ(golden.descr, "<f4");
        ASSERT_EQ(golden.shape.size(), 3u);
        const int64_t n_pos = golden.shape[0], rd = 2 * golden.shape[1];
        Tensor t = make(be, DType::F32, {n_pos, rd / 2, 2});
        be.rope_table(c.base, 16.0, c.orig, 32.0, 1.0, rd, t);
        const UlpHistogram ours = compare(t.ptr<float>(), golden);
        // The alternative evaluation: cos / sin of the fp32 angle in double, rounded once.
        std::vector<float> f(static_cast<size_t>(rd / 2)), alt(static_cast<size_t>(golden.numel()));
        cpuref::rope_inv_freqs(c.base, 16.0, c.orig, 32.0, 1.0, rd, f.data());
        for (int64_t p = 0; p < n_pos; ++p)
            for (int64_t i = 0; i < rd / 2; ++i) {
                const float a = static_cast<float>(p) * f[size_t(i)];
                alt[size_t((p * rd / 2 + i) * 2)] = static_cast<float>(std::cos(static_cast<double>(a)));
                alt[size_t((p * rd / 2 + i) * 2 + 1)] = static_cast<float>(std::sin(static_cast<double>(a)));
            }
        const UlpHistogram rounded = compare(alt.data(), golden);
        std::cout << "[ rope ulp ] " << c.file << " (" << golden.numel() << " values): ours 0 ulp "
                  << ours.exact << ", 1 ulp " << ours.one << ", 2+ ulp " << ours.more
                  << " | correctly rounded cos/sin: 0 ulp " << rounded.exact << ", 1 ulp " << rounded.one
                  << ", 2+ ulp " << rounded.more << "\n";
        RecordProperty(std::string(c.file) + "_ours_max_ulp", static_cast<int>(ours.max));
        RecordProperty(std::string(c.file) + "_correctly_rounded_1ulp", static_cast<int>(rounded.one));
        EXPECT_EQ(ours.max, 0);  // bit for bit (glibc cosf / sinf of the fp32 angle, as torch's CPU polar)
        EXPECT_LE(rounded.max, 1);
    }
}

TEST(CpuRope, YarnBandAndBlendOfTheReleasedModel) {
    int64_t low = 0, high = 0;
    yarn_band(160000.0, 65536, 32.0, 1.0, 64, &low, &high);
    EXPECT_EQ(low, 15);  // docs/MODEL.md 4.0: pairs 0..15 keep their frequency, >= 25 are divided by 16
    EXPECT_EQ(high, 25);
    yarn_band(160000.0, 32, 32.0, 1.0, 16, &low, &high);
    EXPECT_EQ(low, 0);
    EXPECT_EQ(high, 2);
    float plain[32], yarn[32];
    cpuref::rope_inv_freqs(160000.0, 16.0, 0, 32.0, 1.0, 64, plain);
    cpuref::rope_inv_freqs(160000.0, 16.0, 65536, 32.0, 1.0, 64, yarn);
    for (int i = 0; i <= 15; ++i) EXPECT_EQ(yarn[i], plain[i]) << i;
    for (int i = 25; i < 32; ++i) EXPECT_EQ(yarn[i], plain[i] / 16.0f) << i;
    for (int i = 16; i < 25; ++i) {
        EXPECT_LT(yarn[i], plain[i]) << i;
        EXPECT_GT(yarn[i], plain[i] / 16.0f) << i;
    }
    EXPECT_EQ(plain[0], 1.0f);
}

TEST(CpuRope, RotatesInterleavedPairsOfEachHeadsTailInFp32) {
    CpuBackend be(1);
    Rng rng(4);
    const int64_t M = 3, heads = 2, width = 8, rd = 4, n_pos = 10;
    Tensor table = make(be, DType::F32, {n_pos, rd / 2, 2});
    be.rope_table(10000.0, 16.0, 0, 32.0, 1.0, rd, table);
    Tensor x = random_bf16(be, {M, heads * width}, rng);
    Tensor pos = i32_from(be, {M}, {0, 7, 3});
    for (bool inverse : {false, true}) {
        Tensor y = clone(be, x);
        be.rope_inplace(y, heads, width, rd, pos, table, inverse);
        for (int64_t r = 0; r < M; ++r)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t d = 0; d < width; ++d) {
                    const int64_t col = r * heads * width + h * width + d;
                    if (d < width - rd) {  // the nope dims are untouched
                        EXPECT_EQ(y.ptr<uint16_t>()[col], x.ptr<uint16_t>()[col]);
                        continue;
                    }
                    const int64_t i = (d - (width - rd)) / 2;
                    const int64_t pair = col - (d - (width - rd)) % 2;
                    const float a = bf16_to_f32(x.ptr<uint16_t>()[pair]),
                                b = bf16_to_f32(x.ptr<uint16_t>()[pair + 1]);
                    const float* cs = table.ptr<float>() + (pos.ptr<int32_t>()[r] * (rd / 2) + i) * 2;
                    const float c = cs[0], s = inverse ? -cs[1] : cs[1];
                    const float ac = a * c, bs = b * s, as = a * s, bc = b * c;
                    const float want = (d - (width - rd)) % 2 == 0 ? ac - bs : as + bc;
                    EXPECT_EQ(y.ptr<uint16_t>()[col], f32_to_bf16(want)) << r << " " << h << " " << d;
                }
        if (!inverse) {
            // position 0 is the identity rotation
            for (int64_t c = 0; c < heads * width; ++c) EXPECT_EQ(y.ptr<uint16_t>()[c], x.ptr<uint16_t>()[c]);
        }
    }
    // De-rotation undoes the rotation up to bf16 rounding.
    Tensor z = clone(be, x);
    be.rope_inplace(z, heads, width, rd, pos, table, false);
    be.rope_inplace(z, heads, width, rd, pos, table, true);
    for (int64_t i = 0; i < x.numel(); ++i)
        EXPECT_NEAR(bf16_to_f32(z.ptr<uint16_t>()[i]), bf16_to_f32(x.ptr<uint16_t>()[i]),
                    0.02 * std::fabs(bf16_to_f32(x.ptr<uint16_t>()[i])) + 0.02);
    Tensor bad = i32_from(be, {M}, {0, 10, 3});
    EXPECT_THROW(be.rope_inplace(z, heads, width, rd, bad, table, false), RuntimeError);
}

TEST(CpuRmsNorm, MatchesTheFormulaWithCudaMeanAndExactRsqrt) {
    CpuBackend be(2);
    Rng rng(2);
    const int64_t M = 4, N = 80;  // N = 80: 1/N is not a power of two
    Tensor x = random_bf16(be, {M, N}, rng, 3.0f);
    Tensor w = random_bf16(be, {N}, rng);
    Tensor y = make(be, DType::BF16, {M, N});
    const float eps = 1e-20f;
    be.rms_norm(x, w, eps, y);
    for (int64_t r = 0; r < M; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < N; ++i) ss += std::pow(double(bf16_to_f32(x.ptr<uint16_t>()[r * N + i])), 2);
        const float var = static_cast<float>(ss) * (1.0f / static_cast<float>(N));  // torch.mean on CUDA
        const float rs = static_cast<float>(1.0 / std::sqrt(double(var + eps)));
        for (int64_t i = 0; i < N; ++i) {
            const float xn = bf16_to_f32(x.ptr<uint16_t>()[r * N + i]) * rs;
            EXPECT_EQ(y.ptr<uint16_t>()[r * N + i], f32_to_bf16(bf16_to_f32(w.ptr<uint16_t>()[i]) * xn));
        }
    }
    // In place (y aliases x) gives the same bytes.
    Tensor x2 = clone(be, x);
    be.rms_norm(x2, w, eps, x2);
    EXPECT_TRUE(same_bytes(x2, y));
    // An all-zero row stays zero (eps keeps rsqrt finite).
    Tensor z = make(be, DType::BF16, {1, N});
    Tensor zy = make(be, DType::BF16, {1, N});
    be.rms_norm(z, w, eps, zy);
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(bf16_to_f32(zy.ptr<uint16_t>()[i]), 0.0f);
}

TEST(CpuRmsNorm, MeanIsTheSumTimesTheFp32ReciprocalAsCudaTorchMean) {
    // ATen's CUDA mean (ReduceMomentKernel.cu, MeanOps::project) multiplies the sum by
    // float(1) / n. For n = 5120 (the model's D) that differs from a true division for some sums;
    // for powers of two (all of tiny-a's norm widths) the two agree.
    int differ = 0;
    for (uint32_t b = 0x45000000u; b < 0x45000000u + 20000u; ++b) {
        const float sum = bits_f32(b);
        EXPECT_EQ(cpuref::mean_from_sum(sum, 5120), sum * (1.0f / 5120.0f));
        EXPECT_EQ(cpuref::mean_from_sum(sum, 256), sum / 256.0f);
        differ += cpuref::mean_from_sum(sum, 5120) != sum / 5120.0f;
    }
    EXPECT_GT(differ, 0);
}
