// CPU indexer ops (docs/MODEL.md 4.6.2 steps 4-7, 8.1, 8.2).
#include <algorithm>
#include <limits>
#include <vector>

#include "backend/op_checks.h"
#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

namespace {
const float kNegInf = -std::numeric_limits<float>::infinity();
const uint16_t kBf16NegInf = 0xff80;

// qpos I32 [m] (shape checked by opcheck) holds positions: none negative.
void check_qpos_values(const char* op, const Tensor& qpos, int64_t m) {
    const int32_t* p = qpos.ptr<int32_t>();
    for (int64_t r = 0; r < m; ++r)
        DS4R_CHECK(p[r] >= 0, "cpu %s: qpos[%lld] = %d is negative", op, (long long)r, p[r]);
}
}  // namespace

void CpuBackend::index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos,
                              int ratio, const Tensor& score) {
    // q BF16 [m, nh, ihd]; k BF16 [T, ihd]; w BF16 [m, nh]; qpos I32 [m] -> score BF16 [m, T]:
    //   S = bf16(q_h . k_j) (bf16 einsum: dot exact in double, rounded to fp32, then to bf16);
    //   relu in bf16; p = bf16(relu(S) * w_h) (the product of two bf16 is exact in fp32);
    //   score = bf16(((0 + p_0) + p_1) + ...) summed over heads in fp32 and rounded once (docs/MODEL.md
    //   8.2: accumulating in bf16 would be wrong); score = -inf for j >= (qpos + 1) / ratio.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::index_scores(q, k, w, qpos, ratio, score);
    const auto m = dims.m;
    const auto nh = dims.nh;
    const auto ihd = dims.ihd;
    const auto T = dims.T;
    check_qpos_values("index_scores", qpos, m);
    const uint16_t* qp = q.ptr<uint16_t>();
    const uint16_t* kp = k.ptr<uint16_t>();
    const uint16_t* wp = w.ptr<uint16_t>();
    const int32_t* pp = qpos.ptr<int32_t>();
    uint16_t* sp = score.ptr<uint16_t>();
    parallel_for(m, static_cast<double>(nh * T * ihd), [&](int64_t r0, int64_t r1) {
        std::vector<double> qd(static_cast<size_t>(nh * ihd));
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t n_t = (static_cast<int64_t>(pp[r]) + 1) / ratio;
            for (int64_t i = 0; i < nh * ihd; ++i)
                qd[static_cast<size_t>(i)] = bf16_to_f32(qp[r * nh * ihd + i]);
            for (int64_t j = 0; j < T; ++j) {
                if (j >= n_t) {  // causal mask (step 5); the masked value does not depend on the dot
                    sp[r * T + j] = kBf16NegInf;
                    continue;
                }
                const uint16_t* kj = kp + j * ihd;
                float acc = 0.0f;
                for (int64_t h = 0; h < nh; ++h) {
                    const double* qh = qd.data() + h * ihd;
                    double dot = 0.0;
                    for (int64_t d = 0; d < ihd; ++d) dot += qh[d] * bf16_to_f32(kj[d]);
                    float S = round_bf16(static_cast<float>(dot));
                    if (!(S > 0.0f) && !std::isnan(S)) S = 0.0f;  // relu
                    acc += round_bf16(S * bf16_to_f32(wp[r * nh + h]));
                }
                sp[r * T + j] = f32_to_bf16(acc);
            }
        }
    });
}

void CpuBackend::candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                                  int64_t topk_blocks, const Tensor& mask) {
    // score BF16 [m, T]; qpos I32 [m] -> mask I32 [m, W >= ceil(nb / 32)] (32-bit words; bit b of
    // word b / 32 set when block b is kept), nb = ceil(T / block) (model.py select_candidate_blocks,
    // docs/MODEL.md 4.6.2 step 6): block score = max of its positions (-inf padding); the block
    // (n_t - 1) // block (n_t = (qpos + 1) / ratio) is pinned to +inf; keep the top
    // min(topk_blocks, nb) by the CUDA tie rule, dropping picks whose score is -inf.
    // Pinning compares arange(nb) == last, so n_t = 0 (last = -1) pins NO block (not the last one).
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::candidate_blocks(score, qpos, ratio, block, topk_blocks, mask);
    const auto m = dims.m;
    const auto T = dims.T;
    const auto nb = dims.nb;
    const auto words = dims.words;
    check_qpos_values("candidate_blocks", qpos, m);
    const uint16_t* sp = score.ptr<uint16_t>();
    const int32_t* pp = qpos.ptr<int32_t>();
    uint32_t* mp = mask.ptr<uint32_t>();
    const int64_t keep_n = std::min(topk_blocks, nb);
    parallel_for(m, static_cast<double>(T + nb * 8), [&](int64_t r0, int64_t r1) {
        std::vector<float> bs(static_cast<size_t>(nb));
        std::vector<int64_t> picks(static_cast<size_t>(keep_n));
        std::vector<uint32_t> scratch;
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t b = 0; b < nb; ++b) {
                float mx = kNegInf;
                for (int64_t j = b * block; j < std::min(T, (b + 1) * block); ++j) {
                    const float v = bf16_to_f32(sp[r * T + j]);
                    if (std::isnan(v) || v > mx) mx = v;  // torch.amax propagates NaN
                    if (std::isnan(mx)) break;
                }
                bs[static_cast<size_t>(b)] = mx;
            }
            const int64_t n_t = (static_cast<int64_t>(pp[r]) + 1) / ratio;
            const int64_t last = cpuref::floor_div(n_t - 1, block);
            if (last >= 0 && last < nb)
                bs[static_cast<size_t>(last)] = std::numeric_limits<float>::infinity();
            cpuref::select_topk_cuda_rule(bs.data(), nb, keep_n, scratch, picks.data());
            uint32_t* mr = mp + r * words;
            std::fill(mr, mr + words, 0u);
            for (int64_t i = 0; i < keep_n; ++i) {
                const int64_t b = picks[static_cast<size_t>(i)];
                if (bs[static_cast<size_t>(b)] > kNegInf) mr[b / 32] |= 1u << (b % 32);
            }
        }
    });
}

void CpuBackend::apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) {
    // score BF16 [m, T] <- -inf where the block bit of j (j / block) is not set in mask I32 [m, W].
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::apply_candidate_mask(score, mask, block);
    const auto m = dims.m;
    const auto T = dims.T;
    const auto words = dims.words;
    uint16_t* sp = score.ptr<uint16_t>();
    const uint32_t* mp = mask.ptr<uint32_t>();
    for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < T; ++j) {
            const int64_t b = j / block;
            if (!((mp[r * words + b / 32] >> (b % 32)) & 1u)) sp[r * T + j] = kBf16NegInf;
        }
}

void CpuBackend::index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                            const Tensor& idx) {
    // score BF16 [m, T] -> idx I32 [m, K]: the K = idx.dim(1) positions chosen by CUDA torch.topk's
    // rule (values above the K-th, then ties in ascending position; masked -inf ties too), sorted
    // by position, mapped to j + offset if j < n_t = (qpos + 1) / ratio, else -1 (docs/MODEL.md 4.6.2
    // step 7, 8.1). The -1s end up at the tail.
    // Named variables, not a structured binding: lambdas below capture them (clang 14).
    const auto dims = opcheck::index_topk(score, qpos, ratio, offset, idx);
    const auto m = dims.m;
    const auto T = dims.T;
    const auto K = dims.K;
    check_qpos_values("index_topk", qpos, m);
    const uint16_t* sp = score.ptr<uint16_t>();
    const int32_t* pp = qpos.ptr<int32_t>();
    int32_t* ip = idx.ptr<int32_t>();
    parallel_for(m, static_cast<double>(T) * 4.0, [&](int64_t r0, int64_t r1) {
        std::vector<float> v(static_cast<size_t>(T));
        std::vector<int64_t> picks(static_cast<size_t>(K));
        std::vector<uint32_t> scratch;
        for (int64_t r = r0; r < r1; ++r) {
            for (int64_t j = 0; j < T; ++j) v[static_cast<size_t>(j)] = bf16_to_f32(sp[r * T + j]);
            cpuref::select_topk_cuda_rule(v.data(), T, K, scratch, picks.data());
            std::sort(picks.begin(), picks.end());
            const int64_t n_t = (static_cast<int64_t>(pp[r]) + 1) / ratio;
            for (int64_t c = 0; c < K; ++c) {
                const int64_t j = picks[static_cast<size_t>(c)];
                ip[r * K + c] = j < n_t ? static_cast<int32_t>(j + offset) : -1;
            }
        }
    });
}

void CpuBackend::mul_scalar_bf16(const Tensor& x, float factor) {
    // x BF16 (any shape) in place: x <- bf16(fp32(x) * factor) (docs/MODEL.md 4.6.2 step 3).
    opcheck::expect_dtype("mul_scalar_bf16", "x", x, DType::BF16);
    opcheck::expect_data("mul_scalar_bf16", "x", x);
    uint16_t* p = x.ptr<uint16_t>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) * factor);
}

}  // namespace ds4r
