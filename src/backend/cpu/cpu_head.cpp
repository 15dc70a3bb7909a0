// CPU output head statistics (docs/MODEL.md 4.9, docs/DESIGN.md 2): fp32 logits over the full vocabulary for
// one row at a time (never [M, V]), reduced in fp64.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

void CpuBackend::head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                            const HeadStatsOut& out) {
    // x BF16 [M, D]; head BF16 [V, D] (the reference keeps it fp32: exact widening); targets I32 [M]
    // (-1 = none). Per row: logit_v = fp32(x . head_v) accumulated in double; lse = max + log(sum
    // exp(logit - max)) in fp64; entropy = lse - sum p_v * logit_v, p_v = exp(logit_v - lse), fp64;
    // target_logit / rank = 1 + #{v : logit_v > logit_target} (0 and 0 without a target); top-k
    // by logit, descending, ties broken by the lower token id.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::head_stats(x, head, targets, k, out);
    const auto M = dims.M;
    const auto V = dims.V;
    const auto D = dims.D;
    const int32_t* tp = targets.ptr<int32_t>();
    opcheck::head_targets(tp, M, V);
    const uint16_t* xp = x.ptr<uint16_t>();
    const uint16_t* hp = head.ptr<uint16_t>();
    std::vector<float> logits(static_cast<size_t>(V));
    std::vector<double> xr(static_cast<size_t>(D));
    std::vector<int32_t> order(static_cast<size_t>(V));
    constexpr int64_t kChunk = 256;
    for (int64_t r = 0; r < M; ++r) {
        for (int64_t d = 0; d < D; ++d) xr[static_cast<size_t>(d)] = bf16_to_f32(xp[r * D + d]);
        const int64_t chunks = (V + kChunk - 1) / kChunk;
        parallel_for(chunks, static_cast<double>(kChunk * D), [&](int64_t c0, int64_t c1) {
            for (int64_t v = c0 * kChunk; v < std::min(V, c1 * kChunk); ++v) {
                const uint16_t* hv = hp + v * D;
                double s = 0.0;
                for (int64_t d = 0; d < D; ++d) s += xr[static_cast<size_t>(d)] * bf16_to_f32(hv[d]);
                logits[static_cast<size_t>(v)] = static_cast<float>(s);
            }
        });
        double mx = -INFINITY;
        for (float l : logits) mx = std::max(mx, static_cast<double>(l));
        double se = 0.0;
        for (float l : logits) se += std::exp(static_cast<double>(l) - mx);
        const double lse = mx + std::log(se);
        double pl = 0.0;
        for (float l : logits) pl += std::exp(static_cast<double>(l) - lse) * static_cast<double>(l);
        out.lse.ptr<double>()[r] = lse;
        out.entropy.ptr<double>()[r] = lse - pl;
        if (tp[r] >= 0) {
            const float tl = logits[static_cast<size_t>(tp[r])];
            int64_t above = 0;
            for (float l : logits) above += l > tl ? 1 : 0;
            out.target_logit.ptr<float>()[r] = tl;
            out.rank.ptr<int32_t>()[r] = static_cast<int32_t>(1 + above);
        } else {
            out.target_logit.ptr<float>()[r] = 0.0f;
            out.rank.ptr<int32_t>()[r] = 0;
        }
        if (k > 0) {
            std::iota(order.begin(), order.end(), 0);
            // strict weak order: larger logit first, NaN last, equal logits by lower id
            auto above_nan_aware = [](float a, float b) {
                return !std::isnan(a) && (std::isnan(b) || a > b);
            };
            std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
                const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
                if (above_nan_aware(la, lb)) return true;
                if (above_nan_aware(lb, la)) return false;
                return a < b;
            });
            for (int i = 0; i < k; ++i) {
                out.topk_ids.ptr<int32_t>()[r * k + i] = order[static_cast<size_t>(i)];
                out.topk_logit.ptr<float>()[r * k + i] =
                    logits[static_cast<size_t>(order[static_cast<size_t>(i)])];
            }
        }
    }
}

}  // namespace ds4r
