// CPU Engram gate and update (docs/MODEL.md 4.8 steps 2-5; engram.py / model.py Engram.forward).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"

namespace ds4r {

void CpuBackend::engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                               float eps) {
    // X BF16 [M, hc, D] updated in place; kv BF16 [M, (hc + 1) * D] (key of copy k = columns
    // k*D.., value = the last D, shared by all copies); qw, kw BF16 [hc, D]. Per copy k, in fp32:
    //   wt = qw * kw (exact: bf16 x bf16);
    //   rstd = rsqrt(mean(h^2) + eps) * rsqrt(mean(key^2) + eps)  (separate per-copy statistics;
    //          mean = exact sum * fp32(1/D) as CUDA torch.mean; rsqrt exactly rounded);
    //   dot = fp32(sum_d fp32(fp32(h*wt) * key)) * rstd * fp32(D^-0.5)
    //         (torch: (h * weight * key).sum(-1): the elementwise products rounded in fp32, left to
    //          right; the sum accumulated exactly in double and rounded once);
    //   gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)) (signed square root, 4.8);
    //   X_k = bf16(h + gate * value).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::engram_update(X, kv, qw, kw);
    const auto M = dims.M;
    const auto hc = dims.hc;
    const auto D = dims.D;
    const float inv_sqrt_d = static_cast<float>(std::pow(static_cast<double>(D), -0.5));  // self.dim ** -0.5
    const float clamp_value = 1e-6f;
    std::vector<float> wt(static_cast<size_t>(hc * D));
    for (int64_t i = 0; i < hc * D; ++i)
        wt[static_cast<size_t>(i)] = bf16_to_f32(qw.ptr<uint16_t>()[i]) * bf16_to_f32(kw.ptr<uint16_t>()[i]);
    uint16_t* xp = X.ptr<uint16_t>();
    const uint16_t* kvp = kv.ptr<uint16_t>();
    parallel_for(M, static_cast<double>(hc * D * 4), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const uint16_t* value = kvp + (r * (hc + 1) + hc) * D;
            for (int64_t k = 0; k < hc; ++k) {
                uint16_t* h = xp + (r * hc + k) * D;
                const uint16_t* key = kvp + (r * (hc + 1) + k) * D;
                const float* wk = wt.data() + k * D;
                const float ms_h = cpuref::mean_from_sum(cpuref::sum_sq_bf16_f32(h, D), D);
                const float ms_k = cpuref::mean_from_sum(cpuref::sum_sq_bf16_f32(key, D), D);
                const float rstd = cpuref::rsqrt_f32(ms_h + eps) * cpuref::rsqrt_f32(ms_k + eps);
                double s = 0.0;
                for (int64_t d = 0; d < D; ++d) s += (bf16_to_f32(h[d]) * wk[d]) * bf16_to_f32(key[d]);
                const float dot = (static_cast<float>(s) * rstd) * inv_sqrt_d;
                const float mag = std::sqrt(std::max(std::fabs(dot), clamp_value));
                const float gate = cpuref::sigmoid_f32(std::copysign(mag, dot));
                for (int64_t d = 0; d < D; ++d)
                    h[d] = f32_to_bf16(bf16_to_f32(h[d]) + gate * bf16_to_f32(value[d]));
            }
        }
    });
}

}  // namespace ds4r
