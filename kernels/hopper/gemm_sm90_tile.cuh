// The device side of the Hopper (sm_90a) wgmma GEMMs (kernels/hopper/gemm_sm90.cu: the kernels and
// their launchers, the only file that includes this one): the tile configurations, the producer
// (TMA / cp.async loaders, converters) and consumer roles of one output tile. The block-scaled fp8 /
// fp4 linears, the routed experts' grouped fp4 GEMM and the bf16 GEMMs, with the problems and numerics
// contracts of the portable kernels (kernels/gemm.cuh; declarations in kernels/gemm_sm90.cuh).
//
// STRUCTURE (one 128-row output tile per CTA, 384 threads; 128 columns, bf16 256; the grouped experts
// also 64 x 256, Cfg::kSplitN):
// - warpgroup 2 is the producer. Plain problems (when the operands allow a tensor map, Sm90Loads):
//   one thread issues each stage's A and B boxes as TMA copies into the layouts below (zero fill past
//   the tensor), completing on `loaded` by their byte count; the loaders copy only the scale words.
//   Otherwise (and the grouped experts' gathered rows always) its loaders copy every stage's A and B rows
//   (128 bytes of K per row: 128 fp8 codes, 64 packed fp4 bytes, 64 bf16, or 64 codes to widen) with
//   coalesced 16-byte cp.async into kStages-deep 128-byte-swizzled shared tiles (or raw rows), plus the rows'
//   e8m0 scale words; completion arrives on the stage's `loaded` mbarrier through cp.async itself. Where
//   weight rows need converting (fp4 -> e4m3 codes, or codes -> fp16 for the widened partials), half of the
//   warpgroup converts them, fences the async proxy and arrives on `full`; with fp16 weights (nothing to
//   convert) that half writes the stage's scale products sa * sw for the consumers instead
//   (stage_products). Consumers free a stage on `empty`.
// - warpgroups 0 and 1 are the consumers, rows 64 g .. 64 g + 63 each (m64n128 / m64n256; kSplitN: the
//   same 64 rows, columns 128 g ..). A thread's accumulator fragment is sm90_ptx.cuh's (rows r0 =
//   16 warp + lane / 4 and r0 + 8). For the widened partials they widen their A fragments themselves
//   (ldmatrix of the raw, fragment-ordered codes, cvt, wgmma with A from registers).
//
// NUMERICS (gemm_tile.cuh NUMERICS, per output element; no tile shape or row count changes them):
// - block-scaled (docs/MODEL.md 5.3): per 32-wide K block a fresh partial P (Sm90Partials: two fp16
//   wgmma k16 on widened codes, the portable kernels' bits, or one fp8 wgmma k32), then
//   acc = fma(P, sa * sw, acc) where the scale bytes lie in the window of gemm_tile.cuh (kSaLo .. /
//   kSwLo ..), else RN(acc + RN(RN(P * sa) * sw)), in K order, acc from +0, one bf16 rounding at the
//   end. K blocks go in pairs: both wgmmas in flight, the first one's promotion overlapping the second.
//   Widened fp4 stages whose column scales all fold (stage_scales) widen w * sw instead of w: the
//   partial is exactly P * sw and acc = fma(P * sw, sa, acc), the same number. The prepared fp16 experts
//   (Op::Fp4F16) hold w * sw wherever the column's scale folds; stages whose scales all fold take the
//   same fma, the others multiply each column's partial by 2^-b first (exact: P again).
// - bf16: acc from +0 (zeroed registers, scale-d 1), wgmma k16 steps in K order, zero-filled K
//   tails; bf16 (one RNE rounding) or f32 out.
#pragma once

#include "../common.cuh"
#include "../gemm_params.cuh"
#include "../gemm_sm90.cuh"
#include "../gemm_tile.cuh"
#include "sm90_ptx.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DS4R_SM90A_DEVICE 1
#endif

namespace ds4r::kern {

namespace {

using namespace sm90;

// Fp4E5m2: fp4 weights held as e5m2 bytes, one per value (e2m1 -> e5m2 is exact: launch_fp4_to_e5m2,
// the prepared routed experts), with the fp4 weights' column scales; widened partials only.
// Fp8F16: fp8 weights widened to fp16 before the launch (launch_e4m3_to_f16: the converters' very
// values), with the fp8 weights' 32 x 32 block scales; widened partials only, and no converters: B
// arrives as the MMA tile itself.
// Fp4F16: fp4 weights prepared as fp16 with each (column, K block)'s scale taken into the values where
// it folds (launch_fp4_to_f16_folded: the converters' very values; the prepared routed experts when memory
// allows), with the fp4 column scales; widened partials only. B arrives by TMA as the MMA tile (every
// expert of a projection at one stride: one 3-D tensor map, z = expert); the converters only decode the
// stages' scales (stage_scales), and a stage whose scales do not all fold takes its partials back to P
// column by column (promote: unfold_of).
enum class Op : int { Fp8 = 0, Fp4 = 1, Bf16 = 2, Fp4E5m2 = 3, Fp8F16 = 4, Fp4F16 = 5 };

constexpr int kRowBytes = 128;  // bytes of one MMA operand tile row per stage (the 128-byte swizzle)
constexpr int kThreads = 384;   // two consumer warpgroups + one producer warpgroup
constexpr int kConsumers = 256;
constexpr int kProducers = kThreads - kConsumers;
constexpr int kSmemLimit = 227 * 1024;

// The operands of a kernel: kOp and, for the block-scaled ones, kWiden: partials on fp16 wgmma (k16,
// two per 32-wide K block) over the codes widened to fp16 (weights in shared memory by the converters,
// activations in the consumers' registers: the portable kernels' arithmetic), instead of one fp8
// wgmma (k32) on the codes.
//
// One pipeline stage in shared memory (bytes; tiles 1024-aligned; kBM x kBN tiles):
//   A tile [kBM][128] (not widened) | B tile [kBHalves][kBN][128]   swizzled MMA operands (codes, fp16 or
//                                             bf16; 16-bit B in 128-K-element stages: two halves)
//   raw A [kBM][kRawA] | raw B [kBN][kRawB]   rows as read: widened A (16-byte chunks swizzled, for
//                                             the consumers' ldmatrix), weights for the converters
//   sa [kBM] u32 | sw [kSwRows] u32           e8m0 scale words (4 bytes of a row's K/32 scales)
//   (fp4) saf [kKb][kBM] f32 | swf [kKb][kBN] f32 | flags [2] u32   the converter's scales and flags
//   (fp16 weights) prod [kKb][kBM][4] f32 | flags [2] u32   the converter's sa * sw per column block
template <Op kOp_, bool kWiden_, int kBN_ = 128, int kBM_ = 128, bool kTma_ = false, bool kWideK_ = false>
struct Cfg {
    static constexpr Op kOp = kOp_;
    // A and B tiles by TMA from one producer thread (the plain problems, and the prepared fp16 experts
    // where their A rows lie in pair order; gathered rows and every scale word still take the loaders)
    static constexpr bool kTma = kTma_;
    using WithTma = Cfg<kOp_, kWiden_, kBN_, kBM_, true, kWideK_>;  // the same tile with TMA loads
    // Stages of 128 K elements (4 blocks) for the fp16-weight kernels instead of 64: 128-byte raw A rows
    // (one TMA request per row and stage instead of two 64-byte ones, 128-byte swizzle) and each B row in
    // two 128-byte halves (two TMA boxes per stage); half as many stage hand-offs (barriers, scale words,
    // products) per K. The same wgmma sequence per output (bit-identical).
    static constexpr bool kWideK = kWideK_;
    static_assert(!kWideK || kOp_ == Op::Fp8F16 || kOp_ == Op::Fp4F16, "128-wide K stages: fp16 weights");
    // output tile rows: 128 (consumer warpgroup g: rows 64 g .. 64 g + 63, all columns), or 64 with
    // 256 columns (both warpgroups the same 64 rows, warpgroup g columns 128 g .. 128 g + 127: the
    // grouped experts' tiles when experts hold few rows; each output's instruction sequence is the same)
    static constexpr int kBM = kBM_;
    static constexpr bool kSplitN = kBM == 64;
    static_assert(kBM == 128 ||
                      (kSplitN && kBN_ == 256 && (kOp_ == Op::Fp4 || kOp_ == Op::Fp4E5m2 || kOp_ == Op::Fp4F16)),
                  "tile rows");
    // output tile columns: 128 (m64n128 per consumer warpgroup); bf16 also 256 (m64n256: fewer bytes
    // per FLOP, the accumulators need no second copy there); 256 split over the warpgroups (kSplitN)
    static constexpr int kBN = kBN_;
    static_assert(kBN == 128 || (kBN == 256 && (kOp_ == Op::Bf16 || kSplitN)), "tile columns");
    static constexpr int kWgN = kSplitN ? kBN / 2 : kBN;  // columns of one consumer warpgroup
    static constexpr bool kQuant = kOp != Op::Bf16;
    static constexpr bool kWiden = kQuant && kWiden_;
    static_assert(kOp != Op::Fp4E5m2 || kWiden, "e5m2 weights: widened partials");
    static_assert(kOp != Op::Fp8F16 || kWiden, "fp16 weights: widened partials");
    static_assert(kOp != Op::Fp4F16 || kWiden, "prepared fp16 experts: widened partials");
    // Fp4F16: B holds w * sw wherever the column's scale folds (the partial is P * sw there)
    static constexpr bool kPreFolded = kOp == Op::Fp4F16;
    // B by TMA: with A (kTma, the plain problems), or alone (Fp4F16: the grouped experts' A rows are
    // gathered by the loaders)
    static constexpr bool kTmaB = kTma || kPreFolded;
    // the weights' scales: one per 32 x 32 block (fp8), else one per column per 32-wide K block (fp4)
    static constexpr bool kBlockScales = kOp == Op::Fp8 || kOp == Op::Fp8F16;
    // B's elements are 16-bit (bf16, fp16 weights): TMA coordinates in elements, not bytes
    static constexpr bool kB16 = kOp == Op::Bf16 || kOp == Op::Fp8F16 || kOp == Op::Fp4F16;
    // B converted by the converters: fp4 weights -> codes, or widening to fp16 (Fp4E5m2: widened;
    // Fp8F16, Fp4F16: none, their B is already fp16)
    static constexpr bool kConvertB = (kWiden && !kB16) || kOp == Op::Fp4;
    // Fp8F16: the converters write each stage's table of scale products sa * sw instead (stage_products)
    static constexpr bool kProducts = kOp == Op::Fp8F16;
    // a converter role (half the producer warpgroup), the consumers wait on its `full` barrier
    // (Fp4F16: the converters decode each stage's scales, stage_scales)
    static constexpr bool kConvert = kConvertB || kProducts || kPreFolded;
    static constexpr int kLoaders = kConvert ? kProducers / 2 : kProducers;
    // Register split (setmaxnreg; 2 x 128 x consumer + 128 x producer <= the SM's 65,536): the B
    // converters need 56 per producer thread; without them the consumers take 232 (224 spills the
    // fp16-weight kernels' promotion, whose shared loads ptxas moves above the wgmma wait)
    static constexpr int kProducerRegs = kConvertB ? 56 : 40;
    static constexpr int kConsumerRegs = kConvertB ? 224 : 232;
    static_assert(2 * 128 * kConsumerRegs + 128 * kProducerRegs <= 65536, "register file");
    static constexpr int kConverters = kProducers - kLoaders;
    static_assert(!kConvert || kConverters == kLoaders, "converters: the other half of the producers");
    // scale rows per loader: A rows (sa), and weight scale rows (sw: fp8 one per 32 columns, fp4 one
    // per column)
    static constexpr int kSwRows = kBlockScales ? kBN / 32 : kBN;
    static constexpr int kSaPerLoader = (kBM + kLoaders - 1) / kLoaders;
    static constexpr int kSwPerLoader = (kSwRows + kLoaders - 1) / kLoaders;
    static_assert(kSaPerLoader > 0 && kSwPerLoader > 0, "scale rows per loader");
    static constexpr int kKs = (kOp == Op::Bf16 || (kWiden && !kWideK)) ? 64 : 128;  // K elements per stage
    static constexpr int kKb = kKs / 32;                                // 32-wide K blocks per stage
    static_assert(kKb >= 2, "K blocks per stage");
    static constexpr int kABytes = kOp == Op::Bf16 ? 2 * kKs : kKs;  // bytes of a stage's A row as read
    static constexpr int kBBytes = kB16 ? 2 * kKs : (kOp == Op::Fp4 ? kKs / 2 : kKs);
    static constexpr int kRawA = kWiden ? kABytes : 0;
    static constexpr int kRawB = kConvertB ? kBBytes : 0;
    // 16-bit B: a stage's B rows in 128-byte halves (the 128-byte swizzle's span), each half a [kBN][128 B]
    // MMA tile of its own (kWideK: 2)
    static constexpr int kBHalves = kB16 ? kBBytes / kRowBytes : 1;
    static_assert(kBHalves == 1 || kBHalves == 2, "B halves");
    // TMA: a stage's A box (kBM rows x kABytes; kTma) and B box (kBN rows x kBBytes; kTmaB), bytes
    static constexpr uint32_t kTmaBytes =
        static_cast<uint32_t>((kTma ? kBM * kABytes : 0) + (kTmaB ? kBN * kBBytes : 0));
    static_assert(kTmaBytes > 0 || !kTmaB, "stage bytes");
    // widened: no A tile (the consumers widen A in registers from the raw rows)
    static constexpr int kA = 0, kB = kWiden ? 0 : kBM * kRowBytes;
    static constexpr int kRawAOff = kB + kBN * kRowBytes * kBHalves;
    static constexpr int kRawBOff = kRawAOff + kBM * kRawA;
    static constexpr int kSa = kRawBOff + kBN * kRawB;
    static constexpr int kSw = kSa + (kQuant ? 4 * kBM : 0);
    // fp4: the converter's f32 scales [4][128] (sa by row, sw by column) and its window flags [2]
    static constexpr bool kScaleF = kOp == Op::Fp4 || kOp == Op::Fp4E5m2 || kOp == Op::Fp4F16;
    static constexpr int kSaF = kSw + (kQuant ? 4 * kBN : 0);
    static constexpr int kSwF = kSaF + (kScaleF ? 4 * 4 * kBM : 0);
    // Fp8F16: the products sa(row) * sw(column block) [kKb][kBM][4] f32
    static constexpr int kProd = kSwF + (kScaleF ? 4 * 4 * kBN : 0);
    static constexpr int kFlags = kProd + (kProducts ? 16 * kKb * kBM : 0);
    static constexpr int kEnd = kFlags + (kScaleF || kProducts ? 16 : 0);
    static constexpr int kStage = (kEnd + 1023) / 1024 * 1024;
    // loaded, full, empty (<= 8 stages); the A row table and the rows' byte offsets (Bars)
    static constexpr int kBarBytes = 3 * 8 * 8 + 4 * kBM + 8 * kBM;
    static constexpr int kStages =
        (kSmemLimit - 1024 - kBarBytes) / kStage < 8 ? (kSmemLimit - 1024 - kBarBytes) / kStage : 8;
    static constexpr int kBarriers = kStages * kStage;
    static constexpr int kBytes = 1024 /* base alignment slack */ + kBarriers + kBarBytes;
    static_assert(kStages >= 3, "pipeline depth");
    static_assert(kBytes <= kSmemLimit, "Hopper allows 227 KB of shared memory per block");
};

// The 16-byte chunk of widened raw A row r that holds logical chunk c is c ^ raw_a_swizzle<C>(r): TMA's
// 64-byte swizzle for 64-byte rows, its 128-byte swizzle for 128-byte rows (kWideK); either way the
// consumers' ldmatrix of 8 consecutive rows' same chunk hits 8 different bank groups.
template <class C>
__host__ __device__ constexpr int raw_a_swizzle(int r) {
    return C::kRawA == 128 ? (r & 7) : ((r >> 1) & 3);
}

// One output tile's operands: gemm_tile.cuh's TileJob (sb: the weight scales' base; fp8 [ceil(N / 32),
// K / 32], fp4 [N, K / 32], the tile's rows from n0) and two layout facts of the launch.
struct Job : gemm::TileJob {
    bool c_pairs;      // pairs of adjacent outputs may be stored as one aligned access
    bool scale_words;  // scale rows are 4-byte aligned with K / 32 % 4 == 0: 4-byte async copies
    // TMA (Cfg::kTma): the tensor maps of A [groups][M][K] and B [groups][N][K] (generic addresses of
    // the kernel's __grid_constant__ parameters), the tile's first row m0 and problem z (the prepared
    // fp16 experts: A [1][pairs][K] at row m0, B [experts][N][K] at z = the tile's expert)
    const void* tma_a;
    const void* tma_b;
    int m0, z;
};

#if defined(DS4R_SM90A_DEVICE)

// Two e2m1 codes per byte (even element in the low nibble, docs/MODEL.md 3.2) -> e4m3 codes, exact:
// magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 are the e4m3 codes 0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48,
// 0x4C; the sign moves from bit 3 to bit 7. nib16: 4 codes in its low 16 bits (code j at bits 4j..).
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t nib16) {
    const uint32_t mag = __byte_perm(0x3C383000u, 0x4C484440u, nib16 & 0x7777u);
    const uint32_t s = nib16 & 0x8888u;
    const uint32_t sign =
        ((s & 0x8u) << 4) | ((s & 0x80u) << 8) | ((s & 0x800u) << 12) | ((s & 0x8000u) << 16);
    return mag | sign;
}

__device__ __forceinline__ bool sa_in_window(uint32_t b) {
    return b - gemm::kSaLo <= gemm::kSaSpan;
}
__device__ __forceinline__ bool sw_in_window(uint32_t b) {
    return b - gemm::kSwLo <= gemm::kSwSpan;
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}
__device__ __forceinline__ uint64_t lds64(uint32_t a) {
    uint64_t v;
    asm volatile("ld.shared.u64 %0, [%1];\n" : "=l"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ void sts64(uint32_t a, uint64_t v) {
    asm volatile("st.shared.u64 [%0], %1;\n" ::"r"(a), "l"(v) : "memory");
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}
__device__ __forceinline__ void sts32(uint32_t a, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(a), "r"(v) : "memory");
}
// Eight e5m2 bytes (lo: values 0-3, hi: 4-7) -> fp16x8: each byte is its fp16's high byte (e5m2 is
// fp16 without the low mantissa byte), low bytes zero (PRMT selector 4 picks the zero register's byte).
__device__ __forceinline__ uint4 e5m2x8_to_f16x8(uint32_t lo, uint32_t hi) {
    return make_uint4(__byte_perm(lo, 0u, 0x1404u), __byte_perm(lo, 0u, 0x3424u),
                      __byte_perm(hi, 0u, 0x1404u), __byte_perm(hi, 0u, 0x3424u));
}
// Every fp16 of v times the fp16x2 m (both halves the same power of two here).
__device__ __forceinline__ uint4 hmul2x4(uint4 v, uint32_t m) {
    auto mul = [m](uint32_t x) {
        uint32_t r;
        asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(x), "r"(m));
        return r;
    };
    return make_uint4(mul(v.x), mul(v.y), mul(v.z), mul(v.w));
}

// Barrier addresses: loaded[s] (loaders' copies landed), full[s] (stage ready for the MMAs), empty[s].
struct Bars {
    uint32_t base;
    __device__ uint32_t loaded(int s) const { return base + 8 * s; }
    __device__ uint32_t full(int s) const { return base + 64 + 8 * s; }
    __device__ uint32_t empty(int s) const { return base + 128 + 8 * s; }
    __device__ uint32_t rows() const { return base + 192; }  // i32 [kBM]: A row of each tile row, -1 beyond
    // i64 [kBM]: byte offset of each tile row's A row (row x a_pitch), -1 beyond (the loaders' copies)
    __device__ uint32_t row_offsets(int bm) const { return base + 192 + 4 * bm; }
};

// TMA copies of stage i's A box (kBM rows x kABytes bytes at (K byte / element offset, m0, z)) and B
// box (kBN rows at (.., n0, z)) into the places the cp.async loaders fill (tensor maps built by the
// host with the matching swizzle: 128 bytes for MMA tiles, 64 for the widened raw A rows, none for
// the converters' raw B rows); rows and K past the tensor arrive as zeros, as the loaders' zero fill.
// One arrival on loaded[s] that expects both boxes' bytes (zero-filled bytes count too). Run by one
// thread.
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
#pragma unroll
    for (int r = p; r < C::kBM; r += C::kConverters) {
        const uint32_t wa = lds32(st + C::kSa + 4 * r);
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t ba = (wa >> (8 * (q0 + q))) & 0xFFu;
            ok = ok && sa_in_window(ba);
            sts32(st + C::kSaF + 4 * (q * C::kBM + r), e8m0_f32_bits(ba));
        }
    }
#pragma unroll
    for (int r = p; r < C::kBN; r += C::kConverters) {
        const uint32_t ww = lds32(st + C::kSw + 4 * r);
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t bw = (ww >> (8 * (q0 + q))) & 0xFFu;
            ok = ok && sw_in_window(bw);
            fold = fold && sw_foldable(bw);
            sts32(st + C::kSwF + 4 * (q * C::kBN + r), e8m0_f32_bits(bw));
        }
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
    if constexpr (C::kKb == 4) {
        // 4-block stages use every byte of the words: the window tests a word at a time (byte-wise
        // subtract and compare; bit-wise tests of 20 bytes per row outgrow the producers' 40 registers)
        uint32_t out = 0;
#pragma unroll
        for (int cb = 0; cb < 4; ++cb)
            out |= __vcmpgtu4(__vsub4(sww[cb], gemm::kSwLo * 0x01010101u), gemm::kSwSpan * 0x01010101u);
#pragma unroll
        for (int r = p; r < C::kBM; r += C::kConverters)
            out |= __vcmpgtu4(__vsub4(lds32(st + C::kSa + 4 * r), gemm::kSaLo * 0x01010101u),
                              gemm::kSaSpan * 0x01010101u);
        ok = out == 0;
    }
#pragma unroll
    for (int r = p; r < C::kBM; r += C::kConverters) {
        const uint32_t wa = lds32(st + C::kSa + 4 * r);
#pragma unroll
        for (int q = 0; q < C::kKb; ++q) {
            const uint32_t ba = (wa >> (8 * (q0 + q))) & 0xFFu;
            if constexpr (C::kKb != 4) ok = ok && sa_in_window(ba);
            const float sa = __uint_as_float(ba << 23);
            float v[4];
#pragma unroll
            for (int cb = 0; cb < 4; ++cb) {
                const uint32_t bw = (sww[cb] >> (8 * (q0 + q))) & 0xFFu;
                if constexpr (C::kKb != 4) ok = ok && sw_in_window(bw);
                v[cb] = __fmul_rn(sa, __uint_as_float(bw << 23));
            }
            sts128(st + C::kProd + 16 * (q * C::kBM + r),
                   make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                              __float_as_uint(v[3])));
        }
    }
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

// ------------------------------------------------------------------ consumers (warpgroups 0, 1)
// One K block's scales for a thread's two rows, read after the block's wgmma wait (read before it, while
// two partials and the A fragments are live, they spill). fp8 (block scales): s0 / s1 [cb] = sa(row) *
// sw(column block cb) of rows r0 / r0 + 8 and the tile's 4 column blocks, fast = every one of those scale
// bytes lies in the fused form's window (fp16 weights: only fast, from the converters' flags; promote
// reads their products); fp4: s0[0] / s1[0] = sa(r0) / sa(r0 + 8) (the converter's f32 table), fast =
// the stage's flag words (stage_scales; 0: B took the column scales).
struct BlockScales {
    float s0[4], s1[4];
    uint32_t fast;
};

// Block q of the stage at st (byte q of its scale words; the stage's first block is byte q0).
template <class C>
__device__ __forceinline__ BlockScales block_scales(uint32_t st, int q, int q0, int r0) {
    BlockScales sc;
    if constexpr (C::kProducts) {
        // the converters' flags; promote reads their products (stage_products) a row at a time
        sc.fast = (lds32(st + C::kFlags) | lds32(st + C::kFlags + 4)) == 0 ? 1u : 0u;
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
        sc.s0[0] = __uint_as_float(lds32(st + C::kSaF + 4 * (kq * C::kBM + r0)));
        sc.s1[0] = __uint_as_float(lds32(st + C::kSaF + 4 * (kq * C::kBM + r0 + 8)));
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
template <class C>
__device__ __forceinline__ void promote(float (&acc)[64], const float (&P)[64], const BlockScales& sc,
                                        uint32_t st, int q, int q0, int r0, int n0, int lane) {
    if constexpr (C::kBlockScales) {
        static_assert(!C::kSplitN, "fp8 tiles: 128 rows (the column blocks below are the tile's first 4)");
        if (sc.fast && C::kProducts) {
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
        // Block g lies in stage g / kKb (its scale byte (stage's q0) + g % kKb); a stage is freed once
        // its last block's partial is promoted.
        float PA[64], PB[64];
        // widened: the A fragments ([k16 step][4]) of the two blocks in flight; a wgmma reads them until
        // it retires, so they stay live (fence_regs_u32) until its wait
        uint32_t FA[2][4], FB[2][4];
        auto stage_of = [&](int g) { return base + ((g / C::kKb) % C::kStages) * C::kStage; };
        auto issue = [&](float(&P)[64], uint32_t(&F)[2][4], int g) {
            const int i = g / C::kKb, q = g % C::kKb, s = i % C::kStages;
            if (q == 0) {
                mbar_wait(C::kConvert ? bars.full(s) : bars.loaded(s), (i / C::kStages) & 1);
                fence_proxy_async();  // the cp.async rows (generic proxy) before the wgmma reads (async
                                      // proxy)
            }
            const uint32_t a_k = stage_of(g) + C::kA + (C::kSplitN ? 0 : wg * 64 * kRowBytes);
            const uint32_t b_k = stage_of(g) + C::kB + n0 * kRowBytes;
            if constexpr (C::kWiden) {
                // the block's fresh partial: two fp16 k16 steps, A widened here from one ldmatrix of
                // fragment-ordered codes (rows g / g + 8 of both k16 halves, as the portable kernels)
                uint32_t raw[4];
                ldsm_x4(raw, stage_of(g) + C::kRawAOff + a_lane + (((2 * q + a_half) ^ a_swz) << 4));
                uint32_t(&a0)[4] = F[0];
                uint32_t(&a1)[4] = F[1];
                gemm::e4m3x4_to_f16x2x2(raw[0], a0[0], a0[2]);
                gemm::e4m3x4_to_f16x2x2(raw[1], a0[1], a0[3]);
                gemm::e4m3x4_to_f16x2x2(raw[2], a1[0], a1[2]);
                gemm::e4m3x4_to_f16x2x2(raw[3], a1[1], a1[3]);
                fence_regs(P);
                fence_regs_u32(a0);
                fence_regs_u32(a1);
                wgmma_fence();
                // block q's 32 K elements: 64 bytes into its B half (q / 2 with kWideK)
                const uint32_t b_q = b_k + (q >> 1) * (C::kBN * kRowBytes) + (q & 1) * 64;
                wgmma_m64n128k16_f16_rs(P, a0, desc_k128(b_q), 0u);
                wgmma_m64n128k16_f16_rs(P, a1, desc_k128(b_q + 32), 1u);
            } else {
                fence_regs(P);
                wgmma_fence();
                wgmma_m64n128k32_e4m3(P, desc_k128(a_k + q * 32), desc_k128(b_k + q * 32), 0u);
            }
            wgmma_commit();
        };
        // block g's stage's first byte in its scale words, and g's scales
        auto q0_of = [&](int g) { return (C::kKb * (g / C::kKb)) & 3; };
        auto scales_of = [&](int g) {
            return block_scales<C>(stage_of(g), q0_of(g) + g % C::kKb, q0_of(g), r0);
        };
        auto finish = [&](float(&P)[64], uint32_t(&F)[2][4], int g, const BlockScales& sc) {
            fence_regs(P);
            if constexpr (C::kWiden) {
                fence_regs_u32(F[0]);
                fence_regs_u32(F[1]);
            }
            const int i = g / C::kKb, q = g % C::kKb;
            promote<C>(acc, P, sc, stage_of(g), q0_of(g) + q, q0_of(g), r0, n0, lane);
            if (q == C::kKb - 1 || g == KB - 1) mbar_arrive(bars.empty(i % C::kStages));
        };
        // Runs of kRun blocks: block u + 1's wgmma is issued before the wait for block u, so that each
        // block's promotion overlaps the next one's wgmma; only a run's last promotion waits with no
        // partial of this warpgroup in flight. (No wgmma stays in flight across the loop's back edge:
        // ptxas then serializes every wgmma, its C7514 advisory, checked by check_sm90_ptxas.sh.) The
        // buffers alternate PA (even blocks of a run) / PB (odd ones). Runs of 4 took the fp16-weight
        // kernels (light promotions: the converters' products) from 355 to 373 TFLOP/s (wq_a) and
        // cost the converter-bound ones 1-2% (docs/PERFORMANCE.md, eighth session): pairs there. The
        // prepared fp16 experts (no B converters) take runs of 4; they measured the same as pairs
        // (242.1 vs 241.9 TFLOP/s, ninth session): their limit is the producers' feed.
        constexpr int kRun = C::kProducts || C::kPreFolded ? 4 : 2;
        auto run = [&](int g, auto n_const) {
            constexpr int n = decltype(n_const)::value;
            issue(PA, FA, g);
#pragma unroll
            for (int u = 0; u < n; ++u) {
                if (u + 1 < n) {
                    if (u % 2 == 0)
                        issue(PB, FB, g + u + 1);
                    else
                        issue(PA, FA, g + u + 1);
                    wgmma_wait<1>();
                } else {
                    wgmma_wait<0>();
                }
                // the block's scales after its wait: read before it (while the registers of two
                // partials and the A fragments are live), they spill
                const BlockScales sc = scales_of(g + u);
                if (u % 2 == 0)
                    finish(PA, FA, g + u, sc);
                else
                    finish(PB, FB, g + u, sc);
            }
        };
        int g = 0;
        for (; g + kRun <= KB; g += kRun) run(g, std::integral_constant<int, kRun>{});
        for (; g + 2 <= KB; g += 2) run(g, std::integral_constant<int, 2>{});
        if (g < KB) run(g, std::integral_constant<int, 1>{});
    } else {
        for (int i = 0; i < n_stages; ++i) {
            const int s = i % C::kStages;
            mbar_wait(bars.loaded(s), (i / C::kStages) & 1);
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
    } else {
        regs_inc<C::kConsumerRegs>();
        consume<C, kOutF32>(j, base, bars, n_stages, tid / 128, tid % 128);
    }
}

#endif  // DS4R_SM90A_DEVICE

}  // namespace

}  // namespace ds4r::kern
