// The device side of the Hopper (sm_90a) wgmma GEMMs (kernels/hopper/gemm_sm90.cu: the kernels and
// their launchers, the only file that includes them), in three headers: this one, the tile
// configurations and a stage's shared-memory layout (Cfg, Job, Bars, shared-memory helpers);
// gemm_sm90_producers.cuh, the producer roles (TMA / cp.async loaders, converters); gemm_sm90_tile.cuh,
// the consumer roles and one output tile's kernel body (tile). The block-scaled fp8 /
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
    static_assert(
        !kWideK || ((kOp_ == Op::Fp8F16 || kOp_ == Op::Fp4F16) && kBM_ == 128),
        "128-wide K stages: fp16 weights, 128-row tiles (the 64-row ones' 256 B columns need 2 stages)");
    // output tile rows: 128 (consumer warpgroup g: rows 64 g .. 64 g + 63, all columns), or 64 with
    // 256 columns (both warpgroups the same 64 rows, warpgroup g columns 128 g .. 128 g + 127: the
    // grouped experts' tiles when experts hold few rows; each output's instruction sequence is the same)
    static constexpr int kBM = kBM_;
    static constexpr bool kSplitN = kBM == 64;
    static_assert(kBM == 128 || (kSplitN && kBN_ == 256 &&
                                 (kOp_ == Op::Fp4 || kOp_ == Op::Fp4E5m2 || kOp_ == Op::Fp4F16)),
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
    static constexpr int kKb = kKs / 32;  // 32-wide K blocks per stage
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
    // fp4: the converter's f32 scales [4][128] (sa by row in saf_slot order, sw by column) and its
    // window flags [2]
    static constexpr bool kScaleF = kOp == Op::Fp4 || kOp == Op::Fp4E5m2 || kOp == Op::Fp4F16;
    static constexpr int kSaF = kSw + (kQuant ? 4 * kBN : 0);
    static constexpr int kSwF = kSaF + (kScaleF ? 4 * 4 * kBM : 0);
    static_assert(kSaF % 8 == 0, "saf: 8-byte loads of a thread's two rows");
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

// fp4: the slot of tile row r in a K block's row scales (saf): rows r and r + 8 of each 16-row group side
// by side, so that a consumer thread reads its two rows' (r0, r0 + 8) in one 8-byte load.
__host__ __device__ constexpr int saf_slot(int r) {
    return (r & ~15) | ((r & 7) << 1) | ((r >> 3) & 1);
}
constexpr bool saf_slots_pair_rows() {  // a permutation of a tile's 128 rows, r + 8 right after r
    for (int r = 0; r < 128; ++r) {
        if (saf_slot(r) < 0 || saf_slot(r) >= 128 || ((r & 8) == 0 && saf_slot(r + 8) != saf_slot(r) + 1))
            return false;
        for (int o = 0; o < r; ++o)
            if (saf_slot(o) == saf_slot(r)) return false;
    }
    return true;
}
static_assert(saf_slots_pair_rows(), "saf_slot");

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
// The tests above on a scale word's four bytes at once: non-zero where some byte b has b - lo > span
// (byte-wise subtract and compare; 4-block stages test whole words).
__device__ __forceinline__ uint32_t bytes_outside(uint32_t w, uint32_t lo, uint32_t span) {
    constexpr uint32_t kOnes = 0x01010101u;
    return __vcmpgtu4(__vsub4(w, lo * kOnes), span * kOnes);
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

#endif  // DS4R_SM90A_DEVICE

}  // namespace

}  // namespace ds4r::kern
