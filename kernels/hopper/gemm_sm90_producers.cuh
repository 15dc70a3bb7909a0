// The producer roles of a Hopper wgmma GEMM tile (gemm_sm90_stage.cuh: the structure, the stage layout
// and the numerics): the TMA copies of a stage, the cp.async loaders (A and B rows where TMA does not
// apply, every scale word) and the converters (B widened or converted, or a stage's scale tables and
// products for the consumers).
#pragma once

#include "gemm_sm90_stage.cuh"

namespace ds4r::kern {

namespace {

using namespace sm90;

#if defined(DS4R_SM90A_DEVICE)

// TMA copies of stage i's A box (kBM rows x kABytes bytes at (K byte / element offset, m0, z)) and B
// box (kBN rows at (.., n0, z)) into the places the cp.async loaders fill (tensor maps built by the
// host with the matching swizzle: 128 bytes for MMA tiles, kRawA (64 or 128) for the widened raw A rows, none
// for the converters' raw B rows); rows and K past the tensor arrive as zeros, as the loaders' zero fill. One
// arrival on loaded[s] that expects both boxes' bytes (zero-filled bytes count too). Run by one thread.
template <class C>
__device__ __forceinline__ void tma_stage(const Job& j, uint32_t st, Bars bars, int i, int s) {
    // coordinates of dimension 0: elements (bf16) or bytes (codes)
    const int ka = i * (C::kOp == Op::Bf16 ? C::kKs : C::kABytes);
    const int kb = i * (C::kB16 ? C::kKs : C::kBBytes);
    // kBHalves == 2: B's second half (K elements kb + 64 ..) only where K reaches it (the consumers never
    // read it otherwise: a stage past K holds no block)
    const bool second = C::kBHalves == 2 && kb + 64 < j.k;
    mbar_arrive_expect_tx(bars.loaded(s),
                          C::kTmaBytes - (C::kBHalves == 2 && !second ? C::kBN * kRowBytes : 0));
    // (the prepared fp16 experts' A: the pair-ordered rows of every expert, one plane: z = 0)
    if constexpr (C::kTma)
        tma_load_3d(C::kWiden ? st + C::kRawAOff : st + C::kA, j.tma_a, ka, j.m0, C::kPreFolded ? 0 : j.z,
                    bars.loaded(s));
    tma_load_3d(C::kConvertB ? st + C::kRawBOff : st + C::kB, j.tma_b, kb, j.n0, j.z, bars.loaded(s));
    if (second) tma_load_3d(st + C::kB + C::kBN * kRowBytes, j.tma_b, kb + 64, j.n0, j.z, bars.loaded(s));
}

// The bf16 TMA producer (no scale words): one thread.
template <class C>
__device__ __forceinline__ void load_tma(const Job& j, uint32_t base, Bars bars, int n_stages) {
    for (int i = 0; i < n_stages; ++i) {
        const int s = i % C::kStages;
        if (i >= C::kStages) mbar_wait(bars.empty(s), ((i / C::kStages) - 1) & 1);
        tma_stage<C>(j, base + s * C::kStage, bars, i, s);
    }
}

// ------------------------------------------------------------------ loaders
// The loaders copy every stage's A and B rows, kStages ahead of the consumers, with coalesced 16-byte
// cp.async (the lanes of a warp cover whole 128-byte row segments), and the rows' scale words (loader
// p: tile rows p + kLoaders t); completion arrives on loaded[s] through cp.async itself.
template <class C>
__device__ __forceinline__ void load(const Job& j, uint32_t base, Bars bars, int n_stages, int p) {
    constexpr int kWarps = C::kLoaders / 32;
    const int lw = p / 32, lane = p % 32;
    for (int r = p; r < C::kBM; r += C::kLoaders) {
        const int32_t ar = r < j.m_valid ? (j.a_rows ? j.a_rows[r] : r) : -1;
        sts32(bars.rows() + 4 * r, static_cast<uint32_t>(ar));
        sts64(bars.row_offsets(C::kBM) + 8 * r,
              static_cast<uint64_t>(ar >= 0 ? ar * j.a_pitch : int64_t{-1}));
    }
    named_barrier(1, C::kLoaders);

    // scale rows of this loader: A rows p + kLoaders t (< kBM), weight scale rows p + kLoaders t (<
    // kSwRows: fp8 one per 32-column block of the tile, fp4 one per column)
    constexpr int kRa = C::kSaPerLoader, kRw = C::kSwPerLoader;
    const uint8_t* sa_row[kRa];
    const uint8_t* sw_row[kRw];
    bool a_ok[kRa], sw_ok[kRw];
    const int a_bytes = C::kOp == Op::Bf16 ? 2 * j.k : j.k;  // bytes of one A row
    const int b_bytes = C::kB16 ? 2 * j.k : (C::kOp == Op::Fp4 ? j.k / 2 : j.k);
#pragma unroll
    for (int t = 0; t < kRa; ++t) {
        const int r = p + C::kLoaders * t;
        const int32_t ar = r < C::kBM ? static_cast<int32_t>(lds32(bars.rows() + 4 * r)) : -1;
        a_ok[t] = ar >= 0;
        sa_row[t] = C::kQuant ? j.sa + static_cast<int64_t>(a_ok[t] ? ar : 0) * j.sa_pitch : nullptr;
    }
#pragma unroll
    for (int t = 0; t < kRw; ++t) {
        const int r = p + C::kLoaders * t;
        if constexpr (C::kBlockScales) {
            sw_ok[t] = r < C::kSwRows && 32 * r < j.n_valid;
            sw_row[t] = j.sb + static_cast<int64_t>(j.n0 / 32 + (sw_ok[t] ? r : 0)) * j.sb_pitch;
        } else {
            sw_ok[t] = r < C::kSwRows && r < j.n_valid;
            sw_row[t] =
                C::kQuant ? j.sb + (j.n0 + (sw_ok[t] ? static_cast<int64_t>(r) : 0)) * j.sb_pitch : nullptr;
        }
    }
    constexpr int kCprA = C::kABytes / 16, kRpwA = 32 / kCprA;  // chunks per row, rows per warp
    constexpr int kCprB = C::kBBytes / 16, kRpwB = 32 / kCprB;
    const int ca = lane % kCprA, ra = lane / kCprA, cb = lane % kCprB, rb = lane / kCprB;
    const int KB = j.k / 32;
    for (int i = 0; i < n_stages; ++i) {
        const int s = i % C::kStages;
        if (i >= C::kStages) mbar_wait(bars.empty(s), ((i / C::kStages) - 1) & 1);
        const uint32_t st = base + s * C::kStage;
        if constexpr (C::kTmaB) {
            if (p == 0) tma_stage<C>(j, st, bars, i, s);
        }
        // A: straight into the swizzled tile, or (widened) into the raw rows
        if constexpr (!C::kTma) {
            const int off = i * C::kABytes + ca * 16;
#pragma unroll 4
            for (int r = lw * kRpwA + ra; r < C::kBM; r += kWarps * kRpwA) {
                const int64_t ao = static_cast<int64_t>(lds64(bars.row_offsets(C::kBM) + 8 * r));
                const int n = ao >= 0 && off < a_bytes ? 16 : 0;
                // widened: raw rows of kRawA bytes, 16-byte chunk ca at ca ^ raw_a_swizzle(r) (conflict-free
                // ldmatrix of 8 consecutive rows' same chunk, see consume)
                const uint32_t dst = C::kWiden
                                         ? st + C::kRawAOff + r * C::kRawA + ((ca ^ raw_a_swizzle<C>(r)) << 4)
                                         : st + C::kA + swz128(r, ca);
                cp_async16(dst, n ? j.a + ao + off : j.a, n);
            }
        }
        if constexpr (!C::kTmaB) {
            const int off = i * C::kBBytes + cb * 16;
#pragma unroll 4
            for (int r = lw * kRpwB + rb; r < C::kBN; r += kWarps * kRpwB) {
                const int n = r < j.n_valid && off < b_bytes ? 16 : 0;
                const uint32_t dst =
                    C::kConvertB ? st + C::kRawBOff + r * C::kRawB + cb * 16 : st + C::kB + swz128(r, cb);
                cp_async16(dst, n ? j.b + static_cast<int64_t>(r) * j.b_pitch + off : j.b, n);
            }
        }
        if constexpr (C::kQuant) {
            // the aligned 4-byte word holding the stage's first K block's scale (widened stages hold 2
            // blocks: word offset (2 i) & ~3, the stage's bytes at (2 i) & 3)
            const int w0 = (i * C::kKb) & ~3;
            // one row's word: a 4-byte async copy, or (rare shapes: K / 32 % 4 != 0) bytes and a store
            auto scale_word = [&](uint32_t dst, const uint8_t* row, bool ok) {
                if (j.scale_words) {
                    if (ok) cp_async4(dst, row + w0);
                } else {
                    uint32_t w = 0;
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (ok && w0 + q < KB) w |= static_cast<uint32_t>(__ldg(row + w0 + q)) << (8 * q);
                    sts32(dst, w);
                }
            };
#pragma unroll
            for (int t = 0; t < kRa; ++t) {
                const int r = p + C::kLoaders * t;
                if (r < C::kBM) scale_word(st + C::kSa + 4 * r, sa_row[t], a_ok[t]);
            }
#pragma unroll
            for (int t = 0; t < kRw; ++t) {
                const int r = p + C::kLoaders * t;
                if (r < C::kSwRows) scale_word(st + C::kSw + 4 * r, sw_row[t], sw_ok[t]);
            }
        }
        if (C::kQuant && !j.scale_words) {
            // plain stores above: publish them with the copies (rare shapes: K / 32 % 4 != 0)
            cp_async_wait_all();
            fence_proxy_async();
            mbar_arrive(bars.loaded(s));
        } else {
            cp_async_arrive(bars.loaded(s));
        }
    }
}

// ------------------------------------------------------------------ converters (fp4 / widened)
// (fp4 column scales that the widened B takes into its values: gemm_tile.cuh sw_foldable)
using gemm::sw_foldable;

// fp4 stage i's scales, before its weights are converted (converter p): the f32 tables ([K block][row /
// column]) and the flag words, one per converter warp: bit 0 some scale lies outside the fused
// form's window, bit 1 some column scale outside sw_foldable (always set where B is not widened).
// Returns whether the stage's B takes its column scales (no bit set in either word): then every
// partial the consumers get is P * sw, exactly (the products' and sums' exponents all shift by b, no
// value leaves the normal range: scaling by a power of two commutes with every rounding), and
// fma(P * sw, sa, acc) is the fused form's fma(P, sa * sw, acc) bit for bit.
template <class C>
__device__ __forceinline__ bool stage_scales(uint32_t st, int i, int p) {
    const int q0 = (C::kKb * i) & 3;  // the stage's first byte in its scale words
    bool ok = true, fold = C::kWiden;
    // 4-block stages use every byte of the words: the tests take a word at a time (byte-wise subtract
    // and compare), as stage_products does (byte at a time, 4-block stages outgrow 40 registers)
    constexpr bool kWords = C::kKb == 4;
    uint32_t out = 0, unfoldable = 0;
#pragma unroll
    for (int r = p; r < C::kBM; r += C::kConverters) {
        const uint32_t wa = lds32(st + C::kSa + 4 * r);
        if constexpr (kWords) out |= bytes_outside(wa, gemm::kSaLo, gemm::kSaSpan);
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t ba = (wa >> (8 * (q0 + q))) & 0xFFu;
            if constexpr (!kWords) ok = ok && sa_in_window(ba);
            sts32(st + C::kSaF + 4 * (q * C::kBM + saf_slot(r)), e8m0_f32_bits(ba));
        }
    }
#pragma unroll
    for (int r = p; r < C::kBN; r += C::kConverters) {
        const uint32_t ww = lds32(st + C::kSw + 4 * r);
        if constexpr (kWords) {
            out |= bytes_outside(ww, gemm::kSwLo, gemm::kSwSpan);
            unfoldable |= bytes_outside(ww, gemm::kFoldLo, gemm::kFoldSpan);
        }
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t bw = (ww >> (8 * (q0 + q))) & 0xFFu;
            if constexpr (!kWords) {
                ok = ok && sw_in_window(bw);
                fold = fold && sw_foldable(bw);
            }
            sts32(st + C::kSwF + 4 * (q * C::kBN + r), e8m0_f32_bits(bw));
        }
    }
    if constexpr (kWords) {
        ok = out == 0;
        fold = fold && unfoldable == 0;
    }
    const unsigned bad = __ballot_sync(0xffffffffu, !ok), no_fold = __ballot_sync(0xffffffffu, !fold);
    if ((p & 31) == 0) sts32(st + C::kFlags + 4 * (p / 32), (bad ? 1u : 0u) | (no_fold ? 2u : 0u));
    named_barrier(2, C::kConverters);  // both converter warps' words written
    return (lds32(st + C::kFlags) | lds32(st + C::kFlags + 4)) == 0;
}

// Converter p converts weight rows p + kConverters t of the stage's raw rows into the swizzled B tile:
// fp4 -> e4m3 codes (fp8 MMA), or codes -> fp16 (widened MMA, the portable kernels' conversions by
// gemm_tile's bit trick; fp4 with the column scales taken in where stage_scales allows); the
// activations of the widened MMA are widened by the consumers (consume). Each row's shared loads are
// issued before any of its conversions, so that the chains of its 16-byte chunks overlap (one converter
// warp per scheduler: a load / convert / store chain at a time would be latency-bound).
template <class C>
__device__ __forceinline__ void convert_stage(uint32_t st, int i, bool fold, int p) {
    if constexpr (C::kWiden && C::kOp == Op::Fp4E5m2) {
        // e5m2 bytes (the e2m1 values exactly): byte -> fp16 high byte (one PRMT per two values), times
        // 2^b where the stage folds its column scales (fp16 2^b = (byte - 112) << 10; b in [-13, 1]:
        // exact, the fp4 conversion's very values)
        // (unfolded: times 1.0, exact)
        static_assert(C::kBN % (2 * C::kConverters) == 0, "converter rows in pairs");
#pragma unroll 1
        for (int r = p; r < C::kBN; r += 2 * C::kConverters) {
            uint32_t ww[2];
#pragma unroll
            for (int h = 0; h < 2; ++h)
                ww[h] = lds32(st + C::kSw + 4 * (r + h * C::kConverters)) >> (8 * ((2 * i) & 3));
#pragma unroll
            // K block c0 / 2: two 16-byte chunks of both rows, the loads first
            for (int c0 = 0; c0 < 4; c0 += 2) {
                uint4 raw[2][2];
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int c = 0; c < 2; ++c)
                        raw[h][c] =
                            lds128(st + C::kRawBOff + (r + h * C::kConverters) * C::kRawB + (c0 + c) * 16);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = r + h * C::kConverters;
                    const uint32_t mult =
                        fold ? (((ww[h] >> (4 * c0)) & 0xFFu) - 112u) * 0x04000400u : 0x3C003C00u;
#pragma unroll
                    for (int c = 0; c < 2; ++c) {  // 16 bytes = 16 codes -> 2 chunks
                        const uint4 v = raw[h][c];
                        sts128(st + C::kB + swz128(row, 2 * (c0 + c)),
                               hmul2x4(e5m2x8_to_f16x8(v.x, v.y), mult));
                        sts128(st + C::kB + swz128(row, 2 * (c0 + c) + 1),
                               hmul2x4(e5m2x8_to_f16x8(v.z, v.w), mult));
                    }
                }
            }
        }
    } else if constexpr (C::kWiden && C::kOp == Op::Fp4) {
        // Two rows at a time, every shared load first. Folded: a row's scale byte of block c (the
        // stage's bytes from q0) gives the multiplier 2^(14 + b) = fp16 exponent field byte - 98.
        static_assert(C::kBN % (2 * C::kConverters) == 0, "converter rows in pairs");
#pragma unroll 1
        for (int r = p; r < C::kBN; r += 2 * C::kConverters) {
            uint4 raw[2][2];
            uint32_t ww[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r + h * C::kConverters;
                ww[h] = fold ? lds32(st + C::kSw + 4 * row) >> (8 * ((2 * i) & 3)) : 0u;
                raw[h][0] = lds128(st + C::kRawBOff + row * C::kRawB);
                raw[h][1] = lds128(st + C::kRawBOff + row * C::kRawB + 16);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = r + h * C::kConverters;
#pragma unroll
                for (int c = 0; c < 2; ++c) {  // 32 bytes = 64 codes -> 8 chunks; chunk pair c: K block c
                    const uint32_t mult =
                        fold ? (((ww[h] >> (8 * c)) & 0xFFu) - 98u) * 0x04000400u : gemm::kE2m1F16Mult;
                    const uint4 v = raw[h][c];
                    sts128(st + C::kB + swz128(row, 4 * c), gemm::e2m1x8_to_f16x8(v.x, mult));
                    sts128(st + C::kB + swz128(row, 4 * c + 1), gemm::e2m1x8_to_f16x8(v.y, mult));
                    sts128(st + C::kB + swz128(row, 4 * c + 2), gemm::e2m1x8_to_f16x8(v.z, mult));
                    sts128(st + C::kB + swz128(row, 4 * c + 3), gemm::e2m1x8_to_f16x8(v.w, mult));
                }
            }
        }
    } else if constexpr (C::kWiden && C::kOp == Op::Fp8) {
#pragma unroll 1
        for (int r = p; r < C::kBN; r += C::kConverters) {
            uint4 raw[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) raw[c] = lds128(st + C::kRawBOff + r * C::kRawB + c * 16);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                sts128(st + C::kB + swz128(r, 2 * c), gemm::e4m3x8_to_f16x8(raw[c].x, raw[c].y));
                sts128(st + C::kB + swz128(r, 2 * c + 1), gemm::e4m3x8_to_f16x8(raw[c].z, raw[c].w));
            }
        }
    } else {
        static_assert(C::kOp == Op::Fp4, "fp8 partials convert fp4 weights only");
        // fp4 -> e4m3: 64 bytes = 128 codes -> 8 chunks
#pragma unroll 1
        for (int r = p; r < C::kBN; r += C::kConverters) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const uint4 raw = lds128(st + C::kRawBOff + r * C::kRawB + c * 16);
                sts128(st + C::kB + swz128(r, 2 * c),
                       make_uint4(e2m1x4_to_e4m3x4(raw.x & 0xFFFFu), e2m1x4_to_e4m3x4(raw.x >> 16),
                                  e2m1x4_to_e4m3x4(raw.y & 0xFFFFu), e2m1x4_to_e4m3x4(raw.y >> 16)));
                sts128(st + C::kB + swz128(r, 2 * c + 1),
                       make_uint4(e2m1x4_to_e4m3x4(raw.z & 0xFFFFu), e2m1x4_to_e4m3x4(raw.z >> 16),
                                  e2m1x4_to_e4m3x4(raw.w & 0xFFFFu), e2m1x4_to_e4m3x4(raw.w >> 16)));
            }
        }
    }
}

// Fp8F16 stage i's scale products (converter p; no B to convert): for each tile row r and K block q
// of the stage, the 4 products sa(r, q) * sw(column block cb, q) as 16 bytes at kProd + 16 (q kBM + r),
// and one flag word per converter warp: set where some scale byte of the stage lies outside the fused
// form's window (then the consumers take the three roundings from the scale words, and the products
// are unused: in the window both scales are normal powers of two, 2^(b - 127) = b << 23, and the
// product is exact). Scale words of rows or column blocks past the problem are not loaded (stale):
// they can only send a stage to the slower path, whose results are the same.
template <class C>
__device__ __forceinline__ void stage_products(uint32_t st, int i, int p) {
    const int q0 = (C::kKb * i) & 3;  // the stage's first byte in its scale words
    const uint4 sw4 = lds128(st + C::kSw);
    const uint32_t sww[4] = {sw4.x, sw4.y, sw4.z, sw4.w};
    bool ok = true;
    // 4-block stages use every byte of the words: the window tests a word at a time (byte-wise subtract
    // and compare; byte-wise tests of 20 bytes per row outgrow the producers' 40 registers)
    constexpr bool kWords = C::kKb == 4;
    uint32_t out = 0;
    if constexpr (kWords) {
#pragma unroll
        for (int cb = 0; cb < 4; ++cb) out |= bytes_outside(sww[cb], gemm::kSwLo, gemm::kSwSpan);
    }
#pragma unroll
    for (int r = p; r < C::kBM; r += C::kConverters) {
        const uint32_t wa = lds32(st + C::kSa + 4 * r);
        if constexpr (kWords) out |= bytes_outside(wa, gemm::kSaLo, gemm::kSaSpan);
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t ba = (wa >> (8 * (q0 + q))) & 0xFFu;
            if constexpr (!kWords) ok = ok && sa_in_window(ba);
            const float sa = __uint_as_float(ba << 23);
            float v[4];
#pragma unroll
            for (int cb = 0; cb < 4; ++cb) {
                const uint32_t bw = (sww[cb] >> (8 * (q0 + q))) & 0xFFu;
                if constexpr (!kWords) ok = ok && sw_in_window(bw);
                v[cb] = __fmul_rn(sa, __uint_as_float(bw << 23));
            }
            sts128(st + C::kProd + 16 * (q * C::kBM + r),
                   make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                              __float_as_uint(v[3])));
        }
    }
    if constexpr (kWords) ok = out == 0;
    const unsigned bad = __ballot_sync(0xffffffffu, !ok);
    if ((p & 31) == 0) sts32(st + C::kFlags + 4 * (p / 32), bad ? 1u : 0u);
}

template <class C>
__device__ __forceinline__ void convert(Bars bars, uint32_t base, int n_stages, int p) {
    for (int i = 0; i < n_stages; ++i) {
        const int s = i % C::kStages;
        mbar_wait(bars.loaded(s), (i / C::kStages) & 1);
        const uint32_t st = base + s * C::kStage;
        if constexpr (C::kProducts) {
            stage_products<C>(st, i, p);  // read by the consumers' shared loads: no proxy fence
        } else if constexpr (C::kPreFolded) {
            (void)stage_scales<C>(st, i, p);  // tables and flags only (B arrived folded): no proxy fence
        } else {
            bool fold = false;
            if constexpr (C::kScaleF) fold = stage_scales<C>(st, i, p);
            convert_stage<C>(st, i, fold, p);
            fence_proxy_async();
        }
        mbar_arrive(bars.full(s));
    }
}

#endif  // DS4R_SM90A_DEVICE

}  // namespace

}  // namespace ds4r::kern
