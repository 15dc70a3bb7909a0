// CudaBackend ops: the indexer (scores, candidate blocks, top-k), attention index rows, sparse
// attention and the output-head statistics (MODEL.md 4.6, 4.6.2, 4.9, 5.4, 6, 8.1, 8.2). Shapes and
// dtypes are validated here; the kernels live in kernels/{indexer,attention,head}.cu.
//
// Device-side index data (qpos, idx, targets) cannot be validated without a device -> host copy;
// the kernels treat it defensively instead: an index outside [0, s + T) is an empty slot in
// sparse_attn. Only head_stats copies its targets back (M ints, once per call) to reject ids >= V
// as the CPU reference does.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "head.cuh"
#include "indexer.cuh"

namespace ds4r {

namespace {

void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
    DS4R_CHECK(t.dtype == want, "cuda %s: %s must be %s, got %s %s", op, name, dtype_name(want),
               dtype_name(t.dtype), shape_str(t.shape).c_str());
}
void check_data(const char* op, const char* name, const Tensor& t) {
    for (int64_t d : t.shape)
        DS4R_CHECK(d >= 0, "cuda %s: %s has a negative dim %s", op, name, shape_str(t.shape).c_str());
    DS4R_CHECK(t.numel() == 0 || t.data != nullptr, "cuda %s: %s %s has no data", op, name,
               shape_str(t.shape).c_str());
}
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
    DS4R_CHECK(t.shape == want, "cuda %s: %s must have shape %s, got %s", op, name, shape_str(want).c_str(),
               shape_str(t.shape).c_str());
    check_data(op, name, t);
}
void check_numel(const char* op, const char* name, const Tensor& t, int64_t want) {
    check_data(op, name, t);
    DS4R_CHECK(t.numel() == want, "cuda %s: %s %s must have %lld elements", op, name,
               shape_str(t.shape).c_str(), (long long)want);
}
int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t row_len) {
    check_data(op, name, t);
    DS4R_CHECK(t.ndim() >= 1 && t.dim(-1) == row_len, "cuda %s: %s %s must have last dim %lld", op, name,
               shape_str(t.shape).c_str(), (long long)row_len);
    return row_len == 0 ? 0 : t.numel() / row_len;
}
// Vector loads / cp.async need 16-byte aligned bases.
void check_aligned(const char* op, const char* name, const Tensor& t, size_t align) {
    DS4R_CHECK(t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data) % align == 0,
               "cuda %s: %s must be %zu-byte aligned (a view at an odd offset?)", op, name, align);
}
void check_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name,
                    const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0) return;
    const auto* pa = static_cast<const uint8_t*>(a.data);
    const auto* pb = static_cast<const uint8_t*>(b.data);
    DS4R_CHECK(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa, "cuda %s: %s must not overlap %s", op, a_name,
               b_name);
}
void check_grid(const char* op, int64_t blocks) {
    DS4R_CHECK(blocks < (int64_t{1} << 31), "cuda %s: %lld thread blocks exceed the grid limit", op,
               (long long)blocks);
}
// The candidate mask is 32-bit words stored as I32 (the dtype set has no U32), as in the CPU backend.
int64_t mask_words(const char* op, const Tensor& mask, int64_t m, int64_t nb) {
    check_dtype(op, "mask", mask, DType::I32);
    DS4R_CHECK(mask.ndim() == 2 && mask.dim(0) == m && mask.dim(1) >= (nb + 31) / 32,
               "cuda %s: mask must be I32 [%lld, >= %lld] (32-bit words), got %s", op, (long long)m,
               (long long)((nb + 31) / 32), shape_str(mask.shape).c_str());
    check_data(op, "mask", mask);
    return mask.dim(1);
}

}  // namespace

// ---------------------------------------------------------------------------- indexer (MODEL.md 4.6.2)

void CudaBackend::index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos,
                               int ratio, const Tensor& score) {
    // q BF16 [m, nh, ihd]; k BF16 [T, ihd]; w BF16 [m, nh]; qpos I32 [m] -> score BF16 [m, T].
    const char* op = "index_scores";
    check_dtype(op, "q", q, DType::BF16);
    check_dtype(op, "k", k, DType::BF16);
    check_dtype(op, "w", w, DType::BF16);
    check_dtype(op, "qpos", qpos, DType::I32);
    check_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(ratio >= 1, "cuda index_scores: ratio = %d must be >= 1", ratio);
    DS4R_CHECK(q.ndim() == 3, "cuda index_scores: q must be [m, nh, ihd], got %s",
               shape_str(q.shape).c_str());
    check_data(op, "q", q);
    const int64_t m = q.dim(0), nh = q.dim(1), ihd = q.dim(2);
    DS4R_CHECK(nh >= 1 && nh <= kern::kIndexMaxHeads,
               "cuda index_scores: %lld index heads (supported: 1..%d)", (long long)nh, kern::kIndexMaxHeads);
    DS4R_CHECK(kern::index_scores_supported_dim(static_cast<int>(ihd)),
               "cuda index_scores: index head dim %lld not supported (32, 64 or 128)", (long long)ihd);
    const int64_t T = k.numel() == 0 ? 0 : rows_of(op, "k", k, ihd);
    check_shape(op, "w", w, {m, nh});
    check_numel(op, "qpos", qpos, m);
    check_numel(op, "score", score, m * T);
    check_aligned(op, "q", q, 4);
    check_aligned(op, "k", k, 16);
    check_grid(op, (m + 3) / 4);
    DS4R_CHECK((T + 255) / 256 <= 65535, "cuda index_scores: T = %lld keys exceed the grid limit",
               (long long)T);
    check_disjoint(op, "score", score, "q", q);
    check_disjoint(op, "score", score, "k", k);
    if (m == 0 || T == 0) return;
    kern::launch_index_scores(q.ptr<uint16_t>(), k.ptr<uint16_t>(), w.ptr<uint16_t>(), qpos.ptr<int32_t>(), m,
                              static_cast<int>(nh), static_cast<int>(ihd), T, ratio, score.ptr<uint16_t>(),
                              stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                                   int64_t topk_blocks, const Tensor& mask) {
    // score BF16 [m, T]; qpos I32 [m] -> mask I32 [m, >= ceil(ceil(T / block) / 32)] (bit words).
    const char* op = "candidate_blocks";
    check_dtype(op, "score", score, DType::BF16);
    check_dtype(op, "qpos", qpos, DType::I32);
    DS4R_CHECK(
        ratio >= 1 && block >= 1 && topk_blocks >= 0 && topk_blocks <= std::numeric_limits<int32_t>::max(),
        "cuda candidate_blocks: ratio %d, block %lld, topk_blocks %lld out of range", ratio, (long long)block,
        (long long)topk_blocks);
    DS4R_CHECK(score.ndim() == 2, "cuda candidate_blocks: score must be [m, T], got %s",
               shape_str(score.shape).c_str());
    check_data(op, "score", score);
    const int64_t m = score.dim(0), T = score.dim(1), nb = (T + block - 1) / block;
    check_numel(op, "qpos", qpos, m);
    const int64_t words = mask_words(op, mask, m, nb);
    check_grid(op, m);
    check_disjoint(op, "mask", mask, "score", score);
    if (m == 0 || words == 0) return;
    kern::launch_candidate_blocks(score.ptr<uint16_t>(), qpos.ptr<int32_t>(), m, T, ratio, block, topk_blocks,
                                  mask.ptr<uint32_t>(), words, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) {
    // score BF16 [m, T] in place; mask I32 [m, >= ceil(ceil(T / block) / 32)].
    const char* op = "apply_candidate_mask";
    check_dtype(op, "score", score, DType::BF16);
    DS4R_CHECK(block >= 1, "cuda apply_candidate_mask: block = %lld must be >= 1", (long long)block);
    DS4R_CHECK(score.ndim() == 2, "cuda apply_candidate_mask: score must be [m, T], got %s",
               shape_str(score.shape).c_str());
    check_data(op, "score", score);
    const int64_t m = score.dim(0), T = score.dim(1), nb = (T + block - 1) / block;
    const int64_t words = mask_words(op, mask, m, nb);
    check_disjoint(op, "mask", mask, "score", score);
    if (m == 0 || T == 0) return;
    kern::launch_apply_candidate_mask(score.ptr<uint16_t>(), mask.ptr<uint32_t>(), m, T, block, words,
                                      stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                             const Tensor& idx) {
    // score BF16 [m, T]; qpos I32 [m] -> idx I32 [m, K], K <= T.
    const char* op = "index_topk";
    check_dtype(op, "score", score, DType::BF16);
    check_dtype(op, "qpos", qpos, DType::I32);
    check_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(ratio >= 1, "cuda index_topk: ratio = %d must be >= 1", ratio);
    DS4R_CHECK(score.ndim() == 2 && idx.ndim() == 2 && idx.dim(0) == score.dim(0),
               "cuda index_topk: score [m, T] %s and idx [m, K] %s do not match",
               shape_str(score.shape).c_str(), shape_str(idx.shape).c_str());
    check_data(op, "score", score);
    check_data(op, "idx", idx);
    const int64_t m = score.dim(0), T = score.dim(1), K = idx.dim(1);
    DS4R_CHECK(K <= T, "cuda index_topk: K = %lld exceeds the %lld scores", (long long)K, (long long)T);
    DS4R_CHECK(offset >= 0 && offset + T <= std::numeric_limits<int32_t>::max(),
               "cuda index_topk: offset %lld out of range", (long long)offset);
    check_numel(op, "qpos", qpos, m);
    check_grid(op, m);
    check_disjoint(op, "idx", idx, "score", score);
    if (m == 0 || K == 0) return;
    kern::launch_index_topk(score.ptr<uint16_t>(), qpos.ptr<int32_t>(), m, T, ratio, offset,
                            idx.ptr<int32_t>(), K, stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------- attention (MODEL.md 4.6, 5.4)

void CudaBackend::window_indices(const Tensor& qpos, int64_t window, const Tensor& idx) {
    // qpos I32 [m] -> idx I32 [m, W].
    const char* op = "window_indices";
    check_dtype(op, "qpos", qpos, DType::I32);
    check_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(window > 0, "cuda window_indices: window = %lld must be positive", (long long)window);
    DS4R_CHECK(idx.ndim() == 2, "cuda window_indices: idx must be [m, W], got %s",
               shape_str(idx.shape).c_str());
    check_data(op, "idx", idx);
    const int64_t m = idx.dim(0), W = idx.dim(1);
    check_numel(op, "qpos", qpos, m);
    if (m == 0 || W == 0) return;
    kern::launch_attn_indices(qpos.ptr<int32_t>(), m, window, W, nullptr, 0, idx.ptr<int32_t>(), stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) {
    // qpos I32 [m]; topk I32 [m, Kc] (may be empty) -> idx I32 [m, W + Kc].
    const char* op = "attn_indices";
    check_dtype(op, "qpos", qpos, DType::I32);
    check_dtype(op, "idx", idx, DType::I32);
    DS4R_CHECK(window > 0, "cuda attn_indices: window = %lld must be positive", (long long)window);
    DS4R_CHECK(idx.ndim() == 2, "cuda attn_indices: idx must be [m, W + Kc], got %s",
               shape_str(idx.shape).c_str());
    check_data(op, "idx", idx);
    const int64_t m = idx.dim(0), n = idx.dim(1);
    const int64_t kc = topk.empty() ? 0 : topk.dim(1);
    if (kc > 0) {
        check_dtype(op, "topk", topk, DType::I32);
        check_shape(op, "topk", topk, {m, kc});
    }
    DS4R_CHECK(kc <= n, "cuda attn_indices: topk has %lld columns, idx only %lld", (long long)kc,
               (long long)n);
    check_numel(op, "qpos", qpos, m);
    check_disjoint(op, "idx", idx, "topk", topk);
    if (m == 0 || n == 0) return;
    kern::launch_attn_indices(qpos.ptr<int32_t>(), m, window, n - kc, kc > 0 ? topk.ptr<int32_t>() : nullptr,
                              kc, idx.ptr<int32_t>(), stream());
    DS4R_CUDA_LAUNCH_CHECK();
}

void CudaBackend::sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                              const Tensor& idx, float scale, const Tensor& o) {
    // q BF16 [m, H, hd]; win_kv BF16 [s, hd]; cmp_kv BF16 [T, hd]; sink F32 [H]; idx I32 [m, n_idx]
    // -> o BF16 [m, H, hd].
    const char* op = "sparse_attn";
    check_dtype(op, "q", q, DType::BF16);
    check_dtype(op, "win_kv", win_kv, DType::BF16);
    check_dtype(op, "cmp_kv", cmp_kv, DType::BF16);
    check_dtype(op, "sink", sink, DType::F32);
    check_dtype(op, "idx", idx, DType::I32);
    check_dtype(op, "o", o, DType::BF16);
    DS4R_CHECK(q.ndim() == 3, "cuda sparse_attn: q must be [m, H, hd], got %s", shape_str(q.shape).c_str());
    check_data(op, "q", q);
    const int64_t m = q.dim(0), H = q.dim(1), hd = q.dim(2);
    DS4R_CHECK(kern::sparse_attn_supported_dim(hd),
               "cuda sparse_attn: head dim %lld not supported (64, 128, 256, 512)", (long long)hd);
    const int64_t s = rows_of(op, "win_kv", win_kv, hd);
    const int64_t T = cmp_kv.numel() == 0 ? 0 : rows_of(op, "cmp_kv", cmp_kv, hd);
    check_numel(op, "sink", sink, H);
    DS4R_CHECK(idx.ndim() == 2 && idx.dim(0) == m, "cuda sparse_attn: idx must be [%lld, n_idx], got %s",
               (long long)m, shape_str(idx.shape).c_str());
    check_data(op, "idx", idx);
    check_numel(op, "o", o, m * H * hd);
    DS4R_CHECK(std::isfinite(scale), "cuda sparse_attn: scale %g is not finite", static_cast<double>(scale));
    DS4R_CHECK(s + T <= std::numeric_limits<int32_t>::max(),
               "cuda sparse_attn: %lld KV rows exceed int32 indices", (long long)(s + T));
    check_aligned(op, "q", q, 16);
    check_aligned(op, "win_kv", win_kv, 16);
    check_aligned(op, "cmp_kv", cmp_kv, 16);
    check_aligned(op, "o", o, 4);
    // o may be q itself (each CTA reads its q rows before writing the same rows), else disjoint.
    if (o.data != q.data) check_disjoint(op, "o", o, "q", q);
    check_disjoint(op, "o", o, "win_kv", win_kv);
    check_disjoint(op, "o", o, "cmp_kv", cmp_kv);
    check_disjoint(op, "o", o, "idx", idx);
    const int64_t groups = (H + 15) / 16;
    check_grid(op, m * groups);
    DS4R_CHECK(kern::sparse_attn_smem_bytes(hd) <= props().sharedMemPerBlockOptin,
               "cuda sparse_attn: %zu bytes of shared memory needed, the device allows %zu per block",
               kern::sparse_attn_smem_bytes(hd), static_cast<size_t>(props().sharedMemPerBlockOptin));
    if (m == 0 || H == 0) return;
    DS4R_CUDA_CHECK(kern::launch_sparse_attn(q.ptr<uint16_t>(), win_kv.ptr<uint16_t>(),
                                             T > 0 ? cmp_kv.ptr<uint16_t>() : nullptr, sink.ptr<float>(),
                                             idx.ptr<int32_t>(), o.ptr<uint16_t>(), m, H, hd, s, T,
                                             idx.dim(1), scale, stream()));
}

// ---------------------------------------------------------------------------- head (MODEL.md 4.9)

void CudaBackend::head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                             const HeadStatsOut& out) {
    // x BF16 [M, D]; head BF16 [V, D]; targets I32 [M] -> out (HeadStatsOut shapes).
    const char* op = "head_stats";
    check_dtype(op, "x", x, DType::BF16);
    check_dtype(op, "head", head, DType::BF16);
    check_dtype(op, "targets", targets, DType::I32);
    DS4R_CHECK(head.ndim() == 2, "cuda head_stats: head must be [V, D], got %s",
               shape_str(head.shape).c_str());
    check_data(op, "head", head);
    const int64_t V = head.dim(0), D = head.dim(1);
    DS4R_CHECK(V >= 1 && V < (int64_t{1} << 31), "cuda head_stats: vocabulary of %lld", (long long)V);
    DS4R_CHECK(D % 8 == 0, "cuda head_stats: D = %lld must be a multiple of 8", (long long)D);
    DS4R_CHECK(V <= int64_t{65535} * 128, "cuda head_stats: vocabulary of %lld exceeds the grid limit",
               (long long)V);
    DS4R_CHECK(k >= 0 && k <= V && k <= kern::kHeadMaxTopK,
               "cuda head_stats: k = %d outside [0, min(%lld, %d)]", k, (long long)V, kern::kHeadMaxTopK);
    const int64_t M = rows_of(op, "x", x, D);
    check_numel(op, "targets", targets, M);
    check_dtype(op, "out.lse", out.lse, DType::F64);
    check_dtype(op, "out.entropy", out.entropy, DType::F64);
    check_dtype(op, "out.target_logit", out.target_logit, DType::F32);
    check_dtype(op, "out.rank", out.rank, DType::I32);
    check_dtype(op, "out.topk_ids", out.topk_ids, DType::I32);
    check_dtype(op, "out.topk_logit", out.topk_logit, DType::F32);
    check_numel(op, "out.lse", out.lse, M);
    check_numel(op, "out.entropy", out.entropy, M);
    check_numel(op, "out.target_logit", out.target_logit, M);
    check_numel(op, "out.rank", out.rank, M);
    check_numel(op, "out.topk_ids", out.topk_ids, M * k);
    check_numel(op, "out.topk_logit", out.topk_logit, M * k);
    check_aligned(op, "x", x, 16);
    check_aligned(op, "head", head, 16);
    if (M == 0) return;
    check_grid(op, M);
    {
        // The CPU reference rejects targets outside the vocabulary; so do we (M ints, one copy).
        std::vector<int32_t> t(static_cast<size_t>(M));
        download(t.data(), targets, 0, t.size() * sizeof(int32_t));
        for (int64_t r = 0; r < M; ++r)
            DS4R_CHECK(t[static_cast<size_t>(r)] < V,
                       "cuda head_stats: targets[%lld] = %d is outside the vocabulary of %lld", (long long)r,
                       t[static_cast<size_t>(r)], (long long)V);
    }
    const int64_t chunk = std::min<int64_t>(M, kern::kHeadChunkRows);
    Tensor logits = alloc(DType::F32, {chunk, V});  // [chunk, V] fp32, reused by every chunk
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        const int64_t R = std::min(chunk, M - r0);
        DS4R_CUDA_CHECK(kern::launch_head_logits(x.ptr<uint16_t>() + r0 * D, head.ptr<uint16_t>(),
                                                 logits.ptr<float>(), R, V, D, stream()));
        kern::launch_head_row_stats(logits.ptr<float>(), targets.ptr<int32_t>() + r0, R, V, k,
                                    out.lse.ptr<double>() + r0, out.entropy.ptr<double>() + r0,
                                    out.target_logit.ptr<float>() + r0, out.rank.ptr<int32_t>() + r0,
                                    k > 0 ? out.topk_ids.ptr<int32_t>() + r0 * k : nullptr,
                                    k > 0 ? out.topk_logit.ptr<float>() + r0 * k : nullptr, stream());
        DS4R_CUDA_LAUNCH_CHECK();
    }
}

}  // namespace ds4r
