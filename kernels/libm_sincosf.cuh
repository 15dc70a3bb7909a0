// glibc's single-precision sinf / cosf (glibc >= 2.28, x86_64 FMA variant), evaluated on the GPU
// with explicit IEEE double operations, so that the RoPE tables come out bit for bit as DeepSeek's
// reference built them.
//
// Why not CUDA's sinf/cosf: the golden tables (tests/data/tiny-a/rope_{plain,yarn}.npy) were built
// by torch's CPU evaluation of torch.polar (std::cos / std::sin of the fp32 angle = glibc cosf /
// sinf), not by libdevice: a host emulation of libdevice's __nv_sinf/__nv_cosf misses 6-13% of the
// golden entries, correctly rounded values miss 54 of 4112, glibc reproduces all 4112 (see
// cuda_rope_test and the cuda-misc report). docs/MODEL.md 8.3 asks for CUDA's functions; the data
// disagree, and the data win.
//
// The algorithm (originally ARM's optimized-routines, in glibc since 2.28 and unchanged through
// 2.4x): the float argument is widened to double; |x| < pi/4: polynomial directly; |x| < 120:
// one multiply-subtract reduction by pi/2; otherwise an exact 2.62 fixed-point reduction with a
// 192-bit 4/pi table. Polynomials in double, one rounding to float at the end. glibc's x86_64
// libm selects a copy built with -mfma, where GCC contracts every `a + b * c` into an FMA; the
// fma() calls below are exactly those contractions, everything else is a plain IEEE double op
// (written as __dmul_rn so nvcc cannot contract them). This code, compiled for the host, matches
// glibc 2.36's sinf and cosf on every float in [0, 4.2e6] and every 7th float above (both signs):
// 1.38e9 inputs, 0 mismatches. (The non-FMA sse2 copy differs on 2 of 95M sampled inputs.)
// The constants are glibc's (sysdeps/ieee754/flt-32/s_sincosf_data.c): they are the algorithm.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

struct LibmSinCosPoly {
    double c0, c1, c2, c3, c4;  // cosine polynomial (negated in the second table)
    double s1, s2, s3;          // sine polynomial
};

// Table 0: quadrants 0/1; table 1 (quadrants 2/3): cosine coefficients negated.
__device__ __forceinline__ LibmSinCosPoly libm_sincos_poly(int table) {
    LibmSinCosPoly p;
    const bool neg = table != 0;  // selects, not multiplies: nothing here can be contracted
    p.c0 = neg ? -0x1p0 : 0x1p0;
    p.c1 = neg ? 0x1.ffffffd0c621cp-2 : -0x1.ffffffd0c621cp-2;
    p.c2 = neg ? -0x1.55553e1068f19p-5 : 0x1.55553e1068f19p-5;
    p.c3 = neg ? 0x1.6c087e89a359dp-10 : -0x1.6c087e89a359dp-10;
    p.c4 = neg ? -0x1.99343027bf8c3p-16 : 0x1.99343027bf8c3p-16;
    p.s1 = -0x1.555545995a603p-3;
    p.s2 = 0x1.1107605230bc4p-7;
    p.s3 = -0x1.994eb3774cf24p-13;
    return p;
}

// 4/pi to 192 bits, 8 new bits per entry (glibc __inv_pio4).
static __constant__ uint32_t kLibmInvPio4[24] = {
    0xa2,       0xa2f9,     0xa2f983,   0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
    0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
    0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041};

// Top 12 bits of a float with the sign cleared (glibc abstop12).
__device__ __forceinline__ uint32_t libm_abstop12(float x) {
    return (__float_as_uint(x) >> 20) & 0x7ffu;
}

// sinf_poly: x in [-pi/4, pi/4] (double), x2 = x*x; odd n -> cosine polynomial.
__device__ __forceinline__ float libm_sinf_poly(double x, double x2, const LibmSinCosPoly& p, int n) {
    if ((n & 1) == 0) {
        const double x3 = __dmul_rn(x, x2);
        const double s1 = fma(x2, p.s3, p.s2);
        const double x7 = __dmul_rn(x3, x2);
        const double s = fma(x3, p.s1, x);
        return __double2float_rn(fma(x7, s1, s));
    }
    const double x4 = __dmul_rn(x2, x2);
    const double c2 = fma(x2, p.c4, p.c3);
    const double c1 = fma(x2, p.c1, p.c0);
    const double x6 = __dmul_rn(x4, x2);
    const double c = fma(x4, p.c2, c1);
    return __double2float_rn(fma(x6, c2, c));
}

// glibc sinf (want_cos = 0) / cosf (want_cos = 1) of a float.
__device__ __forceinline__ float libm_sincosf(float y, int want_cos) {
    const float pio4f = 0x1.921FB6p-1f;
    const double hpi_inv_2p24 = 0x1.45F306DC9C883p+23;  // 2/pi * 2^24 (x86_64 has no TOINT_INTRINSICS)
    const double hpi = 0x1.921FB54442D18p0;             // pi/2
    const double pi63 = 0x1.921FB54442D18p-62;          // 2pi * 2^-64
    double x = static_cast<double>(y);
    const uint32_t top = libm_abstop12(y);
    if (top < libm_abstop12(pio4f)) {
        const double x2 = __dmul_rn(x, x);
        if (top < libm_abstop12(0x1p-12f)) return want_cos ? 1.0f : y;
        return libm_sinf_poly(x, x2, libm_sincos_poly(0), want_cos);
    }
    int n;
    int table;
    double sgn;
    if (top < libm_abstop12(120.0f)) {
        // reduce_fast: n = round(x * 2/pi) through a scaled truncating conversion; x - n*pi/2 fused.
        const double r = __dmul_rn(x, hpi_inv_2p24);
        n = (__double2int_rz(r) + 0x800000) >> 24;
        x = fma(-static_cast<double>(n), hpi, x);
        sgn = ((n & 3) == 1 || (n & 3) == 2) ? -1.0 : 1.0;  // sign of sine per quadrant {1,-1,-1,1}
        table = (n & 2) ? 1 : 0;
    } else if (top < libm_abstop12(__int_as_float(0x7f800000))) {
        // reduce_large: exact 2.62 fixed-point product with 4/pi.
        uint32_t xi = __float_as_uint(y);
        const int sign = static_cast<int>(xi >> 31);
        const int base = static_cast<int>((xi >> 26) & 15u);
        const int shift = static_cast<int>((xi >> 23) & 7u);
        xi = (xi & 0xffffffu) | 0x800000u;
        xi <<= shift;
        uint64_t res0 = static_cast<uint64_t>(xi * kLibmInvPio4[base]);  // 32-bit product, as glibc
        const uint64_t res1 = static_cast<uint64_t>(xi) * kLibmInvPio4[base + 4];
        const uint64_t res2 = static_cast<uint64_t>(xi) * kLibmInvPio4[base + 8];
        res0 = (res2 >> 32) | (res0 << 32);
        res0 += res1;
        const uint64_t q = (res0 + (1ull << 61)) >> 62;
        res0 -= q << 62;
        x = __dmul_rn(__ll2double_rn(static_cast<long long>(res0)), pi63);
        n = static_cast<int>(q);
        const int ns = n + sign;
        sgn = ((ns & 3) == 1 || (ns & 3) == 2) ? -1.0 : 1.0;
        table = (ns & 2) ? 1 : 0;
    } else {
        return __int_as_float(0x7fc00000);  // inf / NaN -> NaN
    }
    const double xx = __dmul_rn(x, x);
    return libm_sinf_poly(__dmul_rn(x, sgn), xx, libm_sincos_poly(table), n ^ want_cos);
}

}  // namespace ds4r::kern
