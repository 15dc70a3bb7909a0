// Launch wrappers of the GEMM kernels (kernels/gemm.cu, gemm_simt.cu, gemm_peak.cu; the reference
// kernels the tests hold them to are tests/cuda/testkit/gemm_oracle.cu).
// Plain declarations: included by g++-compiled backend code. All matrices are row major; A [M, K] are
// activations, W [N, K] weights (K contiguous), C = A . W^T [M, N]. Pitches are in ELEMENTS of the
// named type. Every kernel fixes each output element's reduction order (instruction sequence); tile
// shapes may depend on M, results never do (kernels/gemm_tile.cuh NUMERICS).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// Tensor-core bf16 GEMM with fp32 accumulation (K in order, 32 at a time), out bf16 (one rounding)
// or f32. groups >= 1 independent problems of the same shape: group g reads x + g * x_goff,
// w + g * w_goff and writes y + g * y_goff (elements).
// x bf16 [M, K] (pitch lda); w bf16 [N, K] (pitch ldw); y [M, N] (pitch ldc).
// Needs K % 8 == 0, lda, ldw, x_goff, w_goff multiples of 8 and 16-byte aligned x, w
// (gemm_bf16_supported checks it); otherwise use launch_gemm_simt.
bool gemm_bf16_supported(const void* x, int64_t lda, int64_t x_goff, const void* w, int64_t ldw,
                         int64_t w_goff, int64_t K);
cudaError_t launch_gemm_bf16(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w, int64_t ldw,
                             int64_t w_goff, void* y, bool y_f32, int64_t ldc, int64_t y_goff, int64_t M,
                             int64_t N, int64_t K, int64_t groups, cudaStream_t stream);

// CUDA-core fp32 GEMM (FFMA, K in order, no TF32) for any dtypes / alignment / K:
// x [M, K] bf16 or f32 (pitch lda); w [N, K] bf16 or f32 (pitch ldw); y [M, N] bf16 or f32 (pitch
// ldc); groups as above.
cudaError_t launch_gemm_simt(const void* x, bool x_f32, int64_t lda, int64_t x_goff, const void* w,
                             bool w_f32, int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                             int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                             cudaStream_t stream);

// Block-scaled GEMMs (docs/MODEL.md 5.3), out bf16 y [M, N] (pitch ldc):
// q e4m3 [M, K] activation codes (pitch K) in Fp8CodeOrder::GemmFragment with sa e8m0 [M, K / 32]
// (launch_act_quant_fp8 with GemmNanMarker scale bytes, quant.cuh);
// fp8: w e4m3 [N, K] with sw e8m0 [ceil(N / 32), K / 32]; fp4: w packed e2m1 [N, K / 2] with sw e8m0
// [N, K / 32]. K % 32 == 0; q, w 16-byte aligned.
cudaError_t launch_gemm_fp8(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                            uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream);
cudaError_t launch_gemm_fp4(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                            uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream);

// The routed experts' grouped fp4 GEMM: one launch covers every expert (up to kMaxGroupedExperts per
// launch; more are done in batches) and up to two projections with the same activations (w1, w3).
// Rows are "pairs" (token, slot) sorted by expert (MoE routing, kernels/moe.cuh); expert e owns pair
// positions [expert_end[e] - n_e, expert_end[e]). The device tile schedule lists 128-row tiles:
// tile t covers pairs [tile_start[t], min(tile_start[t] + 128, expert_end[tile_expert[t]])) of expert
// tile_expert[t]; the tiles of expert e are [tile_begin[e], tile_begin[e + 1]).
constexpr int kMaxGroupedExperts = 512;
// A list of 128-row plan tiles (the routing plan's, or a part of it): tile t of expert e covers pair
// positions [tile_start[t], min(tile_start[t] + 128, expert_end[e])); e's tiles are [tile_begin[e],
// tile_begin[e + 1]).
struct GroupedTileList {
    const int32_t* tile_expert = nullptr;  // [max_tiles]
    const int32_t* tile_start = nullptr;   // [max_tiles]
    const int32_t* tile_begin = nullptr;   // [n_experts + 1]
    int64_t max_tiles = 0;                 // bound on the list's tiles
};

struct GroupedFp4Gemm {
    const uint8_t* q;             // e4m3 activation codes [rows, K] (Fp8CodeOrder::GemmFragment)
    const uint8_t* sa;            // e8m0 [rows, K / 32] (GemmNanMarker bytes)
    const int32_t* a_rows;        // [pairs]: activation row of each pair, or null (row = pair position)
    const int32_t* tile_expert;   // [max_tiles]
    const int32_t* tile_start;    // [max_tiles]
    const int32_t* tile_begin;    // [n_experts + 1]
    const int32_t* expert_end;    // [n_experts]
    int64_t max_tiles;            // bound on the number of tiles (grid size); extra blocks exit at once
    int64_t max_rows_per_expert;  // bound on n_e (the token count)
    int64_t pairs = 0;            // rows over all experts (sum n_e) if known, else 0 (tile choice only)
    int n_experts;
    int n_proj;                  // 1 or 2 projections
    int64_t N, K;                // each expert's weight is [N, K]
    const uint8_t* const* w[2];  // host arrays [n_experts] of device pointers: packed e2m1 [N, K / 2]
                                 // (w_e5m2: e5m2 bytes [N, K])
    const uint8_t* const* s[2];  // host arrays [n_experts]: e8m0 [N, K / 32]
    uint16_t* y[2];              // bf16 [pairs, N]
    // The weights as e5m2 bytes, one per value (launch_fp4_to_e5m2 of the packed codes: the same values;
    // the prepared experts of the Hopper kernels, docs/PERFORMANCE.md). Hopper widened partials only:
    // every other launcher returns cudaErrorInvalidValue.
    bool w_e5m2 = false;
    // The weights as fp16 [N, K] with each (column, K block)'s scale taken into the values where it folds
    // (launch_fp4_to_f16_folded: e2m1 * 2^(byte - 127) for bytes 114 .. 128, else e2m1; the same values
    // the Hopper converters make), every expert of a projection at one stride (w[z][e] = w[z][0] + e *
    // stride: one tensor map). The Hopper kernels' prepared experts where memory allows (twice the e5m2
    // bytes); widened partials only: every other launcher returns cudaErrorInvalidValue.
    bool w_f16 = false;
    // Optional (Hopper, launch_moe_tile_split): the plan above split by tile height: `full` every tile
    // but each expert's last one when it holds 1 .. 64 pairs, `tail` those last tiles (one per expert at
    // most), so that they take 64-row tiles (Sm90GroupedRows::Mixed). Null pointers: no split.
    GroupedTileList full, tail;
};
cudaError_t launch_grouped_gemm_fp4(const GroupedFp4Gemm& g, cudaStream_t stream);

// The Hopper grouped launcher's plan (hopper/gemm_sm90.cu; gemm.cu has its own copy): validates g
// (cudaErrorInvalidValue: K % 32, sizes, projections, 16-byte aligned codes and weights) and calls launch(e0,
// e1, grid) for each batch [e0, e1) of at most kMaxGroupedExperts experts, with grid = (N tiles of bn
// columns, a bound on the batch's tiles of bm rows, projections); stops at the first error.
template <class Launch>
inline cudaError_t for_each_grouped_batch(const GroupedFp4Gemm& g, int64_t bm, int64_t bn, Launch&& launch) {
    auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (g.K % 32 != 0 || g.K > 0x7fffffffLL || g.N > 0x7fffffffLL || g.n_proj < 1 || g.n_proj > 2 ||
        !aligned16(g.q) || g.n_experts < 0)
        return cudaErrorInvalidValue;
    if (g.n_experts == 0 || g.max_tiles <= 0 || g.N == 0) return cudaSuccess;
    for (int z = 0; z < g.n_proj; ++z)
        for (int e = 0; e < g.n_experts; ++e)
            if (!aligned16(g.w[z][e])) return cudaErrorInvalidValue;
    const int64_t gx = (g.N + bn - 1) / bn;
    const int64_t rows_tiles = (g.max_rows_per_expert + bm - 1) / bm;
    for (int e0 = 0; e0 < g.n_experts; e0 += kMaxGroupedExperts) {
        const int e1 = g.n_experts - e0 < kMaxGroupedExperts ? g.n_experts : e0 + kMaxGroupedExperts;
        // tiles of this batch <= min(all tiles, experts x tiles of one expert)
        const int64_t batch_bound = static_cast<int64_t>(e1 - e0) * rows_tiles;
        const int64_t gy = g.max_tiles < batch_bound ? g.max_tiles : batch_bound;
        if (gy <= 0) continue;
        if (gy > 65535 || gx > 0x7fffffffLL) return cudaErrorInvalidValue;
        const cudaError_t err = launch(
            e0, e1,
            dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(g.n_proj)));
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

// mma.sync peak microbenchmark (kernels/gemm_peak.cu): `blocks` blocks of mma_peak_threads_per_block()
// threads, each warp issuing iters x 16 independent m16n8k16 bf16 -> fp32 MMAs from registers;
// out f32 [blocks * threads] receives a checksum. mma_peak_flops_per_launch = 2 * 16 * 8 * 16 * MMAs.
int mma_peak_threads_per_block();
double mma_peak_flops_per_launch(int blocks, int iters);
cudaError_t launch_mma_peak(int blocks, int iters, float* out, cudaStream_t stream);

}  // namespace ds4r::kern
