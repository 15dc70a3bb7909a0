// CPU hyper-connection ops (docs/MODEL.md 4.5, 5.5, 8.2).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

// model.py Block.hc_mixes + kernel hc_split_sinkhorn for one token, transcribed line by line.
void transcribed_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base, int hc,
                       int64_t D, float norm_eps, float eps, int iters, float* pre, float* post,
                       float* comb) {
    const int64_t n = hc * D;
    const int mix = (2 + hc) * hc;
    // x.square().mean(-1): the squares of bf16 values are exact; the sum model is exact-then-round
    double ss = 0;
    for (int64_t c = 0; c < n; ++c) ss += double(bf16_to_f32(X[c])) * bf16_to_f32(X[c]);
    const float mean = static_cast<float>(ss) * (1.0f / static_cast<float>(n));
    const float rsq = static_cast<float>(1.0 / std::sqrt(double(mean + norm_eps)));
    std::vector<float> m(static_cast<size_t>(mix));
    for (int i = 0; i < mix; ++i) {
        double s = 0;
        for (int64_t c = 0; c < n; ++c) s += double(bf16_to_f32(X[c])) * fn[i * n + c];
        m[size_t(i)] = static_cast<float>(s) * rsq;  // F.linear(x, hc_fn) * rsqrt
    }
    for (int k = 0; k < hc; ++k) {
        const float a = m[size_t(k)] * scale[0] + base[k];
        pre[k] = 1.0f / (1.0f + std::exp(-a)) + eps;
        const float b = m[size_t(hc + k)] * scale[1] + base[hc + k];
        post[k] = 2.0f * (1.0f / (1.0f + std::exp(-b)));
    }
    std::vector<float> c(static_cast<size_t>(hc * hc));
    for (int i = 0; i < hc * hc; ++i) c[size_t(i)] = m[size_t(2 * hc + i)] * scale[2] + base[2 * hc + i];
    for (int j = 0; j < hc; ++j) {  // comb = exp(comb - amax(-1)); comb / sum(-1) + eps
        float mx = -INFINITY;
        for (int k = 0; k < hc; ++k) mx = std::max(mx, c[size_t(j * hc + k)]);
        float s = 0;
        for (int k = 0; k < hc; ++k) s += (c[size_t(j * hc + k)] = std::exp(c[size_t(j * hc + k)] - mx));
        for (int k = 0; k < hc; ++k) c[size_t(j * hc + k)] = c[size_t(j * hc + k)] / s + eps;
    }
    auto cols = [&] {
        for (int k = 0; k < hc; ++k) {
            float s = 0;
            for (int j = 0; j < hc; ++j) s += c[size_t(j * hc + k)];
            for (int j = 0; j < hc; ++j) c[size_t(j * hc + k)] /= (s + eps);
        }
    };
    auto rows = [&] {
        for (int j = 0; j < hc; ++j) {
            float s = 0;
            for (int k = 0; k < hc; ++k) s += c[size_t(j * hc + k)];
            for (int k = 0; k < hc; ++k) c[size_t(j * hc + k)] /= (s + eps);
        }
    };
    cols();
    for (int it = 0; it < iters - 1; ++it) {
        rows();
        cols();
    }
    std::copy(c.begin(), c.end(), comb);
}

struct MixCase {
    Tensor X, fn, scale, base;
    int64_t M, hc, D;
};
MixCase random_mix_case(CpuBackend& be, Rng& rng, int64_t M, int64_t hc, int64_t D) {
    MixCase c{random_bf16(be, {M, hc, D}, rng),
              random_f32(be, {(2 + hc) * hc, hc * D}, rng, 0.05f),
              f32_from(be, {3}, {0.7f, 0.3f, 1.9f}),
              random_f32(be, {(2 + hc) * hc}, rng, 0.5f),
              M,
              hc,
              D};
    return c;
}

}  // namespace

TEST(CpuHc, MixesMatchADirectTranscriptionBitForBit) {
    CpuBackend be(3);
    Rng rng(21);
    MixCase c = random_mix_case(be, rng, 5, 4, 48);
    Tensor pre = make(be, DType::F32, {c.M, c.hc}), post = make(be, DType::F32, {c.M, c.hc});
    Tensor comb = make(be, DType::F32, {c.M, c.hc, c.hc});
    be.hc_mixes(c.X, c.fn, c.scale, c.base, 1e-20f, 1e-6f, 20, pre, post, comb);
    for (int64_t r = 0; r < c.M; ++r) {
        float p[4], q[4], cm[16];
        transcribed_mixes(c.X.ptr<uint16_t>() + r * c.hc * c.D, c.fn.ptr<float>(), c.scale.ptr<float>(),
                          c.base.ptr<float>(), 4, c.D, 1e-20f, 1e-6f, 20, p, q, cm);
        for (int k = 0; k < 4; ++k) {
            EXPECT_EQ(pre.ptr<float>()[r * 4 + k], p[k]);
            EXPECT_EQ(post.ptr<float>()[r * 4 + k], q[k]);
        }
        for (int i = 0; i < 16; ++i) EXPECT_EQ(comb.ptr<float>()[r * 16 + i], cm[i]);
    }
}

TEST(CpuHc, SinkhornCombIsDoublyStochasticAndGatesAreInRange) {
    CpuBackend be(1);
    Rng rng(9);
    MixCase c = random_mix_case(be, rng, 6, 4, 32);
    Tensor pre = make(be, DType::F32, {c.M, c.hc}), post = make(be, DType::F32, {c.M, c.hc});
    Tensor comb = make(be, DType::F32, {c.M, c.hc, c.hc});
    be.hc_mixes(c.X, c.fn, c.scale, c.base, 1e-20f, 1e-6f, 20, pre, post, comb);
    for (int64_t r = 0; r < c.M; ++r) {
        const float* cm = comb.ptr<float>() + r * 16;
        for (int k = 0; k < 4; ++k) {
            float col = 0, row = 0;
            for (int j = 0; j < 4; ++j) col += cm[j * 4 + k], row += cm[k * 4 + j];
            EXPECT_NEAR(col, 1.0f, 1e-5f);  // the last step is a column normalization
            EXPECT_NEAR(row, 1.0f, 1e-3f);  // rows converge after 20 iterations
            EXPECT_GT(pre.ptr<float>()[r * 4 + k], 1e-6f);
            EXPECT_LT(pre.ptr<float>()[r * 4 + k], 1.0f + 2e-6f);
            EXPECT_GT(post.ptr<float>()[r * 4 + k], 0.0f);
            EXPECT_LT(post.ptr<float>()[r * 4 + k], 2.0f);
        }
    }
}

TEST(CpuHc, PreSumsSequentiallyInFp32) {
    // ((2^24 + 1) + 1) - 2^24 = 0 in sequential fp32; the exact sum (2) or a pairwise one (1) differ.
    CpuBackend be(1);
    Tensor X = bf16_from(be, {1, 4, 1}, {16777216.0f, 1.0f, 1.0f, -16777216.0f});
    Tensor mix = f32_from(be, {1, 4}, {1, 1, 1, 1});
    Tensor y = make(be, DType::BF16, {1, 1});
    be.hc_pre(X, mix, y);
    EXPECT_EQ(bf16_to_f32(y.ptr<uint16_t>()[0]), 0.0f);
    // Products are fp32: mix 0.1 * X 3 rounds before the add.
    Tensor X2 = bf16_from(be, {1, 4, 1}, {3.0f, 0, 0, 0});
    Tensor mix2 = f32_from(be, {1, 4}, {0.1f, 0, 0, 0});
    be.hc_pre(X2, mix2, y);
    EXPECT_EQ(y.ptr<uint16_t>()[0], f32_to_bf16(0.1f * 3.0f));
}

TEST(CpuHc, PostUsesCombColumnsAndMayAliasTheResidual) {
    CpuBackend be(2);
    Rng rng(17);
    const int64_t M = 3, hc = 4, D = 40;
    Tensor x = random_bf16(be, {M, D}, rng);
    Tensor R = random_bf16(be, {M, hc, D}, rng);
    Tensor post = random_f32(be, {M, hc}, rng);
    Tensor comb = random_f32(be, {M, hc, hc}, rng);
    Tensor out = make(be, DType::BF16, {M, hc, D});
    be.hc_post(x, R, post, comb, out);
    for (int64_t r = 0; r < M; ++r)
        for (int64_t k = 0; k < hc; ++k)
            for (int64_t d = 0; d < D; ++d) {
                float s = 0.0f;  // S_k = sum over the ROW index j of comb[j][k] * R_j
                for (int64_t j = 0; j < hc; ++j)
                    s += comb.ptr<float>()[(r * hc + j) * hc + k] *
                         bf16_to_f32(R.ptr<uint16_t>()[(r * hc + j) * D + d]);
                const float want =
                    post.ptr<float>()[r * hc + k] * bf16_to_f32(x.ptr<uint16_t>()[r * D + d]) + s;
                EXPECT_EQ(out.ptr<uint16_t>()[(r * hc + k) * D + d], f32_to_bf16(want));
            }
    Tensor R2 = clone(be, R);
    be.hc_post(x, R2, post, comb, R2);
    EXPECT_TRUE(same_bytes(R2, out));
}
