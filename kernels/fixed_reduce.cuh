// Fixed-order block reductions for the norm / mHC / Engram kernels (batch invariance, docs/DESIGN.md 4):
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

// ------------------------------------------------------------------ accurate sums
// The CPU backend accumulates long sums (mHC mix dots, RMSNorm / Engram sums of squares) exactly in
// fp64 and rounds once to fp32 (cpuref::sum_sq_bf16_f32). A strided fp32 sum over 20480 terms is
// off by a few ulps, enough to flip an fp8 act-quant scale downstream (issue 10: tiny-a seq 6
// layer 3 on CUDA). Two accurate forms, both with a fixed order (batch invariant, no atomics):
//   - fp64: each thread accumulates its slice in double (products of bf16 x fp32 are exact in
//     double), then the fixed block reduction in double;
//   - compensated: each thread keeps an unevaluated fp32 pair hi + lo (TwoSum for the additions,
//     an FMA for the exact product error: Ogita-Rump-Oishi Dot2), and only the block combine is in
//     double (hi and lo converted exactly). About twice fp32 working precision per thread.

// Compensated fp32 accumulator: the sum is hi + lo.
struct CompSum {
    float hi, lo;
};

__device__ __forceinline__ void comp_zero(CompSum& a) {
    a.hi = 0.0f;
    a.lo = 0.0f;
}

// a += v (v exact fp32): Knuth's TwoSum, the rounding error of hi + v goes to lo.
__device__ __forceinline__ void comp_add(CompSum& a, float v) {
    const float s = __fadd_rn(a.hi, v);
    const float bv = __fsub_rn(s, a.hi);
    const float err = __fadd_rn(__fsub_rn(a.hi, __fsub_rn(s, bv)), __fsub_rn(v, bv));
    a.hi = s;
    a.lo = __fadd_rn(a.lo, err);
}

// a += x * y: the product's rounding error (exact through the FMA) and the addition's both go to lo.
__device__ __forceinline__ void comp_fma(CompSum& a, float x, float y) {
    const float p = __fmul_rn(x, y);
    const float pe = __fmaf_rn(x, y, -p);  // x * y - p exactly
    const float s = __fadd_rn(a.hi, p);
    const float bp = __fsub_rn(s, a.hi);
    const float err = __fadd_rn(__fsub_rn(a.hi, __fsub_rn(s, bp)), __fsub_rn(p, bp));
    a.hi = s;
    a.lo = __fadd_rn(a.lo, __fadd_rn(err, pe));
}

__device__ __forceinline__ double comp_value(const CompSum& a) {
    return __dadd_rn(static_cast<double>(a.hi), static_cast<double>(a.lo));
}

__device__ __forceinline__ double warp_butterfly_sum_f64(double v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Size in doubles of the shared scratch of block_sum_fixed_f64 / block_sum_comp for NV values.
template <int NV>
constexpr int kF64ScratchDoubles = (kFixedReduceWarps + 1) * NV;

// The cross-warp step of the double reductions: thread i < NV adds value i of the 8 warps in order
// (warp 0 first) and publishes it; every thread then reads the totals. One thread per value, not
// every thread, does these additions: fp64 runs at 1/64 of the fp32 rate on sm_86.
// tid: the thread's index in its group of 256 (threadIdx.x, or threadIdx.x % 256 where a block of several
// such groups reduces each on its own, with its own scratch: hc_mixes' split variants).
template <int NV>
__device__ __forceinline__ void cross_warp_f64(double (&out)[NV], double* scratch, int tid) {
    static_assert(NV <= kFixedReduceThreads, "one thread per value");
    __syncthreads();
    double* totals = scratch + kFixedReduceWarps * NV;
    if (tid < NV) {
        const int i = tid;
        double s = scratch[i];
        for (int w = 1; w < kFixedReduceWarps; ++w) s = __dadd_rn(s, scratch[w * NV + i]);
        totals[i] = s;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NV; ++i) out[i] = totals[i];
}

// block_sum_fixed in double: `scratch` is shared memory of kF64ScratchDoubles<NV> doubles.
template <int NV>
__device__ __forceinline__ void block_sum_fixed_f64(double (&v)[NV], double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] = warp_butterfly_sum_f64(v[i]);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NV; ++i) scratch[warp * NV + i] = v[i];
    }
    cross_warp_f64<NV>(v, scratch, threadIdx.x);
}

// Compensated block sum: the warp butterfly adds the pairs with TwoSum (hi + hi' exactly split into
// a sum and its error; the lo parts and the error add in fp32: (lo + lo') + err is the same on both
// lanes of a pair, so every lane ends with the same bits), then lane 0 of each warp converts its
// pair to double and the 8 warp totals add in double, warp 0 first. Every thread receives the
// totals in `out`. `scratch`: shared memory of kF64ScratchDoubles<NV> doubles.
// tid: as cross_warp_f64's, the thread's index in its group (threadIdx.x where the block is one group;
// every group of the block calls this at the same time).
template <int NV>
__device__ __forceinline__ void block_sum_comp(CompSum (&v)[NV], double (&out)[NV], double* scratch,
                                               int tid) {
    const int lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float oh = __shfl_xor_sync(0xffffffffu, v[i].hi, off);
            const float ol = __shfl_xor_sync(0xffffffffu, v[i].lo, off);
            const float a = v[i].hi;
            const float s = __fadd_rn(a, oh);
            const float bv = __fsub_rn(s, a);
            const float err = __fadd_rn(__fsub_rn(a, __fsub_rn(s, bv)), __fsub_rn(oh, bv));
            // err is exact and symmetric in (a, oh); hence the pair's lanes agree bit for bit.
            v[i].hi = s;
            v[i].lo = __fadd_rn(__fadd_rn(v[i].lo, ol), err);
        }
    }
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < NV; ++i) scratch[warp * NV + i] = comp_value(v[i]);
    }
    cross_warp_f64<NV>(out, scratch, tid);
}

}  // namespace ds4r::kern
