// Kernel parameters of the Hopper GEMM kernels (hopper/gemm_sm90.cu) and the host code that fills them
// from the launchers' arguments (gemm.cuh): the plain / grouped-by-z problems (GemmParams) and the
// routed experts' grouped GEMM (GroupedParams, each block's tile job), with gemm_tile.cuh's TileJob.
// The portable kernels (gemm.cu) still hold their own copies of the same logic: a merge of the two
// (tried this session) broke the portable grouped GEMM on the GPU for a reason not yet found, and was
// taken back to the version the GPU suite verified. CUDA headers only.
#pragma once

#include "gemm.cuh"
#include "gemm_tile.cuh"

namespace ds4r::kern {

// One problem (or `groups` same-shape problems along grid.z). Pitches / strides in bytes.
struct GemmParams {
    const uint8_t* a;  // A [M, K] (+ z * a_zstride)
    int64_t a_pitch, a_zstride;
    const uint8_t* sa;  // block-scaled: e8m0 A scales [M, K / 32]
    int64_t sa_pitch;
    const uint8_t* b;  // W [N, K] (+ z * b_zstride)
    int64_t b_pitch, b_zstride;
    const uint8_t* sb;  // block-scaled: e8m0 W scales (fp8 [ceil(N / 32), K / 32], fp4 [N, K / 32])
    int64_t sb_pitch;
    uint8_t* c;  // C [M, N] (+ z * c_zstride)
    int64_t c_pitch, c_zstride;
    bool c_pairs;      // output pairs aligned to their size (Hopper epilogue)
    bool scale_words;  // scale rows 4-byte aligned with K / 32 % 4 == 0 (Hopper scale copies)
    int M, N, K;
    int tiles_m, tiles_n;  // set by the launcher
};

inline bool pairs_aligned(const void* c, int64_t c_pitch_bytes, int64_t z_stride_bytes, int out_bytes) {
    const int64_t pair = 2 * out_bytes;
    return reinterpret_cast<uintptr_t>(c) % pair == 0 && c_pitch_bytes % pair == 0 &&
           z_stride_bytes % pair == 0;
}

// launch_gemm_bf16's arguments (gemm.cuh) as parameters.
inline GemmParams bf16_params(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w, int64_t ldw,
                              int64_t w_goff, void* y, bool y_f32, int64_t ldc, int64_t y_goff, int64_t M,
                              int64_t N, int64_t K) {
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
    p.c_pairs = pairs_aligned(y, p.c_pitch, p.c_zstride, static_cast<int>(yb));
    p.M = static_cast<int>(M);
    p.N = static_cast<int>(N);
    p.K = static_cast<int>(K);
    return p;
}

// launch_gemm_fp8 / launch_gemm_fp4's arguments (gemm.cuh) as parameters; fp4: packed weights.
inline GemmParams scaled_params(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                bool fp4, uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K) {
    auto aligned4 = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 4 == 0; };
    GemmParams p{};
    p.a = q;
    p.a_pitch = K;
    p.sa = sa;
    p.sa_pitch = K / 32;
    p.b = w;
    p.b_pitch = fp4 ? K / 2 : K;
    p.sb = sw;
    p.sb_pitch = K / 32;
    p.c = reinterpret_cast<uint8_t*>(y);
    p.c_pitch = ldc * 2;
    p.c_pairs = pairs_aligned(y, p.c_pitch, 0, 2);
    p.scale_words = (K / 32) % 4 == 0 && aligned4(sa) && aligned4(sw);
    p.M = static_cast<int>(M);
    p.N = static_cast<int>(N);
    p.K = static_cast<int>(K);
    return p;
}

// This block's tile (kBM x kBN, kOutBytes per output) of a GemmParams problem as a gemm_tile job. Grid:
// blockIdx.x walks the tiles in a grouped raster (kGroupM M tiles sweep the N tiles together: L2 reuse
// of B), blockIdx.z the problem. Returns the tile's first row m0 (TMA coordinates).
template <int kBM, int kBN, int kOutBytes>
__device__ __forceinline__ int dense_tile_job(const GemmParams& p, gemm::TileJob& j) {
    constexpr int kGroupM = 8;
    const int pid = static_cast<int>(blockIdx.x);
    const int per_group = kGroupM * p.tiles_n;
    const int first_m = (pid / per_group) * kGroupM;
    const int size_m = min(p.tiles_m - first_m, kGroupM);
    const int in_group = pid % per_group;
    const int m0 = (first_m + in_group % size_m) * kBM;
    const int n0 = (in_group / size_m) * kBN;
    const int64_t z = blockIdx.z;
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
    j.c = p.c + z * p.c_zstride + static_cast<int64_t>(m0) * p.c_pitch + static_cast<int64_t>(n0) * kOutBytes;
    j.c_pitch = p.c_pitch;
    j.m_valid = min(kBM, p.M - m0);
    j.n_valid = min(kBN, p.N - n0);
    j.k = p.K;
    return m0;
}

// The routed experts' grouped GEMM. Grid: blockIdx.x the N tile, blockIdx.y the tile of the routing
// plan's schedule (relative to the batch's first; the grid is an upper bound), blockIdx.z the projection.
struct GroupedParams {
    const uint8_t* q;            // e4m3 activation codes [rows, K] (the kernels' code order)
    const uint8_t* sa;           // e8m0 [rows, K / 32]
    const int32_t* a_rows;       // [pairs]: activation row of each pair, or null (row = pair position)
    const int32_t* tile_expert;  // [max_tiles]
    const int32_t* tile_start;   // [max_tiles]
    const int32_t* tile_begin;   // [n_experts + 1]
    const int32_t* expert_end;   // [n_experts]
    int64_t a_pitch, sa_pitch, b_pitch, sb_pitch, c_pitch;  // bytes
    bool c_pairs;                                           // output pairs 4-byte aligned (Hopper epilogue)
    bool scale_words;  // every scale row 4-byte aligned with K / 32 % 4 == 0 (Hopper scale copies)
    int N, K;
    int e_begin, e_end;                       // experts of this launch
    // packed e2m1 [N, K / 2] (w_e5m2: e5m2 [N, K]; w_f16: fp16 [N, K]) per projection and expert
    const uint8_t* w[2][kMaxGroupedExperts];
    const uint8_t* s[2][kMaxGroupedExperts];  // e8m0 [N, K / 32]
    uint8_t* y[2];                            // bf16 [pairs, N] per projection
};

// The parameters of experts [e0, e1) of g (host).
inline GroupedParams grouped_params(const GroupedFp4Gemm& g, int e0, int e1) {
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
    p.b_pitch = g.w_f16 ? 2 * g.K : (g.w_e5m2 ? g.K : g.K / 2);
    p.sb_pitch = g.K / 32;
    p.c_pitch = g.N * 2;
    p.N = static_cast<int>(g.N);
    p.K = static_cast<int>(g.K);
    p.e_begin = e0;
    p.e_end = e1;
    auto aligned4 = [](const void* x) { return reinterpret_cast<uintptr_t>(x) % 4 == 0; };
    bool pairs = p.c_pitch % 4 == 0, words = (g.K / 32) % 4 == 0 && aligned4(g.sa);
    for (int z = 0; z < g.n_proj; ++z) {
        for (int e = e0; e < e1; ++e) {
            p.w[z][e - e0] = g.w[z][e];
            p.s[z][e - e0] = g.s[z][e];
            words = words && aligned4(g.s[z][e]);
        }
        p.y[z] = reinterpret_cast<uint8_t*>(g.y[z]);
        pairs = pairs && aligned4(g.y[z]);
    }
    p.c_pairs = pairs;
    p.scale_words = words;
    return p;
}

// This block's tile (kBM rows x kBN columns) as a gemm_tile job; false when the block lies beyond the
// schedule's tiles or (kBM = 64) is the empty second half of its plan tile (the whole block returns).
// The routing plan lists 128-row tiles (moe.cuh); with kBM = 64 blocks 2 t and 2 t + 1 take plan tile
// t's two row halves (blockIdx.y: twice the plan's tile bound).
// expert, first (optional): the tile's expert and its first pair position (the coordinates of the
// prepared experts' tensor maps: B's z, A's row).
template <int kBM, int kBN>
__device__ __forceinline__ bool grouped_tile_job(const GroupedParams& p, gemm::TileJob& j,
                                                 int* expert = nullptr, int* first = nullptr) {
    static_assert(kBM == 128 || kBM == 64, "grouped tiles: 128 rows, or the halves of 128");
    constexpr int kParts = 128 / kBM;
    const int64_t t = static_cast<int64_t>(p.tile_begin[p.e_begin]) + blockIdx.y / kParts;
    if (t >= p.tile_begin[p.e_end]) return false;
    const int e = p.tile_expert[t];
    const int start = p.tile_start[t] + static_cast<int>(blockIdx.y % kParts) * kBM;
    const int end = p.expert_end[e];
    if (start >= end) return false;
    const int z = blockIdx.z;
    const int n0 = blockIdx.x * kBN;
    if (expert) *expert = e;
    if (first) *first = start;
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
    return true;
}

}  // namespace ds4r::kern
