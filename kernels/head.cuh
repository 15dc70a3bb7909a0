// Launch wrappers of the output-head kernels (docs/MODEL.md 4.9, docs/DESIGN.md 2): fp32 logits of a chunk of
// rows, then per-row statistics over the full vocabulary. The caller walks the rows in chunks of at
// most kHeadChunkRows so [M, V] is never materialized. Every row's results depend on that row only.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// Rows per logits chunk: 1024 x 129,280 fp32 = 530 MB of temporary. (256 rows left the row-statistics
// kernel at 256 CTAs, under one wave on an H200, and re-read the 1.3 GB head weights once per 256 rows.)
constexpr int64_t kHeadChunkRows = 1024;
// Largest top-k head_row_stats supports.
constexpr int kHeadMaxTopK = 1024;

// logits F32 [R, V] = x BF16 [R, D] . w BF16 [V, D]^T on the tensor cores (products of bf16 values
// are exact in fp32; fp32 accumulation in a fixed k order, independent of R). D % 8 == 0; x, w
// 16-byte aligned. Returns the error of the shared-memory attribute call or of the launch.
cudaError_t launch_head_logits(const uint16_t* x, const uint16_t* w, float* logits, int64_t R, int64_t V,
                               int64_t D, cudaStream_t stream);

// Per row r < R of logits F32 [R, V], targets I32 [R] (-1 = none, else < V):
// lse F64 [R] = max + log(sum exp(l - max)) (fp64), entropy F64 [R] = lse - sum p l (fp64),
// target_logit F32 [R] and rank I32 [R] = 1 + #{l > l_target} (0 and 0 without a target),
// topk_ids I32 [R, k] / topk_logit F32 [R, k]: the k largest logits, descending, equal logits by
// lower id (+0 == -0; NaN below everything). 0 <= k <= min(V, kHeadMaxTopK).
cudaError_t launch_head_row_stats(const float* logits, const int32_t* targets, int64_t R, int64_t V, int k,
                                  double* lse, double* entropy, float* target_logit, int32_t* rank,
                                  int32_t* topk_ids, float* topk_logit, cudaStream_t stream);

}  // namespace ds4r::kern
