// The tensor-core GEMM core: one BM x BN output tile of C = A . B^T with A [M, K] (activations, row
// major) and B [N, K] (weights, row major, K contiguous). Device code only; included by gemm.cu.
//
// Portable sm_80+ instructions only: mma.sync m16n8k16 (fp32 accumulation), ldmatrix, cp.async.
//
// NUMERICS: each output element's result is fixed by its own instruction sequence, which no tile
// shape, warp layout or row count changes (an mma.sync element depends on its row of A, its column of
// B and its accumulator only). The sequences are those of tests/cuda/testkit/gemm_oracle.cu, bit for bit:
// - bf16 x bf16: acc = mma(A[., 16s .. 16s+15], B[., 16s ..], acc) for s = 0 .. 2 * ceil(K / 32) - 1
//   in order (operands beyond K are zero), acc from +0; out bf16 (one RNE rounding) or f32.
// - block-scaled (docs/MODEL.md 5.3): per 32-wide K block kb a fresh partial P = mma(h1, mma(h0, +0)) on
//   the exact fp16 values of the e4m3 / e2m1 codes (h0, h1 the block's two k16 halves), then
//   acc = RN(acc + RN(RN(P * sa[m, kb]) * sw[n, kb])) in K order (the CPU twin's expression).
//   Fast form: acc = fma(P, sa * sw, acc), the SAME number when the scale exponents lie in a window:
//   P is 0 or a multiple of 2^-18 below 2^23 in magnitude (|code products| <= 480^2 < 2^18, codes
//   multiples of 2^-9 / 2^-1, 32 terms), so P * 2^c is exact for c in [-131, 104]; with sa = 2^a,
//   sw = 2^b, a in [-64, 64], b in [-64, 40], both P * sa and P * sa * sw are exact, sa * sw is
//   exact, so both forms round the exact acc + P * 2^(a+b) once. A tile whose block has any scale
//   outside the window (NaN markers, extreme checkpoint scales) takes the original three-rounding
//   expression for that block (a CTA-uniform flag, __syncthreads_or).
//
// STRUCTURE: 64 x 64 warp tiles (4 m16 x 8 n8), warps laid out (BM / 64) x (BN / 64); BK = 32 (one
// quantization block) per pipeline stage, kStages-deep cp.async ring, one __syncthreads per block.
// - bf16: stages hold swizzled bf16 tiles fed to ldmatrix directly.
// - block-scaled: A arrives as e4m3 codes in "fragment order" (kernels/quant.cuh,
//   Fp8CodeOrder::GemmFragment: each 16-code half stored as k 0,1,8,9, 2,3,10,11, ...), so ONE
//   ldmatrix.x4 per m16 block gives a thread exactly the codes of its mma fragments for both k16
//   halves; they are widened in registers (cvt.rn.f16x2.e4m3x2 on sm_89+, a bit trick on sm_86).
//   B (weights, canonical checkpoint layout) is widened once per stage into a double-buffered fp16
//   tile, one block ahead of its use, and read with ldmatrix. Block scales are fetched two blocks
//   ahead into registers and staged (as fp32) with the widened B tile.
// - Warps whose rows (or columns) lie beyond the tile's valid rows skip their MMAs (16-row / 8-column
//   granularity): partial tiles (expert groups, M tails) cost only what they compute.
#pragma once

#include <cuda_fp16.h>

#include "common.cuh"

namespace ds4r::kern::gemm {

constexpr int kBK = 32;

enum class AKind : int { BF16 = 0, E4M3 = 1 };  // E4M3: fragment-ordered activation codes
enum class BKind : int { BF16 = 0, E4M3 = 1, E2M1 = 2 };

// Scale-exponent window of the fast (fused) block-scale form, as e8m0 bytes: sa in [63, 191]
// (2^-64 .. 2^64), sw in [63, 167] (2^-64 .. 2^40). See the header comment.
constexpr uint32_t kSaLo = 63, kSaSpan = 128, kSwLo = 63, kSwSpan = 104;

template <AKind kA_, BKind kB_, bool kOutF32_, int kBM_, int kBN_, int kStages_>
struct Cfg {
    static constexpr AKind kA = kA_;
    static constexpr BKind kB = kB_;
    static constexpr bool kOutF32 = kOutF32_;
    static constexpr int kBM = kBM_, kBN = kBN_, kStages = kStages_;
    static constexpr bool kQuant = kA == AKind::E4M3;  // block-scaled, fp16 MMA on widened codes
    static_assert(kQuant == (kB != BKind::BF16), "operands: bf16 x bf16, or e4m3 x (e4m3 | e2m1)");
    // Warp tile 64 x 64: 128 fp32 accumulators per thread; per K block and warp 8 ldmatrix.x4 of B
    // and 4 (block-scaled; 8 for bf16) of A feed 64 MMAs.
    static constexpr int kWarpM = 64, kWarpN = 64;
    static constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;  // m16 / n8 blocks of a warp tile
    static constexpr int kWarpsM = kBM / kWarpM, kWarpsN = kBN / kWarpN;
    static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
    static_assert(kBM % kWarpM == 0 && kBN % kWarpN == 0 && kStages >= 3, "tile");
    static constexpr int kARow = kQuant ? 32 : 64;  // bytes of one tile row of one stage (32 elements)
    static constexpr int kBRow = kB == BKind::BF16 ? 64 : (kB == BKind::E4M3 ? 32 : 16);
    static constexpr int kAStage = kBM * kARow;
    static constexpr int kBStage = kBN * kBRow;
    static constexpr int kStageBytes = kAStage + kBStage;
    static constexpr int kConvOffset = kStages * kStageBytes;  // block-scaled: fp16 B [2][BN][32]
    static constexpr int kConvBuf = kBN * 64;
    static constexpr int kConvBytes = kQuant ? 2 * kConvBuf : 0;
    static constexpr int kScaleOffset = kConvOffset + kConvBytes;  // fp32 scales [2][BM + kSwPerK]
    // weight scales staged per K block: fp8 one per 8 columns (the 32 x 32 block scale, repeated: the
    // compute reads one per n8 block and forms its products per block, which keeps them short-lived),
    // fp4 one per column
    static constexpr int kSwPerK = kB == BKind::E4M3 ? kBN / 8 : kBN;
    static constexpr int kScaleBuf = kBM + kSwPerK;
    static constexpr int kScaleBytes = kQuant ? 2 * kScaleBuf * 4 : 0;
    static constexpr int kSmemBytes = kScaleOffset + kScaleBytes;
    static_assert(kSmemBytes <= 99 * 1024, "sm_86 allows 99 KB of shared memory per block");
    static_assert(kBM <= kThreads && kSwPerK <= kThreads, "one scale per thread and K block");
    static_assert((kBN * 4) % kThreads == 0, "B widening units per thread");
};

// One output tile's operands. Pitches are in bytes.
struct TileJob {
    const uint8_t* a;       // A rows: tile row r is A row arow(r) at a + arow(r) * a_pitch
    const int32_t* a_rows;  // gather list [m_valid] (arow(r) = a_rows[r]) or null (arow(r) = r)
    int64_t a_pitch;
    const uint8_t* sa;  // block-scaled: A scales e8m0, row arow(r) at sa + arow(r) * sa_pitch
    int64_t sa_pitch;
    const uint8_t* b;  // B row n0 (the tile's first output column)
    int64_t b_pitch;
    const uint8_t* sb;  // block-scaled: B scales e8m0 base: e4m3 [ceil(N/32), .] row (n0+c)/32,
    int64_t sb_pitch;   //   e2m1 [N, .] row n0+c
    int n0;             // absolute index of the tile's first column
    uint8_t* c;         // C at (tile row 0, column n0); bf16 or f32 elements
    int64_t c_pitch;
    int m_valid, n_valid;  // rows / columns of the tile inside the problem (1..BM / 1..BN)
    int k;                 // reduction length: block-scaled: multiple of 32; bf16: multiple of 8
};

// ------------------------------------------------------------------ PTX wrappers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; bytes beyond src_bytes (0..16) are zero-filled.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kN>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kN) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
// d = a . b + c, m16n8k16, fp32 accumulation; kF16: fp16 operands, else bf16.
template <bool kF16>
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                         const float c[4]) {
    if constexpr (kF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
              "f"(c[2]), "f"(c[3]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, "
            "%9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
              "f"(c[2]), "f"(c[3]));
    }
}

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a [rows][32] 16-bit tile (64-byte
// rows), XOR-swizzled so that ldmatrix's 8 row addresses hit 8 distinct bank groups.
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4);
}
// The same for a [rows][32] byte tile (32-byte rows, 2 chunks): rows r and r + 4 swap their chunks.
__device__ __forceinline__ int swz32(int row, int chunk) {
    return row * 32 + ((chunk ^ ((row >> 2) & 1)) << 4);
}

// ------------------------------------------------------------------ exact widening to fp16
// Two e4m3 bytes of w (selected by `sel`, see below) -> fp16x2 (low half = first byte). The bit move
// gives fp16 = value * 2^-8 exactly (e4m3 subnormals become fp16 subnormals), the fp16 multiply by
// 256 restores the value exactly (every e4m3 value is an fp16 normal). The NaN code 0x7f becomes 480:
// a NaN weight code behaves as 480 (as it always has); activation NaN codes occur only in blocks
// whose scale is the NaN marker (quant.cuh Fp8ScaleBytes), whose results are NaN either way.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w, uint32_t sel) {
    const uint32_t x = __byte_perm(w, 0u, sel);  // each selected byte in the high byte of a half
    const uint32_t h = (x & 0x80008000u) | ((x >> 1) & 0x3f803f80u);
    __half2 v = *reinterpret_cast<const __half2*>(&h);
    v = __hmul2(v, __halves2half2(__ushort_as_half(0x5c00), __ushort_as_half(0x5c00)));  // * 256
    return *reinterpret_cast<const uint32_t*>(&v);
}
// 8 e4m3 codes (bytes of lo then hi) -> 8 fp16 as uint4.
__device__ __forceinline__ uint4 e4m3x8_to_f16x8(uint32_t lo, uint32_t hi) {
    uint4 r;
    r.x = e4m3x2_to_f16x2(lo, 0x1404u);  // bytes 0, 1
    r.y = e4m3x2_to_f16x2(lo, 0x3424u);  // bytes 2, 3
    r.z = e4m3x2_to_f16x2(hi, 0x1404u);
    r.w = e4m3x2_to_f16x2(hi, 0x3424u);
    return r;
}
// Activation codes (bytes b0..b3 of w) -> fp16x2 lo = (b0, b1), hi = (b2, b3). Exact for every
// non-NaN code (NaN codes: see e4m3x2_to_f16x2; sm_89+ widens them to NaN, sm_86 to 480).
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 "
        "%1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#else
    lo = e4m3x2_to_f16x2(w, 0x1404u);
    hi = e4m3x2_to_f16x2(w, 0x3424u);
#endif
}
// One byte of two e2m1 codes (even element in the low nibble, docs/MODEL.md 3.2) -> fp16x2 (low half =
// even element). Nibble s|eem: placing eem at fp16 bits 11..9 and s at bit 15 gives exactly the
// e2m1 value * 2^-14 (e = 0, m = 1 is the fp16 subnormal 2^-15); the fp16 multiply by 2^14 restores
// it exactly. byte * 0x00200200 puts the low nibble at bits 12..9 and the high one at 28..25; adding
// 7 * (sign bits 12 / 28) moves them to 15 / 31. mult2: the fp16x2 multiplier, 2^14 (0x7400) in both
// halves; the Hopper kernels pass 2^(14 + b) to take a power-of-two scale 2^b into the values (exact
// where every e2m1 value * 2^b is a normal fp16: b in [-13, 1]).
constexpr uint32_t kE2m1F16Mult = 0x74007400u;
__device__ __forceinline__ uint32_t e2m1x2_to_f16x2(uint32_t byte, uint32_t mult2 = kE2m1F16Mult) {
    const uint32_t u = (byte * 0x00200200u) & 0x1E001E00u;
    const uint32_t h = u + 7u * (u & 0x10001000u);
    __half2 v = *reinterpret_cast<const __half2*>(&h);
    v = __hmul2(v, *reinterpret_cast<const __half2*>(&mult2));
    return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint4 e2m1x8_to_f16x8(uint32_t w, uint32_t mult2 = kE2m1F16Mult) {
    uint4 r;
    r.x = e2m1x2_to_f16x2(w & 0xffu, mult2);
    r.y = e2m1x2_to_f16x2((w >> 8) & 0xffu, mult2);
    r.z = e2m1x2_to_f16x2((w >> 16) & 0xffu, mult2);
    r.w = e2m1x2_to_f16x2(w >> 24, mult2);
    return r;
}
// fp4 column scales 2^b that the widened weights can take into their values: byte = b + 127 with b in
// [-13, 1], where every e2m1 value * 2^b is a normal fp16 (0.5 * 2^-13 .. 6 * 2^1) and the conversion's
// multiplier 2^(14 + b) is one too (the Hopper kernels' converters, and the prepared fp16 experts).
constexpr uint32_t kFoldLo = 114, kFoldSpan = 14;
__host__ __device__ __forceinline__ bool sw_foldable(uint32_t byte) {
    return byte - kFoldLo <= kFoldSpan;
}
// e2m1x2_to_f16x2's multiplier for a weight of fp4 column scale byte `byte`: the values times 2^b where
// the scale folds (fp16 2^(14 + b): exponent field byte - 98), else the plain values.
__device__ __forceinline__ uint32_t e2m1_f16_mult(uint32_t byte) {
    return sw_foldable(byte) ? (byte - 98u) * 0x04000400u : kE2m1F16Mult;
}

// ------------------------------------------------------------------ one K block of one warp
// Lane offsets (bytes, constant over the K loop): the swizzle term of every m16 block's / n16 pair's
// ldmatrix row equals that of block 0 (their rows differ by multiples of 16), so block i's address
// is base + lane offset + i * (16 rows).
struct LaneOffsets {
    uint32_t a[2];  // bf16 A: chunk 2 kk + lane / 16 of row wm * kWarpM + lane % 16; quant A: a[0] only
    uint32_t b[2];  // 16-bit B: chunk 2 kk + (lane / 8) % 2 of row wn * kWarpN + lane % 8 + (lane / 16) * 8
    int sa;         // scale index of row wm * kWarpM + lane / 4
    int sw;         // fp8: n8 block wn * kWarpN / 8; fp4: column wn * kWarpN + 2 (lane % 4)
};
template <class C>
__device__ __forceinline__ LaneOffsets lane_offsets(int lane, int wm, int wn) {
    LaneOffsets o;
    const int nb = wn * C::kWarpN + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) o.b[kk] = static_cast<uint32_t>(swz(nb, kk * 2 + ((lane >> 3) & 1)));
    if constexpr (C::kQuant) {
        o.a[0] = static_cast<uint32_t>(swz32(wm * C::kWarpM + (lane & 7) + ((lane >> 3) & 1) * 8, lane >> 4));
        o.a[1] = 0u;
    } else {
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
            o.a[kk] = static_cast<uint32_t>(swz(wm * C::kWarpM + (lane & 15), kk * 2 + (lane >> 4)));
    }
    o.sa = wm * C::kWarpM + (lane >> 2);
    o.sw = C::kB == BKind::E4M3 ? (wn * C::kWarpN) >> 3 : wn * C::kWarpN + 2 * (lane & 3);
    return o;
}

// The warp's MMAs (and block-scale epilogue) for one 32-wide K block. kMIs: the warp's m16 blocks
// computed, unrolled without branches (full columns, fused scale form); kGeneric: runtime limits
// mi_lim / ni_lim and the choice of scale form (partial columns, scales outside the window).
// a_base / b_base: shared addresses of the A stage and of the 16-bit B tile; ss: the block's scales.
template <class C, int kMIs, bool kGeneric>
__device__ __forceinline__ void warp_block(float (&acc)[C::kMI][C::kNI][4], uint32_t a_base, uint32_t b_base,
                                           const float* ss, const LaneOffsets& lo, int mi_lim, int ni_lim,
                                           bool exact3) {
    constexpr int kMI = C::kMI, kNI = C::kNI;
    constexpr int kMIn = kGeneric ? kMI : kMIs;
    // B fragments of both k16 halves: [half][n8 block][2]
    uint32_t bfr[2][kNI][2];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int p = 0; p < kNI / 2; ++p) {
            if (kGeneric && 2 * p >= ni_lim) {
                bfr[kk][2 * p][0] = bfr[kk][2 * p][1] = bfr[kk][2 * p + 1][0] = bfr[kk][2 * p + 1][1] = 0u;
                continue;
            }
            uint32_t r[4];
            ldmatrix_x4(r, b_base + lo.b[kk] + p * 16 * 64);
            bfr[kk][2 * p][0] = r[0];
            bfr[kk][2 * p][1] = r[1];
            bfr[kk][2 * p + 1][0] = r[2];
            bfr[kk][2 * p + 1][1] = r[3];
        }
    if constexpr (!C::kQuant) {
        uint32_t af[2][kMI][4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int mi = 0; mi < kMIn; ++mi) {
                if (kGeneric && mi >= mi_lim) continue;
                ldmatrix_x4(af[kk][mi], a_base + lo.a[kk] + mi * 16 * 64);
            }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
            for (int mi = 0; mi < kMIn; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni) {
                    if (kGeneric && (mi >= mi_lim || ni >= ni_lim)) continue;
                    mma16816<false>(acc[mi][ni], af[kk][mi], bfr[kk][ni], acc[mi][ni]);
                }
    } else {
        // weight scales of the thread's columns: fp8 one per 32 columns, fp4 one per column
        float sw[kNI][2];
        if constexpr (C::kB == BKind::E4M3) {
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni) sw[ni][0] = sw[ni][1] = ss[C::kBM + lo.sw + ni];
        } else {
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni) {
                const float2 w2 = *reinterpret_cast<const float2*>(ss + C::kBM + lo.sw + ni * 8);
                sw[ni][0] = w2.x;
                sw[ni][1] = w2.y;
            }
        }
#pragma unroll
        for (int mi = 0; mi < kMIn; ++mi) {
            if (kGeneric && mi >= mi_lim) continue;
            // A: one ldmatrix.x4 of fragment-ordered codes = rows g / g + 8 of both k16 halves
            uint32_t raw[4], a[2][4];
            ldmatrix_x4(raw, a_base + lo.a[0] + mi * 16 * 32);
            e4m3x4_to_f16x2x2(raw[0], a[0][0], a[0][2]);
            e4m3x4_to_f16x2x2(raw[1], a[0][1], a[0][3]);
            e4m3x4_to_f16x2x2(raw[2], a[1][0], a[1][2]);
            e4m3x4_to_f16x2x2(raw[3], a[1][1], a[1][3]);
            const float sa0 = ss[lo.sa + mi * 16], sa1 = ss[lo.sa + mi * 16 + 8];
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni) {
                if (kGeneric && ni >= ni_lim) continue;
                float pf[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the block's fresh partial sum P
                mma16816<true>(pf, a[0], bfr[0][ni], pf);
                mma16816<true>(pf, a[1], bfr[1][ni], pf);
                if (kGeneric && exact3) {  // the original three roundings
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[mi][ni][e] = __fadd_rn(
                            acc[mi][ni][e], __fmul_rn(__fmul_rn(pf[e], (e >> 1) ? sa1 : sa0), sw[ni][e & 1]));
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        acc[mi][ni][e] =
                            __fmaf_rn(pf[e], __fmul_rn((e >> 1) ? sa1 : sa0, sw[ni][e & 1]), acc[mi][ni][e]);
                }
            }
        }
    }
}

// ------------------------------------------------------------------ the tile
template <class C>
__device__ __forceinline__ void gemm_tile(const TileJob& j, uint8_t* smem) {
    constexpr int kT = C::kThreads;
    constexpr int kElemA = C::kQuant ? 1 : 2;                    // bytes per A element
    constexpr int kACpr = C::kARow / 16, kBCpr = C::kBRow / 16;  // 16-byte chunks per tile row
    constexpr int kAChunks = C::kBM * kACpr, kBChunks = C::kBN * kBCpr;
    constexpr int kAPer = (kAChunks + kT - 1) / kT, kBPer = (kBChunks + kT - 1) / kT;
    constexpr int kAEl = 16 / kElemA;  // elements per A chunk
    constexpr int kBEl = C::kB == BKind::E2M1 ? 32 : (C::kB == BKind::E4M3 ? 16 : 8);
    constexpr int kBElBytes2 = C::kB == BKind::E2M1 ? 1 : (C::kB == BKind::E4M3 ? 2 : 4);  // 2 x bytes/elem

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;
    const int KB = (j.k + kBK - 1) / kBK;

    // ---- per-thread cp.async sources (fixed rows for the whole K loop)
    const uint8_t* a_src[kAPer];
    int a_dst[kAPer], a_k0[kAPer];
    bool a_ok[kAPer], a_in[kAPer];
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
        const int q = tid + i * kT;
        const int row = q / kACpr, cir = q % kACpr;
        a_in[i] = q < kAChunks;
        a_ok[i] = a_in[i] && row < j.m_valid;
        const int64_t arow = a_ok[i] ? (j.a_rows ? static_cast<int64_t>(j.a_rows[row]) : row) : 0;
        a_src[i] = j.a + arow * j.a_pitch + cir * 16;
        a_dst[i] = C::kQuant ? swz32(row, cir) : swz(row, cir);
        a_k0[i] = cir * kAEl;
    }
    const uint8_t* b_src[kBPer];
    int b_dst[kBPer], b_k0[kBPer];
    bool b_ok[kBPer], b_in[kBPer];
#pragma unroll
    for (int i = 0; i < kBPer; ++i) {
        const int q = tid + i * kT;
        const int row = q / kBCpr, cir = q % kBCpr;
        b_in[i] = q < kBChunks;
        b_ok[i] = b_in[i] && row < j.n_valid;
        b_src[i] = j.b + (b_ok[i] ? static_cast<int64_t>(row) : 0) * j.b_pitch + cir * 16;
        b_dst[i] = C::kB == BKind::BF16 ? swz(row, cir) : row * C::kBRow + cir * 16;
        b_k0[i] = cir * kBEl;
    }

    const uint32_t smem0 = smem_u32(smem);
    // Zero-filled chunks (rows beyond the tile's valid rows, K beyond k) copy 0 bytes; their source
    // address is still a valid one: the row's (block-scaled: K % 32 == 0, so the chunk lies inside
    // row 0 of the tile) or the operand's first byte (bf16 K tails).
    auto load_stage = [&](int stage, int kb) {
        const uint32_t base = smem0 + stage * C::kStageBytes;
        const int kel = kb * kBK;  // first element of the K block
#pragma unroll
        for (int i = 0; i < kAPer; ++i) {
            if (!a_in[i]) continue;
            const uint8_t* src = a_src[i] + static_cast<int64_t>(kb) * C::kARow;
            if constexpr (C::kQuant) {
                cp_async16(base + a_dst[i], src, a_ok[i] ? 16 : 0);
            } else {
                int bytes = 0;
                if (a_ok[i]) bytes = min(max(j.k - (kel + a_k0[i]), 0), kAEl) * kElemA;
                cp_async16(base + a_dst[i], bytes ? src : j.a, bytes);
            }
        }
#pragma unroll
        for (int i = 0; i < kBPer; ++i) {
            if (!b_in[i]) continue;
            const uint8_t* src = b_src[i] + static_cast<int64_t>(kb) * C::kBRow;
            if constexpr (C::kQuant) {
                cp_async16(base + C::kAStage + b_dst[i], src, b_ok[i] ? 16 : 0);
            } else {
                int bytes = 0;
                if (b_ok[i]) bytes = min(max(j.k - (kel + b_k0[i]), 0), kBEl) * kBElBytes2 / 2;
                cp_async16(base + C::kAStage + b_dst[i], bytes ? src : j.b, bytes);
            }
        }
    };

    constexpr int kMI = C::kMI, kNI = C::kNI;
    float acc[kMI][kNI][4];
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    // ---- the warp's valid m16 / n8 blocks (warp uniform). Branch-free variants cover 1/4, 2/4,
    // 3/4 and all of the warp's m16 blocks (rounded up: at most kMI / 4 - 1 blocks of zero rows are
    // computed and dropped); partial columns and unsafe scale blocks take the generic variant.
    const int mi_lim = max(0, min(kMI, (j.m_valid - wm * C::kWarpM + 15) / 16));
    const int ni_lim = max(0, min(kNI, (j.n_valid - wn * C::kWarpN + 7) / 8));
    const LaneOffsets lo = lane_offsets<C>(lane, wm, wn);
    auto compute = [&](uint32_t a_base, uint32_t b_base, const float* ss, bool exact3) {
        if (mi_lim == 0 || ni_lim == 0) return;
        constexpr int q = kMI / 4;
        if (ni_lim == kNI && !exact3) {
            if (mi_lim > 3 * q)
                warp_block<C, 4 * q, false>(acc, a_base, b_base, ss, lo, kMI, kNI, false);
            else if (mi_lim > 2 * q)
                warp_block<C, 3 * q, false>(acc, a_base, b_base, ss, lo, kMI, kNI, false);
            else if (mi_lim > q)
                warp_block<C, 2 * q, false>(acc, a_base, b_base, ss, lo, kMI, kNI, false);
            else
                warp_block<C, q, false>(acc, a_base, b_base, ss, lo, kMI, kNI, false);
        } else {
            warp_block<C, kMI, true>(acc, a_base, b_base, ss, lo, mi_lim, ni_lim, exact3);
        }
    };

#pragma unroll
    for (int s = 0; s < C::kStages - 1; ++s) {
        if (s < KB) load_stage(s, s);
        cp_async_commit();
    }

    if constexpr (!C::kQuant) {
        for (int kb = 0; kb < KB; ++kb) {
            cp_async_wait<C::kStages - 2>();
            __syncthreads();  // stage kb landed for every thread; everyone is done with iteration kb - 1
            {
                const int nk = kb + C::kStages - 1;
                if (nk < KB) load_stage(nk % C::kStages, nk);
                cp_async_commit();
            }
            const uint32_t stage = smem0 + (kb % C::kStages) * C::kStageBytes;
            compute(stage, stage + C::kAStage, nullptr, false);
        }
    } else {
        // ---- block scales: thread tid < BM owns A row tid, tid < kSwPerK weight scale tid
        const uint8_t* sa_src = nullptr;
        const uint8_t* sw_src = nullptr;
        if (tid < C::kBM && tid < j.m_valid) {
            const int64_t arow = j.a_rows ? static_cast<int64_t>(j.a_rows[tid]) : tid;
            sa_src = j.sa + arow * j.sa_pitch;
        }
        if (tid < C::kSwPerK) {
            if constexpr (C::kB == BKind::E4M3) {
                if (tid * 8 < j.n_valid)
                    sw_src = j.sb + static_cast<int64_t>((j.n0 + tid * 8) >> 5) * j.sb_pitch;
            } else {
                if (tid < j.n_valid) sw_src = j.sb + (static_cast<int64_t>(j.n0) + tid) * j.sb_pitch;
            }
        }
        // scale bytes of block kb: sa | sw << 8 (127 = 1.0 where the thread owns none)
        auto fetch = [&](int kb) -> uint32_t {
            uint32_t a = 127u, w = 127u;
            if (kb < KB) {
                if (sa_src) a = __ldg(sa_src + kb);
                if (sw_src) w = __ldg(sw_src + kb);
            }
            return a | (w << 8);
        };
        float* ss = reinterpret_cast<float*>(smem + C::kScaleOffset);
        uint8_t* conv = smem + C::kConvOffset;
        // stage block kb's scales and widened B (raw B in ring slot kb % kStages) into buffer kb & 1;
        // returns whether this thread's scales fall outside the fused form's window
        auto prepare = [&](int kb, uint32_t q) -> bool {
            const int buf = kb & 1;
            const uint32_t a = q & 0xffu, w = q >> 8;
            if (tid < C::kBM) ss[buf * C::kScaleBuf + tid] = e8m0_to_f32(static_cast<uint8_t>(a));
            if (tid < C::kSwPerK)
                ss[buf * C::kScaleBuf + C::kBM + tid] = e8m0_to_f32(static_cast<uint8_t>(w));
            const uint8_t* raw = smem + (kb % C::kStages) * C::kStageBytes + C::kAStage;
            uint8_t* dst = conv + buf * C::kConvBuf;
#pragma unroll
            for (int i = 0; i < C::kBN * 4 / kT; ++i) {
                const int u = tid + i * kT, row = u >> 2, c = u & 3;
                uint4 out;
                if constexpr (C::kB == BKind::E4M3) {
                    const uint2 v = *reinterpret_cast<const uint2*>(raw + row * 32 + c * 8);
                    out = e4m3x8_to_f16x8(v.x, v.y);
                } else {
                    out = e2m1x8_to_f16x8(*reinterpret_cast<const uint32_t*>(raw + row * 16 + c * 4));
                }
                *reinterpret_cast<uint4*>(dst + swz(row, c)) = out;
            }
            return (a - kSaLo > kSaSpan) || (w - kSwLo > kSwSpan);
        };

        uint32_t q1 = fetch(1), q2 = fetch(2);
        bool unsafe = false;
        cp_async_wait<C::kStages - 2>();
        __syncthreads();  // stage 0 landed for every thread
        if (KB > 0) unsafe = prepare(0, fetch(0));
        for (int kb = 0; kb < KB; ++kb) {
            cp_async_wait<C::kStages - 3>();
            // block kb's widened B and scales are complete, stage kb + 1 landed for every thread,
            // everyone is done with iteration kb - 1 (its B buffer and ring slot may be reused)
            const bool exact3 = __syncthreads_or(unsafe) != 0;
            {
                const int nk = kb + C::kStages - 1;
                if (nk < KB) load_stage(nk % C::kStages, nk);
                cp_async_commit();
            }
            if (kb + 1 < KB) unsafe = prepare(kb + 1, q1);
            q1 = q2;
            q2 = fetch(kb + 3);
            const int buf = kb & 1;
            compute(smem0 + (kb % C::kStages) * C::kStageBytes, smem_u32(conv + buf * C::kConvBuf),
                    ss + buf * C::kScaleBuf, exact3);
        }
    }
    cp_async_wait<0>();

    // ---- epilogue: masked stores (fragment element e: row + 8 * (e >> 1), column + (e & 1)); pairs
    // of columns as one 4-byte (bf16) / 8-byte (f32) store when aligned
    constexpr int kOutBytes = C::kOutF32 ? 4 : 2;
    const bool pair_ok =
        (reinterpret_cast<uintptr_t>(j.c) % (2 * kOutBytes)) == 0 && j.c_pitch % (2 * kOutBytes) == 0;
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = wm * C::kWarpM + mi * 16 + (lane >> 2) + 8 * h;
                const int c = wn * C::kWarpN + ni * 8 + (lane & 3) * 2;
                if (r >= j.m_valid || c >= j.n_valid) continue;
                uint8_t* dst =
                    j.c + static_cast<int64_t>(r) * j.c_pitch + static_cast<int64_t>(c) * kOutBytes;
                const float v0 = acc[mi][ni][2 * h], v1 = acc[mi][ni][2 * h + 1];
                const bool two = c + 1 < j.n_valid;
                if constexpr (C::kOutF32) {
                    if (two && pair_ok) {
                        *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
                    } else {
                        reinterpret_cast<float*>(dst)[0] = v0;
                        if (two) reinterpret_cast<float*>(dst)[1] = v1;
                    }
                } else {
                    const uint32_t b0 = f32_to_bf16_bits(v0), b1 = f32_to_bf16_bits(v1);
                    if (two && pair_ok) {
                        *reinterpret_cast<uint32_t*>(dst) = b0 | (b1 << 16);
                    } else {
                        reinterpret_cast<uint16_t*>(dst)[0] = static_cast<uint16_t>(b0);
                        if (two) reinterpret_cast<uint16_t*>(dst)[1] = static_cast<uint16_t>(b1);
                    }
                }
            }
}

}  // namespace ds4r::kern::gemm
