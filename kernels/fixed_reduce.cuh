// Fixed-order block reductions for the norm / mHC / Engram kernels (batch invariance, DESIGN.md 4):
// the order depends only on the block size, never on the number of rows or on the other rows.
// Each thread first accumulates its own strided slice sequentially; then a warp butterfly (xor 16,
// 8, 4, 2, 1: every lane ends with the same bits, fp32 addition being commutative); then the warp
// totals are added sequentially, warp 0 first. CUDA headers only.
#pragma once

#include <cuda_runtime.h>

namespace ds4r::kern {

constexpr int kFixedReduceThreads = 256;  // every kernel using these helpers launches 256 threads
constexpr int kFixedReduceWarps = kFixedReduceThreads / 32;

__device__ __forceinline__ float warp_butterfly_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Sum of NV per-thread values over a 256-thread block; every thread receives the totals.
// `scratch` is shared memory of kFixedReduceWarps * NV floats. Contains __syncthreads(): call from
// every thread of the block, in uniform control flow.
template <int NV>
__device__ __forceinline__ void block_sum_fixed(float (&v)[NV], float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] = warp_butterfly_sum(v[i]);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NV; ++i) scratch[warp * NV + i] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NV; ++i) {
        float s = scratch[i];
        for (int w = 1; w < kFixedReduceWarps; ++w) s = __fadd_rn(s, scratch[w * NV + i]);
        v[i] = s;
    }
}

}  // namespace ds4r::kern
