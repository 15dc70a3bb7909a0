// CPU compressor pooling, window indices and sparse attention (docs/MODEL.md 4.6, 4.6.1, 5.4, 6.4).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

void CpuBackend::compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) {
    // kv, sc F32 [2n (+1), hd] -> out BF16 [n, hd]: per channel, a 2-way softmax over the group's
    // scores, w_i = exp(sc_i - max) / sum (true division, as CUDA's softmax epilogue), then
    // out = bf16((0 + kv_0 * w_0) + kv_1 * w_1) in fp32 (docs/MODEL.md 4.6.1, 8.2). A trailing odd row is
    // ignored (it waits for decode in the reference).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::compress_pool2(kv, sc, out);
    const auto n = dims.n;
    const auto hd = dims.hd;
    const float* K = kv.ptr<float>();
    const float* S = sc.ptr<float>();
    uint16_t* O = out.ptr<uint16_t>();
    parallel_for(n, static_cast<double>(hd) * 40.0, [&](int64_t j0, int64_t j1) {
        for (int64_t j = j0; j < j1; ++j)
            for (int64_t c = 0; c < hd; ++c) {
                const float a = S[(2 * j) * hd + c], b = S[(2 * j + 1) * hd + c];
                const float mx = std::max(a, b);
                const float ea = std::exp(a - mx), eb = std::exp(b - mx);
                const float sum = ea + eb;
                const float wa = ea / sum, wb = eb / sum;
                float acc = 0.0f;
                acc += K[(2 * j) * hd + c] * wa;
                acc += K[(2 * j + 1) * hd + c] * wb;
                O[j * hd + c] = f32_to_bf16(acc);
            }
    });
}

namespace {

// Row r of the window index columns: out[c] = max(p - window + 1, 0) + c, or -1 where that exceeds
// p = qpos[r] (model.py get_window_topk_idxs, docs/MODEL.md 4.6 b).
void window_row(int64_t r, int64_t p, int64_t window, int64_t W, int32_t* out) {
    DS4R_CHECK(p >= 0, "cpu window_indices: qpos[%lld] = %lld is negative", (long long)r, (long long)p);
    const int64_t start = std::max<int64_t>(p - window + 1, 0);
    for (int64_t c = 0; c < W; ++c) {
        const int64_t j = start + c;
        out[c] = j > p ? -1 : static_cast<int32_t>(j);
    }
}

}  // namespace

void CpuBackend::window_indices(const Tensor& qpos, int64_t window, const Tensor& idx) {
    // qpos I32 [m] -> idx I32 [m, W].
    const auto [m, W] = opcheck::window_indices(qpos, window, idx);
    const int32_t* pp = qpos.ptr<int32_t>();
    int32_t* ip = idx.ptr<int32_t>();
    for (int64_t r = 0; r < m; ++r) window_row(r, pp[r], window, W, ip + r * W);
}

void CpuBackend::attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) {
    // qpos I32 [m]; topk I32 [m, Kc] (may be empty) -> idx I32 [m, W + Kc] = [window columns ; topk].
    const auto [m, W, kc] = opcheck::attn_indices(qpos, window, topk, idx);
    const int32_t* pp = qpos.ptr<int32_t>();
    const int32_t* tk = kc > 0 ? topk.ptr<int32_t>() : nullptr;
    int32_t* ip = idx.ptr<int32_t>();
    const int64_t n = W + kc;
    for (int64_t r = 0; r < m; ++r) {
        window_row(r, pp[r], window, W, ip + r * n);
        for (int64_t c = 0; c < kc; ++c) ip[r * n + W + c] = tk[r * kc + c];
    }
}

void CpuBackend::sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                             const Tensor& idx, float scale, const Tensor& o) {
    // q BF16 [m, H, hd]; win_kv BF16 [s, hd]; cmp_kv BF16 [T, hd] (T may be 0); sink F32 [H];
    // idx I32 [m, n_idx] (j < s: win_kv[j]; j >= s: cmp_kv[j - s]; -1 empty) -> o BF16 [m, H, hd].
    // The kernel's algorithm per (row, head) (docs/MODEL.md 5.4): tiles of 64 index slots from slot 0;
    // scores s_i = fp32(q . K_i) * scale (the dot exact in double, rounded once: an fp32 MMA model),
    // -inf for empty slots; M seeded -1e30; M' = max(M, max_i s_i); alpha = exp(M - M');
    // p_i = exp(s_i - M'); sum = sum * alpha + (sum_i p_i, fp32, i ascending); acc = acc * alpha +
    // fp32(sum_i bf16(p_i) * K_i) (the tile's PV product exact in double, rounded once); after the
    // last tile sum += exp(sink - M) (unscaled sink, no value row); o = bf16(acc / sum). exp is the
    // host expf (CUDA: libdevice expf, last-ulp differences). All-empty tiles are skipped: they keep
    // M, scale by exp(0) = 1 and add 0 (numerically inert, docs/MODEL.md 6.4); an all-empty row gives 0.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::sparse_attn(q, win_kv, cmp_kv, sink, idx, o);
    const auto m = dims.m;
    const auto H = dims.H;
    const auto hd = dims.hd;
    const auto s = dims.s;
    const auto T = dims.T;
    const auto n_idx = dims.n_idx;
    const int32_t* ip = idx.ptr<int32_t>();
    for (int64_t i = 0; i < m * n_idx; ++i)
        DS4R_CHECK(ip[i] >= -1 && ip[i] < s + T, "cpu sparse_attn: idx[%lld, %lld] = %d outside [-1, %lld)",
                   (long long)(i / std::max<int64_t>(n_idx, 1)), (long long)(i % std::max<int64_t>(n_idx, 1)),
                   ip[i], (long long)(s + T));
    const uint16_t* qp = q.ptr<uint16_t>();
    const uint16_t* wkv = win_kv.ptr<uint16_t>();
    const uint16_t* ckv = cmp_kv.ptr<uint16_t>();
    const float* sk = sink.ptr<float>();
    uint16_t* out = o.ptr<uint16_t>();
    constexpr int64_t kTile = 64;
    const float kNegInf = -std::numeric_limits<float>::infinity();
    parallel_for(m * H, static_cast<double>(n_idx * hd * 2), [&](int64_t i0, int64_t i1) {
        std::vector<double> qd(static_cast<size_t>(hd)), pv(static_cast<size_t>(hd));
        std::vector<float> acc(static_cast<size_t>(hd));
        float sc[kTile], p[kTile];
        const uint16_t* rows[kTile];
        for (int64_t item = i0; item < i1; ++item) {
            const int64_t r = item / H, h = item % H;
            const uint16_t* qh = qp + (r * H + h) * hd;
            for (int64_t d = 0; d < hd; ++d) qd[static_cast<size_t>(d)] = bf16_to_f32(qh[d]);
            std::fill(acc.begin(), acc.end(), 0.0f);
            float sum = 0.0f, M = -1e30f;
            const int32_t* ir = ip + r * n_idx;
            for (int64_t t0 = 0; t0 < n_idx; t0 += kTile) {
                const int64_t nt = std::min(kTile, n_idx - t0);
                bool any = false;
                for (int64_t i = 0; i < kTile; ++i) {
                    const int32_t j = i < nt ? ir[t0 + i] : -1;
                    rows[i] =
                        j < 0 ? nullptr : (j < s ? wkv + static_cast<int64_t>(j) * hd : ckv + (j - s) * hd);
                    any = any || rows[i] != nullptr;
                }
                if (!any) continue;
                float tile_max = kNegInf;
                for (int64_t i = 0; i < kTile; ++i) {
                    if (!rows[i]) {
                        sc[i] = kNegInf;
                        continue;
                    }
                    double dot = 0.0;
                    for (int64_t d = 0; d < hd; ++d)
                        dot += qd[static_cast<size_t>(d)] * bf16_to_f32(rows[i][d]);
                    sc[i] = static_cast<float>(dot) * scale;
                    tile_max = std::max(tile_max, sc[i]);
                }
                const float M_new = std::max(M, tile_max);
                const float alpha = std::exp(M - M_new);
                float tsum = 0.0f;
                for (int64_t i = 0; i < kTile; ++i) {
                    p[i] = rows[i] ? std::exp(sc[i] - M_new) : 0.0f;
                    tsum += p[i];
                }
                sum = sum * alpha + tsum;
                std::fill(pv.begin(), pv.end(), 0.0);
                for (int64_t i = 0; i < kTile; ++i) {
                    if (!rows[i]) continue;
                    const double pb = round_bf16(p[i]);  // probabilities rounded to bf16 before PV
                    for (int64_t d = 0; d < hd; ++d)
                        pv[static_cast<size_t>(d)] += pb * bf16_to_f32(rows[i][d]);
                }
                for (int64_t d = 0; d < hd; ++d)
                    acc[static_cast<size_t>(d)] =
                        acc[static_cast<size_t>(d)] * alpha + static_cast<float>(pv[static_cast<size_t>(d)]);
                M = M_new;
            }
            sum += std::exp(sk[h] - M);
            uint16_t* oh = out + (r * H + h) * hd;
            for (int64_t d = 0; d < hd; ++d) oh[d] = f32_to_bf16(acc[static_cast<size_t>(d)] / sum);
        }
    });
}

}  // namespace ds4r
