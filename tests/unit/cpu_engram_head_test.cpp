// CPU Engram update (docs/MODEL.md 4.8) and output head statistics (4.9, docs/DESIGN.md 2).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

TEST(CpuEngram, MatchesTheReferenceFormulaPerCopy) {
    CpuBackend be(2);
    Rng rng(55);
    const int64_t M = 3, hc = 4, D = 48;
    Tensor X = random_bf16(be, {M, hc, D}, rng);
    Tensor kv = random_bf16(be, {M, (hc + 1) * D}, rng, 2.0f);
    Tensor qw = random_bf16(be, {hc, D}, rng), kw = random_bf16(be, {hc, D}, rng);
    Tensor Y = clone(be, X);
    const float eps = 1e-20f;
    be.engram_update(Y, kv, qw, kw, eps);
    auto bf = [](const Tensor& t, int64_t i) { return bf16_to_f32(t.ptr<uint16_t>()[i]); };
    for (int64_t r = 0; r < M; ++r)
        for (int64_t k = 0; k < hc; ++k) {
            double sh = 0, sk = 0, dot = 0;
            for (int64_t d = 0; d < D; ++d) {
                const float h = bf(X, (r * hc + k) * D + d), key = bf(kv, r * (hc + 1) * D + k * D + d);
                const float wt = bf(qw, k * D + d) * bf(kw, k * D + d);
                sh += double(h) * h;
                sk += double(key) * key;
                dot += (h * wt) * key;  // (h * weight * key): fp32 products, left to right
            }
            const float inv_d = 1.0f / float(D);
            const float rstd = float(1.0 / std::sqrt(double(float(sh) * inv_d + eps))) *
                               float(1.0 / std::sqrt(double(float(sk) * inv_d + eps)));
            const float dd = (float(dot) * rstd) * float(std::pow(double(D), -0.5));
            const float gate =
                1.0f / (1.0f + std::exp(-std::copysign(std::sqrt(std::max(std::fabs(dd), 1e-6f)), dd)));
            for (int64_t d = 0; d < D; ++d) {
                const float want = bf(X, (r * hc + k) * D + d) + gate * bf(kv, r * (hc + 1) * D + hc * D + d);
                EXPECT_EQ(Y.ptr<uint16_t>()[(r * hc + k) * D + d], f32_to_bf16(want))
                    << r << " " << k << " " << d;
            }
        }
}

TEST(CpuEngram, ZeroDotTakesThePositiveSignedRootFloor) {
    // h = 0: dot = +0, so gate = sigmoid(+sqrt(1e-6)) ~ 0.50025, never sigmoid(0) or sigmoid(-0.001).
    CpuBackend be(1);
    Rng rng(3);
    const int64_t hc = 2, D = 32;
    Tensor X = make(be, DType::BF16, {1, hc, D});
    Tensor kv = random_bf16(be, {1, (hc + 1) * D}, rng);
    Tensor qw = random_bf16(be, {hc, D}, rng), kw = random_bf16(be, {hc, D}, rng);
    be.engram_update(X, kv, qw, kw, 1e-20f);
    const float gate = 1.0f / (1.0f + std::exp(-std::sqrt(1e-6f)));
    for (int64_t k = 0; k < hc; ++k)
        for (int64_t d = 0; d < D; ++d)
            EXPECT_EQ(X.ptr<uint16_t>()[k * D + d],
                      f32_to_bf16(0.0f + gate * bf16_to_f32(kv.ptr<uint16_t>()[hc * D + d])));
}

TEST(CpuHead, StatisticsMatchANaiveDoubleLogSoftmax) {
    CpuBackend be(3);
    Rng rng(8);
    const int64_t M = 4, V = 700, D = 40;
    Tensor x = random_bf16(be, {M, D}, rng);
    Tensor head = random_bf16(be, {V, D}, rng, 0.5f);
    // rows 5 and 9 of the head identical: their logits tie, the lower id must come first
    for (int64_t d = 0; d < D; ++d) head.ptr<uint16_t>()[9 * D + d] = head.ptr<uint16_t>()[5 * D + d];
    // make them the top logit of row 0 by aligning them with x[0]
    for (int64_t d = 0; d < D; ++d)
        head.ptr<uint16_t>()[5 * D + d] = head.ptr<uint16_t>()[9 * D + d] =
            f32_to_bf16(4.0f * bf16_to_f32(x.ptr<uint16_t>()[d]));
    const int k = 5;
    Tensor targets = i32_from(be, {M}, {9, 0, -1, 699});
    HeadStatsOut out{make(be, DType::F64, {M}), make(be, DType::F64, {M}),    make(be, DType::F32, {M}),
                     make(be, DType::I32, {M}), make(be, DType::I32, {M, k}), make(be, DType::F32, {M, k})};
    be.head_stats(x, head, targets, k, out);
    for (int64_t r = 0; r < M; ++r) {
        std::vector<float> logit(static_cast<size_t>(V));
        for (int64_t v = 0; v < V; ++v) {
            double s = 0;
            for (int64_t d = 0; d < D; ++d)
                s += double(bf16_to_f32(x.ptr<uint16_t>()[r * D + d])) *
                     bf16_to_f32(head.ptr<uint16_t>()[v * D + d]);
            logit[size_t(v)] = float(s);
        }
        long double mx = -INFINITY, z = 0, pl = 0;
        for (float l : logit) mx = std::max(mx, (long double)l);
        for (float l : logit) z += std::exp((long double)l - mx);
        const long double lse = mx + std::log(z);
        for (float l : logit) pl += std::exp((long double)l - lse) * l;
        EXPECT_NEAR(out.lse.ptr<double>()[r], double(lse), 1e-12 * std::fabs(double(lse)) + 1e-12);
        EXPECT_NEAR(out.entropy.ptr<double>()[r], double(lse - pl), 1e-10);
        EXPECT_GT(out.entropy.ptr<double>()[r], 0.0);
        EXPECT_LE(out.entropy.ptr<double>()[r], std::log(double(V)) + 1e-9);
        const int32_t t = targets.ptr<int32_t>()[r];
        if (t >= 0) {
            int above = 0;
            for (float l : logit) above += l > logit[size_t(t)];
            EXPECT_EQ(out.target_logit.ptr<float>()[r], logit[size_t(t)]);
            EXPECT_EQ(out.rank.ptr<int32_t>()[r], 1 + above);
        } else {
            EXPECT_EQ(out.rank.ptr<int32_t>()[r], 0);
            EXPECT_EQ(out.target_logit.ptr<float>()[r], 0.0f);
        }
        for (int i = 0; i < k; ++i) {
            const int32_t id = out.topk_ids.ptr<int32_t>()[r * k + i];
            EXPECT_EQ(out.topk_logit.ptr<float>()[r * k + i], logit[size_t(id)]);
            if (i > 0) {
                const int32_t prev = out.topk_ids.ptr<int32_t>()[r * k + i - 1];
                EXPECT_TRUE(logit[size_t(prev)] > logit[size_t(id)] ||
                            (logit[size_t(prev)] == logit[size_t(id)] && prev < id));
            }
        }
        int64_t better = 0;  // nothing outside the top-k beats its last entry
        for (float l : logit) better += l > out.topk_logit.ptr<float>()[r * k + k - 1];
        EXPECT_LE(better, k - 1);
    }
    // row 0: ids 5 and 9 tie for the top logit -> 5 first, then 9; the target 9 has rank 1
    EXPECT_EQ(out.topk_ids.ptr<int32_t>()[0], 5);
    EXPECT_EQ(out.topk_ids.ptr<int32_t>()[1], 9);
    EXPECT_EQ(out.rank.ptr<int32_t>()[0], 1);
    Tensor bad = i32_from(be, {M}, {0, 0, 0, 700});
    EXPECT_THROW(be.head_stats(x, head, bad, k, out), RuntimeError);
}
