// Output-head kernels (docs/MODEL.md 4.9, docs/DESIGN.md 2). See head.cuh for the contracts.
#include "attn_device.cuh"
#include "common.cuh"
#include "head.cuh"

namespace ds4r::kern {

namespace {

using namespace ds4r::kern::attn;

// ------------------------------------------------------------------ logits GEMM
// CTA tile 128 rows x 128 vocab entries, k tiles of 32, 3-stage cp.async pipeline, 8 warps as
// 2 (rows) x 4 (vocab), warp tile 64 x 32 = 4 x 4 m16n8k16 MMAs per k16 step. Fragments by
// ldmatrix from rows of 40 bf16 (80 bytes: the 8 row addresses of a matrix hit distinct banks).
// Out-of-range rows / columns / k are zero-filled (adding +0 products changes no fp32 sum).
// Every logit is one fp32 accumulation chain over k = 0, 16, 32, ... whatever R is.
constexpr int kHbM = 128, kHbN = 128, kHbK = 32, kHbStages = 3, kHbThreads = 256;
constexpr int kHbLd = kHbK + 8;
constexpr size_t kHbStageElems = static_cast<size_t>(kHbM + kHbN) * kHbLd;
constexpr size_t kHbSmemBytes = kHbStages * kHbStageElems * 2;

__global__ void __launch_bounds__(kHbThreads)
    head_logits_kernel(const uint16_t* __restrict__ x, const uint16_t* __restrict__ w,
                       float* __restrict__ out, int64_t R, int64_t V, int64_t D) {
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* base = reinterpret_cast<uint16_t*>(smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int warp_m = warp >> 2, warp_n = warp & 3;
    const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kHbM, n0 = static_cast<int64_t>(blockIdx.y) * kHbN;
    const int64_t ktiles = (D + kHbK - 1) / kHbK;

    auto load_stage = [&](int stage, int64_t kt) {
        uint16_t* as = base + stage * kHbStageElems;
        uint16_t* bs = as + kHbM * kHbLd;
        const int64_t k0 = kt * kHbK;
        for (int c = tid; c < (kHbM + kHbN) * (kHbK / 8); c += kHbThreads) {
            const bool is_b = c >= kHbM * (kHbK / 8);
            const int cc = is_b ? c - kHbM * (kHbK / 8) : c;
            const int row = cc / (kHbK / 8), col8 = cc % (kHbK / 8);
            const int64_t kk = k0 + col8 * 8;
            const int64_t gr = (is_b ? n0 : m0) + row;
            const bool ok = kk < D && gr < (is_b ? V : R);
            const uint16_t* src = is_b ? w : x;
            if (ok) src += gr * D + kk;
            cp_async16((is_b ? bs : as) + row * kHbLd + col8 * 8, src, ok ? 16 : 0);
        }
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
    for (int st = 0; st < kHbStages - 1; ++st) {
        if (st < ktiles) load_stage(st, st);
        cp_async_commit();
    }
    for (int64_t kt = 0; kt < ktiles; ++kt) {
        cp_async_wait<kHbStages - 2>();
        __syncthreads();  // tile kt landed for every thread; stage (kt - 1) % S is free again
        const int64_t nk = kt + kHbStages - 1;
        if (nk < ktiles) load_stage(static_cast<int>(nk % kHbStages), nk);
        cp_async_commit();
        const uint16_t* as = base + (kt % kHbStages) * kHbStageElems;
        const uint16_t* bs = as + kHbM * kHbLd;
#pragma unroll
        for (int kk = 0; kk < kHbK / 16; ++kk) {
            uint32_t a[4][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
                ldmatrix_x4(a[mt],
                            as + (warp_m * 64 + mt * 16 + (lane & 15)) * kHbLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                uint32_t t[4];
                ldmatrix_x4(t, bs + (warp_n * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kHbLd +
                                   kk * 16 + ((lane >> 3) & 1) * 8);
                b[2 * np][0] = t[0];
                b[2 * np][1] = t[1];
                b[2 * np + 1][0] = t[2];
                b[2 * np + 1][1] = t[3];
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma_bf16_16816(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = m0 + warp_m * 64 + mt * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t col = n0 + warp_n * 32 + nt * 8 + 2 * qd + (e & 1);
                if (row < R && col < V) out[row * V + col] = acc[mt][nt][e];
            }
}

// ------------------------------------------------------------------ per-row statistics
// One CTA (512 threads) per row. Passes over the row's V logits: (1) max and #{l > l_target};
// (2) se = sum exp(l - max) and sum exp(l - max) * l in fp64 (so sum p l = that / se, one pass
// instead of the reference's second exp pass; equal to rounding); (3-6) radix select of the k-th
// largest logit key (4 digits); (7) the ordered selection pass. fp64 sums: each thread sequential
// over v = tid, tid + 512, ..., then a fixed pairwise tree: deterministic, per row.
constexpr int kHsThreads = 512;
constexpr int kHsItems = 8;

// Order key of a logit for the head's top-k: larger logit = larger key, +0 == -0 (the CPU compares
// floats), NaN below everything (key 0 is NaN's alone: -inf maps to 0x007fffff).
__device__ __forceinline__ uint32_t head_topk_key(float v) {
    if (isnan(v)) return 0u;
    if (v == 0.0f) return 0x80000000u;
    const uint32_t x = __float_as_uint(v);
    return (x & 0x80000000u) ? ~x : (x | 0x80000000u);
}

struct HsSmem {
    RadixSmem<kHsThreads> rs;
    double red[kHsThreads];
    float fred[kHsThreads / 32];
    unsigned long long cand[kHeadMaxTopK];
};

// Sum of v over the block by a fixed pairwise tree (thread order). All threads call it.
__device__ double block_sum_f64(double v, double* red) {
    const int tid = threadIdx.x;
    red[tid] = v;
    __syncthreads();
    for (int s = kHsThreads / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    const double total = red[0];
    __syncthreads();
    return total;
}

__global__ void __launch_bounds__(kHsThreads)
    head_row_stats_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets, int64_t V,
                          int k, double* __restrict__ lse_out, double* __restrict__ ent_out,
                          float* __restrict__ tl_out, int32_t* __restrict__ rank_out,
                          int32_t* __restrict__ topk_ids, float* __restrict__ topk_logit) {
    __shared__ HsSmem sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = blockIdx.x;
    const float* row = logits + r * V;
    const int32_t t = targets[r];
    const bool has_t = t >= 0 && t < V;
    const float tl = has_t ? row[t] : 0.0f;

    // (1) max, rank count
    float mx = -INFINITY;
    uint32_t above = 0;
    for (int64_t v = tid; v < V; v += kHsThreads) {
        const float l = row[v];
        mx = fmaxf(mx, l);  // NaN ignored, like std::max(mx, l) from -inf
        above += l > tl ? 1u : 0u;
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0) sm.fred[warp] = mx;
    uint64_t n_above;
    block_exclusive_scan<kHsThreads>(above, sm.rs.scan, &n_above);  // also orders the fred writes
    mx = sm.fred[0];
    for (int w = 1; w < kHsThreads / 32; ++w) mx = fmaxf(mx, sm.fred[w]);
    const double dmx = mx;

    // (2) fp64 sums
    double se = 0.0, sel = 0.0;
    for (int64_t v = tid; v < V; v += kHsThreads) {
        const double l = row[v];
        const double e = exp(l - dmx);
        se += e;
        sel = __fma_rn(e, l, sel);  // one fma, as contraction compiled it before --fmad=false (same bytes)
    }
    se = block_sum_f64(se, sm.red);
    sel = block_sum_f64(sel, sm.red);
    if (tid == 0) {
        const double lse = dmx + log(se);
        lse_out[r] = lse;
        ent_out[r] = lse - sel / se;
        tl_out[r] = tl;
        rank_out[r] = has_t ? static_cast<int32_t>(1 + n_above) : 0;
    }
    if (k <= 0) return;

    // (3-6) k-th largest key, (7) selection in ascending id order, then sort (key desc, id asc)
    auto key_at = [row](int64_t v) { return head_topk_key(row[v]); };
    uint32_t kth, n_gt;
    radix_select_kth<kHsThreads, 32>(V, static_cast<uint32_t>(k), key_at, sm.rs, &kth, &n_gt);
    unsigned long long* cand = sm.cand;
    auto emit = [cand, key_at](uint32_t pos, int64_t v) {
        cand[pos] =
            (static_cast<unsigned long long>(key_at(v)) << 32) | (0xffffffffu - static_cast<uint32_t>(v));
    };
    select_ordered<kHsThreads, kHsItems>(V, static_cast<uint32_t>(k), kth, n_gt, key_at, emit, sm.rs.scan);
    int P = 1;
    while (P < k) P <<= 1;
    for (int i = k + tid; i < P; i += kHsThreads) cand[i] = 0ull;  // below every real entry
    __syncthreads();
    // bitonic sort, descending
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P; i += kHsThreads) {
                const int partner = i ^ stride;
                if (partner > i) {
                    const bool desc = (i & size) == 0;
                    const unsigned long long a = cand[i], b = cand[partner];
                    if ((a < b) == desc) {
                        cand[i] = b;
                        cand[partner] = a;
                    }
                }
            }
            __syncthreads();
        }
    for (int i = tid; i < k; i += kHsThreads) {
        const uint32_t v = 0xffffffffu - static_cast<uint32_t>(cand[i] & 0xffffffffull);
        topk_ids[r * k + i] = static_cast<int32_t>(v);
        topk_logit[r * k + i] = row[v];
    }
}

}  // namespace

cudaError_t launch_head_logits(const uint16_t* x, const uint16_t* w, float* logits, int64_t R, int64_t V,
                               int64_t D, cudaStream_t stream) {
    if (R == 0 || V == 0) return cudaSuccess;
    cudaError_t err = cudaFuncSetAttribute(head_logits_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kHbSmemBytes));
    if (err != cudaSuccess) return err;
    const dim3 grid(static_cast<unsigned>((R + kHbM - 1) / kHbM),
                    static_cast<unsigned>((V + kHbN - 1) / kHbN));
    head_logits_kernel<<<grid, kHbThreads, kHbSmemBytes, stream>>>(x, w, logits, R, V, D);
    return cudaGetLastError();
}

cudaError_t launch_head_row_stats(const float* logits, const int32_t* targets, int64_t R, int64_t V, int k,
                                  double* lse, double* entropy, float* target_logit, int32_t* rank,
                                  int32_t* topk_ids, float* topk_logit, cudaStream_t stream) {
    if (R == 0) return cudaSuccess;
    head_row_stats_kernel<<<static_cast<unsigned>(R), kHsThreads, 0, stream>>>(
        logits, targets, V, k, lse, entropy, target_logit, rank, topk_ids, topk_logit);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
