// Tensor-core GEMM kernels: plain / grouped-by-z problems and the routed experts' grouped GEMM, all
// built on gemm_tile (gemm_tile.cuh). Launch wrappers validate what the kernels assume.
//
// Tile shapes: 256 x 128 (8 warps) when a problem has more than 128 rows, else 128 x 128 (4 warps,
// two CTAs per SM); the experts' grouped GEMM uses 128 x 128 (the routing plan's 128-row tiles). The
// choice depends on M but no result does: every output element's instruction sequence is the same in
// both (gemm_tile.cuh NUMERICS; tests/cuda/cuda_gemm_paths_test.cpp checks it bitwise against the
// reference kernels of tests/cuda/testkit/gemm_oracle.cu).
#include "gemm.cuh"
#include "gemm_tile.cuh"

namespace ds4r::kern {

namespace {

using gemm::AKind;
using gemm::BKind;
using gemm::Cfg;
using gemm::TileJob;

// Shared memory (bytes): Bf16Big 98304, Fp8Big 79904, Fp4Big 70656 (one CTA of 8 warps per SM);
// Bf16Small 49152, Fp8Small 42112, Fp4Small 43008 (two CTAs of 4 warps per SM, also on sm_86's
// 100 KB). Registers: <= 255 per thread (1 x 256 or 2 x 128 threads per SM).
template <bool kF32>
using Bf16Big = Cfg<AKind::BF16, BKind::BF16, kF32, 256, 128, 4>;
template <bool kF32>
using Bf16Small = Cfg<AKind::BF16, BKind::BF16, kF32, 128, 128, 3>;
using Fp8Big = Cfg<AKind::E4M3, BKind::E4M3, false, 256, 128, 5>;
using Fp8Small = Cfg<AKind::E4M3, BKind::E4M3, false, 128, 128, 3>;
using Fp4Big = Cfg<AKind::E4M3, BKind::E2M1, false, 256, 128, 5>;
using Fp4Small = Cfg<AKind::E4M3, BKind::E2M1, false, 128, 128, 4>;
static_assert(Bf16Small<false>::kSmemBytes <= 49 * 1024 && Fp8Small::kSmemBytes <= 49 * 1024 &&
                  Fp4Small::kSmemBytes <= 49 * 1024,
              "two 128 x 128 CTAs per SM on sm_86 (100 KB of shared memory, 1 KB reserved per CTA)");
using Fp4Grouped = Fp4Small;
static_assert(Fp4Grouped::kBM == 128, "the MoE routing plan (moe.cuh) lists 128-row tiles");

constexpr int kSmallM = 128;  // problems with at most this many rows use the 128 x 128 tiles
constexpr int kGroupM = 8;    // tile raster: 8 M tiles sweep the N tiles together (L2 reuse of B)

// One problem (or `groups` same-shape problems along grid.z). Pitches / strides in bytes.
struct GemmParams {
    const uint8_t* a;  // A [M, K]
    int64_t a_pitch, a_zstride;
    const uint8_t* sa;  // block-scaled: A scales [M, K / 32]
    int64_t sa_pitch;
    const uint8_t* b;  // W [N, K]
    int64_t b_pitch, b_zstride;
    const uint8_t* sb;  // block-scaled: W scales
    int64_t sb_pitch;
    uint8_t* c;  // C [M, N]
    int64_t c_pitch, c_zstride;
    int M, N, K;
    int tiles_m, tiles_n;
};

template <class C>
constexpr int min_blocks() {
    return C::kThreads <= 128 ? 2 : 1;
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, min_blocks<C>())
    gemm_kernel(const __grid_constant__ GemmParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    // grouped raster: consecutive blocks walk kGroupM M tiles, then the next N tile
    const int pid = static_cast<int>(blockIdx.x);
    const int per_group = kGroupM * p.tiles_n;
    const int first_m = (pid / per_group) * kGroupM;
    const int size_m = min(p.tiles_m - first_m, kGroupM);
    const int in_group = pid % per_group;
    const int m0 = (first_m + in_group % size_m) * C::kBM;
    const int n0 = (in_group / size_m) * C::kBN;
    const int64_t z = blockIdx.z;
    TileJob j;
    j.a = p.a + z * p.a_zstride + static_cast<int64_t>(m0) * p.a_pitch;
    j.a_rows = nullptr;
    j.a_pitch = p.a_pitch;
    j.sa = p.sa ? p.sa + static_cast<int64_t>(m0) * p.sa_pitch : nullptr;
    j.sa_pitch = p.sa_pitch;
    j.b = p.b + z * p.b_zstride + static_cast<int64_t>(n0) * p.b_pitch;
    j.b_pitch = p.b_pitch;
    j.sb = p.sb;
    j.sb_pitch = p.sb_pitch;
    j.n0 = n0;
    j.c = p.c + z * p.c_zstride + static_cast<int64_t>(m0) * p.c_pitch +
          static_cast<int64_t>(n0) * (C::kOutF32 ? 4 : 2);
    j.c_pitch = p.c_pitch;
    j.m_valid = min(C::kBM, p.M - m0);
    j.n_valid = min(C::kBN, p.N - n0);
    j.k = p.K;
    gemm::gemm_tile<C>(j, smem);
}

// The routed experts' grouped GEMM; blockIdx.x: N tile, blockIdx.y: tile of the schedule (relative to
// the batch's first), blockIdx.z: projection.
struct GroupedParams {
    const uint8_t* q;
    const uint8_t* sa;
    const int32_t* a_rows;
    const int32_t* tile_expert;
    const int32_t* tile_start;
    const int32_t* tile_begin;
    const int32_t* expert_end;
    int64_t a_pitch, sa_pitch, b_pitch, sb_pitch, c_pitch;  // bytes
    int N, K;
    int e_begin, e_end;  // experts of this launch
    const uint8_t* w[2][kMaxGroupedExperts];
    const uint8_t* s[2][kMaxGroupedExperts];
    uint8_t* y[2];
};

__global__ void __launch_bounds__(Fp4Grouped::kThreads, min_blocks<Fp4Grouped>())
    grouped_fp4_kernel(const __grid_constant__ GroupedParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int64_t t = static_cast<int64_t>(p.tile_begin[p.e_begin]) + blockIdx.y;
    if (t >= p.tile_begin[p.e_end]) return;  // the grid is an upper bound on the tile count
    const int e = p.tile_expert[t];
    const int start = p.tile_start[t];
    const int end = p.expert_end[e];
    const int z = blockIdx.z;
    const int n0 = blockIdx.x * Fp4Grouped::kBN;
    TileJob j;
    if (p.a_rows) {
        j.a = p.q;
        j.a_rows = p.a_rows + start;
        j.sa = p.sa;
    } else {
        j.a = p.q + static_cast<int64_t>(start) * p.a_pitch;
        j.a_rows = nullptr;
        j.sa = p.sa + static_cast<int64_t>(start) * p.sa_pitch;
    }
    j.a_pitch = p.a_pitch;
    j.sa_pitch = p.sa_pitch;
    j.b = p.w[z][e - p.e_begin] + static_cast<int64_t>(n0) * p.b_pitch;
    j.b_pitch = p.b_pitch;
    j.sb = p.s[z][e - p.e_begin];
    j.sb_pitch = p.sb_pitch;
    j.n0 = n0;
    j.c = p.y[z] + static_cast<int64_t>(start) * p.c_pitch + static_cast<int64_t>(n0) * 2;
    j.c_pitch = p.c_pitch;
    j.m_valid = min(Fp4Grouped::kBM, end - start);
    j.n_valid = min(Fp4Grouped::kBN, p.N - n0);
    j.k = p.K;
    gemm::gemm_tile<Fp4Grouped>(j, smem);
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Kernel attributes, set once per kernel (thread-safe static initialization): the dynamic shared
// memory beyond 48 KB, and the largest shared-memory carveout (the kernels bypass L1 for their
// operands; sm_86 fits two 128 x 128 CTAs only in its 100 KB configuration).
template <class C, class Kernel>
cudaError_t set_kernel_attributes(Kernel kernel) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         static_cast<int>(cudaSharedmemCarveoutMaxShared));
    if (e == cudaSuccess && C::kSmemBytes > 48 * 1024)
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    return e;
}

// (One kernel per (C, Params) pair: gemm_kernel<C> / grouped_fp4_kernel, so the static is per kernel.)
template <class C, class Kernel, class Params>
cudaError_t launch_tiles(Kernel kernel, const Params& p, dim3 grid, cudaStream_t stream) {
    static const cudaError_t attributes = set_kernel_attributes<C>(kernel);
    if (attributes != cudaSuccess) return attributes;
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
    return cudaGetLastError();
}

template <class C>
cudaError_t launch_plain(GemmParams p, int64_t M, int64_t N, int64_t groups, cudaStream_t stream) {
    if (M == 0 || N == 0 || groups == 0) return cudaSuccess;
    const int64_t gn = (N + C::kBN - 1) / C::kBN, gm = (M + C::kBM - 1) / C::kBM;
    if (gn * gm > 0x7fffffffLL || groups > 65535 || M > 0x7fffffffLL || N > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    p.tiles_m = static_cast<int>(gm);
    p.tiles_n = static_cast<int>(gn);
    return launch_tiles<C>(gemm_kernel<C>, p,
                           dim3(static_cast<unsigned>(gm * gn), 1, static_cast<unsigned>(groups)), stream);
}

// The tile shape for M rows (see the file comment).
template <class Big, class Small>
cudaError_t launch_by_rows(const GemmParams& p, int64_t M, int64_t N, int64_t groups, cudaStream_t stream) {
    if (M > kSmallM) return launch_plain<Big>(p, M, N, groups, stream);
    return launch_plain<Small>(p, M, N, groups, stream);
}

}  // namespace

bool gemm_bf16_supported(const void* x, int64_t lda, int64_t x_goff, const void* w, int64_t ldw,
                         int64_t w_goff, int64_t K) {
    return K % 8 == 0 && lda % 8 == 0 && ldw % 8 == 0 && x_goff % 8 == 0 && w_goff % 8 == 0 && aligned16(x) &&
           aligned16(w) && K <= 0x7fffffffLL;
}

cudaError_t launch_gemm_bf16(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w, int64_t ldw,
                             int64_t w_goff, void* y, bool y_f32, int64_t ldc, int64_t y_goff, int64_t M,
                             int64_t N, int64_t K, int64_t groups, cudaStream_t stream) {
    if (!gemm_bf16_supported(x, lda, x_goff, w, ldw, w_goff, K)) return cudaErrorInvalidValue;
    const int64_t yb = y_f32 ? 4 : 2;
    GemmParams p{};
    p.a = reinterpret_cast<const uint8_t*>(x);
    p.a_pitch = lda * 2;
    p.a_zstride = x_goff * 2;
    p.b = reinterpret_cast<const uint8_t*>(w);
    p.b_pitch = ldw * 2;
    p.b_zstride = w_goff * 2;
    p.c = static_cast<uint8_t*>(y);
    p.c_pitch = ldc * yb;
    p.c_zstride = y_goff * yb;
    p.M = static_cast<int>(M);
    p.N = static_cast<int>(N);
    p.K = static_cast<int>(K);
    if (y_f32) return launch_by_rows<Bf16Big<true>, Bf16Small<true>>(p, M, N, groups, stream);
    return launch_by_rows<Bf16Big<false>, Bf16Small<false>>(p, M, N, groups, stream);
}

namespace {
template <BKind kB>
cudaError_t launch_scaled(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                          uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    if (K % 32 != 0 || K > 0x7fffffffLL || !aligned16(q) || !aligned16(w)) return cudaErrorInvalidValue;
    const int64_t KB = K / 32;
    GemmParams p{};
    p.a = q;
    p.a_pitch = K;
    p.sa = sa;
    p.sa_pitch = KB;
    p.b = w;
    p.b_pitch = kB == BKind::E2M1 ? K / 2 : K;
    p.sb = sw;
    p.sb_pitch = KB;
    p.c = reinterpret_cast<uint8_t*>(y);
    p.c_pitch = ldc * 2;
    p.M = static_cast<int>(M);
    p.N = static_cast<int>(N);
    p.K = static_cast<int>(K);
    if constexpr (kB == BKind::E4M3) return launch_by_rows<Fp8Big, Fp8Small>(p, M, N, 1, stream);
    return launch_by_rows<Fp4Big, Fp4Small>(p, M, N, 1, stream);
}
}  // namespace

cudaError_t launch_gemm_fp8(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                            uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    return launch_scaled<BKind::E4M3>(q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_gemm_fp4(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                            uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    return launch_scaled<BKind::E2M1>(q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_grouped_gemm_fp4(const GroupedFp4Gemm& g, cudaStream_t stream) {
    if (g.K % 32 != 0 || g.K > 0x7fffffffLL || g.N > 0x7fffffffLL || g.n_proj < 1 || g.n_proj > 2 ||
        !aligned16(g.q) || g.n_experts < 0 || g.w_e5m2 || g.w_f16)  // prepared weights: the Hopper kernels only
        return cudaErrorInvalidValue;
    if (g.n_experts == 0 || g.max_tiles <= 0 || g.N == 0) return cudaSuccess;
    constexpr int kBM = Fp4Grouped::kBM, kBN = Fp4Grouped::kBN;
    const int64_t gx = (g.N + kBN - 1) / kBN;
    const int64_t rows_tiles = (g.max_rows_per_expert + kBM - 1) / kBM;
    for (int e0 = 0; e0 < g.n_experts; e0 += kMaxGroupedExperts) {
        const int e1 = g.n_experts - e0 < kMaxGroupedExperts ? g.n_experts : e0 + kMaxGroupedExperts;
        GroupedParams p{};
        p.q = g.q;
        p.sa = g.sa;
        p.a_rows = g.a_rows;
        p.tile_expert = g.tile_expert;
        p.tile_start = g.tile_start;
        p.tile_begin = g.tile_begin;
        p.expert_end = g.expert_end;
        p.a_pitch = g.K;
        p.sa_pitch = g.K / 32;
        p.b_pitch = g.K / 2;
        p.sb_pitch = g.K / 32;
        p.c_pitch = g.N * 2;
        p.N = static_cast<int>(g.N);
        p.K = static_cast<int>(g.K);
        p.e_begin = e0;
        p.e_end = e1;
        for (int z = 0; z < g.n_proj; ++z) {
            for (int e = e0; e < e1; ++e) {
                p.w[z][e - e0] = g.w[z][e];
                p.s[z][e - e0] = g.s[z][e];
                if (!aligned16(g.w[z][e])) return cudaErrorInvalidValue;
            }
            p.y[z] = reinterpret_cast<uint8_t*>(g.y[z]);
        }
        // tiles of this batch <= min(all tiles, experts x tiles of one expert)
        const int64_t batch_bound = static_cast<int64_t>(e1 - e0) * rows_tiles;
        const int64_t gy = g.max_tiles < batch_bound ? g.max_tiles : batch_bound;
        if (gy <= 0) continue;
        if (gy > 65535 || gx > 0x7fffffffLL) return cudaErrorInvalidValue;
        const cudaError_t err = launch_tiles<Fp4Grouped>(
            grouped_fp4_kernel, p,
            dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(g.n_proj)),
            stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

}  // namespace ds4r::kern
