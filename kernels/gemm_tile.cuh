// The tensor-core GEMM core: one 128x128 output tile of C = A . B^T with A [M, K] (activations, row
// major) and B [N, K] (weights, row major, K contiguous). Device code only; included by gemm.cu.
//
// Structure (sm_80+ portable: mma.sync m16n8k16, ldmatrix, cp.async):
// - Block tile 128 x 128 x 32 (BK = one quantization block), 8 warps in 2 (M) x 4 (N), warp tile
//   64 x 32 (4 m16 x 4 n8 MMA tiles). The tiling never depends on M: batch invariance.
// - A 4-stage cp.async pipeline streams the raw operand bytes of one 32-wide K block per stage.
// - bf16 x bf16 (linear_bf16, wo_a, linear_f32 of bf16 operands): the stage is stored swizzled and
//   fed to ldmatrix directly; bf16 MMA, fp32 accumulation over all of K in K order.
// - Block-scaled (linear_fp8 / linear_fp4, MODEL.md 5.3): A = e4m3 activation codes, B = e4m3 codes
//   (32x32 block scales) or packed e2m1 (per row, per 32 along K). After a stage lands, all threads
//   widen it ONCE into fp16 tiles (exact: e4m3 and e2m1 values are fp16 normals) and stage the
//   block's power-of-two scales; then per 32-wide K block the two k16 MMAs accumulate into a FRESH
//   fp32 fragment P, and acc = acc + (P * sa[m, kb]) * sw[n, kb] with IEEE roundings in K order (the
//   CPU twin's exact expression), rounded to bf16 at the end.
// Each output element's reduction order is fixed by the tile shape only; no split-K, no atomics.
#pragma once

#include <cuda_fp16.h>

#include "common.cuh"

namespace ds4r::kern::gemm {

constexpr int kBM = 128, kBN = 128, kBK = 32;
constexpr int kThreads = 256;  // 8 warps
constexpr int kStages = 4;
constexpr int kWarpM = 64, kWarpN = 32;  // warp tile; warps laid out 2 (M) x 4 (N)
constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;

enum class AKind : int { BF16 = 0, E4M3 = 1 };
enum class BKind : int { BF16 = 0, E4M3 = 1, E2M1 = 2 };

template <AKind kA_, BKind kB_, bool kOutF32_>
struct Cfg {
    static constexpr AKind kA = kA_;
    static constexpr BKind kB = kB_;
    static constexpr bool kOutF32 = kOutF32_;
    static constexpr bool kQuant = kA == AKind::E4M3;  // block-scaled, fp16 MMA on widened codes
    static_assert(kQuant == (kB != BKind::BF16), "operands: bf16 x bf16, or e4m3 x (e4m3 | e2m1)");
    static constexpr int kARow = kQuant ? 32 : 64;  // raw bytes of one tile row of 32 elements
    static constexpr int kBRow = kB == BKind::BF16 ? 64 : (kB == BKind::E4M3 ? 32 : 16);
    static constexpr int kAStage = kBM * kARow;
    static constexpr int kBStage = kBN * kBRow;
    static constexpr int kStageBytes = kAStage + kBStage;
    static constexpr int kConvBytes = kQuant ? (kBM + kBN) * 64 : 0;  // widened fp16 tiles [128][32]
    static constexpr int kScaleBytes = kQuant ? (kBM + kBN) * 4 : 0;  // fp32 scales of one K block
    static constexpr int kSmemBytes = kStages * kStageBytes + kConvBytes + kScaleBytes;
};

// One output tile's operands. Pitches are in bytes.
struct TileJob {
    const uint8_t* a;        // A rows: tile row r is A row arow(r) at a + arow(r) * a_pitch
    const int32_t* a_rows;   // gather list [m_valid] (arow(r) = a_rows[r]) or null (arow(r) = r)
    int64_t a_pitch;
    const uint8_t* sa;       // block-scaled: A scales e8m0, row arow(r) at sa + arow(r) * sa_pitch
    int64_t sa_pitch;
    const uint8_t* b;        // B row n0 (the tile's first output column)
    int64_t b_pitch;
    const uint8_t* sb;       // block-scaled: B scales e8m0 base: e4m3 [ceil(N/32), .] row (n0+c)/32,
    int64_t sb_pitch;        //   e2m1 [N, .] row n0+c
    int n0;                  // absolute index of the tile's first column
    uint8_t* c;              // C at (tile row 0, column n0); bf16 or f32 elements
    int64_t c_pitch;
    int m_valid, n_valid;    // rows / columns of the tile inside the problem (1..128)
    int k;                   // reduction length: block-scaled: multiple of 32; bf16: multiple of 8
};

// ------------------------------------------------------------------ PTX wrappers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; bytes beyond src_bytes (0..16) are zero-filled.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
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
__device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    if constexpr (kF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    }
}

// Byte offset of 16-byte chunk `chunk` (0..3) of row `row` in a [rows][32] 16-bit tile (64-byte
// rows), XOR-swizzled so that ldmatrix's 8 row addresses hit 8 distinct bank groups.
__device__ __forceinline__ int swz(int row, int chunk) { return row * 64 + ((chunk ^ ((row >> 1) & 3)) << 4); }

// ------------------------------------------------------------------ exact widening to fp16
// Two e4m3 bytes of w (selected by `sel`, see below) -> fp16x2 (low half = first byte). The bit move
// gives fp16 = value * 2^-8 exactly (e4m3 subnormals become fp16 subnormals), the fp16 multiply by
// 256 restores the value exactly (every e4m3 value is an fp16 normal). The NaN code 0x7f becomes 480
// (activation NaNs are carried by a NaN block scale instead, see quant.cuh Fp8ScaleBytes).
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
// One byte of two e2m1 codes (even element in the low nibble, MODEL.md 3.2) -> fp16x2 (low half =
// even element). The fp16 encodings of 0, .5, 1, 1.5, 2, 3, 4, 6 have a zero low byte; their high
// bytes form the byte_perm lookup table.
__device__ __forceinline__ uint32_t e2m1x2_to_f16x2(uint32_t byte) {
    const uint32_t sel = ((byte & 0x7u) << 4) | ((byte & 0x70u) << 8);  // bytes: 0, lut[m0], 0, lut[m1]
    const uint32_t mag = __byte_perm(0x3E3C3800u, 0x46444240u, sel);
    const uint32_t sign = ((byte & 0x8u) << 12) | ((byte & 0x80u) << 24);
    return mag | sign;
}
__device__ __forceinline__ uint4 e2m1x8_to_f16x8(uint32_t w) {
    uint4 r;
    r.x = e2m1x2_to_f16x2(w & 0xffu);
    r.y = e2m1x2_to_f16x2((w >> 8) & 0xffu);
    r.z = e2m1x2_to_f16x2((w >> 16) & 0xffu);
    r.w = e2m1x2_to_f16x2(w >> 24);
    return r;
}

// ------------------------------------------------------------------ the tile
template <class C>
__device__ __forceinline__ void gemm_tile(const TileJob& j, uint8_t* smem) {
    constexpr int kElemA = C::kQuant ? 1 : 2;  // bytes per element (e2m1: see kBRow)
    constexpr int kAChunks = C::kAStage / 16, kBChunks = C::kBStage / 16;
    constexpr int kAPer = (kAChunks + kThreads - 1) / kThreads, kBPer = (kBChunks + kThreads - 1) / kThreads;
    constexpr int kACpr = C::kARow / 16, kBCpr = C::kBRow / 16;  // 16-byte chunks per tile row
    constexpr int kAEl = 16 / kElemA;                             // elements per A chunk
    constexpr int kBEl = C::kB == BKind::E2M1 ? 32 : (C::kB == BKind::E4M3 ? 16 : 8);
    constexpr int kBElBytes2 = C::kB == BKind::E2M1 ? 1 : (C::kB == BKind::E4M3 ? 2 : 4);  // 2 x bytes/elem

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int KB = (j.k + kBK - 1) / kBK;

    // ---- per-thread cp.async sources (fixed rows for the whole K loop)
    const uint8_t* a_src[kAPer];
    int a_dst[kAPer], a_k0[kAPer];
    bool a_ok[kAPer];
#pragma unroll
    for (int i = 0; i < kAPer; ++i) {
        const int q = tid + i * kThreads;
        const int row = q / kACpr, cir = q % kACpr;
        a_ok[i] = q < kAChunks && row < j.m_valid;
        const int64_t arow = a_ok[i] ? (j.a_rows ? static_cast<int64_t>(j.a_rows[row]) : row) : 0;
        a_src[i] = j.a + arow * j.a_pitch + cir * 16;
        a_dst[i] = C::kQuant ? row * C::kARow + cir * 16 : swz(row, cir);
        a_k0[i] = cir * kAEl;
    }
    const uint8_t* b_src[kBPer];
    int b_dst[kBPer], b_k0[kBPer];
    bool b_ok[kBPer], b_in[kBPer];
#pragma unroll
    for (int i = 0; i < kBPer; ++i) {
        const int q = tid + i * kThreads;
        const int row = q / kBCpr, cir = q % kBCpr;
        b_in[i] = q < kBChunks;
        b_ok[i] = b_in[i] && row < j.n_valid;
        b_src[i] = j.b + (b_ok[i] ? static_cast<int64_t>(row) : 0) * j.b_pitch + cir * 16;
        b_dst[i] = C::kQuant ? row * C::kBRow + cir * 16 : swz(row, cir);
        b_k0[i] = cir * kBEl;
    }

    const uint32_t smem0 = smem_u32(smem);
    auto load_stage = [&](int stage, int kb) {
        const uint32_t base = smem0 + stage * C::kStageBytes;
        const int kel = kb * kBK;  // first element of the K block
#pragma unroll
        for (int i = 0; i < kAPer; ++i) {
            if (tid + i * kThreads < kAChunks) {
                int bytes = 0;
                if (a_ok[i]) bytes = min(max(j.k - (kel + a_k0[i]), 0), kAEl) * kElemA;
                cp_async16(base + a_dst[i], bytes ? a_src[i] + static_cast<int64_t>(kb) * C::kARow : j.a, bytes);
            }
        }
#pragma unroll
        for (int i = 0; i < kBPer; ++i) {
            if (b_in[i]) {
                int bytes = 0;
                if (b_ok[i]) bytes = min(max(j.k - (kel + b_k0[i]), 0), kBEl) * kBElBytes2 / 2;
                cp_async16(base + C::kAStage + b_dst[i], bytes ? b_src[i] + static_cast<int64_t>(kb) * C::kBRow : j.b,
                           bytes);
            }
        }
    };

    // ---- block-scaled: scale sources (thread < 128: A row tid; else B column tid - 128)
    const uint8_t* s_src = nullptr;
    uint8_t s_next = 0;
    if constexpr (C::kQuant) {
        if (tid < kBM) {
            if (tid < j.m_valid) {
                const int64_t arow = j.a_rows ? static_cast<int64_t>(j.a_rows[tid]) : tid;
                s_src = j.sa + arow * j.sa_pitch;
            }
        } else {
            const int col = tid - kBM;
            if (col < j.n_valid) {
                const int64_t srow = C::kB == BKind::E4M3 ? (j.n0 + col) >> 5 : static_cast<int64_t>(j.n0) + col;
                s_src = j.sb + srow * j.sb_pitch;
            }
        }
        if (s_src && KB > 0) s_next = __ldg(s_src);
    }

    float acc[kMI][kNI][4];
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int t = 0; t < 4; ++t) acc[mi][ni][t] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < KB) load_stage(s, s);
        cp_async_commit();
    }

    uint8_t* conv = smem + kStages * C::kStageBytes;                 // [A fp16 128x32][B fp16 128x32]
    float* s_scale = reinterpret_cast<float*>(conv + C::kConvBytes);  // [A 128][B 128]

    for (int kb = 0; kb < KB; ++kb) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // stage kb landed for every thread; everyone is done with iteration kb - 1
        {
            const int nk = kb + kStages - 1;
            if (nk < KB) load_stage(nk % kStages, nk);
            cp_async_commit();
        }
        const uint8_t* stage = smem + (kb % kStages) * C::kStageBytes;
        uint32_t tA, tB;  // shared addresses of the 16-bit [128][32] swizzled operand tiles
        if constexpr (C::kQuant) {
            // widen the stage once: 512 units of 8 elements per operand, 2 per thread
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int u = tid + i * kThreads, row = u >> 2, c = u & 3;
                const uint2 w = *reinterpret_cast<const uint2*>(stage + row * 32 + c * 8);
                *reinterpret_cast<uint4*>(conv + swz(row, c)) = e4m3x8_to_f16x8(w.x, w.y);
            }
            const uint8_t* bst = stage + C::kAStage;
            uint8_t* bconv = conv + kBM * 64;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int u = tid + i * kThreads, row = u >> 2, c = u & 3;
                if constexpr (C::kB == BKind::E4M3) {
                    const uint2 w = *reinterpret_cast<const uint2*>(bst + row * 32 + c * 8);
                    *reinterpret_cast<uint4*>(bconv + swz(row, c)) = e4m3x8_to_f16x8(w.x, w.y);
                } else {
                    const uint32_t w = *reinterpret_cast<const uint32_t*>(bst + row * 16 + c * 4);
                    *reinterpret_cast<uint4*>(bconv + swz(row, c)) = e2m1x8_to_f16x8(w);
                }
            }
            s_scale[tid] = e8m0_to_f32(s_next);
            if (s_src && kb + 1 < KB) s_next = __ldg(s_src + kb + 1);  // prefetch: used next iteration
            __syncthreads();
            tA = smem_u32(conv);
            tB = smem_u32(bconv);
        } else {
            tA = smem_u32(stage);
            tB = smem_u32(stage + C::kAStage);
        }

        // ---- fragments of both k16 halves
        uint32_t af[2][kMI][4], bfr[2][kNI][2];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
#pragma unroll
            for (int mi = 0; mi < kMI; ++mi) {
                const int row = wm * kWarpM + mi * 16 + (lane & 15);
                ldmatrix_x4(af[kk][mi], tA + swz(row, kk * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int p = 0; p < kNI / 2; ++p) {
                const int n = wn * kWarpN + p * 16 + (lane & 7) + ((lane >> 4) << 3);
                uint32_t r[4];
                ldmatrix_x4(r, tB + swz(n, kk * 2 + ((lane >> 3) & 1)));
                bfr[kk][2 * p][0] = r[0];
                bfr[kk][2 * p][1] = r[1];
                bfr[kk][2 * p + 1][0] = r[2];
                bfr[kk][2 * p + 1][1] = r[3];
            }
        }

        if constexpr (C::kQuant) {
            float sa[kMI][2], sw[kNI][2];
#pragma unroll
            for (int mi = 0; mi < kMI; ++mi) {
                const int r = wm * kWarpM + mi * 16 + (lane >> 2);
                sa[mi][0] = s_scale[r];
                sa[mi][1] = s_scale[r + 8];
            }
#pragma unroll
            for (int ni = 0; ni < kNI; ++ni) {
                const int c = wn * kWarpN + ni * 8 + (lane & 3) * 2;
                sw[ni][0] = s_scale[kBM + c];
                sw[ni][1] = s_scale[kBM + c + 1];
            }
#pragma unroll
            for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
                for (int ni = 0; ni < kNI; ++ni) {
                    float f[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the block's fresh partial sum P
                    mma16816<true>(f, af[0][mi], bfr[0][ni], f);
                    mma16816<true>(f, af[1][mi], bfr[1][ni], f);
#pragma unroll
                    for (int t = 0; t < 4; ++t)
                        acc[mi][ni][t] = __fadd_rn(acc[mi][ni][t], __fmul_rn(__fmul_rn(f[t], sa[mi][t >> 1]), sw[ni][t & 1]));
                }
        } else {
#pragma unroll
            for (int kk = 0; kk < 2; ++kk)
#pragma unroll
                for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
                    for (int ni = 0; ni < kNI; ++ni) mma16816<false>(acc[mi][ni], af[kk][mi], bfr[kk][ni], acc[mi][ni]);
        }
    }
    cp_async_wait<0>();

    // ---- epilogue: masked stores (fragment element t: row + 8 * (t >> 1), column + (t & 1))
#pragma unroll
    for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni)
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int r = wm * kWarpM + mi * 16 + (lane >> 2) + 8 * (t >> 1);
                const int c = wn * kWarpN + ni * 8 + (lane & 3) * 2 + (t & 1);
                if (r < j.m_valid && c < j.n_valid) {
                    uint8_t* dst = j.c + static_cast<int64_t>(r) * j.c_pitch;
                    if constexpr (C::kOutF32)
                        reinterpret_cast<float*>(dst)[c] = acc[mi][ni][t];
                    else
                        reinterpret_cast<uint16_t*>(dst)[c] = f32_to_bf16_bits(acc[mi][ni][t]);
                }
            }
}

}  // namespace ds4r::kern::gemm
