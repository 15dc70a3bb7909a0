// Device building blocks of the activation quantizers (docs/MODEL.md 5.1, 5.2): vector loads / stores and
// the warp-level amax around the scalar steps of include/ds4r/numeric.h, which the CPU backend's
// fp8_quant_block / fp4_quant_block (cpu_ref.h) use too, so results are bit identical. Used by
// kernels/quant.cu and the MoE SwiGLU kernel. Device code only; CUDA headers and common.cuh only.
#pragma once

#include "common.cuh"

namespace ds4r::kern {

// max that propagates NaN (torch.amax does; fmaxf would drop it).
__device__ __forceinline__ float nan_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    return fmaxf(a, b);
}

// The scalar steps (fp8_block_scale, fp8_code, fp4_e8m0_block_scale, fp4_e4m3_block_scale_code,
// fp4_code, e8m0_of_pow2) are include/ds4r/numeric.h's, shared with the CPU backend.

// fp4 scale from the raw amax (docs/MODEL.md 5.2, 8.2): e4m3_16 = false: E8M0 branch, true: E4M3 branch
// (the scale is the e4m3 value of its code).
__device__ __forceinline__ float fp4_block_scale(float amax, bool e4m3_16) {
    return e4m3_16 ? e4m3_to_f32(fp4_e4m3_block_scale_code(amax)) : fp4_e8m0_block_scale(amax);
}

// 8 consecutive bf16 values <-> fp32 (a 16-byte vector access when kVec).
template <bool kVec>
__device__ __forceinline__ void load_bf16x8(const uint16_t* p, float v[8]) {
    if (kVec) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = bf16_bits_to_f32(p[i]);
    }
}
// The 8 inputs whose codes thread `gi` (8 codes at q + 8 gi) writes in Fp8CodeOrder::GemmFragment
// (quant.cuh), in output order, from a row-major bf16 array p (element 0 = the row block's start).
// Thread j = gi % 4 of a 32-block covers half h = j / 2, quarter u = j % 2: codes of k = 4u, 4u+1,
// 8+4u, 9+4u, 4u+2, 4u+3, 10+4u, 11+4u of the half. kVec: p 8-byte aligned (two 8-byte loads).
template <bool kVec>
__device__ __forceinline__ void load_bf16x8_gemm_fragment(const uint16_t* p, int64_t gi, float v[8]) {
    const int j = static_cast<int>(gi & 3);
    const uint16_t* lo = p + (gi >> 2) * 32 + 16 * (j >> 1) + 4 * (j & 1);  // k = 4u .. 4u+3
    const uint16_t* hi = lo + 8;                                            // k = 8+4u .. 11+4u
    uint32_t w[4];
    if (kVec) {
        const uint2 a = *reinterpret_cast<const uint2*>(lo);
        const uint2 b = *reinterpret_cast<const uint2*>(hi);
        w[0] = a.x, w[1] = a.y, w[2] = b.x, w[3] = b.y;
    } else {
        w[0] = lo[0] | (static_cast<uint32_t>(lo[1]) << 16);
        w[1] = lo[2] | (static_cast<uint32_t>(lo[3]) << 16);
        w[2] = hi[0] | (static_cast<uint32_t>(hi[1]) << 16);
        w[3] = hi[2] | (static_cast<uint32_t>(hi[3]) << 16);
    }
    // output order: lo[0], lo[1], hi[0], hi[1], lo[2], lo[3], hi[2], hi[3]
    const uint32_t o[4] = {w[0], w[2], w[1], w[3]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(o[i] << 16);
        v[2 * i + 1] = __uint_as_float(o[i] & 0xffff0000u);
    }
}
template <bool kVec>
__device__ __forceinline__ void store_bf16x8(uint16_t* p, const uint16_t h[8]) {
    if (kVec) {
        uint4 u;
        u.x = h[0] | (static_cast<uint32_t>(h[1]) << 16);
        u.y = h[2] | (static_cast<uint32_t>(h[3]) << 16);
        u.z = h[4] | (static_cast<uint32_t>(h[5]) << 16);
        u.w = h[6] | (static_cast<uint32_t>(h[7]) << 16);
        *reinterpret_cast<uint4*>(p) = u;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = h[i];
    }
}
template <bool kVec>
__device__ __forceinline__ void store_u8x8(uint8_t* p, const uint8_t b[8]) {
    if (kVec) {
        uint2 u;
        u.x = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
        u.y = b[4] | (b[5] << 8) | (b[6] << 16) | (static_cast<uint32_t>(b[7]) << 24);
        *reinterpret_cast<uint2*>(p) = u;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = b[i];
    }
}

// amax of a block spread over `lanes` consecutive lanes (8 values each); every lane of the warp must
// call it (shuffles with the full mask).
template <int kLanes>
__device__ __forceinline__ float group_amax(const float v[8]) {
    float a = fabsf(v[0]);
#pragma unroll
    for (int i = 1; i < 8; ++i) a = nan_max(a, fabsf(v[i]));
#pragma unroll
    for (int o = 1; o < kLanes; o <<= 1) a = nan_max(a, __shfl_xor_sync(0xffffffffu, a, o));
    return a;
}

}  // namespace ds4r::kern
