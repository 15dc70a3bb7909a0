// CPU indexer ops (MODEL.md 4.6.2 steps 4-7, 8.1, 8.2).
#include <algorithm>
#include <limits>
#include <vector>

#include "cpu_backend.h"
#include "cpu_ref.h"
#include "ds4r/error.h"

namespace ds4r {

using namespace cpu_detail;

namespace {
const float kNegInf = -std::numeric_limits<float>::infinity();
const uint16_t kBf16NegInf = 0xff80;

void check_qpos(const char* op, const Tensor& qpos, int64_t m) {
    check_dtype(op, "qpos", qpos, DType::I32);
    check_numel(op, "qpos", qpos, m);
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
    //   score = bf16(((0 + p_0) + p_1) + ...) summed over heads in fp32 and rounded once (MODEL.md
    //   8.2: accumulating in bf16 would be wrong); score = -inf for j >= (qpos + 1) / ratio.
    const char* op = "index_scores";
    check_dtype(op, "q", q, DType::BF16);
    check_dtype(op, "k", k, DType::BF16);
    check_dtype(op, "w", w, DType::BF16);
    check_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(ratio >= 1, "cpu index_scores: ratio = %d must be >= 1", ratio);
    DS4R_CHECK(q.ndim() == 3, "cpu index_scores: q must be [m, nh, ihd], got %s", shape_str(q.shape).c_str());
    const int64_t m = q.dim(0), nh = q.dim(1), ihd = q.dim(2);
    check_data(op, "q", q);
    const int64_t T = k.numel() == 0 ? 0 : rows_of(op, "k", k, ihd);
    check_shape(op, "w", w, {m, nh});
    check_qpos(op, qpos, m);
    check_numel(op, "score", score, m * T);
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
    // MODEL.md 4.6.2 step 6): block score = max of its positions (-inf padding); the block
    // (n_t - 1) // block (n_t = (qpos + 1) / ratio) is pinned to +inf; keep the top
    // min(topk_blocks, nb) by the CUDA tie rule, dropping picks whose score is -inf.
    // Pinning compares arange(nb) == last, so n_t = 0 (last = -1) pins NO block (not the last one).
    const char* op = "candidate_blocks";
    check_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(mask.dtype == DType::I32,
               "cpu candidate_blocks: mask must be I32 (used as 32-bit words), got %s",
               dtype_name(mask.dtype));
    DS4R_CHECK(ratio >= 1 && block >= 1 && topk_blocks >= 0,
               "cpu candidate_blocks: ratio %d, block %lld, topk_blocks %lld out of range", ratio,
               (long long)block, (long long)topk_blocks);
    DS4R_CHECK(score.ndim() == 2, "cpu candidate_blocks: score must be [m, T], got %s",
               shape_str(score.shape).c_str());
    const int64_t m = score.dim(0), T = score.dim(1), nb = (T + block - 1) / block;
    check_data(op, "score", score);
    check_qpos(op, qpos, m);
    DS4R_CHECK(mask.ndim() == 2 && mask.dim(0) == m && mask.dim(1) >= (nb + 31) / 32,
               "cpu candidate_blocks: mask must be [%lld, >= %lld], got %s", (long long)m,
               (long long)((nb + 31) / 32), shape_str(mask.shape).c_str());
    check_data(op, "mask", mask);
    const int64_t words = mask.dim(1);
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
    const char* op = "apply_candidate_mask";
    check_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(mask.dtype == DType::I32, "cpu apply_candidate_mask: mask must be I32, got %s",
               dtype_name(mask.dtype));
    DS4R_CHECK(block >= 1, "cpu apply_candidate_mask: block = %lld must be >= 1", (long long)block);
    DS4R_CHECK(score.ndim() == 2, "cpu apply_candidate_mask: score must be [m, T], got %s",
               shape_str(score.shape).c_str());
    const int64_t m = score.dim(0), T = score.dim(1), nb = (T + block - 1) / block;
    check_data(op, "score", score);
    DS4R_CHECK(mask.ndim() == 2 && mask.dim(0) == m && mask.dim(1) >= (nb + 31) / 32,
               "cpu apply_candidate_mask: mask must be [%lld, >= %lld], got %s", (long long)m,
               (long long)((nb + 31) / 32), shape_str(mask.shape).c_str());
    check_data(op, "mask", mask);
    const int64_t words = mask.dim(1);
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
    // by position, mapped to j + offset if j < n_t = (qpos + 1) / ratio, else -1 (MODEL.md 4.6.2
    // step 7, 8.1). The -1s end up at the tail.
    const char* op = "index_topk";
    check_dtype(op, "score", score, DType::BF16);
    check_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(ratio >= 1, "cpu index_topk: ratio = %d must be >= 1", ratio);
    DS4R_CHECK(score.ndim() == 2 && idx.ndim() == 2 && idx.dim(0) == score.dim(0),
               "cpu index_topk: score [m, T] %s and idx [m, K] %s do not match",
               shape_str(score.shape).c_str(), shape_str(idx.shape).c_str());
    const int64_t m = score.dim(0), T = score.dim(1), K = idx.dim(1);
    DS4R_CHECK(K <= T, "cpu index_topk: K = %lld exceeds the %lld scores", (long long)K, (long long)T);
    DS4R_CHECK(offset >= 0 && offset + T <= std::numeric_limits<int32_t>::max(),
               "cpu index_topk: offset %lld out of range", (long long)offset);
    check_data(op, "score", score);
    check_data(op, "idx", idx);
    check_qpos(op, qpos, m);
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

}  // namespace ds4r
