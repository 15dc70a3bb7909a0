// Exact conversions between fp32 and the narrow formats of the checkpoint and of DeepSeek's
// activation quantization (docs/MODEL.md 3.2, 5.1, 5.2), and the scalar steps of the activation
// quantizers. All roundings are IEEE round-to-nearest-even.
//
// One definition for both backends: the functions marked DS4R_HD are `__host__ __device__` when the
// header is compiled by nvcc (kernels/ include it through kernels/common.cuh) and plain inline
// functions in host-only builds. Arithmetic that could round differently is written with the
// DS4R_MUL_RN / DS4R_DIV_RN forms (IEEE on both sides: host code is built with -ffp-contract=off,
// device code uses the __f*_rn intrinsics, which are never contracted).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DS4R_HD __host__ __device__ __forceinline__
#else
#define DS4R_HD inline
#endif

#if defined(__CUDA_ARCH__)
#define DS4R_MUL_RN(a, b) __fmul_rn((a), (b))
#define DS4R_DIV_RN(a, b) __fdiv_rn((a), (b))
#else
#define DS4R_MUL_RN(a, b) ((a) * (b))
#define DS4R_DIV_RN(a, b) ((a) / (b))
#endif

namespace ds4r {

DS4R_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}
DS4R_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}
DS4R_HD bool is_nan_f32(float f) {
    return (f32_bits(f) & 0x7fffffffu) > 0x7f800000u;
}
DS4R_HD bool sign_bit_f32(float f) {
    return (f32_bits(f) >> 31) != 0u;
}
DS4R_HD float abs_f32(float f) {
    return bits_f32(f32_bits(f) & 0x7fffffffu);
}
constexpr uint32_t kF32QuietNanBits = 0x7fc00000u;

// ---- bf16 (stored as its uint16 bit pattern) ----
DS4R_HD float bf16_to_f32(uint16_t h) {
    return bits_f32(static_cast<uint32_t>(h) << 16);
}
DS4R_HD uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
// Round an fp32 value to the nearest bf16 value, returned as fp32.
DS4R_HD float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

// ---- IEEE fp16 (host only: the kernels use cuda_fp16's conversions) ----
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0)
        v = std::ldexp(static_cast<float>(man), -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
    return sign ? -v : v;
}
inline uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    float a = std::fabs(f);
    if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
    if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (a < 6.103515625e-05f) {                                       // subnormal: multiple of 2^-24
        float q = std::nearbyint(a * 16777216.0f);                    // exact scale, RNE
        return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
    }
    int e;
    float m = std::frexp(a, &e);            // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(m * 2048.0f);  // 11 significant bits, RNE
    if (q == 2048.0f) {
        q = 1024.0f;
        ++e;
    }
    uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
    if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | (exp << 10) | (static_cast<uint32_t>(q) - 1024u));
}

// ---- float8 e4m3fn ----
DS4R_HD float e4m3_to_f32(uint8_t b) {
    const uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 15 && man == 7)
        v = bits_f32(kF32QuietNanBits);
    else if (exp == 0)
        v = ::ldexpf(static_cast<float>(man), -9);
    else
        v = ::ldexpf(static_cast<float>(8u + man), static_cast<int>(exp) - 10);
    return sign ? -v : v;
}
// Round-to-nearest-even, saturating at +-448 (the reference clamps to [-448, 448] first).
DS4R_HD uint8_t f32_to_e4m3(float f) {
    if (is_nan_f32(f)) return 0x7f;
    const uint8_t sign = sign_bit_f32(f) ? 0x80 : 0x00;
    const float a = abs_f32(f);
    if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);
    if (a < 0.015625f) {  // below the smallest normal 2^-6: multiples of 2^-9
        const float q = ::rintf(a * 512.0f);
        if (q >= 8.0f) return static_cast<uint8_t>(sign | 0x08);  // rounds up to 2^-6
        return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
    }
    int e;
    const float m = ::frexpf(a, &e);  // a = m * 2^e, m in [0.5, 1)
    float q = ::rintf(m * 16.0f);     // 4 significant bits, RNE
    if (q == 16.0f) {
        q = 8.0f;
        ++e;
    }
    const int exp = e - 1 + 7;
    if (exp > 15 || (exp == 15 && q > 14.0f)) return static_cast<uint8_t>(sign | 0x7e);
    return static_cast<uint8_t>(sign | (exp << 3) | (static_cast<int>(q) - 8));
}

// ---- e8m0 (unsigned power-of-two scale) ----
// 2^(e-127), exact (e = 0: the subnormal 2^-127; 0xff: NaN).
DS4R_HD float e8m0_to_f32(uint8_t e) {
    if (e == 0xff) return bits_f32(kF32QuietNanBits);
    if (e == 0) return bits_f32(0x00400000u);
    return bits_f32(static_cast<uint32_t>(e) << 23);
}
// The same value's bits, by selects instead of branches, for device code whose branches cost (the
// Hopper kernels' per-stage scale decoding: nvcc turns e8m0_to_f32's ifs into divergent branches there).
// Equal to e8m0_to_f32's bits for every code (tests/unit/smoke_test.cpp).
DS4R_HD uint32_t e8m0_f32_bits(uint32_t e) {
    const uint32_t v = e == 0 ? 0x00400000u : e << 23;
    return e == 0xFFu ? kF32QuietNanBits : v;
}

// ---- fp4 e2m1 (two codes per byte for packed weights: even element in the low nibble) ----
DS4R_HD float e2m1_to_f32(uint32_t code) {
#if defined(__CUDA_ARCH__)
    const float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
#else
    static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
#endif
    const float v = kMag[code & 7u];
    return (code & 8u) ? -v : v;
}
// Round to the nearest e2m1 value, ties to the even code (docs/MODEL.md 5.2); keeps the sign (-0 too).
// Input is expected in [-6, 6] (callers clamp); larger magnitudes saturate to 6.
DS4R_HD uint8_t f32_to_e2m1(float f) {
    const uint8_t sign = sign_bit_f32(f) ? 8 : 0;
    const float a = abs_f32(f);
    uint8_t c;
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
    return static_cast<uint8_t>(sign | c);
}

// ---- CUDA torch.topk's selection order (docs/MODEL.md 8.1) ----
// The radix order key: a larger key is a larger value; NaN is the largest; -0 < +0 (the key
// distinguishes the two zeros, so they never tie). Never 0 for a real value.
DS4R_HD uint32_t topk_order_key(float v) {
    const uint32_t x = f32_bits(v);
    if (is_nan_f32(v)) return 0xffffffffu;
    return (x & 0x80000000u) ? ~x : (x | 0x80000000u);
}

// ---- activation quantization, one value / one block scale (docs/MODEL.md 5.1, 5.2, 8.2) ----
// The kernels multiply by the reciprocals as fp32 constants (1/448 and 1/6 rounded once from double).
constexpr float kFp8MaxInv = static_cast<float>(1.0 / 448.0);
constexpr float kFp4MaxInv = static_cast<float>(1.0 / 6.0);
constexpr float kFp8Max = 448.0f;
constexpr float kFp4Max = 6.0f;
constexpr float kFp8AmaxFloor = 1e-4f;            // act_quant: amax.clamp_min(1e-4)
constexpr float kFp4E8m0AmaxFloor = 0x1.8p-124f;  // fp4 E8M0 branch: 6 * 2^-126
constexpr float kFp4E4m3AmaxFloor = 0x1.8p-7f;    // fp4 E4M3 branch: 6 * 2^-9

// max(amax, floor) that keeps a NaN amax (torch's clamp_min propagates NaN).
DS4R_HD float amax_floor(float amax, float floor_v) {
    return (!(amax >= floor_v) && !is_nan_f32(amax)) ? floor_v : amax;
}
// 2^ceil(log2(amax * max_inv)) with the kernels' bit trick (docs/MODEL.md 5.1): biased exponent of the
// fp32 product, plus one when its mantissa is non-zero, so an exact power of two stays. A NaN
// product yields the bit pattern 0x80000000 (the exponent overflows into the sign) on both sides.
DS4R_HD float ceil_pow2_scale(float amax, float max_inv) {
    const uint32_t bits = f32_bits(DS4R_MUL_RN(amax, max_inv));
    const int32_t exp_field = static_cast<int32_t>((bits >> 23) & 0xffu);
    const int32_t e = exp_field - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
    return bits_f32(static_cast<uint32_t>(e + 127) << 23);
}
// e8m0 byte of a power-of-two scale (its biased exponent field).
DS4R_HD uint8_t e8m0_of_pow2(float s) {
    return static_cast<uint8_t>((f32_bits(s) >> 23) & 0xffu);
}
// fp8 block scale from the raw (NaN-propagating) amax: floor 1e-4, rounded up to a power of two.
DS4R_HD float fp8_block_scale(float amax) {
    return ceil_pow2_scale(amax_floor(amax, kFp8AmaxFloor), kFp8MaxInv);
}
// e4m3 code of x / s, clamped to +-448, RNE saturating (division by a power of two: exact).
DS4R_HD uint8_t fp8_code(float x, float s) {
    float v = DS4R_DIV_RN(x, s);
    if (v > kFp8Max) v = kFp8Max;
    if (v < -kFp8Max) v = -kFp8Max;
    return f32_to_e4m3(v);
}
// fp4 E8M0 branch (docs/MODEL.md 5.2): floor 6 * 2^-126, power of two rounded up.
DS4R_HD float fp4_e8m0_block_scale(float amax) {
    return ceil_pow2_scale(amax_floor(amax, kFp4E8m0AmaxFloor), kFp4MaxInv);
}
// fp4 E4M3 branch (docs/MODEL.md 5.2 / 8.2): floor 6 * 2^-9 (an all-zero block still gets 2^-9), then
// the e4m3 code of amax / 6 with a TRUE fp32 division, RNE, saturating at 448. (The golden quant
// data distinguishes this from amax * fp32(1/6): see cpu_quant_test.) Returns the e4m3 code.
DS4R_HD uint8_t fp4_e4m3_block_scale_code(float amax) {
    float r = DS4R_DIV_RN(amax_floor(amax, kFp4E4m3AmaxFloor), kFp4Max);
    if (r > kFp8Max) r = kFp8Max;
    return f32_to_e4m3(r);
}
// e2m1 code of x / s: true fp32 division (not exact for e4m3 scales), clamp +-6, ties to the even code.
DS4R_HD uint8_t fp4_code(float x, float s) {
    float v = DS4R_DIV_RN(x, s);
    if (v > kFp4Max) v = kFp4Max;
    if (v < -kFp4Max) v = -kFp4Max;
    return f32_to_e2m1(v);
}

}  // namespace ds4r
