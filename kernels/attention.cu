// Attention kernels (docs/MODEL.md 4.6 b-d, 5.4, 6.4). See attention.cuh for the contracts.
#include "attention.cuh"
#include "attn_device.cuh"
#include "common.cuh"

namespace ds4r::kern {

namespace {

using namespace ds4r::kern::attn;

__global__ void attn_indices_kernel(const int32_t* __restrict__ qpos, int64_t m, int64_t window, int64_t W,
                                    const int32_t* __restrict__ topk, int64_t kc, int32_t* __restrict__ idx) {
    const int64_t n = W + kc, total = m * n;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / n, c = i - r * n;
        if (c < W) {
            // model.py get_window_topk_idxs: start = max(p - window + 1, 0), -1 past the query itself
            const int64_t p = qpos[r];
            const int64_t start = p - window + 1 > 0 ? p - window + 1 : 0;
            const int64_t j = start + c;
            idx[i] = j > p ? -1 : static_cast<int32_t>(j);
        } else {
            idx[i] = topk[r * kc + (c - W)];
        }
    }
}

// ------------------------------------------------------------------ sparse attention
// ------------------------------------------------------------------ sparse attention
// One CTA per (query row, group of HG heads), NW warps. The reference runs one CTA per query with all
// 64 heads (it has 227 KB of shared memory on Hopper). Two shapes of the same algorithm:
//   - HG = 16, 8 warps, one K tile (the portable kernels): sm_86 has 99 KB per block, so the 64 x hd K
//     tile (66.5 KB with padding) plus the group's Q (16.6 KB) fill one CTA and the 64 heads take 4
//     CTAs, each gathering the row's KV tiles itself (4 reads of the 640 KB of a 640-slot row; the CTAs
//     of one row are launched next to each other, so the repeats mostly hit L2);
//   - HG = 64, 8 warps, two K tiles (the Hopper kernel set, up to 223 KB): one gather per row, the next
//     tile's gather in flight while this one is computed, and 4 independent S chains per warp (one Q
//     fragment feeding 4 K fragments) instead of 1.
// Both load a warp's P fragments once per tile for all its PV tiles (SaCfg::WPM, PNT).
// Every output element's operations are the same in both (the MMA chains, their order, the softmax
// steps), so they give the same bits (CudaAttention.SparseAttnWideCtaGivesTheNarrowBits).
//
// Per 64-slot tile (slots t0..t0+63, slots past n_idx count as -1; all-empty tiles are skipped, which
// is numerically inert, docs/MODEL.md 6.4):
//   1. slot -> row pointer (null = empty); cp.async gather of the 64 rows into k_s (zeros if empty).
//   2. S[heads, 64 slots]: one m16n8 tile (16 heads x 8 slots) at a time over all hd (hd/16 MMAs chained
//      in k order), then S *= scale in fp32; empty slots -inf.
//   3. Softmax step per head (TPH threads per head, 64 / TPH slots each): tile max by butterfly (max is
//      exact), M_new = max(M, tile max), p = expf(S - M_new) in fp32, bf16(p) staged for the PV MMA;
//      one thread per head sums the 64 fp32 p sequentially (slot order) and updates
//      sum = sum * alpha + tsum (alpha = expf(M - M_new)), as the CPU reference.
//   4. PV: warp w owns one m16 head tile and a range of output dims (SaCfg::WPM, PNT), one m16n8 tile at
//      a time: pv = P(bf16) . V over the 64 slots (4 chained MMAs from the warp's P fragments, loaded once
//      per tile; V fragments by ldmatrix.trans from the same k_s), then acc = acc * alpha + pv (two fp32
//      roundings, as the CPU reference).
// After the last tile: sum += expf(sink - M) (raw, unscaled sink logit), o = bf16(acc / sum).
constexpr int kSaTile = 64;

template <int HD, int HG, int NW, bool kPipe>
struct SaCfg {
    static constexpr int kThreads = NW * 32;
    static constexpr bool kPipelined = kPipe;
    static constexpr int kBufs = kPipe ? 2 : 1;          // K tiles (and their row pointers) in shared memory
    static constexpr int MT = HG / 16;                   // m16 head tiles
    static constexpr int STW = MT * (kSaTile / 8) / NW;  // S tiles (m16 x n8) per warp
    // PV: warp w owns the head m-tile w / WPM and n8 tiles (w % WPM) * PNT .. of the output dims, so that
    // it loads its P fragments once per tile and each V fragment feeds one MMA
    static constexpr int WPM = NW / MT;        // PV warps per head m-tile
    static constexpr int PNT = HD / 8 / WPM;   // PV n8 tiles (8 output dims each) per warp
    static constexpr int TPH = kThreads / HG;  // softmax threads per head
    static constexpr int SPT = kSaTile / TPH;  // softmax slots per thread
    static_assert(HG % 16 == 0 && HD % 64 == 0, "head group, head dim");
    static_assert(STW >= 1 && STW * NW == MT * (kSaTile / 8) && 8 % STW == 0,
                  "S tiles split evenly over the warps, each warp's in one m16 head tile");
    static_assert(WPM >= 1 && WPM * MT == NW && PNT >= 1 && PNT * 8 * WPM == HD,
                  "PV tiles split evenly over the warps");
    static_assert(TPH >= 1 && TPH <= 32 && (TPH & (TPH - 1)) == 0 && SPT * TPH == kSaTile, "softmax split");
    static constexpr int KS = HD + 8;       // bf16 row stride of k_s and q_s (ldmatrix / lds conflict-free)
    static constexpr int SS = kSaTile + 4;  // f32 row stride of s_s
    static constexpr int PS = kSaTile + 8;  // bf16 row stride of p_s
    static constexpr size_t k_off = 0;      // bf16 [kBufs][64][KS]
    static constexpr size_t q_off = k_off + size_t(kBufs) * kSaTile * KS * 2;              // bf16 [HG][KS]
    static constexpr size_t s_off = q_off + size_t(HG) * KS * 2;                           // f32 [HG][SS]
    static constexpr size_t p_off = s_off + size_t(HG) * SS * 4;                           // bf16 [HG][PS]
    static constexpr size_t row_off = p_off + size_t(HG) * PS * 2;                         // [kBufs][64] rows
    static constexpr size_t stat_off = row_off + size_t(kBufs) * kSaTile * sizeof(void*);  // f32 [3][HG]
    static constexpr size_t bytes = stat_off + 3 * HG * sizeof(float);
    static_assert(q_off % 16 == 0 && s_off % 16 == 0 && p_off % 16 == 0 && row_off % 16 == 0,
                  "smem alignment");
};
// The portable shape (<= 99 KB for hd <= 512) and the Hopper one (8 warps: 16 warps at hd 512 spilled
// 572 bytes at their 128 registers, docs/PERFORMANCE.md, fourteenth session).
template <int HD>
using SaNarrow = SaCfg<HD, 16, 8, false>;
template <int HD>
using SaWide = SaCfg<HD, 64, 8, true>;

template <int HD, class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    sparse_attn_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ win_kv,
                       const uint16_t* __restrict__ cmp_kv, const float* __restrict__ sink,
                       const int32_t* __restrict__ idx, uint16_t* __restrict__ o, int64_t H, int64_t s,
                       int64_t T, int64_t n_idx, float scale, int64_t groups) {
    constexpr int HG = C::MT * 16, NT = C::kThreads;
    constexpr int KS = C::KS, SS = C::SS, PS = C::PS;
    constexpr int KSTEPS = HD / 16;
    constexpr int C8 = HD / 8;  // 16-byte chunks per row
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + C::q_off);
    float* s_s = reinterpret_cast<float*>(smem + C::s_off);
    uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + C::p_off);
    float* m_s = reinterpret_cast<float*>(smem + C::stat_off);  // running max per head
    float* sum_s = m_s + HG;                                    // running denominator
    float* alpha_s = sum_s + HG;                                // this tile's rescale factor
    auto k_buf = [&](int b) { return reinterpret_cast<uint16_t*>(smem + C::k_off) + b * kSaTile * KS; };
    auto rows_buf = [&](int b) {
        return reinterpret_cast<const uint16_t**>(smem + C::row_off) + b * kSaTile;
    };

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int64_t r = static_cast<int64_t>(blockIdx.x) / groups;
    const int64_t h0 = (static_cast<int64_t>(blockIdx.x) % groups) * HG;

    for (int c = tid; c < HG * C8; c += NT) {
        const int hr = c / C8, col = c % C8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (h0 + hr < H) v = *reinterpret_cast<const uint4*>(q + ((r * H + h0 + hr) * HD + col * 8));
        *reinterpret_cast<uint4*>(&q_s[hr * KS + col * 8]) = v;
    }
    if (tid < HG) {
        m_s[tid] = -1e30f;  // finite seed: an all-empty row ends with zeros, not NaN (docs/MODEL.md 5.4)
        sum_s[tid] = 0.0f;
    }
    // PV: this warp's head m-tile (heads 16 pmt + g, + 8) and first output dim
    const int pmt = warp / C::WPM, pn0 = (warp % C::WPM) * C::PNT * 8;
    float acc[C::PNT][4];
#pragma unroll
    for (int nt = 0; nt < C::PNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

    const int32_t* irow = idx + r * n_idx;
    // Tile t0's row pointers into rows buffer b and, when any slot is filled, its gather into K buffer b
    // (one cp.async group, committed either way). Contains a barrier; returns whether any slot is filled
    // (the same on every thread).
    auto stage = [&](int64_t t0, int b) {
        const uint16_t** rows = rows_buf(b);
        int any = 0;
        if (tid < kSaTile) {
            const int64_t slot = t0 + tid;
            const int64_t j = slot < n_idx ? irow[slot] : -1;
            const uint16_t* p = nullptr;
            if (j >= 0 && j < s)
                p = win_kv + j * HD;
            else if (j >= s && j < s + T)
                p = cmp_kv + (j - s) * HD;
            rows[tid] = p;
            any = p != nullptr;
        }
        const bool filled = __syncthreads_or(any) != 0;
        if (filled) {
            uint16_t* k_s = k_buf(b);
            for (int c = tid; c < kSaTile * C8; c += NT) {
                const int row = c / C8, col = c % C8;
                const uint16_t* p = rows[row];
                uint16_t* dst = &k_s[row * KS + col * 8];
                if (p)
                    cp_async16(dst, p + col * 8, 16);
                else
                    *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        cp_async_commit();
        return filled;
    };
    // One filled tile from K buffer b (its gather landed and is visible to every thread).
    auto compute = [&](int b) {
        const uint16_t* k_s = k_buf(b);
        const uint16_t* const* rows = rows_buf(b);
        // S: tiles warp * STW .. (m16 head tile i / 8, slots 8 * (i % 8) ..), chains interleaved
        {
            float c4[C::STW][4];
#pragma unroll
            for (int j = 0; j < C::STW; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) c4[j][e] = 0.0f;
            // the warp's tiles lie in one m16 head tile (STW divides 8): one Q fragment per k step feeds
            // all of them (loaded once, not once per tile: half the S phase's shared-memory reads)
            const int smt = warp * C::STW / 8;
#pragma unroll 4
            for (int ks = 0; ks < KSTEPS; ++ks) {
                uint32_t a[4];
                ld_a_frag(a, &q_s[(16 * smt + g) * KS + ks * 16 + 2 * qd], KS);
#pragma unroll
                for (int j = 0; j < C::STW; ++j) {
                    const int nt = (warp * C::STW + j) % 8;
                    const uint16_t* kp = &k_s[(nt * 8 + g) * KS + ks * 16 + 2 * qd];
                    mma_bf16_16816(c4[j], a, ld_shared_u32(kp), ld_shared_u32(kp + 8));
                }
            }
#pragma unroll
            for (int j = 0; j < C::STW; ++j) {
                const int i = warp * C::STW + j, mt = i / 8, nt = i % 8;
                const int key = nt * 8 + 2 * qd, h = 16 * mt + g;
                const bool v0 = rows[key] != nullptr, v1 = rows[key + 1] != nullptr;
                s_s[h * SS + key] = v0 ? __fmul_rn(c4[j][0], scale) : -INFINITY;
                s_s[h * SS + key + 1] = v1 ? __fmul_rn(c4[j][1], scale) : -INFINITY;
                s_s[(h + 8) * SS + key] = v0 ? __fmul_rn(c4[j][2], scale) : -INFINITY;
                s_s[(h + 8) * SS + key + 1] = v1 ? __fmul_rn(c4[j][3], scale) : -INFINITY;
            }
        }
        __syncthreads();

        // softmax step: head h = tid / TPH, slots SPT * (tid % TPH) .. (the head's TPH threads are
        // neighbouring lanes of one warp)
        {
            const int h = tid / C::TPH, sub = tid % C::TPH;
            float sv[C::SPT], tmax = -INFINITY;
#pragma unroll
            for (int e = 0; e < C::SPT; ++e) {
                sv[e] = s_s[h * SS + sub * C::SPT + e];
                tmax = fmaxf(tmax, sv[e]);
            }
#pragma unroll
            for (int off = C::TPH / 2; off >= 1; off >>= 1)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float m_old = m_s[h];
            const float mnew = fmaxf(m_old, tmax);
#pragma unroll
            for (int e = 0; e < C::SPT; ++e) {
                sv[e] = expf(sv[e] - mnew);  // empty slot: expf(-inf) = 0
                p_s[h * PS + sub * C::SPT + e] = f32_to_bf16_bits(sv[e]);  // probabilities rounded before PV
            }
            // The tile's sum of p in slot order, ((0 + p0) + p1) + ... + p63 (the order the per-head loop
            // over s_s had: the same bits), from registers: the head's threads take turns, each adding its
            // SPT slots to the running sum and passing it on by shuffle. No barrier, no shared memory.
            const int first = (tid & 31) & ~(C::TPH - 1);  // lane of the head's sub 0
            float tsum = 0.0f;
#pragma unroll
            for (int k = 0; k < C::TPH; ++k) {
                if (sub == k) {
#pragma unroll
                    for (int e = 0; e < C::SPT; ++e) tsum = __fadd_rn(tsum, sv[e]);
                }
                tsum = __shfl_sync(0xffffffffu, tsum, first + k);
            }
            __syncwarp();
            if (sub == 0) {
                const float alpha = expf(m_old - mnew);
                sum_s[h] = __fadd_rn(__fmul_rn(sum_s[h], alpha), tsum);
                m_s[h] = mnew;  // every thread of the head read m_s[h] before the shuffles above
                alpha_s[h] = alpha;
            }
        }
        __syncthreads();

        // acc = acc * alpha + P . V for heads 16 pmt + g (+ 8), dims pn0 ..
        {
            uint32_t pa[kSaTile / 16][4];  // the m-tile's P fragments, k16 steps kk = 0 .. 3
#pragma unroll
            for (int kk = 0; kk < kSaTile / 16; ++kk)
                ld_a_frag(pa[kk], &p_s[(16 * pmt + g) * PS + kk * 16 + 2 * qd], PS);
            const float al0 = alpha_s[16 * pmt + g], al1 = alpha_s[16 * pmt + g + 8];
#pragma unroll
            for (int nt = 0; nt < C::PNT; ++nt) {
                const int n0 = pn0 + nt * 8;
                float pv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kk = 0; kk < kSaTile / 16; ++kk) {
                    uint32_t b0, b1;
                    ldmatrix_x2_trans(b0, b1, &k_s[(kk * 16 + (lane & 15)) * KS + n0]);
                    mma_bf16_16816(pv, pa[kk], b0, b1);
                }
                acc[nt][0] = __fadd_rn(__fmul_rn(acc[nt][0], al0), pv[0]);
                acc[nt][1] = __fadd_rn(__fmul_rn(acc[nt][1], al0), pv[1]);
                acc[nt][2] = __fadd_rn(__fmul_rn(acc[nt][2], al1), pv[2]);
                acc[nt][3] = __fadd_rn(__fmul_rn(acc[nt][3], al1), pv[3]);
            }
        }
    };

    if constexpr (C::kPipelined) {
        // tile t + 1's gather into the other buffer is in flight while tile t is computed
        bool cur = stage(0, 0);
        int b = 0;
        for (int64_t t0 = 0; t0 < n_idx; t0 += kSaTile, b ^= 1) {
            bool next = false;
            if (t0 + kSaTile < n_idx)
                next = stage(t0 + kSaTile, b ^ 1);  // buffer b ^ 1's last reader (tile t - 1) is done
            else
                cp_async_commit();  // an empty group: "all but the newest group" is tile t's
            cp_async_wait<1>();
            __syncthreads();  // tile t's rows landed for every thread
            if (cur) compute(b);
            __syncthreads();  // tile t's reads of k_s / p_s / rows / alpha_s are done
            cur = next;
        }
    } else {
        for (int64_t t0 = 0; t0 < n_idx; t0 += kSaTile) {
            __syncthreads();              // the previous tile's reads of k_s / p_s / rows / alpha_s are done
            if (!stage(t0, 0)) continue;  // uniform: an all-empty tile changes nothing
            cp_async_wait<0>();
            __syncthreads();
            compute(0);
        }
    }
    __syncthreads();
    if (tid < HG && h0 + tid < H)
        sum_s[tid] = __fadd_rn(sum_s[tid], expf(sink[h0 + tid] - m_s[tid]));  // sink: raw logit, no value
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < C::PNT; ++nt) {
        const int d = pn0 + nt * 8 + 2 * qd;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int hr = 16 * pmt + g + 8 * half;
            if (h0 + hr >= H) continue;
            const float den = sum_s[hr];
            const uint16_t v0 = f32_to_bf16_bits(acc[nt][2 * half] / den);
            const uint16_t v1 = f32_to_bf16_bits(acc[nt][2 * half + 1] / den);
            *reinterpret_cast<uint32_t*>(o + (r * H + h0 + hr) * HD + d) = pack_bf16x2(v0, v1);
        }
    }
}

template <int HD, class C>
cudaError_t launch_sa(const uint16_t* q, const uint16_t* win_kv, const uint16_t* cmp_kv, const float* sink,
                      const int32_t* idx, uint16_t* o, int64_t m, int64_t H, int64_t s, int64_t T,
                      int64_t n_idx, float scale, cudaStream_t stream) {
    constexpr size_t bytes = C::bytes;
    cudaError_t err = cudaFuncSetAttribute(
        sparse_attn_kernel<HD, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
    constexpr int64_t kHeads = C::MT * 16;
    const int64_t groups = (H + kHeads - 1) / kHeads;
    sparse_attn_kernel<HD, C><<<static_cast<unsigned>(m * groups), C::kThreads, bytes, stream>>>(
        q, win_kv, cmp_kv, sink, idx, o, H, s, T, n_idx, scale, groups);
    return cudaGetLastError();
}
}  // namespace

cudaError_t launch_attn_indices(const int32_t* qpos, int64_t m, int64_t window, int64_t W,
                                const int32_t* topk, int64_t kc, int32_t* idx, cudaStream_t stream) {
    const int64_t total = m * (W + kc);
    if (total == 0) return cudaSuccess;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    attn_indices_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(
        qpos, m, window, W, topk, kc, idx);
    return cudaGetLastError();
}

bool sparse_attn_supported_dim(int64_t hd) {
    return hd == 64 || hd == 128 || hd == 256 || hd == 512;
}

int64_t sparse_attn_heads_per_cta(SparseAttnCta cta) {
    return cta == SparseAttnCta::Heads64 ? 64 : 16;
}

namespace {

// f.template run<HD, C>() for the runtime head dim and CTA shape; `fallback` where hd is not instantiated.
template <class R, class F>
R with_sa_cfg(int64_t hd, SparseAttnCta cta, R fallback, const F& f) {
    const bool wide = cta == SparseAttnCta::Heads64;
    switch (hd) {
        case 64:
            return wide ? f.template run<64, SaWide<64>>() : f.template run<64, SaNarrow<64>>();
        case 128:
            return wide ? f.template run<128, SaWide<128>>() : f.template run<128, SaNarrow<128>>();
        case 256:
            return wide ? f.template run<256, SaWide<256>>() : f.template run<256, SaNarrow<256>>();
        case 512:
            return wide ? f.template run<512, SaWide<512>>() : f.template run<512, SaNarrow<512>>();
        default:
            return fallback;
    }
}

struct SaBytes {
    template <int HD, class C>
    size_t run() const {
        return C::bytes;
    }
};

struct SaLaunch {
    const uint16_t *q, *win_kv, *cmp_kv;
    const float* sink;
    const int32_t* idx;
    uint16_t* o;
    int64_t m, H, s, T, n_idx;
    float scale;
    cudaStream_t stream;
    template <int HD, class C>
    cudaError_t run() const {
        return launch_sa<HD, C>(q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream);
    }
};

}  // namespace

size_t sparse_attn_smem_bytes(int64_t hd, SparseAttnCta cta) {
    return with_sa_cfg(hd, cta, size_t{0}, SaBytes{});
}

cudaError_t launch_sparse_attn(const uint16_t* q, const uint16_t* win_kv, const uint16_t* cmp_kv,
                               const float* sink, const int32_t* idx, uint16_t* o, int64_t m, int64_t H,
                               int64_t hd, int64_t s, int64_t T, int64_t n_idx, float scale,
                               cudaStream_t stream, SparseAttnCta cta) {
    if (m == 0 || H == 0) return cudaSuccess;
    return with_sa_cfg(hd, cta, cudaErrorInvalidValue,
                       SaLaunch{q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream});
}

}  // namespace ds4r::kern
