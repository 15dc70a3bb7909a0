// Launch wrappers of the indexer kernels (docs/MODEL.md 4.6.2 steps 4-7, 8.1, 8.2): index scores, the
// candidate-block mask, applying it, and the top-K_c selection. Raw device pointers, one sequence's
// rows per call; every output row depends only on its own inputs (batch invariant, deterministic).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// Largest index-head count and the head dims index_scores supports (real 32 x 128, tiny 4 x 64).
constexpr int kIndexMaxHeads = 32;
bool index_scores_supported_dim(int ihd);

// score BF16 [m, T] (bits) from q BF16 [m, nh, ihd] (fp4-QDQ'd, roped), k BF16 [T, ihd],
// w BF16 [m, nh] (already * 1/64), qpos I32 [m]: S = bf16(fp32 q_h . k_j), relu,
// p = bf16(relu(S) * w_h), score = bf16(((0 + p_0) + p_1) + ... + p_{nh-1}) in fp32;
// -inf for j >= (qpos + 1) / ratio. nh <= kIndexMaxHeads; ihd in {32, 64, 128}; q, k 16-byte aligned.
cudaError_t launch_index_scores(const uint16_t* q, const uint16_t* k, const uint16_t* w, const int32_t* qpos,
                                int64_t m, int nh, int ihd, int64_t T, int ratio, uint16_t* score,
                                cudaStream_t stream);

// mask I32 [m, words] (32-bit words, bit b % 32 of word b / 32 = block b kept) from score BF16 [m, T]
// and qpos I32 [m]: block max over `block` positions (-inf padding, NaN propagates), the block
// (n_t - 1) // block pinned to +inf when n_t >= 1 (n_t = (qpos + 1) / ratio; n_t = 0 pins none),
// top min(topk_blocks, n_blocks) by the CUDA tie rule, picks whose score is not > -inf dropped.
// words >= ceil(n_blocks / 32); extra words are zeroed.
cudaError_t launch_candidate_blocks(const uint16_t* score, const int32_t* qpos, int64_t m, int64_t T,
                                    int ratio, int64_t block, int64_t topk_blocks, uint32_t* mask,
                                    int64_t words, cudaStream_t stream);

// In place on score BF16 [m, T]: -inf where bit (j / block) of mask I32 [m, words] row is 0.
cudaError_t launch_apply_candidate_mask(uint16_t* score, const uint32_t* mask, int64_t m, int64_t T,
                                        int64_t block, int64_t words, cudaStream_t stream);

// idx I32 [m, K] from score BF16 [m, T] (K <= T): the K positions of CUDA torch.topk (values > the
// K-th largest, then equal values by ascending position), sorted ascending, each mapped to
// j + offset if j < (qpos + 1) / ratio else -1. qpos I32 [m].
cudaError_t launch_index_topk(const uint16_t* score, const int32_t* qpos, int64_t m, int64_t T, int ratio,
                              int64_t offset, int32_t* idx, int64_t K, cudaStream_t stream);

}  // namespace ds4r::kern
