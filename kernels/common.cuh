// Device helpers shared by every kernel family: exact conversions (twins of include/ds4r/numeric.h),
// and the elementwise function forms of MODEL.md 8.2. CUDA headers only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
// Round-to-nearest-even fp32 -> bf16 bits (NaN kept quiet).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float round_bf16(float f) {
    return bf16_bits_to_f32(f32_to_bf16_bits(f));
}

// float8 e4m3fn -> fp32 (exact).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    const uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 15 && man == 7)
        v = __int_as_float(0x7fc00000);
    else if (exp == 0)
        v = ldexpf(static_cast<float>(man), -9);
    else
        v = ldexpf(static_cast<float>(8u + man), static_cast<int>(exp) - 10);
    return sign ? -v : v;
}
// fp32 -> e4m3fn, round-to-nearest-even, saturating at +-448.
__device__ __forceinline__ uint8_t f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0x00;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    if (a < 0.015625f) {
        const float q = rintf(a * 512.0f);
        if (q >= 8.0f) return sign | 0x08;
        return sign | static_cast<uint8_t>(q);
    }
    int e;
    float m = frexpf(a, &e);
    float q = rintf(m * 16.0f);
    if (q == 16.0f) {
        q = 8.0f;
        ++e;
    }
    const int exp = e - 1 + 7;
    if (exp > 15 || (exp == 15 && q > 14.0f)) return sign | 0x7e;
    return sign | static_cast<uint8_t>((exp << 3) | (static_cast<int>(q) - 8));
}
// e8m0 scale byte -> 2^(e-127) (exact; 0xff = NaN).
__device__ __forceinline__ float e8m0_to_f32(uint8_t e) {
    if (e == 0xff) return __int_as_float(0x7fc00000);
    if (e == 0) return __uint_as_float(0x00400000u);  // 2^-127 (subnormal)
    return __uint_as_float(static_cast<uint32_t>(e) << 23);
}
// e2m1 code (low 4 bits) -> fp32.
__device__ __forceinline__ float e2m1_to_f32(uint32_t code) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[code & 7u];
    return (code & 8u) ? -v : v;
}
// Round to e2m1, ties to the even code, sign kept (MODEL.md 5.2). Input clamped to [-6, 6] by callers.
__device__ __forceinline__ uint32_t f32_to_e2m1(float f) {
    const uint32_t sign = signbit(f) ? 8u : 0u;
    const float a = fabsf(f);
    uint32_t c;
    if (a <= 0.25f)
        c = 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7;
    return sign | c;
}

// Elementwise forms of DeepSeek's reference on CUDA torch (MODEL.md 8.2). expf/log1pf/sqrtf are the
// IEEE-accurate library functions (no fast-math); rsqrt is the hardware approximation torch uses.
__device__ __forceinline__ float ref_sigmoid(float x) {
    return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float ref_softplus(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}
__device__ __forceinline__ float ref_silu(float g) {
    return g / (1.0f + expf(-g));
}
__device__ __forceinline__ float ref_rsqrt(float x) {
    return rsqrtf(x);
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

}  // namespace ds4r::kern
