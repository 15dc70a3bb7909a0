// CPU MoE: router, routed fp4 experts, shared fp8 expert (docs/MODEL.md 4.7, 8.1, 8.2).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

namespace {

// SwiGLU middle (model.py Expert.forward): u = clamp(u, -limit, limit); g = min(g, limit) (the gate
// is clamped from above only); a = silu(g) * u in fp32 (silu as one division); a = weight * a;
// returns bf16(a). No clamps when limit <= 0, as the reference.
inline uint16_t swiglu(float g, float u, float limit, const float* weight) {
    if (limit > 0.0f) {
        u = std::min(std::max(u, -limit), limit);
        g = std::min(g, limit);
    }
    float a = cpuref::silu_f32(g) * u;
    if (weight) a = *weight * a;
    return f32_to_bf16(a);
}

void check_fp4(const char* name, const Fp4Linear& l, int64_t N, int64_t K) {
    DS4R_CHECK(l.w.ndim() == 2 && l.w.dim(0) == N && 2 * l.w.dim(1) == K,
               "cpu moe: %s must be packed [%lld, %lld], got %s", name, (long long)N, (long long)(K / 2),
               shape_str(l.w.shape).c_str());
}
void check_fp8(const char* name, const Fp8Linear& l, int64_t N, int64_t K) {
    DS4R_CHECK(l.w.ndim() == 2 && l.w.dim(0) == N && l.w.dim(1) == K,
               "cpu moe: %s must be [%lld, %lld], got %s", name, (long long)N, (long long)K,
               shape_str(l.w.shape).c_str());
}

}  // namespace

void CpuBackend::moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y,
                     const Tensor& route_idx, const Tensor& route_w) {
    // x BF16 [M, D] (ffn-normed) -> y BF16 [M, D]; route_idx I32 [M, k] / route_w F32 [M, k] optional.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::moe(x, w, p, y, route_idx, route_w);
    const auto M = dims.M;
    const auto E = dims.E;
    const auto D = dims.D;
    const int k = p.topk;
    const bool want_idx = opcheck::given(route_idx), want_w = opcheck::given(route_w);
    // The shared expert's shapes here; its fp8 format and each routed expert's weights are checked
    // by the row kernels when they run (a routed expert only when a token reaches it).
    const int64_t I = w.sw1.w.ndim() == 2 ? w.sw1.w.dim(0) : -1;
    check_fp8("shared w1", w.sw1, I, D);
    check_fp8("shared w3", w.sw3, I, D);
    check_fp8("shared w2", w.sw2, D, I);

    // ---- router (model.py Gate.forward): logits = fp32 GEMM (fp64 accumulation -> fp32) / gate_temp
    // (a multiply by fp32(1 / gate_temp) on CUDA); score = sqrt(softplus(logits)); top-k of
    // score + bias by the CUDA rule, descending; weights = unbiased scores, / (sum + 1e-20) with the
    // CUDA 6-term order (k > 1), * route_scale.
    const uint16_t* xp = x.ptr<uint16_t>();
    const uint16_t* gw = w.gate_w.ptr<uint16_t>();
    const float* bias = w.gate_bias.ptr<float>();
    std::vector<int32_t> sel(static_cast<size_t>(M * k));
    std::vector<float> wt(static_cast<size_t>(M * k));
    parallel_for(M, static_cast<double>(E * D), [&](int64_t r0, int64_t r1) {
        std::vector<double> xr(static_cast<size_t>(D));
        std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E)),
            wk(static_cast<size_t>(k));
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t d = 0; d < D; ++d) xr[static_cast<size_t>(d)] = bf16_to_f32(xp[r * D + d]);
            for (int64_t e = 0; e < E; ++e) {
                double s = 0.0;
                for (int64_t d = 0; d < D; ++d) s += xr[static_cast<size_t>(d)] * bf16_to_f32(gw[e * D + d]);
                const float logit = cpuref::div_by_scalar_cuda(static_cast<float>(s), p.gate_temp);
                score[static_cast<size_t>(e)] = std::sqrt(cpuref::softplus_f32(logit));
                biased[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] + bias[e];
            }
            const std::vector<int64_t> top = cpuref::topk_sorted_desc_cuda_rule(biased.data(), E, k);
            for (int i = 0; i < k; ++i)
                wk[static_cast<size_t>(i)] = score[static_cast<size_t>(top[static_cast<size_t>(i)])];
            if (k > 1) {
                const float denom = cpuref::topk_weight_sum(wk.data(), k) + 1e-20f;
                for (auto& v : wk) v = v / denom;
            }
            for (int i = 0; i < k; ++i) {
                sel[static_cast<size_t>(r * k + i)] = static_cast<int32_t>(top[static_cast<size_t>(i)]);
                wt[static_cast<size_t>(r * k + i)] = wk[static_cast<size_t>(i)] * p.route_scale;
            }
        }
    });
    if (want_idx) std::copy(sel.begin(), sel.end(), route_idx.ptr<int32_t>());
    if (want_w) std::copy(wt.begin(), wt.end(), route_w.ptr<float>());

    // ---- routed experts, accumulated into fp32 y in increasing expert id order (model.py
    // MoE.forward: y[idx] += expert(x[idx], weights[idx, top]); each token's contributions are
    // therefore summed in expert-id order, not in top-k rank order).
    std::vector<float> acc(static_cast<size_t>(M * D), 0.0f);
    std::vector<std::vector<int64_t>> rows_of_expert(static_cast<size_t>(E));
    std::vector<std::vector<float>> weight_of_expert(static_cast<size_t>(E));
    for (int64_t r = 0; r < M; ++r)  // row-major like torch.where(indices == e): rows ascending
        for (int i = 0; i < k; ++i) {
            const int32_t e = sel[static_cast<size_t>(r * k + i)];
            rows_of_expert[static_cast<size_t>(e)].push_back(r);
            weight_of_expert[static_cast<size_t>(e)].push_back(wt[static_cast<size_t>(r * k + i)]);
        }
    std::vector<uint16_t> xe, g, u, a, out;
    for (int64_t e = 0; e < E; ++e) {
        const std::vector<int64_t>& rows = rows_of_expert[static_cast<size_t>(e)];
        if (rows.empty()) continue;
        const ExpertWeights& ew = w.experts[static_cast<size_t>(e)];
        const int64_t Ie = ew.w1.w.ndim() == 2 ? ew.w1.w.dim(0) : -1;
        check_fp4("expert w1", ew.w1, Ie, D);
        check_fp4("expert w3", ew.w3, Ie, D);
        check_fp4("expert w2", ew.w2, D, Ie);
        const int64_t n = static_cast<int64_t>(rows.size());
        xe.resize(static_cast<size_t>(n * D));
        for (int64_t i = 0; i < n; ++i)
            std::copy(xp + rows[static_cast<size_t>(i)] * D, xp + (rows[static_cast<size_t>(i)] + 1) * D,
                      xe.begin() + i * D);
        g.resize(static_cast<size_t>(n * Ie));
        u.resize(static_cast<size_t>(n * Ie));
        a.resize(static_cast<size_t>(n * Ie));
        out.resize(static_cast<size_t>(n * D));
        fp4_linear_rows(xe.data(), n, ew.w1, g.data());
        fp4_linear_rows(xe.data(), n, ew.w3, u.data());
        const std::vector<float>& we = weight_of_expert[static_cast<size_t>(e)];
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < Ie; ++j) {
                const size_t q = static_cast<size_t>(i * Ie + j);
                a[q] =
                    swiglu(bf16_to_f32(g[q]), bf16_to_f32(u[q]), p.swiglu_limit, &we[static_cast<size_t>(i)]);
            }
        fp4_linear_rows(a.data(), n, ew.w2, out.data());
        for (int64_t i = 0; i < n; ++i) {
            float* yr = acc.data() + rows[static_cast<size_t>(i)] * D;
            for (int64_t d = 0; d < D; ++d) yr[d] += bf16_to_f32(out[static_cast<size_t>(i * D + d)]);
        }
    }

    // ---- shared expert: the same SwiGLU with fp8 linears and no routing weight; y += bf16 output.
    g.resize(static_cast<size_t>(M * I));
    u.resize(static_cast<size_t>(M * I));
    a.resize(static_cast<size_t>(M * I));
    out.resize(static_cast<size_t>(M * D));
    fp8_linear_rows(xp, M, w.sw1, g.data());
    fp8_linear_rows(xp, M, w.sw3, u.data());
    for (size_t q = 0; q < a.size(); ++q)
        a[q] = swiglu(bf16_to_f32(g[q]), bf16_to_f32(u[q]), p.swiglu_limit, nullptr);
    fp8_linear_rows(a.data(), M, w.sw2, out.data());
    uint16_t* yp = y.ptr<uint16_t>();
    for (int64_t i = 0; i < M * D; ++i)
        yp[i] = f32_to_bf16(acc[static_cast<size_t>(i)] + bf16_to_f32(out[static_cast<size_t>(i)]));
}

}  // namespace ds4r
