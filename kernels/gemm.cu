// Tensor-core GEMM kernels: plain / grouped-by-z problems and the routed experts' grouped GEMM, all
// built on gemm_tile (gemm_tile.cuh). Launch wrappers validate what the kernels assume.
//
// Tile shapes: 256 x 128 (8 warps) when a problem has more than 128 rows, else 128 x 128 (4 warps,
// two CTAs per SM); the experts' grouped GEMM uses 128 x 128 (the routing plan's 128-row tiles). The
// choice depends on M but no result does: every output element's instruction sequence is the same in
// both (gemm_tile.cuh NUMERICS; tests/cuda/cuda_gemm_paths_test.cpp checks it bitwise against the
// reference kernels of tests/cuda/testkit/gemm_oracle.cu).
#include "gemm.cuh"
#include "gemm_params.cuh"
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

template <class C>
constexpr int min_blocks() {
    return C::kThreads <= 128 ? 2 : 1;
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, min_blocks<C>())
    gemm_kernel(const __grid_constant__ GemmParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    TileJob j;
    dense_tile_job<C::kBM, C::kBN, C::kOutF32 ? 4 : 2>(p, j);
    gemm::gemm_tile<C>(j, smem);
}

// The routed experts' grouped GEMM (gemm_params.cuh).
__global__ void __launch_bounds__(Fp4Grouped::kThreads, min_blocks<Fp4Grouped>())
    grouped_fp4_kernel(const __grid_constant__ GroupedParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    TileJob j;
    if (!grouped_tile_job<Fp4Grouped::kBM, Fp4Grouped::kBN>(p, j)) return;
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
    const GemmParams p = bf16_params(x, lda, x_goff, w, ldw, w_goff, y, y_f32, ldc, y_goff, M, N, K);
    if (y_f32) return launch_by_rows<Bf16Big<true>, Bf16Small<true>>(p, M, N, groups, stream);
    return launch_by_rows<Bf16Big<false>, Bf16Small<false>>(p, M, N, groups, stream);
}

namespace {
template <BKind kB>
cudaError_t launch_scaled(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                          uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    if (K % 32 != 0 || K > 0x7fffffffLL || !aligned16(q) || !aligned16(w)) return cudaErrorInvalidValue;
    const GemmParams p = scaled_params(q, sa, w, sw, kB == BKind::E2M1, y, ldc, M, N, K);
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
    return for_each_grouped_batch(g, Fp4Grouped::kBM, Fp4Grouped::kBN, [&](int e0, int e1, dim3 grid) {
        return launch_tiles<Fp4Grouped>(grouped_fp4_kernel, grouped_params(g, e0, e1), grid, stream);
    });
}

}  // namespace ds4r::kern
