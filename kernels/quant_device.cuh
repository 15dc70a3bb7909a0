// Device building blocks of the activation quantizers (MODEL.md 5.1, 5.2): twins of the CPU's
// src/backend/cpu/cpu_ref.h (fp8_quant_block, fp4_block_scale, fp4_quant_block), operation for
// operation, so results are bit identical. Used by kernels/quant.cu and the MoE SwiGLU kernel.
// Device code only; CUDA headers and common.cuh only.
#pragma once

#include "common.cuh"

namespace ds4r::kern {

// The kernels multiply by the reciprocals as fp32 constants (1/448 and 1/6 rounded once from double).
__device__ __forceinline__ float fp8_max_inv() {
    return static_cast<float>(1.0 / 448.0);
}
__device__ __forceinline__ float fp4_max_inv() {
    return static_cast<float>(1.0 / 6.0);
}
constexpr float kDevFp8AmaxFloor = 1e-4f;  // act_quant: amax.clamp_min(1e-4)

// max that propagates NaN (torch.amax does; fmaxf would drop it).
__device__ __forceinline__ float nan_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    return fmaxf(a, b);
}

// 2^ceil(log2(amax * max_inv)) by the kernels' bit trick (MODEL.md 5.1): biased exponent of the fp32
// product, +1 when its mantissa is non-zero. A NaN product yields the bit pattern 0x80000000 (the
// exponent overflows into the sign), exactly as the CPU twin computes it.
__device__ __forceinline__ float ceil_pow2_scale(float amax, float max_inv) {
    const uint32_t bits = __float_as_uint(__fmul_rn(amax, max_inv));
    const int32_t e = static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u ? 1 : 0);
    return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}
__device__ __forceinline__ uint8_t e8m0_of_pow2(float s) {
    return static_cast<uint8_t>((__float_as_uint(s) >> 23) & 0xffu);
}

// fp8 block scale from the raw (NaN-propagating) amax: floor 1e-4, rounded up to a power of two.
__device__ __forceinline__ float fp8_block_scale(float amax) {
    if (!(amax >= kDevFp8AmaxFloor) && !(amax != amax)) amax = kDevFp8AmaxFloor;
    return ceil_pow2_scale(amax, fp8_max_inv());
}
// e4m3 code of x / s, clamped to +-448, RNE saturating (division by a power of two: exact).
__device__ __forceinline__ uint8_t fp8_code(float x, float s) {
    float v = __fdiv_rn(x, s);
    if (v > 448.0f) v = 448.0f;
    if (v < -448.0f) v = -448.0f;
    return f32_to_e4m3(v);
}

// fp4 scale from the raw amax (MODEL.md 5.2, 8.2). e4m3_16 = false: E8M0 branch (floor 6 * 2^-126,
// power of two rounded up); true: E4M3 branch (floor 6 * 2^-9, e4m3(amax / 6) with a true division).
__device__ __forceinline__ float fp4_block_scale(float amax, bool e4m3_16) {
    if (!e4m3_16) {
        const float floor_v = 0x1.8p-124f;  // 6 * 2^-126
        if (!(amax >= floor_v) && !(amax != amax)) amax = floor_v;
        return ceil_pow2_scale(amax, fp4_max_inv());
    }
    const float floor_v = 0x1.8p-7f;  // 6 * 2^-9
    if (!(amax >= floor_v) && !(amax != amax)) amax = floor_v;
    float r = __fdiv_rn(amax, 6.0f);
    if (r > 448.0f) r = 448.0f;
    return e4m3_to_f32(f32_to_e4m3(r));
}
// e2m1 code of x / s: true fp32 division, clamp +-6, ties to the even code.
__device__ __forceinline__ uint32_t fp4_code(float x, float s) {
    float v = __fdiv_rn(x, s);
    if (v > 6.0f) v = 6.0f;
    if (v < -6.0f) v = -6.0f;
    return f32_to_e2m1(v);
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
