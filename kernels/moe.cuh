// Launch wrappers of the MoE kernels (docs/MODEL.md 4.7) other than the GEMMs: router top-k, the routing
// plan (pairs grouped by expert, deterministic counting sort), the SwiGLU + activation quant of the
// expert hidden rows, and the combine. Plain declarations: included by g++-compiled backend code.
//
// Vocabulary: a "pair" is (token row r, top-k slot s). Pairs are ordered by expert id, and by
// ascending row inside one expert; expert e owns pair positions [expert_begin[e], expert_end[e]).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "quant.cuh"

namespace ds4r::kern {

// Router (docs/MODEL.md 4.7, 8.1, 8.2): logits f32 [M, E] (already x . gate^T); bias f32 [E].
// score = sqrt(softplus(logit * inv_temp)); top-k of score + bias under CUDA torch.topk's rule, in
// descending order (ties: ascending expert id); w = score[idx] / (sum + 1e-20) * route_scale with the
// CUDA sum order ((w0 + w4) + w2) + ((w1 + w5) + w3) for k == 6 (sequential otherwise).
// -> idx i32 [M, k], w f32 [M, k]. 1 <= k <= E, k <= 32.
cudaError_t launch_moe_router(const float* logits, const float* bias, int64_t M, int E, int k, float inv_temp,
                              float route_scale, int32_t* idx, float* w, cudaStream_t stream);

// Routing plan from idx i32 [M, k] and w f32 [M, k] (E experts, k distinct experts per row):
//   counts [E]                     pairs per expert (scratch)
//   expert_begin, expert_end [E]   pair position ranges
//   tile_begin [E + 1]             the 128-row tiles of expert e are [tile_begin[e], tile_begin[e + 1])
//   tile_expert, tile_start [max_tiles]  expert and first pair position of each tile
//   pair_row [M * k], pair_w [M * k]     token row and routing weight of each pair position
//   slot_pos [M, k]                pair position of (row, slot)
// max_tiles must bound sum_e ceil(n_e / 128). Every array is written by the kernels (no memset).
cudaError_t launch_moe_routing(const int32_t* idx, const float* w, int64_t M, int k, int E, int32_t* counts,
                               int32_t* expert_begin, int32_t* expert_end, int32_t* tile_begin,
                               int32_t* tile_expert, int32_t* tile_start, int64_t max_tiles,
                               int32_t* pair_row, float* pair_w, int32_t* slot_pos, cudaStream_t stream);

// The routing plan's tile list split by tile height (GroupedFp4Gemm::full / tail), from counts [E] and
// expert_begin [E] of launch_moe_routing: full_begin [E + 1], full_expert / full_start [max_tiles] (each
// expert's tiles of 128 pairs but its last one when that holds 1 .. 64 pairs), tail_begin [E + 1],
// tail_expert / tail_start [E] (those last tiles). max_tiles: launch_moe_routing's bound. Every array is
// written (no memset).
cudaError_t launch_moe_tile_split(const int32_t* counts, const int32_t* expert_begin, int E,
                                  int32_t* full_begin, int32_t* full_expert, int32_t* full_start,
                                  int64_t max_tiles, int32_t* tail_begin, int32_t* tail_expert,
                                  int32_t* tail_start, cudaStream_t stream);

// SwiGLU of the expert hidden rows + act quant for the down projection (docs/MODEL.md 4.7, 5.1):
// g, u bf16 [P, I]; a = silu(min(g, limit)) * clamp(u, -limit, limit) in fp32, then a = weight[p] * a
// when weight (f32 [P]) is non-null; bf16(a) quantized per 32 -> q e4m3 [P, I], s e8m0 [P, I / 32], the
// block-scaled GEMM's A operand (quant.cuh: GemmNanMarker scale bytes, codes in `order`: GemmFragment
// for the portable GEMMs, Canonical for the Hopper ones). I % 32 == 0.
cudaError_t launch_swiglu_quant(const uint16_t* g, const uint16_t* u, const float* weight, float limit,
                                int64_t P, int64_t I, uint8_t* q, uint8_t* s, Fp8CodeOrder order,
                                cudaStream_t stream);

// dst [n, row_bytes] with row i = src row rows[i] (src [*, row_bytes]; rows i32 [n] in range): the
// activation rows of the pairs in pair order (the Hopper grouped kernel on prepared fp16 experts then
// reads them by TMA, gather_pair_rows in the backend).
cudaError_t launch_gather_rows(const uint8_t* src, int64_t row_bytes, const int32_t* rows, int64_t n,
                               uint8_t* dst, cudaStream_t stream);

// Combine (docs/MODEL.md 4.7): y bf16 [M, D] with y[r] = bf16(((0 + e_a) + e_b) ... + shared[r]) in fp32,
// the routed terms out_e bf16 [M * k, D] at pair positions slot_pos [M, k], added in ascending
// expert id (idx i32 [M, k]); shared bf16 [M, D]. k <= 32.
cudaError_t launch_moe_combine(const uint16_t* out_e, const int32_t* idx, const int32_t* slot_pos, int k,
                               const uint16_t* shared, int64_t M, int64_t D, uint16_t* y,
                               cudaStream_t stream);

}  // namespace ds4r::kern
