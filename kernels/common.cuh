// Device helpers shared by every kernel family: the exact conversions (include/ds4r/numeric.h, shared
// with the host) and the elementwise function forms of docs/MODEL.md 8.2. CUDA headers only.
//
// Launcher convention (every kernels/*.cuh): a launch_* function takes raw device pointers, sizes and a
// stream, launches asynchronously and returns cudaGetLastError() (cudaSuccess for an empty launch);
// the caller checks it (DS4R_CUDA_CHECK in src/backend/cuda/).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ds4r/numeric.h"

namespace ds4r::kern {

// The exact conversions are include/ds4r/numeric.h's (one definition for host and device, found
// here by the enclosing namespace ds4r): bf16_to_f32, f32_to_bf16, round_bf16, e4m3_to_f32,
// f32_to_e4m3, e8m0_to_f32, e2m1_to_f32, f32_to_e2m1. The kernels' names for the bf16 pair:
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return bf16_to_f32(h);
}
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    return f32_to_bf16(f);
}

// CUDA's expf (the accurate path of the CUDA 12 math library, instruction for instruction as nvcc
// emits it), split before its final multiply: expf(a) = e * s with e = ex2.approx.ftz(r), s = 2^j.
// Why: the reference computes torch.sigmoid / F.silu as 1 / (1 + exp(-x)) in code nvcc compiles with
// FMA contraction, which fuses that final multiply with the "+ 1" into fma(e, s, 1). This build uses
// --fmad=false (no implicit contraction), so the fusion is written out (docs/MODEL.md 8.2).
__device__ __forceinline__ void ref_expf_split(float a, float* e, float* s) {
    const float t = __saturatef(__fmaf_rn(a, __uint_as_float(0x3BBB989Du), 0.5f));  // log2(e) / 252
    const float j = __fmaf_rd(t, 252.0f, __uint_as_float(0x4B400001u));             // 2^23 + 2^22 + 1
    const float k = __fadd_rn(j, __uint_as_float(0xCB40007Fu));                     // - (2^23 + 2^22 + 127)
    float r = __fmaf_rn(a, __uint_as_float(0x3FB8AA3Bu), -k);                       // log2(e), hi
    r = __fmaf_rn(a, __uint_as_float(0x32A57060u), r);                              // log2(e), lo
    float x2;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(x2) : "f"(r));
    *e = x2;
    *s = __uint_as_float(__float_as_uint(j) << 23);
}
// 1 + expf(a) as the reference's contracted code evaluates it: fma(e, s, 1).
__device__ __forceinline__ float ref_one_plus_expf(float a) {
    float e, s;
    ref_expf_split(a, &e, &s);
    return __fmaf_rn(e, s, 1.0f);
}

// Elementwise forms of DeepSeek's reference on CUDA torch (docs/MODEL.md 8.2). expf/log1pf/sqrtf are the
// IEEE-accurate library functions (no fast-math); rsqrt is the hardware approximation torch uses.
__device__ __forceinline__ float ref_sigmoid(float x) {
    return 1.0f / ref_one_plus_expf(-x);
}
__device__ __forceinline__ float ref_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float ref_silu(float g) {
    return g / ref_one_plus_expf(-g);
}
__device__ __forceinline__ float ref_rsqrt(float x) {
    return rsqrtf(x);
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

// Elementwise kernels: kElemThreads threads per block, one element per thread, grid-stride beyond
// kMaxElemBlocks blocks; elem_blocks(n) is the grid size for n elements (at least 1).
constexpr int kElemThreads = 256;
constexpr int64_t kMaxElemBlocks = 65535LL * 16;
inline int elem_blocks(int64_t n) {
    const int64_t b = cdiv(n, kElemThreads);
    return static_cast<int>(b < kMaxElemBlocks ? (b > 0 ? b : 1) : kMaxElemBlocks);
}

}  // namespace ds4r::kern
