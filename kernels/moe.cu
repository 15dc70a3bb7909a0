// MoE kernels other than the GEMMs (docs/MODEL.md 4.7): router top-k, routing plan, SwiGLU + act quant,
// combine. Every reduction has a fixed order; the routing plan is a counting sort whose positions
// follow ascending token rows (no atomics), so results are deterministic and batch invariant.
#include "moe.cuh"
#include "quant_device.cuh"

namespace ds4r::kern {

namespace {

// ------------------------------------------------------------------ router
constexpr int kRouterWarps = 4;  // one token row per warp
constexpr int kMaxTopk = 32;

// topk_order_key (include/ds4r/numeric.h): larger key = larger value; 0 marks a taken expert.

// smem per warp: score [E] f32, key [E] u32, sel [kMaxTopk] i32.
__global__ void __launch_bounds__(kRouterWarps * 32)
    router_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t M, int E, int k,
                  float inv_temp, float route_scale, int32_t* __restrict__ idx, float* __restrict__ wout) {
    extern __shared__ __align__(16) uint8_t router_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
    if (r >= M) return;  // whole warps only: the shuffles below stay inside one warp
    float* score = reinterpret_cast<float*>(router_smem) + static_cast<int64_t>(warp) * (2 * E + kMaxTopk);
    uint32_t* key = reinterpret_cast<uint32_t*>(score + E);
    int32_t* sel = reinterpret_cast<int32_t*>(key + E);
    const float* lrow = logits + r * E;
    for (int e = lane; e < E; e += 32) {
        // logits / gate_temp as CUDA torch divides by a python scalar: a multiply by fp32(1 / temp)
        const float s = sqrtf(ref_softplus(__fmul_rn(lrow[e], inv_temp)));
        score[e] = s;
        key[e] = topk_order_key(__fadd_rn(s, bias[e]));
    }
    __syncwarp();
    // k rounds of arg-max: the largest key, ties to the lowest expert id. This selects exactly CUDA
    // torch.topk's set (values above the k-th, then ties by ascending id) in descending order.
    for (int t = 0; t < k; ++t) {
        unsigned long long best = 0ull;
        for (int e = lane; e < E; e += 32) {
            const uint32_t kv = key[e];
            if (kv == 0u) continue;
            const unsigned long long cand =
                (static_cast<unsigned long long>(kv) << 32) | (0xffffffffu - static_cast<uint32_t>(e));
            best = cand > best ? cand : best;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        if (lane == 0) {
            const int e = static_cast<int>(0xffffffffu - static_cast<uint32_t>(best & 0xffffffffull));
            sel[t] = e;
            key[e] = 0u;
        }
        __syncwarp();
    }
    // weights: the unbiased scores of the selection, / (sum + 1e-20) when k > 1, * route_scale
    float denom = 1.0f;
    if (k > 1) {
        if (lane == 0) {
            float sum;
            if (k == 6) {  // CUDA torch.sum's order for 6 values (docs/MODEL.md 8.2)
                const float w0 = score[sel[0]], w1 = score[sel[1]], w2 = score[sel[2]];
                const float w3 = score[sel[3]], w4 = score[sel[4]], w5 = score[sel[5]];
                sum = __fadd_rn(__fadd_rn(__fadd_rn(w0, w4), w2), __fadd_rn(__fadd_rn(w1, w5), w3));
            } else {
                sum = 0.0f;
                for (int t = 0; t < k; ++t) sum = __fadd_rn(sum, score[sel[t]]);
            }
            denom = __fadd_rn(sum, 1e-20f);
        }
        denom = __shfl_sync(0xffffffffu, denom, 0);
    }
    if (lane < k) {
        const int e = sel[lane];
        float v = score[e];
        if (k > 1) v = __fdiv_rn(v, denom);
        idx[r * k + lane] = e;
        wout[r * k + lane] = __fmul_rn(v, route_scale);
    }
}

// ------------------------------------------------------------------ routing plan
constexpr int kRouteThreads = 256;

// counts[e] = number of rows whose top-k holds e. grid: E blocks.
__global__ void __launch_bounds__(kRouteThreads)
    route_count_kernel(const int32_t* __restrict__ idx, int64_t M, int k, int32_t* __restrict__ counts) {
    __shared__ int32_t part[kRouteThreads / 32];
    const int e = blockIdx.x;
    int32_t c = 0;
    for (int64_t r = threadIdx.x; r < M; r += kRouteThreads)
        for (int s = 0; s < k; ++s) c += idx[r * k + s] == e ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t t = 0;
        for (int i = 0; i < kRouteThreads / 32; ++i) t += part[i];
        counts[e] = t;
    }
}

// Exclusive scans (one block): pair ranges and the 128-row tile list.
__global__ void __launch_bounds__(kRouteThreads)
    route_plan_kernel(const int32_t* __restrict__ counts, int E, int32_t* __restrict__ expert_begin,
                      int32_t* __restrict__ expert_end, int32_t* __restrict__ tile_begin,
                      int32_t* __restrict__ tile_expert, int32_t* __restrict__ tile_start,
                      int64_t max_tiles) {
    if (threadIdx.x == 0) {
        int32_t pos = 0, tiles = 0;
        for (int e = 0; e < E; ++e) {
            expert_begin[e] = pos;
            tile_begin[e] = tiles;
            pos += counts[e];
            expert_end[e] = pos;
            tiles += (counts[e] + 127) / 128;
        }
        tile_begin[E] = tiles;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
        const int32_t t0 = tile_begin[e], nt = tile_begin[e + 1] - t0;
        for (int32_t t = 0; t < nt; ++t) {
            if (t0 + t >= max_tiles) break;  // cannot happen when max_tiles is a true bound
            tile_expert[t0 + t] = e;
            tile_start[t0 + t] = expert_begin[e] + t * 128;
        }
    }
}

// The plan's tiles split by height (launch_moe_tile_split; one block): an expert whose last tile holds
// 1 .. 64 pairs moves that tile to the tail list.
__global__ void __launch_bounds__(kRouteThreads)
    route_tile_split_kernel(const int32_t* __restrict__ counts, const int32_t* __restrict__ expert_begin,
                            int E, int32_t* __restrict__ full_begin, int32_t* __restrict__ full_expert,
                            int32_t* __restrict__ full_start, int64_t max_tiles,
                            int32_t* __restrict__ tail_begin, int32_t* __restrict__ tail_expert,
                            int32_t* __restrict__ tail_start) {
    auto split = [](int32_t n, int32_t& full, int32_t& tail) {
        const int32_t r = n % 128;
        tail = r >= 1 && r <= 64 ? 1 : 0;
        full = (n + 127) / 128 - tail;
    };
    if (threadIdx.x == 0) {
        int32_t f = 0, t = 0;
        for (int e = 0; e < E; ++e) {
            full_begin[e] = f;
            tail_begin[e] = t;
            int32_t nf, nt;
            split(counts[e], nf, nt);
            f += nf;
            t += nt;
        }
        full_begin[E] = f;
        tail_begin[E] = t;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
        int32_t nf, nt;
        split(counts[e], nf, nt);
        const int32_t f0 = full_begin[e];
        for (int32_t i = 0; i < nf; ++i) {
            if (f0 + i >= max_tiles) break;  // cannot happen when max_tiles bounds the plan's tiles
            full_expert[f0 + i] = e;
            full_start[f0 + i] = expert_begin[e] + i * 128;
        }
        if (nt) {
            tail_expert[tail_begin[e]] = e;
            tail_start[tail_begin[e]] = expert_begin[e] + nf * 128;
        }
    }
}

// Pair positions of expert e (grid: E blocks): rows ascending, by a block-wide exclusive scan of the
// "row r uses e" flags over chunks of kRouteThreads rows.
__global__ void __launch_bounds__(kRouteThreads)
    route_fill_kernel(const int32_t* __restrict__ idx, const float* __restrict__ w, int64_t M, int k,
                      const int32_t* __restrict__ expert_begin, int32_t* __restrict__ pair_row,
                      float* __restrict__ pair_w, int32_t* __restrict__ slot_pos) {
    __shared__ int32_t warp_sum[kRouteThreads / 32];
    const int e = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int32_t base = expert_begin[e];
    for (int64_t r0 = 0; r0 < M; r0 += kRouteThreads) {
        const int64_t r = r0 + threadIdx.x;
        int slot = -1;
        if (r < M)
            for (int s = 0; s < k; ++s)
                if (idx[r * k + s] == e) slot = s;  // top-k experts of a row are distinct
        const unsigned ball = __ballot_sync(0xffffffffu, slot >= 0);
        const int32_t before_in_warp = __popc(ball & ((1u << lane) - 1u));
        if (lane == 0) warp_sum[warp] = __popc(ball);
        __syncthreads();
        int32_t before = before_in_warp, total = 0;
        for (int i = 0; i < kRouteThreads / 32; ++i) {
            if (i < warp) before += warp_sum[i];
            total += warp_sum[i];
        }
        if (slot >= 0) {
            const int32_t pos = base + before;
            pair_row[pos] = static_cast<int32_t>(r);
            pair_w[pos] = w[r * k + slot];
            slot_pos[r * k + slot] = pos;
        }
        base += total;
        __syncthreads();  // warp_sum is rewritten by the next chunk
    }
}

// ------------------------------------------------------------------ SwiGLU + act quant
constexpr int kQuantThreads = 256;

// One thread per 8 codes (8 elements of one 32-block, in the GEMM fragment order, or in canonical
// order for kCanonical); 4 lanes per block.
template <bool kVec, bool kCanonical>
__global__ void __launch_bounds__(kQuantThreads)
    swiglu_quant_kernel(const uint16_t* __restrict__ g, const uint16_t* __restrict__ u,
                        const float* __restrict__ weight, float limit, int64_t I, int64_t n_groups,
                        uint8_t* __restrict__ q, uint8_t* __restrict__ s) {
    const int64_t gi = static_cast<int64_t>(blockIdx.x) * kQuantThreads + threadIdx.x;
    const bool active = gi < n_groups;
    float v[8];
    if (active) {
        float gv[8], uv[8];
        // the codes go to the down projection's GEMM in its operand order (quant.cuh Fp8CodeOrder)
        if constexpr (kCanonical) {
            load_bf16x8<kVec>(g + gi * 8, gv);
            load_bf16x8<kVec>(u + gi * 8, uv);
        } else {
            load_bf16x8_gemm_fragment<kVec>(g, gi, gv);
            load_bf16x8_gemm_fragment<kVec>(u, gi, uv);
        }
        const float wrow = weight ? weight[gi * 8 / I] : 1.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float gg = gv[i], uu = uv[i];
            if (limit > 0.0f) {  // the reference clamps only when a limit is set (NaN propagates)
                if (uu > limit) uu = limit;
                if (uu < -limit) uu = -limit;
                if (gg > limit) gg = limit;
            }
            float a = __fmul_rn(ref_silu(gg), uu);
            if (weight) a = __fmul_rn(wrow, a);
            v[i] = bf16_bits_to_f32(f32_to_bf16_bits(a));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    const float amax = group_amax<4>(v);
    if (!active) return;
    const float sc = fp8_block_scale(amax);
    uint8_t b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = fp8_code(v[i], sc);
    store_u8x8<kVec>(q + gi * 8, b);
    if ((gi & 3) == 0) s[gi >> 2] = (amax <= __int_as_float(0x7f7fffff)) ? e8m0_of_pow2(sc) : uint8_t{0xff};
}

// ------------------------------------------------------------------ combine
constexpr int kCombineThreads = 128;

// grid: M blocks (one row each).
template <bool kVec>
__global__ void __launch_bounds__(kCombineThreads)
    combine_kernel(const uint16_t* __restrict__ out_e, const int32_t* __restrict__ idx,
                   const int32_t* __restrict__ slot_pos, int k, const uint16_t* __restrict__ shared,
                   int64_t D, uint16_t* __restrict__ y) {
    __shared__ int64_t src_row[kMaxTopk];
    __shared__ int32_t src_expert[kMaxTopk];
    const int64_t r = blockIdx.x;
    if (threadIdx.x == 0) {
        // the row's slots in ascending expert id (insertion sort of <= 32 entries)
        for (int s = 0; s < k; ++s) {
            const int32_t e = idx[r * k + s];
            const int64_t p = slot_pos[r * k + s];
            int i = s;
            while (i > 0 && src_expert[i - 1] > e) {
                src_expert[i] = src_expert[i - 1];
                src_row[i] = src_row[i - 1];
                --i;
            }
            src_expert[i] = e;
            src_row[i] = p;
        }
    }
    __syncthreads();
    for (int64_t d0 = static_cast<int64_t>(threadIdx.x) * 8; d0 < D; d0 += kCombineThreads * 8) {
        const int n = D - d0 < 8 ? static_cast<int>(D - d0) : 8;
        float acc[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;  // y starts as fp32 zeros
        for (int s = 0; s < k; ++s) {
            const uint16_t* src = out_e + src_row[s] * D + d0;
            float v[8];
            if (kVec) {
                load_bf16x8<true>(src, v);
            } else {
                for (int i = 0; i < 8; ++i) v[i] = i < n ? bf16_bits_to_f32(src[i]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[i] = __fadd_rn(acc[i], v[i]);
        }
        float sv[8];
        if (kVec) {
            load_bf16x8<true>(shared + r * D + d0, sv);
        } else {
            for (int i = 0; i < 8; ++i) sv[i] = i < n ? bf16_bits_to_f32(shared[r * D + d0 + i]) : 0.0f;
        }
        uint16_t h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = f32_to_bf16_bits(__fadd_rn(acc[i], sv[i]));
        if (kVec) {
            store_bf16x8<true>(y + r * D + d0, h);
        } else {
            for (int i = 0; i < n; ++i) y[r * D + d0 + i] = h[i];
        }
    }
}

bool aligned16(const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// dst row i = src row rows[i] (row_bytes each; kVec: 16-byte words). One block per row.
template <bool kVec>
__global__ void __launch_bounds__(256)
    gather_rows_kernel(const uint8_t* src, int64_t row_bytes, const int32_t* rows, uint8_t* dst) {
    const int64_t i = blockIdx.x;
    const uint8_t* from = src + static_cast<int64_t>(rows[i]) * row_bytes;
    uint8_t* to = dst + i * row_bytes;
    if constexpr (kVec) {
        for (int64_t b = 16 * static_cast<int64_t>(threadIdx.x); b < row_bytes; b += 16 * blockDim.x)
            *reinterpret_cast<uint4*>(to + b) = __ldg(reinterpret_cast<const uint4*>(from + b));
    } else {
        for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) to[b] = __ldg(from + b);
    }
}

}  // namespace

cudaError_t launch_gather_rows(const uint8_t* src, int64_t row_bytes, const int32_t* rows, int64_t n,
                               uint8_t* dst, cudaStream_t stream) {
    if (n < 0 || n > 0x7fffffffLL || row_bytes < 0) return cudaErrorInvalidValue;
    if (n == 0 || row_bytes == 0) return cudaSuccess;
    if (row_bytes % 16 == 0 && aligned16(src) && aligned16(dst))
        gather_rows_kernel<true><<<static_cast<unsigned>(n), 256, 0, stream>>>(src, row_bytes, rows, dst);
    else
        gather_rows_kernel<false><<<static_cast<unsigned>(n), 256, 0, stream>>>(src, row_bytes, rows, dst);
    return cudaGetLastError();
}

cudaError_t launch_moe_router(const float* logits, const float* bias, int64_t M, int E, int k, float inv_temp,
                              float route_scale, int32_t* idx, float* w, cudaStream_t stream) {
    if (E < 1 || k < 1 || k > E || k > kMaxTopk) return cudaErrorInvalidValue;
    if (M == 0) return cudaSuccess;
    const size_t smem = static_cast<size_t>(kRouterWarps) * (2 * static_cast<size_t>(E) + kMaxTopk) * 4;
    if (smem > 48 * 1024) return cudaErrorInvalidValue;  // E <= 1504
    const int64_t blocks = (M + kRouterWarps - 1) / kRouterWarps;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    router_kernel<<<static_cast<unsigned>(blocks), kRouterWarps * 32, smem, stream>>>(
        logits, bias, M, E, k, inv_temp, route_scale, idx, w);
    return cudaGetLastError();
}

cudaError_t launch_moe_routing(const int32_t* idx, const float* w, int64_t M, int k, int E, int32_t* counts,
                               int32_t* expert_begin, int32_t* expert_end, int32_t* tile_begin,
                               int32_t* tile_expert, int32_t* tile_start, int64_t max_tiles,
                               int32_t* pair_row, float* pair_w, int32_t* slot_pos, cudaStream_t stream) {
    if (E < 1 || k < 1 || k > E || M * k > 0x7fffffffLL) return cudaErrorInvalidValue;
    route_count_kernel<<<E, kRouteThreads, 0, stream>>>(idx, M, k, counts);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    route_plan_kernel<<<1, kRouteThreads, 0, stream>>>(counts, E, expert_begin, expert_end, tile_begin,
                                                       tile_expert, tile_start, max_tiles);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    if (M == 0) return cudaSuccess;
    route_fill_kernel<<<E, kRouteThreads, 0, stream>>>(idx, w, M, k, expert_begin, pair_row, pair_w,
                                                       slot_pos);
    return cudaGetLastError();
}

cudaError_t launch_moe_tile_split(const int32_t* counts, const int32_t* expert_begin, int E,
                                  int32_t* full_begin, int32_t* full_expert, int32_t* full_start,
                                  int64_t max_tiles, int32_t* tail_begin, int32_t* tail_expert,
                                  int32_t* tail_start, cudaStream_t stream) {
    if (E < 1 || max_tiles < 1) return cudaErrorInvalidValue;
    route_tile_split_kernel<<<1, kRouteThreads, 0, stream>>>(counts, expert_begin, E, full_begin, full_expert,
                                                             full_start, max_tiles, tail_begin, tail_expert,
                                                             tail_start);
    return cudaGetLastError();
}

cudaError_t launch_swiglu_quant(const uint16_t* g, const uint16_t* u, const float* weight, float limit,
                                int64_t P, int64_t I, uint8_t* q, uint8_t* s, Fp8CodeOrder order,
                                cudaStream_t stream) {
    if (I % 32 != 0 || I <= 0) return cudaErrorInvalidValue;
    const int64_t n_groups = P * I / 8;
    if (n_groups == 0) return cudaSuccess;
    const int64_t blocks = (n_groups + kQuantThreads - 1) / kQuantThreads;
    if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
    const bool vec = aligned16(g) && aligned16(u) && reinterpret_cast<uintptr_t>(q) % 8 == 0;
    const dim3 grid(static_cast<unsigned>(blocks));
    if (order == Fp8CodeOrder::Canonical) {
        if (vec)
            swiglu_quant_kernel<true, true>
                <<<grid, kQuantThreads, 0, stream>>>(g, u, weight, limit, I, n_groups, q, s);
        else
            swiglu_quant_kernel<false, true>
                <<<grid, kQuantThreads, 0, stream>>>(g, u, weight, limit, I, n_groups, q, s);
    } else {
        if (vec)
            swiglu_quant_kernel<true, false>
                <<<grid, kQuantThreads, 0, stream>>>(g, u, weight, limit, I, n_groups, q, s);
        else
            swiglu_quant_kernel<false, false>
                <<<grid, kQuantThreads, 0, stream>>>(g, u, weight, limit, I, n_groups, q, s);
    }
    return cudaGetLastError();
}

cudaError_t launch_moe_combine(const uint16_t* out_e, const int32_t* idx, const int32_t* slot_pos, int k,
                               const uint16_t* shared, int64_t M, int64_t D, uint16_t* y,
                               cudaStream_t stream) {
    if (k < 1 || k > kMaxTopk || M > 0x7fffffffLL) return cudaErrorInvalidValue;
    if (M == 0 || D == 0) return cudaSuccess;
    const bool vec = D % 8 == 0 && aligned16(out_e) && aligned16(shared) && aligned16(y);
    if (vec)
        combine_kernel<true>
            <<<static_cast<unsigned>(M), kCombineThreads, 0, stream>>>(out_e, idx, slot_pos, k, shared, D, y);
    else
        combine_kernel<false>
            <<<static_cast<unsigned>(M), kCombineThreads, 0, stream>>>(out_e, idx, slot_pos, k, shared, D, y);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
