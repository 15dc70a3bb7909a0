// Exact host conversions between fp32 and the narrow formats of the checkpoint and of DeepSeek's
// activation quantization (MODEL.md 3.2, 5.1, 5.2). All roundings are IEEE round-to-nearest-even.
// kernels/ has device twins of these (kernels/numeric.cuh); tests check that both agree.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ds4r {

inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// ---- bf16 (stored as its uint16 bit pattern) ----
inline float bf16_to_f32(uint16_t h) {
    return bits_f32(static_cast<uint32_t>(h) << 16);
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}
// Round an fp32 value to the nearest bf16 value, returned as fp32.
inline float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

// ---- IEEE fp16 ----
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
inline float e4m3_to_f32(uint8_t b) {
    uint32_t sign = b >> 7, exp = (b >> 3) & 0xfu, man = b & 0x7u;
    float v;
    if (exp == 15 && man == 7)
        v = NAN;
    else if (exp == 0)
        v = std::ldexp(static_cast<float>(man), -9);
    else
        v = std::ldexp(static_cast<float>(8u + man), static_cast<int>(exp) - 10);
    return sign ? -v : v;
}
// Round-to-nearest-even, saturating at +-448 (the reference clamps to [-448, 448] first).
inline uint8_t f32_to_e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    float a = std::fabs(f);
    if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);
    if (a < 0.015625f) {  // below the smallest normal 2^-6: multiples of 2^-9
        float q = std::nearbyint(a * 512.0f);
        if (q >= 8.0f) return static_cast<uint8_t>(sign | 0x08);  // rounds up to 2^-6
        return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
    }
    int e;
    float m = std::frexp(a, &e);          // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(m * 16.0f);  // 4 significant bits, RNE
    if (q == 16.0f) {
        q = 8.0f;
        ++e;
    }
    int exp = e - 1 + 7;
    if (exp > 15 || (exp == 15 && q > 14.0f)) return static_cast<uint8_t>(sign | 0x7e);
    return static_cast<uint8_t>(sign | (exp << 3) | (static_cast<int>(q) - 8));
}

// ---- e8m0 (unsigned power-of-two scale) ----
inline float e8m0_to_f32(uint8_t e) {
    if (e == 0xff) return NAN;
    return std::ldexp(1.0f, static_cast<int>(e) - 127);
}

// ---- fp4 e2m1 (two codes per byte for packed weights: even element in the low nibble) ----
inline float e2m1_to_f32(uint8_t code) {
    static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = kMag[code & 7u];
    return (code & 8u) ? -v : v;
}
// Round to the nearest e2m1 value, ties to the even code (MODEL.md 5.2); keeps the sign (-0 too).
// Input is expected in [-6, 6] (callers clamp); larger magnitudes saturate to 6.
inline uint8_t f32_to_e2m1(float f) {
    uint8_t sign = std::signbit(f) ? 8 : 0;
    float a = std::fabs(f);
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

}  // namespace ds4r
