// Tensor-core GEMM kernels: plain / grouped-by-z problems and the routed experts' grouped GEMM, all
// built on gemm_tile (gemm_tile.cuh). Launch wrappers validate what the kernels assume.
#include "gemm.cuh"
#include "gemm_tile.cuh"

namespace ds4r::kern {

namespace {

using gemm::AKind;
using gemm::BKind;
using gemm::Cfg;
using gemm::kBM;
using gemm::kBN;
using gemm::TileJob;

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
};

template <class C>
__global__ void __launch_bounds__(gemm::kThreads) gemm_kernel(const __grid_constant__ GemmParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM;
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
    j.c = p.c + z * p.c_zstride + static_cast<int64_t>(m0) * p.c_pitch + static_cast<int64_t>(n0) * (C::kOutF32 ? 4 : 2);
    j.c_pitch = p.c_pitch;
    j.m_valid = min(kBM, p.M - m0);
    j.n_valid = min(kBN, p.N - n0);
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

using Fp4Cfg = Cfg<AKind::E4M3, BKind::E2M1, false>;

__global__ void __launch_bounds__(gemm::kThreads) grouped_fp4_kernel(const __grid_constant__ GroupedParams p) {
    extern __shared__ __align__(128) uint8_t smem[];
    const int64_t t = static_cast<int64_t>(p.tile_begin[p.e_begin]) + blockIdx.y;
    if (t >= p.tile_begin[p.e_end]) return;  // the grid is an upper bound on the tile count
    const int e = p.tile_expert[t];
    const int start = p.tile_start[t];
    const int end = p.expert_end[e];
    const int z = blockIdx.z;
    const int n0 = blockIdx.x * kBN;
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
    j.m_valid = min(kBM, end - start);
    j.n_valid = min(kBN, p.N - n0);
    j.k = p.K;
    gemm::gemm_tile<Fp4Cfg>(j, smem);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class C, class Kernel, class Params>
cudaError_t launch_tiles(Kernel kernel, const Params& p, dim3 grid, cudaStream_t stream) {
    constexpr int smem = C::kSmemBytes;
    if (smem > 48 * 1024) {
        const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
    }
    kernel<<<grid, gemm::kThreads, smem, stream>>>(p);
    return cudaGetLastError();
}

template <class C>
cudaError_t launch_plain(const GemmParams& p, int64_t M, int64_t N, int64_t groups, cudaStream_t stream) {
    if (M == 0 || N == 0 || groups == 0) return cudaSuccess;
    const int64_t gx = (N + kBN - 1) / kBN, gy = (M + kBM - 1) / kBM;
    if (gx > 0x7fffffffLL || gy > 65535 || groups > 65535 || M > 0x7fffffffLL || N > 0x7fffffffLL)
        return cudaErrorInvalidValue;
    return launch_tiles<C>(gemm_kernel<C>, p, dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                                                   static_cast<unsigned>(groups)),
                           stream);
}

}  // namespace

bool gemm_bf16_supported(const void* x, int64_t lda, int64_t x_goff, const void* w, int64_t ldw, int64_t w_goff,
                         int64_t K) {
    return K % 8 == 0 && lda % 8 == 0 && ldw % 8 == 0 && x_goff % 8 == 0 && w_goff % 8 == 0 && aligned16(x) &&
           aligned16(w) && K <= 0x7fffffffLL;
}

cudaError_t launch_gemm_bf16(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w, int64_t ldw,
                             int64_t w_goff, void* y, bool y_f32, int64_t ldc, int64_t y_goff, int64_t M, int64_t N,
                             int64_t K, int64_t groups, cudaStream_t stream) {
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
    if (y_f32) return launch_plain<Cfg<AKind::BF16, BKind::BF16, true>>(p, M, N, groups, stream);
    return launch_plain<Cfg<AKind::BF16, BKind::BF16, false>>(p, M, N, groups, stream);
}

namespace {
template <BKind kB>
cudaError_t launch_scaled(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                          int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
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
    return launch_plain<Cfg<AKind::E4M3, kB, false>>(p, M, N, 1, stream);
}
}  // namespace

cudaError_t launch_gemm_fp8(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                            int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    return launch_scaled<BKind::E4M3>(q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_gemm_fp4(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                            int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    return launch_scaled<BKind::E2M1>(q, sa, w, sw, y, ldc, M, N, K, stream);
}

cudaError_t launch_grouped_gemm_fp4(const GroupedFp4Gemm& g, cudaStream_t stream) {
    if (g.K % 32 != 0 || g.K > 0x7fffffffLL || g.N > 0x7fffffffLL || g.n_proj < 1 || g.n_proj > 2 ||
        !aligned16(g.q) || g.n_experts < 0)
        return cudaErrorInvalidValue;
    if (g.n_experts == 0 || g.max_tiles <= 0 || g.N == 0) return cudaSuccess;
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
        const cudaError_t err = launch_tiles<Fp4Cfg>(
            grouped_fp4_kernel, p,
            dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(g.n_proj)), stream);
        if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
}

int gemm_smem_bytes_bf16() { return Cfg<AKind::BF16, BKind::BF16, false>::kSmemBytes; }
int gemm_smem_bytes_fp8() { return Cfg<AKind::E4M3, BKind::E4M3, false>::kSmemBytes; }
int gemm_smem_bytes_fp4() { return Fp4Cfg::kSmemBytes; }

}  // namespace ds4r::kern
