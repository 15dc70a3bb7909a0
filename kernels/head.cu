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
// One CTA (512 threads) per row, thread t owning the 4-logit groups q = t, t + 512, t + 1024, ... of
// the row (groups of ids 4q .. 4q + 3; loaded as one 16-byte vector where the row is 16-byte aligned,
// else element by element: the same values in the same order, so a row's results never depend on its
// address). One pass over the row reads every logit once, kHsUnroll vectors in flight per thread:
//   - the max (fmaxf, NaN ignored) and #{l > l_target};
//   - se = sum exp(l - m) and sel = sum exp(l - m) * l in fp64 against the thread's running max m
//     (online: when a tile of kHsUnroll groups raises m, se and sel are rescaled by exp(m_old - m_new);
//     at the end each thread's pair is scaled by exp(m - max) and summed by a fixed tree). Each
//     thread's order is fixed by V alone: deterministic and batch invariant;
//   - the thread's largest top-k key (head_topk_key of its max; 0 if it holds no number).
// Top-k (k <= 512): T = the k-th largest of the 512 thread maxima (a bitwise search with
// __syncthreads_count) is <= the row's k-th largest key, since those k maxima are k distinct logits.
// Only threads whose maximum is >= T can hold a key >= T: their groups are read again, by the whole
// block, and every key >= T (all of the top-k, ties included) goes to a shared candidate list; the
// candidates, distinct by id, are ordered by (key desc, id asc) (rank counting, or a bitonic sort
// above 512): the order does not depend on the order they arrived in. Typically ~k threads and a few
// KB are read again. Exact fallback (k > 512, or more than kHsCandCap candidates, e.g. rows of equal
// logits): the radix select of the k-th key and the ordered selection pass (attn_device.cuh) over the
// row, as before.
constexpr int kHsThreads = 512;
constexpr int kHsUnroll = 4;      // float4 groups per thread per tile
constexpr int kHsCandCap = 4096;  // candidate list entries (32 KB, shared with the fallback)
constexpr int kHsItems = 8;       // fallback select_ordered items per thread
constexpr int kHsWarps = kHsThreads / 32;

// Order key of a logit for the head's top-k: larger logit = larger key, +0 == -0 (the CPU compares
// floats), NaN below everything (key 0 is NaN's alone: -inf maps to 0x007fffff).
__device__ __forceinline__ uint32_t head_topk_key(float v) {
    if (isnan(v)) return 0u;
    if (v == 0.0f) return 0x80000000u;
    const uint32_t x = __float_as_uint(v);
    return (x & 0x80000000u) ? ~x : (x | 0x80000000u);
}
// Candidate entry: key above, ~id below (larger entry = earlier in the top-k order; 0 below all).
__device__ __forceinline__ unsigned long long head_cand(uint32_t key, int64_t v) {
    return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(v));
}

struct HsSmem {
    union {
        unsigned long long cand[kHsCandCap];  // candidate path
        struct {
            RadixSmem<kHsThreads> rs;
            unsigned long long sel[kHeadMaxTopK];
        } fb;  // exact fallback
    } u;
    double wmax[kHsWarps], wse[kHsWarps], wsel[kHsWarps];
    uint32_t wabove[kHsWarps];
    uint32_t ncand, nhot;
    uint16_t hot[kHsThreads];
};
static_assert(sizeof(HsSmem) <= 48 * 1024, "static shared memory");

// Logits 4q .. 4q + 3 of a row of V (NaN past the end; nothing is read there).
__device__ __forceinline__ float4 hs_load_group(const float* __restrict__ row, int64_t V, int64_t q,
                                                bool vec) {
    const int64_t i = q * 4;
    if (vec && i + 4 <= V) return __ldg(reinterpret_cast<const float4*>(row + i));
    float4 x;
    x.x = i < V ? __ldg(row + i) : NAN;
    x.y = i + 1 < V ? __ldg(row + i + 1) : NAN;
    x.z = i + 2 < V ? __ldg(row + i + 2) : NAN;
    x.w = i + 3 < V ? __ldg(row + i + 3) : NAN;
    return x;
}
__device__ __forceinline__ float hs_elem(const float4& x, int c) {
    return c == 0 ? x.x : c == 1 ? x.y : c == 2 ? x.z : x.w;
}

// Descending bitonic sort of a[0, P) in shared memory, P a power of two. All threads call it; it
// starts and ends with a barrier.
__device__ void hs_bitonic_desc(unsigned long long* a, int P) {
    const int tid = threadIdx.x;
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P; i += kHsThreads) {
                const int partner = i ^ stride;
                if (partner > i) {
                    const bool desc = (i & size) == 0;
                    const unsigned long long a0 = a[i], b0 = a[partner];
                    if ((a0 < b0) == desc) {
                        a[i] = b0;
                        a[partner] = a0;
                    }
                }
            }
            __syncthreads();
        }
}

// Writes the top-k from the first k entries of a sorted candidate array.
__device__ __forceinline__ void hs_write_sorted(const unsigned long long* a, const float* row, int k,
                                                int32_t* ids, float* vals) {
    for (int i = threadIdx.x; i < k; i += kHsThreads) {
        const uint32_t v = 0xffffffffu - static_cast<uint32_t>(a[i] & 0xffffffffull);
        ids[i] = static_cast<int32_t>(v);
        vals[i] = row[v];
    }
}

// The previous kernel's exact top-k over the whole row: radix select of the k-th key (4 digit
// passes), the ordered selection pass, a bitonic sort of the k selected. 1 <= k <= min(V, 1024).
__device__ void hs_topk_radix(const float* __restrict__ row, int64_t V, int k, HsSmem& sm, int32_t* ids,
                              float* vals) {
    auto key_at = [row](int64_t v) { return head_topk_key(row[v]); };
    uint32_t kth, n_gt;
    radix_select_kth<kHsThreads, 32>(V, static_cast<uint32_t>(k), key_at, sm.u.fb.rs, &kth, &n_gt);
    unsigned long long* cand = sm.u.fb.sel;
    auto emit = [cand, key_at](uint32_t pos, int64_t v) { cand[pos] = head_cand(key_at(v), v); };
    select_ordered<kHsThreads, kHsItems>(V, static_cast<uint32_t>(k), kth, n_gt, key_at, emit,
                                         sm.u.fb.rs.scan);
    int P = 1;
    while (P < k) P <<= 1;
    for (int i = k + static_cast<int>(threadIdx.x); i < P; i += kHsThreads) cand[i] = 0ull;
    hs_bitonic_desc(cand, P);
    hs_write_sorted(cand, row, k, ids, vals);
}

// logits F32 [R, V] (row r at logits + r * V, any 4-byte alignment), targets I32 [R] -> lse F64 [R],
// ent F64 [R], tl F32 [R], rank I32 [R], topk_ids I32 [R, k], topk_logit F32 [R, k]. grid = R.
__global__ void __launch_bounds__(kHsThreads, 2)
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
    const int64_t ngroups = (V + 3) / 4;
    const bool vec = (reinterpret_cast<uintptr_t>(row) & 15u) == 0;  // uniform
    if (tid == 0) {
        sm.ncand = 0;
        sm.nhot = 0;
    }

    // (1) the pass over the row
    float fmx = NAN;  // max of the numbers seen (fmaxf ignores NaN), NaN while none
    double m = -INFINITY, se = 0.0, sel = 0.0;
    uint32_t above = 0;
    for (int64_t q0 = 0; q0 < ngroups; q0 += static_cast<int64_t>(kHsThreads) * kHsUnroll) {
        float4 x[kHsUnroll];
#pragma unroll
        for (int u = 0; u < kHsUnroll; ++u) x[u] = hs_load_group(row, V, q0 + u * kHsThreads + tid, vec);
        float tm = NAN;
#pragma unroll
        for (int u = 0; u < kHsUnroll; ++u)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float l = hs_elem(x[u], c);  // NaN past the end: no effect on either
                tm = fmaxf(tm, l);
                above += l > tl ? 1u : 0u;
            }
        fmx = fmaxf(fmx, tm);
        // a tile that raises the running max (never an all-NaN tile) rescales the sums (by 0 from -inf)
        if (static_cast<double>(tm) > m) {
            const double s = exp(m - static_cast<double>(tm));
            se = __dmul_rn(se, s);
            sel = __dmul_rn(sel, s);
            m = tm;
        }
#pragma unroll
        for (int u = 0; u < kHsUnroll; ++u)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                if ((q0 + u * kHsThreads + tid) * 4 + c < V) {
                    const double l = hs_elem(x[u], c);
                    // -inf contributes 0 (as exp(-inf - max) does), also while m is still -inf
                    const double e = l == -INFINITY ? 0.0 : exp(l - m);
                    se += e;
                    sel = __fma_rn(e, l, sel);  // -inf: 0 * -inf = NaN, as in the CPU's sum
                }
            }
    }

    // (2) block results: max, rank count, fp64 sums (fixed trees)
    double wm = m;
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) wm = fmax(wm, __shfl_xor_sync(0xffffffffu, wm, off));
    const uint32_t wab = __reduce_add_sync(0xffffffffu, above);
    if (lane == 0) {
        sm.wmax[warp] = wm;
        sm.wabove[warp] = wab;
    }
    __syncthreads();
    double mx = sm.wmax[0];
    for (int w = 1; w < kHsWarps; ++w) mx = fmax(mx, sm.wmax[w]);
    // exp(m - mx): 1 for the threads holding the max; NaN where mx is +-inf (then se is NaN, as the
    // CPU's exp(inf - inf) or exp(-inf - -inf) makes it)
    const double sc = exp(m - mx);
    double a = __dmul_rn(se, sc), b = __dmul_rn(sel, sc);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, off);
        b += __shfl_xor_sync(0xffffffffu, b, off);
    }
    if (lane == 0) {
        sm.wse[warp] = a;
        sm.wsel[warp] = b;
    }
    __syncthreads();
    if (tid == 0) {
        double s0 = 0.0, s1 = 0.0;
        uint32_t n_above = 0;
        for (int w = 0; w < kHsWarps; ++w) {
            s0 += sm.wse[w];
            s1 += sm.wsel[w];
            n_above += sm.wabove[w];
        }
        const double lse = mx + log(s0);
        lse_out[r] = lse;
        ent_out[r] = lse - s1 / s0;
        tl_out[r] = tl;
        rank_out[r] = has_t ? static_cast<int32_t>(1 + n_above) : 0;
    }
    if (k <= 0) return;
    int32_t* ids = topk_ids + r * k;
    float* vals = topk_logit + r * k;

    // (3) top-k from the candidates >= T
    if (k <= kHsThreads) {
        const uint32_t kmx = head_topk_key(fmx);
        uint32_t T = 0;  // the largest T with #{threads: kmx >= T} >= k
        for (int bit = 31; bit >= 0; --bit) {
            const uint32_t c = T | (1u << bit);
            if (__syncthreads_count(kmx >= c) >= k) T = c;
        }
        if (kmx >= T) sm.hot[atomicAdd(&sm.nhot, 1u)] = static_cast<uint16_t>(tid);
        __syncthreads();
        const uint32_t nhot = sm.nhot;
        const uint32_t per = static_cast<uint32_t>((ngroups + kHsThreads - 1) / kHsThreads);
        const uint32_t items = nhot * per;  // (hot thread, its g-th group) pairs, spread over the block
        volatile uint32_t* ncand_v = &sm.ncand;
        for (uint32_t j0 = 0; j0 < items; j0 += kHsThreads * kHsUnroll) {
            if (*ncand_v > static_cast<uint32_t>(kHsCandCap)) break;  // overflowed: the fallback runs
            int64_t q[kHsUnroll];
            float4 x[kHsUnroll];
#pragma unroll
            for (int u = 0; u < kHsUnroll; ++u) {
                const uint32_t j = j0 + u * kHsThreads + tid;
                q[u] = j < items ? sm.hot[j % nhot] + static_cast<int64_t>(j / nhot) * kHsThreads : ngroups;
                x[u] = hs_load_group(row, V, q[u], vec);
            }
#pragma unroll
            for (int u = 0; u < kHsUnroll; ++u)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int64_t v = q[u] * 4 + c;
                    if (v < V) {
                        const uint32_t key = head_topk_key(hs_elem(x[u], c));
                        if (key >= T) {
                            const uint32_t p = atomicAdd(&sm.ncand, 1u);
                            if (p < static_cast<uint32_t>(kHsCandCap)) sm.u.cand[p] = head_cand(key, v);
                        }
                    }
                }
        }
        __syncthreads();
        const uint32_t nc = sm.ncand;  // >= k by construction; every entry written when <= the cap
        if (nc <= static_cast<uint32_t>(kHsCandCap) && nc >= static_cast<uint32_t>(k)) {
            if (nc <= static_cast<uint32_t>(kHsThreads)) {
                // the entries are distinct: an entry's rank = the number of larger entries
                if (static_cast<uint32_t>(tid) < nc) {
                    const unsigned long long mine = sm.u.cand[tid];
                    uint32_t rk = 0;
                    for (uint32_t j = 0; j < nc; ++j) rk += sm.u.cand[j] > mine ? 1u : 0u;
                    if (rk < static_cast<uint32_t>(k)) {
                        const uint32_t v = 0xffffffffu - static_cast<uint32_t>(mine & 0xffffffffull);
                        ids[rk] = static_cast<int32_t>(v);
                        vals[rk] = row[v];
                    }
                }
            } else {
                int P = 1;
                while (P < static_cast<int>(nc)) P <<= 1;
                for (int i = static_cast<int>(nc) + tid; i < P; i += kHsThreads) sm.u.cand[i] = 0ull;
                hs_bitonic_desc(sm.u.cand, P);
                hs_write_sorted(sm.u.cand, row, k, ids, vals);
            }
            return;  // uniform: nc is the same in every thread
        }
        __syncthreads();  // the candidate list's memory becomes the fallback's
    }
    hs_topk_radix(row, V, k, sm, ids, vals);
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
