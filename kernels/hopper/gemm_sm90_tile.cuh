// The consumer roles of a Hopper wgmma GEMM tile and one output tile's kernel body (tile): the
// warpgroups that issue the wgmmas and promote each K block's partial (gemm_sm90_stage.cuh: the
// structure, the stage layout and the numerics; gemm_sm90_producers.cuh: the roles that fill the stages).
#pragma once

#include "gemm_sm90_producers.cuh"

namespace ds4r::kern {

namespace {

using namespace sm90;

#if defined(DS4R_SM90A_DEVICE)

// ------------------------------------------------------------------ consumers (warpgroups 0, 1)
// One K block's scales for a thread's two rows, read after the block's wgmma wait (read before it, while
// two partials and the A fragments are live, they spill), or before it where they are few (consume's
// kScalesEarly: the fp16-weight GEMMs and the prepared fp16 experts with TMA and 128-wide stages). fp8 (block
// scales): s0 / s1 [cb] = sa(row) * sw(column block cb) of rows r0 / r0 + 8 and the tile's 4 column blocks,
// fast = every one of those scale bytes lies in the fused form's window (fp16 weights: only fast, from the
// converters' flags; promote reads their products); fp4: s0[0] / s1[0] = sa(r0) / sa(r0 + 8) (the converter's
// f32 table), fast = the stage's flag words (stage_scales; 0: B took the column scales).
struct BlockScales {
    float s0[4], s1[4];
    uint32_t fast;
};

// Block q of the stage at st (byte q of its scale words; the stage's first block is byte q0).
// kEarly (fp16 weights): the block's products too (s0 / s1 [cb]: rows r0 / r0 + 8), for promote to take
// from registers.
template <class C, bool kEarly = false>
__device__ __forceinline__ BlockScales block_scales(uint32_t st, int q, int q0, int r0) {
    BlockScales sc;
    if constexpr (C::kProducts) {
        // the converters' flags; promote reads their products (stage_products) a row at a time, or
        // (kEarly) they are read here
        sc.fast = (lds32(st + C::kFlags) | lds32(st + C::kFlags + 4)) == 0 ? 1u : 0u;
        if constexpr (kEarly) {
            const uint4 p0 = lds128(st + C::kProd + 16 * ((q - q0) * C::kBM + r0));
            const uint4 p1 = lds128(st + C::kProd + 16 * ((q - q0) * C::kBM + r0 + 8));
            sc.s0[0] = __uint_as_float(p0.x), sc.s0[1] = __uint_as_float(p0.y);
            sc.s0[2] = __uint_as_float(p0.z), sc.s0[3] = __uint_as_float(p0.w);
            sc.s1[0] = __uint_as_float(p1.x), sc.s1[1] = __uint_as_float(p1.y);
            sc.s1[2] = __uint_as_float(p1.z), sc.s1[3] = __uint_as_float(p1.w);
        }
    } else if constexpr (C::kBlockScales) {
        const uint32_t sa0b = (lds32(st + C::kSa + 4 * r0) >> (8 * q)) & 0xFFu;
        const uint32_t sa1b = (lds32(st + C::kSa + 4 * (r0 + 8)) >> (8 * q)) & 0xFFu;
        const float sa0 = e8m0_to_f32(static_cast<uint8_t>(sa0b)),
                    sa1 = e8m0_to_f32(static_cast<uint8_t>(sa1b));
        bool fast = sa_in_window(sa0b) && sa_in_window(sa1b);
#pragma unroll
        for (int cb = 0; cb < 4; ++cb) {
            const uint32_t b = (lds32(st + C::kSw + 4 * cb) >> (8 * q)) & 0xFFu;
            fast = fast && sw_in_window(b);
            const float sw = e8m0_to_f32(static_cast<uint8_t>(b));
            sc.s0[cb] = __fmul_rn(sa0, sw);
            sc.s1[cb] = __fmul_rn(sa1, sw);
        }
        sc.fast = fast ? 1u : 0u;
    } else {
        const int kq = q - q0;  // the block's index inside the stage
        // rows r0 and r0 + 8 side by side (saf_slot; r0 % 16 < 8)
        const uint64_t s01 = lds64(st + C::kSaF + 4 * (kq * C::kBM + saf_slot(r0)));
        sc.s0[0] = __uint_as_float(static_cast<uint32_t>(s01));
        sc.s1[0] = __uint_as_float(static_cast<uint32_t>(s01 >> 32));
        sc.fast = lds32(st + C::kFlags) | lds32(st + C::kFlags + 4);
    }
    return sc;
}

// Fp4F16: the factor that takes a column's pre-folded partial P * 2^b back to P: 2^-b where the column's
// scale byte folds (gemm::sw_foldable), else 1 (its B holds w). From the scale's f32 bits (e8m0_f32_bits:
// byte << 23; bytes 0 and 255, 2^-127 and NaN, have exponent fields 0 and 255, and never fold).
__device__ __forceinline__ float unfold_of(uint32_t sw_bits) {
    const uint32_t b = sw_bits >> 23;
    return sw_foldable(b) ? __uint_as_float((254u - b) << 23) : 1.0f;
}

// acc += P * scales of K block q (see NUMERICS; sc: block_scales of the block). r0: the thread's first
// tile row; n0: its warpgroup's first tile column (kSplitN: 128 wg, else 0).
template <class C, bool kEarly = false>
__device__ __forceinline__ void promote(float (&acc)[64], const float (&P)[64], const BlockScales& sc,
                                        uint32_t st, int q, int q0, int r0, int n0, int lane) {
    if constexpr (C::kBlockScales) {
        static_assert(!C::kSplitN, "fp8 tiles: 128 rows (the column blocks below are the tile's first 4)");
        if (sc.fast && C::kProducts && kEarly) {
            // the products block_scales<C, true> read
#pragma unroll
            for (int i = 0; i < 64; ++i)
                acc[i] = __fmaf_rn(P[i], ((i >> 1) & 1) ? sc.s1[i >> 4] : sc.s0[i >> 4], acc[i]);
        } else if (sc.fast && C::kProducts) {
            // the converters' products of rows r0 (h = 0) and r0 + 8 (h = 1), one row's at a time
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint4 pr = lds128(st + C::kProd + 16 * ((q - q0) * C::kBM + r0 + 8 * h));
                const float s4[4] = {__uint_as_float(pr.x), __uint_as_float(pr.y), __uint_as_float(pr.z),
                                     __uint_as_float(pr.w)};
#pragma unroll
                for (int i = 0; i < 64; ++i)
                    if (((i >> 1) & 1) == h) acc[i] = __fmaf_rn(P[i], s4[i >> 4], acc[i]);
            }
        } else if (sc.fast) {
#pragma unroll
            for (int i = 0; i < 64; ++i)
                acc[i] = __fmaf_rn(P[i], ((i >> 1) & 1) ? sc.s1[i >> 4] : sc.s0[i >> 4], acc[i]);
        } else {
            // the three roundings (a scale byte outside the window: rare), the scales read again
            const float sa0 = e8m0_to_f32(static_cast<uint8_t>(lds32(st + C::kSa + 4 * r0) >> (8 * q)));
            const float sa1 = e8m0_to_f32(static_cast<uint8_t>(lds32(st + C::kSa + 4 * (r0 + 8)) >> (8 * q)));
            float sw[4];
#pragma unroll
            for (int cb = 0; cb < 4; ++cb)
                sw[cb] = e8m0_to_f32(static_cast<uint8_t>(lds32(st + C::kSw + 4 * cb) >> (8 * q)));
#pragma unroll
            for (int i = 0; i < 64; ++i)
                acc[i] =
                    __fadd_rn(acc[i], __fmul_rn(__fmul_rn(P[i], ((i >> 1) & 1) ? sa1 : sa0), sw[i >> 4]));
        }
    } else {
        // fp4: one scale per column; the thread's columns 8 jj + 2 (lane % 4) + {0, 1}, jj = 0 .. 15
        // (accumulators 4 jj .. 4 jj + 3: rows r0, r0, r0 + 8, r0 + 8)
        const float fa0 = sc.s0[0], fa1 = sc.s1[0];
        if (sc.fast == 0) {
            // B took the column scales (stage_scales): P is P * sw, acc = fma(P * sw, sa, acc)
#pragma unroll
            for (int i = 0; i < 64; ++i) acc[i] = __fmaf_rn(P[i], ((i >> 1) & 1) ? fa1 : fa0, acc[i]);
            return;
        }
        const int kq = q - q0;
        const bool all_fast = (sc.fast & 1u) == 0;
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
            const int col = n0 + 8 * jj + 2 * (lane & 3);
            uint2 w2;
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                         : "=r"(w2.x), "=r"(w2.y)
                         : "r"(st + C::kSwF + 4 * (kq * C::kBN + col)));
            const float w0 = __uint_as_float(w2.x), w1 = __uint_as_float(w2.y);
            const int i = 4 * jj;
            // the block's partials P of the two columns (Fp4F16: B held w * sw where the column's scale
            // folds; times 2^-b, exact, gives P back)
            float p0 = P[i], p1 = P[i + 1], p2 = P[i + 2], p3 = P[i + 3];
            if constexpr (C::kPreFolded) {
                const float u0 = unfold_of(w2.x), u1 = unfold_of(w2.y);
                p0 = __fmul_rn(p0, u0);
                p1 = __fmul_rn(p1, u1);
                p2 = __fmul_rn(p2, u0);
                p3 = __fmul_rn(p3, u1);
            }
            if (all_fast) {
                acc[i] = __fmaf_rn(p0, __fmul_rn(fa0, w0), acc[i]);
                acc[i + 1] = __fmaf_rn(p1, __fmul_rn(fa0, w1), acc[i + 1]);
                acc[i + 2] = __fmaf_rn(p2, __fmul_rn(fa1, w0), acc[i + 2]);
                acc[i + 3] = __fmaf_rn(p3, __fmul_rn(fa1, w1), acc[i + 3]);
            } else {
                acc[i] = __fadd_rn(acc[i], __fmul_rn(__fmul_rn(p0, fa0), w0));
                acc[i + 1] = __fadd_rn(acc[i + 1], __fmul_rn(__fmul_rn(p1, fa0), w1));
                acc[i + 2] = __fadd_rn(acc[i + 2], __fmul_rn(__fmul_rn(p2, fa1), w0));
                acc[i + 3] = __fadd_rn(acc[i + 3], __fmul_rn(__fmul_rn(p3, fa1), w1));
            }
        }
    }
}

// Waits until stage i (slot i % kStages, its round i / kStages) is ready for the consumers: its copies
// landed and, where the producer warpgroup converts (kConvert), its converters are done with it.
template <class C>
__device__ __forceinline__ void wait_stage_ready(Bars bars, int i) {
    const int s = i % C::kStages;
    mbar_wait(C::kConvert ? bars.full(s) : bars.loaded(s), (i / C::kStages) & 1);
}

// A consumer warpgroup whose 64 tile rows hold no valid row (the short last tile of a routed expert, up to
// 64 pairs, or a linear's last row tile): no wgmma, no promotion, nothing to store. It keeps the stage
// hand-offs alone, one thread standing for the warpgroup's 128: each stage waited for (so that its
// arrivals for a stage's next round cannot come before the round they belong to), then freed. The other
// warpgroup's rows take the instruction sequence they take in every tile (bit-identical outputs); the
// tile costs half the tensor work, and B, read by the expert's full tile next to it in the same launch,
// comes from L2 (docs/PERFORMANCE.md, fifteenth session).
template <class C>
__device__ __forceinline__ void idle_consume(Bars bars, int n_stages, int t) {
    if (t != 0) return;
    for (int i = 0; i < n_stages; ++i) {
        wait_stage_ready<C>(bars, i);
        mbar_arrive_count(bars.empty(i % C::kStages), 128);
    }
}

template <class C, bool kOutF32>
__device__ __forceinline__ void consume(const Job& j, uint32_t base, Bars bars, int n_stages, int wg, int t) {
    const int warp = t / 32, lane = t % 32;
    // tile rows r0, r0 + 8; columns n0 .. n0 + kWgN - 1 (kSplitN: the warpgroups split the columns)
    const int r0 = (C::kSplitN ? 0 : 64 * wg) + 16 * warp + lane / 4;
    const int n0 = C::kSplitN ? C::kWgN * wg : 0;
    const int KB = j.k / 32;
    constexpr int kAcc = C::kWgN / 2;  // accumulators per thread (m64nN: N / 2)
    // widened: this lane's ldmatrix row of the raw A rows (fragment-ordered codes, kRawA bytes per row per
    // stage, chunks swizzled by the loaders): matrix lane / 8 = (rows +8: bit 0, k16 half: bit 1)
    const int a_row = (C::kSplitN ? 0 : 64 * wg) + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
    const uint32_t a_lane = static_cast<uint32_t>(a_row * C::kRawA);
    const int a_half = lane >> 4, a_swz = raw_a_swizzle<C>(a_row);
    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

    if constexpr (C::kQuant) {
        // Two partial buffers: the wgmma of K block g + 1 runs while block g's partial is promoted.
        // Block g lies in stage g / kKb at block q = g % kKb of it (its scale byte: the stage's first,
        // (kKb * stage) % 4, plus q); a stage is freed once its last block's partial is promoted.
        float PA[64], PB[64];
        // widened: the A fragments ([k16 step][4]) of the two blocks in flight; a wgmma reads them until
        // it retires, so they stay live (fence_regs_u32) until its wait
        uint32_t FA[2][4], FB[2][4];
        // the light promotions' scales (flags; fp4: the rows' two scales) are read before the block's
        // wgmma wait, so that their latency lies under it, in the kernels with TMA and 128-wide stages
        // (elsewhere they spill there, as the fp8 block scales' eight products do)
        constexpr bool kScalesEarly = (C::kProducts || C::kPreFolded) && C::kTma && C::kWideK;
        auto stage_at = [&](int i) { return base + (i % C::kStages) * C::kStage; };
        // Block (i, q)'s stage wait (at the stage's first block) and (widened) its raw A codes: the
        // stage's raw A rows by one ldmatrix (rows g / g + 8 of both k16 halves, as the portable kernels)
        auto load_a = [&](uint32_t(&raw)[4], int i, int q) {
            if (q == 0) {
                wait_stage_ready<C>(bars, i);
                fence_proxy_async();  // the cp.async rows (generic proxy) before the wgmma reads (async
                                      // proxy)
            }
            if constexpr (C::kWiden)
                ldsm_x4(raw, stage_at(i) + C::kRawAOff + a_lane + (((2 * q + a_half) ^ a_swz) << 4));
        };
        // the raw codes widened to fp16: the block's A fragments
        auto widen_a = [&](uint32_t(&F)[2][4], const uint32_t(&raw)[4]) {
            if constexpr (C::kWiden) {
                gemm::e4m3x4_to_f16x2x2(raw[0], F[0][0], F[0][2]);
                gemm::e4m3x4_to_f16x2x2(raw[1], F[0][1], F[0][3]);
                gemm::e4m3x4_to_f16x2x2(raw[2], F[1][0], F[1][2]);
                gemm::e4m3x4_to_f16x2x2(raw[3], F[1][1], F[1][3]);
            }
        };
        // Block (i, q)'s fresh partial into P (its A fragments in F): two fp16 k16 steps on the widened A,
        // or one fp8 k32 step. The descriptors are the stage tile's plus the block's offset (desc_add: one
        // add where q is known at compile time, the runs that start a stage).
        auto fire = [&](float(&P)[64], uint32_t(&F)[2][4], int i, int q) {
            const uint32_t a_k = stage_at(i) + C::kA + (C::kSplitN ? 0 : wg * 64 * kRowBytes);
            const uint32_t b_k = stage_at(i) + C::kB + n0 * kRowBytes;
            if constexpr (C::kWiden) {
                fence_regs(P);
                fence_regs_u32(F[0]);
                fence_regs_u32(F[1]);
                wgmma_fence();
                // block q's 32 K elements: 64 bytes into its B half (q / 2 with kWideK)
                const uint32_t b_q = (q >> 1) * (C::kBN * kRowBytes) + (q & 1) * 64;
                if constexpr (C::kSplitN) {
                    // (the warpgroups' columns: a descriptor per thread; as one plus offsets it spills)
                    wgmma_m64n128k16_f16_rs(P, F[0], desc_k128(b_k + b_q), 0u);
                    wgmma_m64n128k16_f16_rs(P, F[1], desc_k128(b_k + b_q + 32), 1u);
                } else {
                    const uint64_t db = desc_k128(b_k);
                    wgmma_m64n128k16_f16_rs(P, F[0], desc_add(db, b_q), 0u);
                    wgmma_m64n128k16_f16_rs(P, F[1], desc_add(db, b_q + 32), 1u);
                }
            } else {
                fence_regs(P);
                wgmma_fence();
                wgmma_m64n128k32_e4m3(P, desc_add(desc_k128(a_k), q * 32), desc_add(desc_k128(b_k), q * 32),
                                      0u);
            }
            wgmma_commit();
        };
        // the stage's first byte in its scale words, and block (i, q)'s scales
        auto q0_of = [&](int i) { return (C::kKb * i) & 3; };
        auto scales_of = [&](int i, int q) {
            return block_scales<C, kScalesEarly>(stage_at(i), q0_of(i) + q, q0_of(i), r0);
        };
        // after a block's wait: its A fragments (a wgmma reads them until it retires) are free from here
        auto retire = [&](float(&P)[64], uint32_t(&F)[2][4]) {
            fence_regs(P);
            if constexpr (C::kWiden) {
                fence_regs_u32(F[0]);
                fence_regs_u32(F[1]);
            }
        };
        auto finish = [&](float(&P)[64], int i, int q, const BlockScales& sc) {
            promote<C, kScalesEarly>(acc, P, sc, stage_at(i), q0_of(i) + q, q0_of(i), r0, n0, lane);
            if (q == C::kKb - 1 || i * C::kKb + q == KB - 1) mbar_arrive(bars.empty(i % C::kStages));
        };
        // Runs of kRun blocks: block u + 1's wgmma is issued before the wait for block u, so that each
        // block's promotion overlaps the next one's wgmma; only a run's last promotion waits with no
        // partial of this warpgroup in flight. With kEarlyPrep, block u + 2's stage wait and raw A codes
        // (load_a) come before block u's promotion and its widening after it, into the fragment registers
        // block u's wgmma has just released: the shared-memory load's latency lies under the promotion
        // (docs/PERFORMANCE.md, fifteenth and seventeenth sessions). load_a never waits for a stage that
        // needs this run's promotions: it is at most one stage past block u's, and kStages >= 3. (No
        // wgmma stays in flight across the loop's back edge: ptxas then serializes every wgmma, its C7514
        // advisory, checked by check_sm90_ptxas.sh.) The buffers alternate PA / FA (even blocks of a run)
        // and PB / FB (odd ones). Runs of 4 took the fp16-weight kernels (light promotions: the
        // converters' products) from 355 to 373 TFLOP/s (wq_a) and cost the converter-bound ones 1-2%
        // (docs/PERFORMANCE.md, eighth session): pairs there. The prepared fp16 experts (no B
        // converters) take runs of 4 as well; runs of 8 measured no better for them (0.98-1.01x,
        // seventeenth session).
        constexpr int kRun = C::kProducts || C::kPreFolded ? 4 : 2;
        // the early load_a where A arrives by TMA (the loaders' variants, the fallbacks, spill with it:
        // their row tables take registers the early fragments need)
        constexpr bool kEarlyPrep = C::kTma;
        // A run of n blocks from block g; kAligned: g starts a stage (the blocks' q known at compile time)
        auto run = [&](int g, auto n_const, auto aligned_const) {
            constexpr int n = decltype(n_const)::value;
            constexpr bool kAligned = decltype(aligned_const)::value;
            const int i0 = g / C::kKb, q0 = kAligned ? 0 : g % C::kKb;
            // block u of the run: its stage and its block in the stage
            auto blk_i = [&](int u) { return kAligned ? i0 + u / C::kKb : i0 + (q0 + u) / C::kKb; };
            auto blk_q = [&](int u) { return kAligned ? u % C::kKb : (q0 + u) % C::kKb; };
            uint32_t RA[4], RB[4];
            // block u's raw codes loaded and widened at once (where nothing lies between the two)
            auto prep = [&](uint32_t(&R)[4], uint32_t(&F)[2][4], int u) {
                load_a(R, blk_i(u), blk_q(u));
                widen_a(F, R);
            };
            prep(RA, FA, 0);
            fire(PA, FA, blk_i(0), blk_q(0));
            if (kEarlyPrep && n > 1) prep(RB, FB, 1);
#pragma unroll
            for (int u = 0; u < n; ++u) {
                if (u + 1 < n) {
                    if (u % 2 == 0) {
                        if (!kEarlyPrep) prep(RB, FB, u + 1);
                        fire(PB, FB, blk_i(u + 1), blk_q(u + 1));
                    } else {
                        if (!kEarlyPrep) prep(RA, FA, u + 1);
                        fire(PA, FA, blk_i(u + 1), blk_q(u + 1));
                    }
                }
                BlockScales sc;
                if constexpr (kScalesEarly) sc = scales_of(blk_i(u), blk_q(u));
                if (u + 1 < n)
                    wgmma_wait<1>();
                else
                    wgmma_wait<0>();
                if constexpr (kEarlyPrep) {
                    if (u % 2 == 0) {
                        retire(PA, FA);
                        if (u + 2 < n) load_a(RA, blk_i(u + 2), blk_q(u + 2));
                    } else {
                        retire(PB, FB);
                        if (u + 2 < n) load_a(RB, blk_i(u + 2), blk_q(u + 2));
                    }
                }
                // the other kernels' scales after the wait: read before it (while the registers of two
                // partials and the A fragments are live), they spill
                if constexpr (!kScalesEarly) sc = scales_of(blk_i(u), blk_q(u));
                if (u % 2 == 0) {
                    if (!kEarlyPrep) retire(PA, FA);
                    finish(PA, blk_i(u), blk_q(u), sc);
                    if (kEarlyPrep && u + 2 < n) widen_a(FA, RA);
                } else {
                    if (!kEarlyPrep) retire(PB, FB);
                    finish(PB, blk_i(u), blk_q(u), sc);
                    if (kEarlyPrep && u + 2 < n) widen_a(FB, RB);
                }
            }
        };
        using std::integral_constant;
        int g = 0;
        for (; g + kRun <= KB; g += kRun)
            run(g, integral_constant<int, kRun>{}, integral_constant<bool, kRun % C::kKb == 0>{});
        for (; g + 2 <= KB; g += 2) run(g, integral_constant<int, 2>{}, integral_constant<bool, false>{});
        if (g < KB) run(g, integral_constant<int, 1>{}, integral_constant<bool, false>{});
    } else {
        for (int i = 0; i < n_stages; ++i) {
            const int s = i % C::kStages;
            wait_stage_ready<C>(bars, i);  // (bf16: no converters, the copies alone)
            fence_proxy_async();
            const uint32_t st = base + s * C::kStage;
            fence_regs(acc);
            wgmma_fence();
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const uint64_t da = desc_k128(st + C::kA + wg * 64 * kRowBytes + q * 32);
                const uint64_t db = desc_k128(st + C::kB + q * 32);
                if constexpr (C::kBN == 256)
                    wgmma_m64n256k16_bf16(acc, da, db, 1u);
                else
                    wgmma_m64n128k16_bf16(acc, da, db, 1u);
            }
            wgmma_commit();
            // keep this stage's wgmmas in flight; the previous stage's are done: free it
            wgmma_wait<1>();
            fence_regs(acc);
            if (i > 0) mbar_arrive(bars.empty((i - 1) % C::kStages));
        }
        wgmma_wait<0>();
        fence_regs(acc);
    }

    // epilogue: the fragment's pairs of adjacent columns
#pragma unroll
    for (int i = 0; i < kAcc; i += 2) {
        const int r = r0 + 8 * ((i >> 1) & 1);
        const int cl = n0 + 8 * (i >> 2) + 2 * (lane & 3);
        if (r >= j.m_valid || cl >= j.n_valid) continue;
        uint8_t* row = j.c + static_cast<int64_t>(r) * j.c_pitch;
        if constexpr (kOutF32) {
            float* y = reinterpret_cast<float*>(row) + cl;
            if (cl + 1 < j.n_valid && j.c_pairs) {
                *reinterpret_cast<float2*>(y) = make_float2(acc[i], acc[i + 1]);
            } else {
                y[0] = acc[i];
                if (cl + 1 < j.n_valid) y[1] = acc[i + 1];
            }
        } else {
            uint16_t* y = reinterpret_cast<uint16_t*>(row) + cl;
            const uint16_t lo = f32_to_bf16_bits(acc[i]), hi = f32_to_bf16_bits(acc[i + 1]);
            if (cl + 1 < j.n_valid && j.c_pairs) {
                *reinterpret_cast<uint32_t*>(y) =
                    static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
            } else {
                y[0] = lo;
                if (cl + 1 < j.n_valid) y[1] = hi;
            }
        }
    }
}

template <class C, bool kOutF32>
__device__ __forceinline__ void tile(const Job& j, uint8_t* smem) {
    const uint32_t base = (smem_u32(smem) + 1023u) & ~1023u;
    const Bars bars{base + C::kBarriers};
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < C::kStages; ++s) {
            // each loader: one (cp.async) arrival; TMA: plus the issuing thread's expect-tx arrival
            // (bf16: that one alone, the loaders have no scale words)
            mbar_init(bars.loaded(s), C::kTmaB ? (C::kQuant ? C::kLoaders + 1 : 1) : C::kLoaders);
            mbar_init(bars.full(s),
                      C::kConvert ? kProducers - C::kLoaders : 1);  // each converter (unused without)
            mbar_init(bars.empty(s), kConsumers);                   // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int row_bytes = C::kOp == Op::Bf16 ? 2 * j.k : j.k;
    const int n_stages = (row_bytes + C::kABytes - 1) / C::kABytes;
    if (tid >= kConsumers) {
        regs_dec<C::kProducerRegs>();
        const int p = tid - kConsumers;
        if constexpr (C::kTma && !C::kQuant) {
            if (p == 0) load_tma<C>(j, base, bars, n_stages);
        } else if (p < C::kLoaders)
            load<C>(j, base, bars, n_stages, p);
        else if constexpr (C::kConvert)
            convert<C>(bars, base, n_stages, p - C::kLoaders);
    } else if (!C::kSplitN && tid >= 128 && j.m_valid <= 64) {
        regs_dec<C::kProducerRegs>();
        idle_consume<C>(bars, n_stages, tid - 128);
    } else {
        regs_inc<C::kConsumerRegs>();
        consume<C, kOutF32>(j, base, bars, n_stages, tid / 128, tid % 128);
    }
}
#endif  // DS4R_SM90A_DEVICE

}  // namespace

}  // namespace ds4r::kern
