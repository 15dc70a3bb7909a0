// CPU MoE (docs/MODEL.md 4.7, 8.1, 8.2): router, routed fp4 experts summed in expert-id order, shared expert.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

struct MoeCase {
    MoeWeights w;
    int64_t E, D, I;
};

MoeCase random_moe(CpuBackend& be, Rng& rng, int64_t E, int64_t D, int64_t I) {
    MoeCase c{{}, E, D, I};
    c.w.gate_w = random_bf16(be, {E, D}, rng, 0.2f);
    c.w.gate_bias = random_f32(be, {E}, rng, 0.05f);
    c.w.sw1 = random_fp8_linear(be, I, D, rng);
    c.w.sw3 = random_fp8_linear(be, I, D, rng);
    c.w.sw2 = random_fp8_linear(be, D, I, rng);
    for (int64_t e = 0; e < E; ++e)
        c.w.experts.push_back({random_fp4_linear(be, I, D, rng), random_fp4_linear(be, D, I, rng),
                               random_fp4_linear(be, I, D, rng)});
    return c;
}

float swiglu_ref(float g, float u, float limit) {
    u = std::min(std::max(u, -limit), limit);
    g = std::min(g, limit);
    return (g / (1.0f + std::exp(-g))) * u;
}

// One expert (or the shared expert with weight < 0 meaning "none") applied to one token row through
// the public linear ops.
template <class Lin, class LinFn>
std::vector<float> expert_row(CpuBackend& be, const Tensor& xrow, const Lin& w1, const Lin& w3, const Lin& w2,
                              int64_t I, int64_t D, float weight, float limit, LinFn lin) {
    Tensor g = make(be, DType::BF16, {1, I}), u = make(be, DType::BF16, {1, I});
    lin(xrow, w1, g);
    lin(xrow, w3, u);
    std::vector<float> a(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
        float v = swiglu_ref(bf16_to_f32(g.ptr<uint16_t>()[i]), bf16_to_f32(u.ptr<uint16_t>()[i]), limit);
        if (weight >= 0) v = weight * v;
        a[size_t(i)] = v;
    }
    Tensor ab = bf16_from(be, {1, I}, a), out = make(be, DType::BF16, {1, D});
    lin(ab, w2, out);
    return values(out);
}

}  // namespace

TEST(CpuMoe, RouterAndExpertCompositionMatchTheReferenceFormulas) {
    CpuBackend be(3);
    Rng rng(77);
    const int64_t M = 5;
    MoeCase c = random_moe(be, rng, 12, 64, 32);
    MoeParams p;            // topk 6, route_scale 1.5, swiglu_limit 10, gate_temp 1
    p.swiglu_limit = 0.5f;  // small enough that the clamps bite
    Tensor x = random_bf16(be, {M, c.D}, rng);
    Tensor y = make(be, DType::BF16, {M, c.D});
    Tensor ridx = make(be, DType::I32, {M, p.topk}), rw = make(be, DType::F32, {M, p.topk});
    be.moe(x, c.w, p, y, ridx, rw);
    auto fp4 = [&](const Tensor& a, const Fp4Linear& l, const Tensor& o) { be.linear_fp4(a, l, o); };
    auto fp8 = [&](const Tensor& a, const Fp8Linear& l, const Tensor& o) { be.linear_fp8(a, l, o); };
    for (int64_t r = 0; r < M; ++r) {
        std::vector<float> score(size_t(c.E)), biased(size_t(c.E));
        for (int64_t e = 0; e < c.E; ++e) {
            double s = 0;
            for (int64_t d = 0; d < c.D; ++d)
                s += double(bf16_to_f32(x.ptr<uint16_t>()[r * c.D + d])) *
                     bf16_to_f32(c.w.gate_w.ptr<uint16_t>()[e * c.D + d]);
            const float l = static_cast<float>(s);
            score[size_t(e)] = std::sqrt(l > 20.0f ? l : std::log1p(std::exp(l)));
            biased[size_t(e)] = score[size_t(e)] + c.w.gate_bias.ptr<float>()[e];
        }
        const std::vector<int64_t> top = cpuref::topk_sorted_desc_cuda_rule(biased.data(), c.E, 6);
        float wv[6];
        for (int i = 0; i < 6; ++i) wv[i] = score[size_t(top[size_t(i)])];
        const float denom = ((wv[0] + wv[4]) + wv[2]) + ((wv[1] + wv[5]) + wv[3]) + 1e-20f;
        for (int i = 0; i < 6; ++i) {
            wv[i] = wv[i] / denom * 1.5f;
            EXPECT_EQ(ridx.ptr<int32_t>()[r * 6 + i], top[size_t(i)]);
            EXPECT_EQ(rw.ptr<float>()[r * 6 + i], wv[i]);
            if (i > 0) {
                EXPECT_GE(biased[size_t(top[size_t(i - 1)])], biased[size_t(top[size_t(i)])]);
            }
        }
        Tensor xr = copy_rows(be, x, r, r + 1);
        std::vector<float> acc(size_t(c.D), 0.0f);
        for (int64_t e = 0; e < c.E; ++e)  // expert-id order
            for (int i = 0; i < 6; ++i) {
                if (top[size_t(i)] != e) continue;
                const ExpertWeights& ew = c.w.experts[size_t(e)];
                const std::vector<float> o =
                    expert_row(be, xr, ew.w1, ew.w3, ew.w2, c.I, c.D, wv[i], p.swiglu_limit, fp4);
                for (int64_t d = 0; d < c.D; ++d) acc[size_t(d)] += o[size_t(d)];
            }
        const std::vector<float> sh =
            expert_row(be, xr, c.w.sw1, c.w.sw3, c.w.sw2, c.I, c.D, -1.0f, p.swiglu_limit, fp8);
        for (int64_t d = 0; d < c.D; ++d)
            EXPECT_EQ(y.ptr<uint16_t>()[r * c.D + d], f32_to_bf16(acc[size_t(d)] + sh[size_t(d)]))
                << r << " " << d;
    }
}

TEST(CpuMoe, ContributionsAreSummedInExpertIdOrderNotRankOrder) {
    // Rank order is [1, 2, 0, 3, 4, 5]. Expert 1 outputs B ~ 2^60, expert 2 exactly -B (same weights
    // and routing weight, w2 with every sign flipped), expert 0 a small s, experts 3-5 and the shared
    // expert 0. Expert-id order: ((s + B) - B) = 0 in fp32; rank order: ((B - B) + s) = s != 0.
    CpuBackend be(2);
    Rng rng(5);
    const int64_t E = 8, D = 32, I = 32;
    MoeCase c = random_moe(be, rng, E, D, I);
    const float gate_logit[E] = {4, 5, 5, 3, 2.5f, 2, -10, -10};
    be.fill(c.w.gate_w, 0);
    be.fill(c.w.gate_bias, 0);
    for (int64_t e = 0; e < E; ++e) c.w.gate_w.ptr<uint16_t>()[e * D] = f32_to_bf16(gate_logit[e]);
    ExpertWeights& e1 = c.w.experts[1];
    ExpertWeights& e2 = c.w.experts[2];
    for (int64_t i = 0; i < e1.w1.w.numel(); ++i) e2.w1.w.ptr<uint8_t>()[i] = e1.w1.w.ptr<uint8_t>()[i];
    for (int64_t i = 0; i < e1.w3.w.numel(); ++i) e2.w3.w.ptr<uint8_t>()[i] = e1.w3.w.ptr<uint8_t>()[i];
    for (int64_t i = 0; i < e1.w2.w.numel(); ++i)
        e2.w2.w.ptr<uint8_t>()[i] = e1.w2.w.ptr<uint8_t>()[i] ^ 0x88;
    for (const Tensor* s : {&e1.w1.s, &e1.w3.s, &e1.w2.s})
        for (int64_t i = 0; i < s->numel(); ++i) s->ptr<uint8_t>()[i] = 127;
    be.fill(e1.w2.s, 127 + 60);  // expert 1 (and 2): outputs around 2^60
    std::memcpy(e2.w1.s.data, e1.w1.s.data, e1.w1.s.nbytes());
    std::memcpy(e2.w3.s.data, e1.w3.s.data, e1.w3.s.nbytes());
    std::memcpy(e2.w2.s.data, e1.w2.s.data, e1.w2.s.nbytes());
    for (int64_t e = 3; e < E; ++e) be.fill(c.w.experts[size_t(e)].w2.w, 0);
    be.fill(c.w.sw2.w, 0);
    std::vector<float> xv(size_t(D), 0.0f);
    xv[0] = 1.0f;
    for (int64_t d = 1; d < D; ++d) xv[size_t(d)] = 0.25f * rng.normal();
    xv[0] = 1.0f;
    Tensor x = bf16_from(be, {1, D}, xv);
    // gate: only column 0 of gate_w is set, so the logits are x[0] * gate_logit = gate_logit
    Tensor y = make(be, DType::BF16, {1, D});
    Tensor ridx = make(be, DType::I32, {1, 6}), rw = make(be, DType::F32, {1, 6});
    MoeParams p;
    be.moe(x, c.w, p, y, ridx, rw);
    const std::vector<int32_t> rank = {1, 2, 0, 3, 4, 5};
    for (int i = 0; i < 6; ++i) EXPECT_EQ(ridx.ptr<int32_t>()[i], rank[size_t(i)]);
    EXPECT_EQ(rw.ptr<float>()[0], rw.ptr<float>()[1]);
    // The small expert's own output is nonzero: rank-order summation would have kept it.
    auto fp4 = [&](const Tensor& a, const Fp4Linear& l, const Tensor& o) { be.linear_fp4(a, l, o); };
    const ExpertWeights& e0 = c.w.experts[0];
    const std::vector<float> s =
        expert_row(be, x, e0.w1, e0.w3, e0.w2, I, D, rw.ptr<float>()[2], p.swiglu_limit, fp4);
    const std::vector<float> big =
        expert_row(be, x, e1.w1, e1.w3, e1.w2, I, D, rw.ptr<float>()[0], p.swiglu_limit, fp4);
    int nonzero_s = 0, big_enough = 0;
    for (int64_t d = 0; d < D; ++d) {
        nonzero_s += s[size_t(d)] != 0.0f;
        big_enough += std::fabs(big[size_t(d)]) > std::ldexp(std::fabs(s[size_t(d)]), 26);
        float rank_order = 0.0f;
        rank_order += big[size_t(d)];
        rank_order += -big[size_t(d)];
        rank_order += s[size_t(d)];
        float id_order = 0.0f;
        id_order += s[size_t(d)];
        id_order += big[size_t(d)];
        id_order += -big[size_t(d)];
        EXPECT_EQ(y.ptr<uint16_t>()[d], f32_to_bf16(id_order)) << d;
        if (std::fabs(big[size_t(d)]) > std::ldexp(std::fabs(s[size_t(d)]), 26) && s[size_t(d)] != 0.0f) {
            EXPECT_NE(f32_to_bf16(id_order), f32_to_bf16(rank_order)) << d;
        }
    }
    EXPECT_GT(nonzero_s, D / 4);
    EXPECT_GT(big_enough, D / 4);
}

TEST(CpuMoe, RowsAreBatchInvariantAndWeightsSumToRouteScale) {
    CpuBackend be(4);
    Rng rng(123);
    MoeCase c = random_moe(be, rng, 10, 64, 32);
    const int64_t M = 7;
    Tensor x = random_bf16(be, {M, c.D}, rng);
    Tensor y = make(be, DType::BF16, {M, c.D});
    Tensor rw = make(be, DType::F32, {M, 6});
    MoeParams p;
    be.moe(x, c.w, p, y, Tensor{}, rw);  // route_idx not wanted
    for (int64_t r = 0; r < M; ++r) {
        float s = 0;
        for (int i = 0; i < 6; ++i) s += rw.ptr<float>()[r * 6 + i];
        EXPECT_NEAR(s, 1.5f, 1e-5f);
        Tensor xr = copy_rows(be, x, r, r + 1);
        Tensor yr = make(be, DType::BF16, {1, c.D});
        be.moe(xr, c.w, p, yr, Tensor{}, Tensor{});
        EXPECT_TRUE(rows_equal(y, r, r + 1, yr)) << r;
    }
}
