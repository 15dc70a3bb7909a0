// CudaBackend ops: the indexer (scores, candidate blocks, top-k), attention index rows, sparse
// attention and the output-head statistics (docs/MODEL.md 4.6, 4.6.2, 4.9, 5.4, 6, 8.1, 8.2). Contracts:
// backend/op_checks.h, plus the kernels' own limits here; the kernels live in
// kernels/{indexer,attention,head}.cu.
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
#include "backend/cuda/cuda_linear_checks.h"
#include "head.cuh"
#include "indexer.cuh"

namespace ds4r {

using namespace cuda_linear;

// ---------------------------------------------------------------------------- indexer (docs/MODEL.md 4.6.2)

void CudaBackend::index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos,
                               int ratio, const Tensor& score) {
    // q BF16 [m, nh, ihd]; k BF16 [T, ihd]; w BF16 [m, nh]; qpos I32 [m] -> score BF16 [m, T].
    const char* op = "index_scores";
    const auto [m, nh, ihd, T] = opcheck::index_scores(q, k, w, qpos, ratio, score);
    DS4R_CHECK(nh >= 1 && nh <= kern::kIndexMaxHeads,
               "cuda index_scores: %lld index heads (supported: 1..%d)", (long long)nh, kern::kIndexMaxHeads);
    DS4R_CHECK(kern::index_scores_supported_dim(static_cast<int>(ihd)),
               "cuda index_scores: index head dim %lld not supported (32, 64 or 128)", (long long)ihd);
    check_aligned(op, "q", q, 4);
    check_aligned(op, "k", k, 16);
    check_grid(op, (m + 3) / 4);
    DS4R_CHECK((T + 255) / 256 <= 65535, "cuda index_scores: T = %lld keys exceed the grid limit",
               (long long)T);
    check_disjoint(op, "score", score, "q", q);
    check_disjoint(op, "score", score, "k", k);
    if (m == 0 || T == 0) return;
    DS4R_CUDA_CHECK(kern::launch_index_scores(
        q.ptr<uint16_t>(), k.ptr<uint16_t>(), w.ptr<uint16_t>(), qpos.ptr<int32_t>(), m, static_cast<int>(nh),
        static_cast<int>(ihd), T, ratio, score.ptr<uint16_t>(), stream()));
}

void CudaBackend::candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block,
                                   int64_t topk_blocks, const Tensor& mask) {
    // score BF16 [m, T]; qpos I32 [m] -> mask I32 [m, >= ceil(ceil(T / block) / 32)] (bit words).
    const char* op = "candidate_blocks";
    const auto [m, T, nb, words] = opcheck::candidate_blocks(score, qpos, ratio, block, topk_blocks, mask);
    DS4R_CHECK(topk_blocks <= std::numeric_limits<int32_t>::max(),
               "cuda candidate_blocks: topk_blocks %lld exceeds the kernel's int32 count",
               (long long)topk_blocks);
    check_grid(op, m);
    check_disjoint(op, "mask", mask, "score", score);
    if (m == 0 || words == 0) return;
    DS4R_CUDA_CHECK(kern::launch_candidate_blocks(score.ptr<uint16_t>(), qpos.ptr<int32_t>(), m, T, ratio,
                                                  block, topk_blocks, mask.ptr<uint32_t>(), words, stream()));
}

void CudaBackend::apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) {
    // score BF16 [m, T] in place; mask I32 [m, >= ceil(ceil(T / block) / 32)].
    const char* op = "apply_candidate_mask";
    const auto [m, T, nb, words] = opcheck::apply_candidate_mask(score, mask, block);
    check_disjoint(op, "mask", mask, "score", score);
    if (m == 0 || T == 0) return;
    DS4R_CUDA_CHECK(kern::launch_apply_candidate_mask(score.ptr<uint16_t>(), mask.ptr<uint32_t>(), m, T,
                                                      block, words, stream()));
}

void CudaBackend::index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                             const Tensor& idx) {
    // score BF16 [m, T]; qpos I32 [m] -> idx I32 [m, K], K <= T.
    const char* op = "index_topk";
    const auto [m, T, K] = opcheck::index_topk(score, qpos, ratio, offset, idx);
    check_grid(op, m);
    check_disjoint(op, "idx", idx, "score", score);
    if (m == 0 || K == 0) return;
    DS4R_CUDA_CHECK(kern::launch_index_topk(score.ptr<uint16_t>(), qpos.ptr<int32_t>(), m, T, ratio, offset,
                                            idx.ptr<int32_t>(), K, stream()));
}

// ---------------------------------------------------------------------------- attention
// (docs/MODEL.md 4.6, 5.4)

void CudaBackend::window_indices(const Tensor& qpos, int64_t window, const Tensor& idx) {
    // qpos I32 [m] -> idx I32 [m, W].
    const auto [m, W] = opcheck::window_indices(qpos, window, idx);
    if (m == 0 || W == 0) return;
    DS4R_CUDA_CHECK(kern::launch_attn_indices(qpos.ptr<int32_t>(), m, window, W, nullptr, 0,
                                              idx.ptr<int32_t>(), stream()));
}

void CudaBackend::attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) {
    // qpos I32 [m]; topk I32 [m, Kc] (may be empty) -> idx I32 [m, W + Kc].
    const auto [m, W, kc] = opcheck::attn_indices(qpos, window, topk, idx);
    if (m == 0 || W + kc == 0) return;
    DS4R_CUDA_CHECK(kern::launch_attn_indices(qpos.ptr<int32_t>(), m, window, W,
                                              kc > 0 ? topk.ptr<int32_t>() : nullptr, kc, idx.ptr<int32_t>(),
                                              stream()));
}

void CudaBackend::sparse_attn(const Tensor& q, const Tensor& win_kv, const Tensor& cmp_kv, const Tensor& sink,
                              const Tensor& idx, float scale, const Tensor& o) {
    // q BF16 [m, H, hd]; win_kv BF16 [s, hd]; cmp_kv BF16 [T, hd]; sink F32 [H]; idx I32 [m, n_idx]
    // -> o BF16 [m, H, hd].
    const char* op = "sparse_attn";
    const auto [m, H, hd, s, T, n_idx] = opcheck::sparse_attn(q, win_kv, cmp_kv, sink, idx, o);
    DS4R_CHECK(kern::sparse_attn_supported_dim(hd),
               "cuda sparse_attn: head dim %lld not supported (64, 128, 256, 512)", (long long)hd);
    DS4R_CHECK(std::isfinite(scale), "cuda sparse_attn: scale %g is not finite", static_cast<double>(scale));
    DS4R_CHECK(s + T <= std::numeric_limits<int32_t>::max(),
               "cuda sparse_attn: %lld KV rows exceed int32 indices", (long long)(s + T));
    check_aligned(op, "q", q, 16);
    check_aligned(op, "win_kv", win_kv, 16);
    check_aligned(op, "cmp_kv", cmp_kv, 16);
    check_aligned(op, "o", o, 4);
    // o may be q itself (each CTA reads its q rows before writing the same rows), else disjoint.
    check_same_or_disjoint(op, "o", o, "q", q);
    check_disjoint(op, "o", o, "win_kv", win_kv);
    check_disjoint(op, "o", o, "cmp_kv", cmp_kv);
    check_disjoint(op, "o", o, "idx", idx);
    const kern::SparseAttnCta cta = gemm_.attn_cta;
    const int64_t per_cta = kern::sparse_attn_heads_per_cta(cta);
    check_grid(op, m * ((H + per_cta - 1) / per_cta));
    DS4R_CHECK(kern::sparse_attn_smem_bytes(hd, cta) <= props().sharedMemPerBlockOptin,
               "cuda sparse_attn: %zu bytes of shared memory needed, the device allows %zu per block",
               kern::sparse_attn_smem_bytes(hd, cta), static_cast<size_t>(props().sharedMemPerBlockOptin));
    if (m == 0 || H == 0) return;
    DS4R_CUDA_CHECK(kern::launch_sparse_attn(q.ptr<uint16_t>(), win_kv.ptr<uint16_t>(),
                                             T > 0 ? cmp_kv.ptr<uint16_t>() : nullptr, sink.ptr<float>(),
                                             idx.ptr<int32_t>(), o.ptr<uint16_t>(), m, H, hd, s, T, n_idx,
                                             scale, stream(), cta));
}

// ---------------------------------------------------------------------------- head (docs/MODEL.md 4.9)

void CudaBackend::head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                             const HeadStatsOut& out) {
    // x BF16 [M, D]; head BF16 [V, D]; targets I32 [M] -> out (HeadStatsOut shapes).
    const char* op = "head_stats";
    const auto [M, V, D] = opcheck::head_stats(x, head, targets, k, out);
    DS4R_CHECK(V >= 1 && V < (int64_t{1} << 31), "cuda head_stats: vocabulary of %lld", (long long)V);
    DS4R_CHECK(D % 8 == 0, "cuda head_stats: D = %lld must be a multiple of 8", (long long)D);
    DS4R_CHECK(V <= int64_t{65535} * 128, "cuda head_stats: vocabulary of %lld exceeds the grid limit",
               (long long)V);
    DS4R_CHECK(k <= kern::kHeadMaxTopK, "cuda head_stats: k = %d exceeds the kernel's top-k limit %d", k,
               kern::kHeadMaxTopK);
    check_aligned(op, "x", x, 16);
    check_aligned(op, "head", head, 16);
    if (M == 0) return;
    check_grid(op, M);
    {
        // The CPU reference rejects targets outside the vocabulary; so do we (M ints, one copy).
        std::vector<int32_t> t(static_cast<size_t>(M));
        download(t.data(), targets, 0, t.size() * sizeof(int32_t));
        opcheck::head_targets(t.data(), M, V);
    }
    const int64_t chunk = std::min<int64_t>(M, kern::kHeadChunkRows);
    Tensor logits = alloc(DType::F32, {chunk, V});  // [chunk, V] fp32, reused by every chunk
    for (int64_t r0 = 0; r0 < M; r0 += chunk) {
        const int64_t R = std::min(chunk, M - r0);
        {
            ProfileRange pr(*this, "head/logits");  // DS4R_PROFILE: sub-regions of "head"
            head_logits(x.ptr<uint16_t>() + r0 * D, head.ptr<uint16_t>(), logits.ptr<float>(), R, V, D);
        }
        ProfileRange pr(*this, "head/row_stats");
        DS4R_CUDA_CHECK(kern::launch_head_row_stats(
            logits.ptr<float>(), targets.ptr<int32_t>() + r0, R, V, k, out.lse.ptr<double>() + r0,
            out.entropy.ptr<double>() + r0, out.target_logit.ptr<float>() + r0, out.rank.ptr<int32_t>() + r0,
            k > 0 ? out.topk_ids.ptr<int32_t>() + r0 * k : nullptr,
            k > 0 ? out.topk_logit.ptr<float>() + r0 * k : nullptr, stream()));
    }
}

void CudaBackend::head_logits(const uint16_t* x, const uint16_t* head, float* logits, int64_t R, int64_t V,
                              int64_t D) {
    // Hopper: the bf16 wgmma GEMM (the same fp32 chain over k16 steps from +0, f32 out); else the
    // head's own mma.sync kernel (kernels/head.cu)
    if (gemm_.hopper && kern::gemm_bf16_supported(x, D, 0, head, D, 0, D))
        DS4R_CUDA_CHECK(gemm_.bf16(x, D, 0, head, D, 0, logits, true, V, 0, R, V, D, 1, stream()));
    else
        DS4R_CUDA_CHECK(kern::launch_head_logits(x, head, logits, R, V, D, stream()));
}

}  // namespace ds4r
