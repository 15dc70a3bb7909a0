// The routed experts' grouped GEMM, shared by its portable (gemm.cu) and Hopper (hopper/gemm_sm90.cu)
// kernels: the kernel parameters of one batch of experts and each block's output tile. Grid: blockIdx.x
// the N tile, blockIdx.y the tile of the routing plan's schedule (relative to the batch's first; the grid
// is an upper bound), blockIdx.z the projection. CUDA headers only.
#pragma once

#include "gemm.cuh"
#include "gemm_tile.cuh"

namespace ds4r::kern {

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
    const uint8_t* w[2][kMaxGroupedExperts];  // packed e2m1 [N, K / 2] per projection and expert
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
    p.b_pitch = g.K / 2;
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
// schedule's tiles (the whole block returns).
template <int kBM, int kBN>
__device__ __forceinline__ bool grouped_tile_job(const GroupedParams& p, gemm::TileJob& j) {
    const int64_t t = static_cast<int64_t>(p.tile_begin[p.e_begin]) + blockIdx.y;
    if (t >= p.tile_begin[p.e_end]) return false;
    const int e = p.tile_expert[t];
    const int start = p.tile_start[t];
    const int end = p.expert_end[e];
    const int z = blockIdx.z;
    const int n0 = blockIdx.x * kBN;
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
