// Hopper (sm_90a) GEMMs on wgmma: the kernels and their launchers (tensor maps, tile configurations,
// grid shapes) for the block-scaled fp8 / fp4 linears, the routed experts' grouped fp4 GEMM and the
// bf16 GEMMs (declarations in kernels/gemm_sm90.cuh; structure and numerics: gemm_sm90_stage.cuh;
// the device roles: gemm_sm90_producers.cuh, gemm_sm90_tile.cuh).
// Compiled for sm_90a only.
#include <cuda.h>  // CUtensorMap (cuTensorMapEncodeTiled through the runtime's driver entry point)

#include <algorithm>

#include "gemm_sm90_tile.cuh"

namespace ds4r::kern {

namespace {

// ------------------------------------------------------------------ kernels

template <class C, bool kOutF32>
__global__ void __launch_bounds__(kThreads, 1) dense_kernel(const __grid_constant__ GemmParams p) {
#if defined(DS4R_SM90A_DEVICE)
    extern __shared__ __align__(1024) uint8_t smem[];
    Job j;
    constexpr int kOutBytes = kOutF32 ? 4 : 2;
    dense_tile_job<C::kBM, C::kBN, kOutBytes>(p, j);
    j.c_pairs = p.c_pairs;
    j.scale_words = p.scale_words;
    tile<C, kOutF32>(j, smem);
#endif
}

// The tensor maps of a TMA launch (A, B: [groups][rows][K elements or bytes], boxes of one stage).
struct TmaMaps {
    CUtensorMap a, b;
};

template <class C, bool kOutF32>
__global__ void __launch_bounds__(kThreads, 1)
    dense_tma_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ TmaMaps maps) {
#if defined(DS4R_SM90A_DEVICE)
    extern __shared__ __align__(1024) uint8_t smem[];
    Job j;
    constexpr int kOutBytes = kOutF32 ? 4 : 2;
    j.m0 = dense_tile_job<C::kBM, C::kBN, kOutBytes>(p, j);
    j.z = static_cast<int>(blockIdx.z);
    j.tma_a = &maps.a;
    j.tma_b = &maps.b;
    j.c_pairs = p.c_pairs;
    j.scale_words = p.scale_words;
    tile<C, kOutF32>(j, smem);
#endif
}

// The routed experts' grouped GEMM (gemm_params.cuh).
template <class C>
__global__ void __launch_bounds__(kThreads, 1) grouped_kernel(const __grid_constant__ GroupedParams p) {
#if defined(DS4R_SM90A_DEVICE)
    extern __shared__ __align__(1024) uint8_t smem[];
    Job j;
    if (!grouped_tile_job<C::kBM, C::kBN>(p, j)) return;
    j.c_pairs = p.c_pairs;
    j.scale_words = p.scale_words;
    tile<C, false>(j, smem);
#endif
}

// The prepared fp16 experts' weights of each projection: [experts][N][K] fp16, one map per projection
// (boxes of one stage: kKs elements x kBN rows, 128-byte swizzle; z = the expert); with C::kTma also the
// activation codes in pair order, [pairs][K] bytes (boxes of kABytes x kBM rows, 64-byte swizzle: the
// widened raw A rows).
struct ExpertMaps {
    CUtensorMap b[2];
    CUtensorMap a;
};

// The routed experts' grouped GEMM on prepared fp16 experts (Cfg::kTmaB): B by TMA at (K, the tile's
// first column, the tile's expert); A by TMA at (K, the tile's first pair) where the rows lie in pair
// order (C::kTma: GroupedParams::a_rows null), else gathered by the loaders.
template <class C>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_tma_kernel(const __grid_constant__ GroupedParams p, const __grid_constant__ ExpertMaps maps) {
#if defined(DS4R_SM90A_DEVICE)
    extern __shared__ __align__(1024) uint8_t smem[];
    Job j;
    int expert = 0, first = 0;
    if (!grouped_tile_job<C::kBM, C::kBN>(p, j, &expert, &first)) return;
    j.c_pairs = p.c_pairs;
    j.scale_words = p.scale_words;
    j.tma_a = C::kTma ? &maps.a : nullptr;
    j.tma_b = &maps.b[blockIdx.z];
    j.m0 = first;
    j.z = expert;
    tile<C, false>(j, smem);
#endif
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One instantiation (and one static attribute call) per kernel.
template <class C, auto kKernel, class... Args>
cudaError_t launch(dim3 grid, cudaStream_t stream, const Args&... args) {
    static const cudaError_t attributes =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kBytes);
    if (attributes != cudaSuccess) return attributes;
    kKernel<<<grid, kThreads, C::kBytes, stream>>>(args...);
    return cudaGetLastError();
}

// cuTensorMapEncodeTiled, from the driver through the runtime (no libcuda link); null where the
// driver lacks it.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                   CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                   CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
    static const EncodeTiledFn fn = [] {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();  // not sticky: clear it for the launches that follow
            return static_cast<EncodeTiledFn>(nullptr);
        }
        return reinterpret_cast<EncodeTiledFn>(f);
    }();
    return fn;
}

// One operand's tensor map: [groups][rows][k] elements of 2 bytes (elem16: bf16 or fp16; the copies
// move bits, zero-filling past the tensor) or bytes, pitch and zstride in bytes; boxes of box_k elements
// x box_rows rows with the given swizzle. False where TMA cannot describe it (alignment, strides, sizes):
// the caller then takes the cp.async loaders.
bool operand_map(CUtensorMap* map, bool elem16, const uint8_t* base, int64_t k, int64_t rows, int64_t pitch,
                 int64_t zstride, int64_t groups, int box_k, int box_rows, CUtensorMapSwizzle swizzle) {
    const EncodeTiledFn encode = encode_tiled();
    if (encode == nullptr || k <= 0 || rows <= 0 || groups <= 0 || !aligned16(base) || pitch <= 0 ||
        pitch % 16 != 0 || (groups > 1 && (zstride <= 0 || zstride % 16 != 0)))
        return false;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows),
                                static_cast<cuuint64_t>(groups)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(pitch),
                                   static_cast<cuuint64_t>(groups > 1 ? zstride : pitch)};
    const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_k), static_cast<cuuint32_t>(box_rows), 1};
    const cuuint32_t steps[3] = {1, 1, 1};
    return encode(map, elem16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3,
                  const_cast<uint8_t*>(base), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The swizzle of the widened raw A rows (raw_a_swizzle: 64-byte rows, or 128-byte rows with kWideK).
template <class C>
constexpr CUtensorMapSwizzle raw_a_map_swizzle() {
    return C::kRawA == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
}

// The A and B maps of a Cfg::kTma kernel C for problem p (M x N, K elements, `groups` along z), with the
// layouts its stages hold (Cfg: swizzled MMA tiles, widened raw A rows, converters' raw B rows).
template <class C>
bool operand_maps(TmaMaps* maps, const GemmParams& p, int64_t M, int64_t N, int64_t K, int64_t groups) {
    constexpr bool kBf16 = C::kOp == Op::Bf16;
    // dimension 0: K elements (bf16, fp16 weights) or bytes (codes; fp4 weights: two per byte)
    const int64_t a_k = K, b_k = C::kOp == Op::Fp4 ? K / 2 : K;
    const CUtensorMapSwizzle sa = C::kWiden ? raw_a_map_swizzle<C>() : CU_TENSOR_MAP_SWIZZLE_128B;
    const CUtensorMapSwizzle sb = C::kConvertB ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B;
    // 16-bit B: boxes of one 128-byte half (tma_stage loads kBHalves of them per stage)
    const int box_a = kBf16 ? C::kKs : C::kABytes, box_b = C::kB16 ? C::kKs / C::kBHalves : C::kBBytes;
    return operand_map(&maps->a, kBf16, p.a, a_k, M, p.a_pitch, p.a_zstride, groups, box_a, C::kBM, sa) &&
           operand_map(&maps->b, C::kB16, p.b, b_k, N, p.b_pitch, p.b_zstride, groups, box_b, C::kBN, sb);
}

// extra: the TmaMaps of a Cfg::kTma kernel.
template <class C, bool kOutF32, class... Extra>
cudaError_t launch_dense(GemmParams p, int64_t M, int64_t N, int64_t groups, cudaStream_t stream,
                         const Extra&... extra) {
    if (M == 0 || N == 0 || groups == 0) return cudaSuccess;
    const int64_t gn = (N + C::kBN - 1) / C::kBN, gm = (M + C::kBM - 1) / C::kBM;
    if (gn * gm > 0x7fffffffLL || groups > 65535 || M > 0x7fffffffLL || N > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    p.tiles_m = static_cast<int>(gm);
    p.tiles_n = static_cast<int>(gn);
    p.M = static_cast<int>(M);
    p.N = static_cast<int>(N);
    const dim3 grid(static_cast<unsigned>(gm * gn), 1, static_cast<unsigned>(groups));
    if constexpr (C::kTma)
        return launch<C, dense_tma_kernel<C, kOutF32>>(grid, stream, p, extra...);
    else
        return launch<C, dense_kernel<C, kOutF32>>(grid, stream, p);
}

// A plain problem on tile C: TMA loads (tile CT, C::WithTma unless given) where the operands allow tensor
// maps (Auto; Tma: else cudaErrorNotSupported), else C's cp.async loaders. The same wgmma sequence either
// way (bit-identical outputs).
template <class C, bool kOutF32, class CT = typename C::WithTma>
cudaError_t launch_plain(Sm90Loads loads, const GemmParams& p, int64_t M, int64_t N, int64_t K,
                         int64_t groups, cudaStream_t stream) {
    if (M == 0 || N == 0 || groups == 0) return cudaSuccess;
    if (loads == Sm90Loads::TmaWideK) loads = Sm90Loads::Tma;  // (the fp16-weight GEMMs' choice alone)
    if (loads != Sm90Loads::CpAsync) {
        TmaMaps maps{};
        if (operand_maps<CT>(&maps, p, M, N, K, groups))
            return launch_dense<CT, kOutF32>(p, M, N, groups, stream, maps);
        if (loads == Sm90Loads::Tma) return cudaErrorNotSupported;
    }
    return launch_dense<C, kOutF32>(p, M, N, groups, stream);
}

// A block-scaled linear.
template <Op kOp, bool kWiden>
cudaError_t launch_scaled(Sm90Loads loads, const uint8_t* q, const uint8_t* sa, const uint8_t* w,
                          const uint8_t* sw, uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                          cudaStream_t stream) {
    if (K % 32 != 0 || K > 0x7fffffffLL || !aligned16(q) || !aligned16(w)) return cudaErrorInvalidValue;
    const GemmParams p = scaled_params(q, sa, w, sw, kOp == Op::Fp4, y, ldc, M, N, K);
    return launch_plain<Cfg<kOp, kWiden>, false>(loads, p, M, N, K, 1, stream);
}

// A block-scaled fp8 linear with its weights widened to fp16 beforehand (w16 [N, K] fp16 bits; sw the
// fp8 weights' scales): Op::Fp8F16, widened partials.
cudaError_t launch_scaled_f16w(Sm90Loads loads, const uint8_t* q, const uint8_t* sa, const uint16_t* w16,
                               const uint8_t* sw, uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                               cudaStream_t stream) {
    if (K % 32 != 0 || K > 0x7fffffffLL || !aligned16(q) || !aligned16(w16)) return cudaErrorInvalidValue;
    GemmParams p = scaled_params(q, sa, reinterpret_cast<const uint8_t*>(w16), sw, false, y, ldc, M, N, K);
    p.b_pitch = 2 * K;  // fp16 rows
    // TMA in 128-wide K stages (Auto, TmaWideK: the faster stages, docs/PERFORMANCE.md, twelfth
    // session) or 64-wide ones (Tma); the loaders in 64-wide stages (CpAsync, and Auto where TMA cannot
    // describe the operands: the two widths' tensor maps need the same alignments)
    using Narrow = Cfg<Op::Fp8F16, true>;
    if (loads == Sm90Loads::Tma || loads == Sm90Loads::CpAsync)
        return launch_plain<Narrow, false>(loads, p, M, N, K, 1, stream);
    return launch_plain<Narrow, false, Cfg<Op::Fp8F16, true, 128, 128, true, true>>(loads, p, M, N, K, 1,
                                                                                    stream);
}

// The tensor maps of g's prepared fp16 experts for tile C (GroupedFp4Gemm::w_f16); false where the
// experts of a projection do not lie at one stride or TMA cannot describe them.
template <class C>
bool expert_maps(ExpertMaps* maps, const GroupedFp4Gemm& g) {
    if (g.n_experts <= 0) return false;
    for (int z = 0; z < g.n_proj; ++z) {
        const uint8_t* const* w = g.w[z];
        const int64_t stride = g.n_experts > 1 ? w[1] - w[0] : 2 * g.N * g.K;
        if (stride < 2 * g.N * g.K) return false;  // overlapping experts
        for (int e = 2; e < g.n_experts; ++e)
            if (w[e] - w[0] != e * stride) return false;
        if (!operand_map(&maps->b[z], true, w[0], g.K, g.N, 2 * g.K, stride, g.n_experts,
                         C::kKs / C::kBHalves, C::kBN, CU_TENSOR_MAP_SWIZZLE_128B))
            return false;
    }
    return true;
}

// The prepared fp16 experts' A map for tile C (ExpertMaps::a): the activation codes in pair order,
// [g.pairs][K] bytes; false where the rows are gathered (a_rows), their count is unknown or TMA cannot
// describe them (the loaders then gather them).
template <class C>
bool pair_rows_map(CUtensorMap* map, const GroupedFp4Gemm& g) {
    return g.a_rows == nullptr && g.pairs > 0 &&
           operand_map(map, false, g.q, g.K, g.pairs, g.K, 0, 1, C::kABytes, C::kBM, raw_a_map_swizzle<C>());
}

// kBM: 128 (the routing plan's tiles) or 64 (two blocks per plan tile: grid.y doubled). kOp: Fp4,
// Fp4E5m2 (g.w_e5m2) or Fp4F16 (g.w_f16: B by TMA, cudaErrorNotSupported where expert_maps fails; A by
// TMA too where its rows lie in pair order, pair_rows_map); the last two widened partials only.
// kWideK: stages of 128 K elements (Fp4F16 on 128-row tiles; Cfg::kWideK).
template <Op kOp, bool kWiden, int kBM, bool kWideK = false>
cudaError_t launch_grouped(const GroupedFp4Gemm& g, cudaStream_t stream) {
    using C = Cfg<kOp, kWiden, kBM == 64 ? 256 : 128, kBM, false, kWideK>;
    using CT = typename C::WithTma;
    ExpertMaps maps{};
    bool tma_a = false;
    if constexpr (C::kPreFolded) {
        if (g.K % 32 != 0 || g.n_proj < 1 || g.n_proj > 2) return cudaErrorInvalidValue;
        if (g.n_experts > 0 && g.max_tiles > 0 && g.N > 0) {
            if (!expert_maps<C>(&maps, g)) return cudaErrorNotSupported;
            tma_a = pair_rows_map<CT>(&maps.a, g);
        }
    }
    return for_each_grouped_batch(g, 128, C::kBN, [&](int e0, int e1, dim3 grid) {
        grid.y *= 128 / kBM;
        if (grid.y > 65535u) return cudaErrorInvalidValue;
        if constexpr (C::kPreFolded) {
            if (tma_a)
                return launch<CT, grouped_tma_kernel<CT>>(grid, stream, grouped_params(g, e0, e1), maps);
            return launch<C, grouped_tma_kernel<C>>(grid, stream, grouped_params(g, e0, e1), maps);
        } else {
            return launch<C, grouped_kernel<C>>(grid, stream, grouped_params(g, e0, e1));
        }
    });
}

// g with its tiles taken from list l
GroupedFp4Gemm with_tiles(const GroupedFp4Gemm& g, const GroupedTileList& l) {
    GroupedFp4Gemm h = g;
    h.tile_expert = l.tile_expert;
    h.tile_start = l.tile_start;
    h.tile_begin = l.tile_begin;
    h.max_tiles = l.max_tiles;
    return h;
}

template <Op kOp, bool kWiden>
cudaError_t launch_grouped_rows(Sm90GroupedRows rows, const GroupedFp4Gemm& g, cudaStream_t stream) {
    // the fp16 experts' 128-row tiles in 128-wide K stages (Rows128Narrow: the 64-wide ones, the baseline;
    // every other layout has 64-wide stages only)
    constexpr bool kWide128 = kOp == Op::Fp4F16;
    if (rows == Sm90GroupedRows::Rows128Narrow) return launch_grouped<kOp, kWiden, 128>(g, stream);
    const bool split = g.full.tile_begin != nullptr && g.tail.tile_begin != nullptr;
    if (rows == Sm90GroupedRows::Auto)
        rows = g.pairs > 0 && g.n_experts > 0 && g.pairs <= 64 * static_cast<int64_t>(g.n_experts)
                   ? Sm90GroupedRows::Rows64
                   : (split && sm90_grouped_auto_mixed(kOp == Op::Fp4F16) ? Sm90GroupedRows::Mixed
                                                                          : Sm90GroupedRows::Rows128);
    if (rows == Sm90GroupedRows::Mixed) {
        if (!split) return cudaErrorInvalidValue;
        const cudaError_t err = launch_grouped<kOp, kWiden, 128, kWide128>(with_tiles(g, g.full), stream);
        if (err != cudaSuccess) return err;
        GroupedFp4Gemm t = with_tiles(g, g.tail);
        t.max_rows_per_expert = std::min<int64_t>(g.max_rows_per_expert, 64);  // one tail tile per expert
        return launch_grouped<kOp, kWiden, 64>(t, stream);
    }
    if (rows == Sm90GroupedRows::Rows64) return launch_grouped<kOp, kWiden, 64>(g, stream);
    return launch_grouped<kOp, kWiden, 128, kWide128>(g, stream);
}

}  // namespace

bool sm90_gemm_usable(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
}

bool sm90_tensor_maps_usable() {
    return encode_tiled() != nullptr;
}

cudaError_t launch_gemm_bf16_sm90_loads(Sm90Loads loads, const uint16_t* x, int64_t lda, int64_t x_goff,
                                        const uint16_t* w, int64_t ldw, int64_t w_goff, void* y, bool y_f32,
                                        int64_t ldc, int64_t y_goff, int64_t M, int64_t N, int64_t K,
                                        int64_t groups, cudaStream_t stream) {
    if (!gemm_bf16_supported(x, lda, x_goff, w, ldw, w_goff, K)) return cudaErrorInvalidValue;
    const GemmParams p = bf16_params(x, lda, x_goff, w, ldw, w_goff, y, y_f32, ldc, y_goff, M, N, K);
    using C = Cfg<Op::Bf16, false, 256>;
    if (y_f32) return launch_plain<C, true>(loads, p, M, N, K, groups, stream);
    return launch_plain<C, false>(loads, p, M, N, K, groups, stream);
}

cudaError_t launch_gemm_bf16_sm90(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w,
                                  int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                                  int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                                  cudaStream_t stream) {
    return launch_gemm_bf16_sm90_loads(Sm90Loads::Auto, x, lda, x_goff, w, ldw, w_goff, y, y_f32, ldc, y_goff,
                                       M, N, K, groups, stream);
}

cudaError_t launch_gemm_fp8_sm90_partials(Sm90Partials partials, const uint8_t* q, const uint8_t* sa,
                                          const uint8_t* w, const uint8_t* sw, uint16_t* y, int64_t ldc,
                                          int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                                          Sm90Loads loads) {
    if (partials == Sm90Partials::Fp16Widened)
        return launch_scaled<Op::Fp8, true>(loads, q, sa, w, sw, y, ldc, M, N, K, stream);
    return launch_scaled<Op::Fp8, false>(loads, q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_gemm_fp8_sm90_f16w(const uint8_t* q, const uint8_t* sa, const uint16_t* w16,
                                      const uint8_t* sw, uint16_t* y, int64_t ldc, int64_t M, int64_t N,
                                      int64_t K, cudaStream_t stream, Sm90Loads loads) {
    return launch_scaled_f16w(loads, q, sa, w16, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_gemm_fp4_sm90_partials(Sm90Partials partials, const uint8_t* q, const uint8_t* sa,
                                          const uint8_t* w, const uint8_t* sw, uint16_t* y, int64_t ldc,
                                          int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                                          Sm90Loads loads) {
    if (partials == Sm90Partials::Fp16Widened)
        return launch_scaled<Op::Fp4, true>(loads, q, sa, w, sw, y, ldc, M, N, K, stream);
    return launch_scaled<Op::Fp4, false>(loads, q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_grouped_gemm_fp4_sm90_tiles(Sm90Partials partials, Sm90GroupedRows rows,
                                               const GroupedFp4Gemm& g, cudaStream_t stream) {
    if (g.w_e5m2 && g.w_f16) return cudaErrorInvalidValue;
    if (g.w_e5m2 || g.w_f16) {
        if (partials != Sm90Partials::Fp16Widened) return cudaErrorInvalidValue;
        if (g.w_f16) return launch_grouped_rows<Op::Fp4F16, true>(rows, g, stream);
        return launch_grouped_rows<Op::Fp4E5m2, true>(rows, g, stream);
    }
    if (partials == Sm90Partials::Fp16Widened) return launch_grouped_rows<Op::Fp4, true>(rows, g, stream);
    return launch_grouped_rows<Op::Fp4, false>(rows, g, stream);
}

cudaError_t launch_grouped_gemm_fp4_sm90_partials(Sm90Partials partials, const GroupedFp4Gemm& g,
                                                  cudaStream_t stream) {
    return launch_grouped_gemm_fp4_sm90_tiles(partials, Sm90GroupedRows::Auto, g, stream);
}

cudaError_t launch_gemm_fp8_sm90(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                 uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                 cudaStream_t stream) {
    return launch_gemm_fp8_sm90_partials(kSm90DefaultPartials, q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_gemm_fp4_sm90(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                 uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                 cudaStream_t stream) {
    return launch_gemm_fp4_sm90_partials(kSm90DefaultPartials, q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_grouped_gemm_fp4_sm90(const GroupedFp4Gemm& g, cudaStream_t stream) {
    return launch_grouped_gemm_fp4_sm90_partials(kSm90DefaultPartials, g, stream);
}

}  // namespace ds4r::kern
