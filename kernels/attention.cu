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
// One CTA per (query row, group of 16 heads): 8 warps, 256 threads. The reference runs one CTA per
// query with all 64 heads (it has 227 KB of shared memory on Hopper); sm_86 has 99 KB per block, so
// the 64 x hd K tile (66.5 KB with padding) plus the group's Q (16.6 KB) fill one CTA and the 64
// heads take 4 CTAs, each gathering the row's KV tiles itself (4 reads of the 640 KB of a 640-slot
// row; the CTAs of one row are launched next to each other, so the repeats mostly hit L2).
//
// Per 64-slot tile (slots t0..t0+63, slots past n_idx count as -1; all-empty tiles are skipped, which
// is numerically inert, docs/MODEL.md 6.4):
//   1. slot -> row pointer (null = empty); cp.async gather of the 64 rows into k_s (zeros if empty).
//   2. S[16 heads, 64 slots]: warp w computes slots 8w..8w+7 over all hd (one m16n8 tile, hd/16 MMAs
//      chained in k order), then S *= scale in fp32; empty slots -inf.
//   3. Softmax step per head (16 threads per head, 4 slots each): tile max by butterfly (max is
//      exact), M_new = max(M, tile max), p = expf(S - M_new) in fp32, bf16(p) staged for the PV MMA;
//      one thread per head sums the 64 fp32 p sequentially (slot order) and updates
//      sum = sum * alpha + tsum (alpha = expf(M - M_new)), as the CPU reference.
//   4. PV: warp w owns output dims w*hd/8.., one n8 tile at a time: pv = P(bf16) . V over the 64
//      slots (4 chained MMAs, V fragments by ldmatrix.trans from the same k_s), then
//      acc = acc * alpha + pv (two fp32 roundings, as the CPU reference).
// After the last tile: sum += expf(sink - M) (raw, unscaled sink logit), o = bf16(acc / sum).
constexpr int kSaTile = 64;
constexpr int kSaHeads = 16;
constexpr int kSaWarps = 8;
constexpr int kSaThreads = kSaWarps * 32;

template <int HD>
struct SaLayout {
    static constexpr int KS = HD + 8;       // bf16 row stride of k_s and q_s (ldmatrix / lds conflict-free)
    static constexpr int SS = kSaTile + 4;  // f32 row stride of s_s
    static constexpr int PS = kSaTile + 8;  // bf16 row stride of p_s
    static constexpr size_t k_off = 0;      // bf16 [64][KS]
    static constexpr size_t q_off = k_off + size_t(kSaTile) * KS * 2;              // bf16 [16][KS]
    static constexpr size_t s_off = q_off + size_t(kSaHeads) * KS * 2;             // f32 [16][SS]
    static constexpr size_t p_off = s_off + size_t(kSaHeads) * SS * 4;             // bf16 [16][PS]
    static constexpr size_t row_off = p_off + size_t(kSaHeads) * PS * 2;           // row pointers [64]
    static constexpr size_t stat_off = row_off + size_t(kSaTile) * sizeof(void*);  // f32 [4][16]
    static constexpr size_t bytes = stat_off + 4 * kSaHeads * sizeof(float);
    static_assert(q_off % 16 == 0 && s_off % 16 == 0 && p_off % 16 == 0 && row_off % 16 == 0,
                  "smem alignment");
};

template <int HD>
__global__ void __launch_bounds__(kSaThreads, 1)
    sparse_attn_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ win_kv,
                       const uint16_t* __restrict__ cmp_kv, const float* __restrict__ sink,
                       const int32_t* __restrict__ idx, uint16_t* __restrict__ o, int64_t H, int64_t s,
                       int64_t T, int64_t n_idx, float scale, int64_t groups) {
    using L = SaLayout<HD>;
    constexpr int KS = L::KS, SS = L::SS, PS = L::PS;
    constexpr int KSTEPS = HD / 16;
    constexpr int DW = HD / kSaWarps;  // output dims per warp
    constexpr int NTW = DW / 8;        // n8 tiles per warp in the PV product
    constexpr int C8 = HD / 8;         // 16-byte chunks per row
    static_assert(HD % 64 == 0, "head dim");
    extern __shared__ __align__(16) uint8_t smem[];
    uint16_t* k_s = reinterpret_cast<uint16_t*>(smem + L::k_off);
    uint16_t* q_s = reinterpret_cast<uint16_t*>(smem + L::q_off);
    float* s_s = reinterpret_cast<float*>(smem + L::s_off);
    uint16_t* p_s = reinterpret_cast<uint16_t*>(smem + L::p_off);
    const uint16_t** rows_s = reinterpret_cast<const uint16_t**>(smem + L::row_off);
    float* m_s = reinterpret_cast<float*>(smem + L::stat_off);  // running max per head
    float* mnew_s = m_s + kSaHeads;                             // this tile's new max
    float* sum_s = mnew_s + kSaHeads;                           // running denominator
    float* alpha_s = sum_s + kSaHeads;                          // this tile's rescale factor

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int64_t r = static_cast<int64_t>(blockIdx.x) / groups;
    const int64_t h0 = (static_cast<int64_t>(blockIdx.x) % groups) * kSaHeads;

    for (int c = tid; c < kSaHeads * C8; c += kSaThreads) {
        const int hr = c / C8, col = c % C8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (h0 + hr < H) v = *reinterpret_cast<const uint4*>(q + ((r * H + h0 + hr) * HD + col * 8));
        *reinterpret_cast<uint4*>(&q_s[hr * KS + col * 8]) = v;
    }
    if (tid < kSaHeads) {
        m_s[tid] = -1e30f;  // finite seed: an all-empty row ends with zeros, not NaN (docs/MODEL.md 5.4)
        sum_s[tid] = 0.0f;
    }
    float acc[NTW][4];
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.0f;

    const int32_t* irow = idx + r * n_idx;
    for (int64_t t0 = 0; t0 < n_idx; t0 += kSaTile) {
        __syncthreads();  // the previous tile's reads of k_s / p_s / rows_s / alpha_s are done
        int any = 0;
        if (tid < kSaTile) {
            const int64_t slot = t0 + tid;
            const int64_t j = slot < n_idx ? irow[slot] : -1;
            const uint16_t* p = nullptr;
            if (j >= 0 && j < s)
                p = win_kv + j * HD;
            else if (j >= s && j < s + T)
                p = cmp_kv + (j - s) * HD;
            rows_s[tid] = p;
            any = p != nullptr;
        }
        if (!__syncthreads_or(any)) continue;  // uniform: an all-empty tile changes nothing

        for (int c = tid; c < kSaTile * C8; c += kSaThreads) {
            const int row = c / C8, col = c % C8;
            const uint16_t* p = rows_s[row];
            uint16_t* dst = &k_s[row * KS + col * 8];
            if (p)
                cp_async16(dst, p + col * 8, 16);
            else
                *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();

        // S for slots 8*warp .. 8*warp + 7
        {
            float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
            for (int ks = 0; ks < KSTEPS; ++ks) {
                uint32_t a[4];
                const uint16_t* qa = &q_s[g * KS + ks * 16 + 2 * qd];
                a[0] = ld_shared_u32(qa);
                a[1] = ld_shared_u32(qa + 8 * KS);
                a[2] = ld_shared_u32(qa + 8);
                a[3] = ld_shared_u32(qa + 8 * KS + 8);
                const uint16_t* kp = &k_s[(warp * 8 + g) * KS + ks * 16 + 2 * qd];
                mma_bf16_16816(c4, a, ld_shared_u32(kp), ld_shared_u32(kp + 8));
            }
            const int key = warp * 8 + 2 * qd;
            const bool v0 = rows_s[key] != nullptr, v1 = rows_s[key + 1] != nullptr;
            s_s[g * SS + key] = v0 ? __fmul_rn(c4[0], scale) : -INFINITY;
            s_s[g * SS + key + 1] = v1 ? __fmul_rn(c4[1], scale) : -INFINITY;
            s_s[(g + 8) * SS + key] = v0 ? __fmul_rn(c4[2], scale) : -INFINITY;
            s_s[(g + 8) * SS + key + 1] = v1 ? __fmul_rn(c4[3], scale) : -INFINITY;
        }
        __syncthreads();

        // softmax step: head h = tid / 16, slots 4 * (tid % 16) ..
        {
            const int h = tid >> 4, sub = tid & 15;
            float sv[4], tmax = -INFINITY;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                sv[e] = s_s[h * SS + sub * 4 + e];
                tmax = fmaxf(tmax, sv[e]);
            }
#pragma unroll
            for (int off = 8; off >= 1; off >>= 1)
                tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            const float mnew = fmaxf(m_s[h], tmax);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = expf(sv[e] - mnew);  // empty slot: expf(-inf) = 0
                s_s[h * SS + sub * 4 + e] = p;
                p_s[h * PS + sub * 4 + e] = f32_to_bf16_bits(p);  // probabilities rounded before PV
            }
            if (sub == 0) mnew_s[h] = mnew;
        }
        __syncthreads();
        if (tid < kSaHeads) {
            float tsum = 0.0f;
            for (int i = 0; i < kSaTile; ++i) tsum = __fadd_rn(tsum, s_s[tid * SS + i]);
            const float alpha = expf(m_s[tid] - mnew_s[tid]);
            sum_s[tid] = __fadd_rn(__fmul_rn(sum_s[tid], alpha), tsum);
            m_s[tid] = mnew_s[tid];
            alpha_s[tid] = alpha;
        }
        __syncthreads();

        // acc = acc * alpha + P . V for dims warp * DW ..
        {
            const float al0 = alpha_s[g], al1 = alpha_s[g + 8];
#pragma unroll
            for (int nt = 0; nt < NTW; ++nt) {
                const int n0 = warp * DW + nt * 8;
                float pv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kk = 0; kk < kSaTile / 16; ++kk) {
                    uint32_t a[4];
                    const uint16_t* pa = &p_s[g * PS + kk * 16 + 2 * qd];
                    a[0] = ld_shared_u32(pa);
                    a[1] = ld_shared_u32(pa + 8 * PS);
                    a[2] = ld_shared_u32(pa + 8);
                    a[3] = ld_shared_u32(pa + 8 * PS + 8);
                    uint32_t b0, b1;
                    ldmatrix_x2_trans(b0, b1, &k_s[(kk * 16 + (lane & 15)) * KS + n0]);
                    mma_bf16_16816(pv, a, b0, b1);
                }
                acc[nt][0] = __fadd_rn(__fmul_rn(acc[nt][0], al0), pv[0]);
                acc[nt][1] = __fadd_rn(__fmul_rn(acc[nt][1], al0), pv[1]);
                acc[nt][2] = __fadd_rn(__fmul_rn(acc[nt][2], al1), pv[2]);
                acc[nt][3] = __fadd_rn(__fmul_rn(acc[nt][3], al1), pv[3]);
            }
        }
    }
    __syncthreads();
    if (tid < kSaHeads && h0 + tid < H)
        sum_s[tid] = __fadd_rn(sum_s[tid], expf(sink[h0 + tid] - m_s[tid]));  // sink: raw logit, no value
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < NTW; ++nt) {
        const int d = warp * DW + nt * 8 + 2 * qd;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int hr = g + 8 * half;
            if (h0 + hr >= H) continue;
            const float den = sum_s[hr];
            const uint16_t v0 = f32_to_bf16_bits(acc[nt][2 * half] / den);
            const uint16_t v1 = f32_to_bf16_bits(acc[nt][2 * half + 1] / den);
            *reinterpret_cast<uint32_t*>(o + (r * H + h0 + hr) * HD + d) = pack_bf16x2(v0, v1);
        }
    }
}

template <int HD>
cudaError_t launch_sa(const uint16_t* q, const uint16_t* win_kv, const uint16_t* cmp_kv, const float* sink,
                      const int32_t* idx, uint16_t* o, int64_t m, int64_t H, int64_t s, int64_t T,
                      int64_t n_idx, float scale, cudaStream_t stream) {
    const size_t bytes = SaLayout<HD>::bytes;
    cudaError_t err = cudaFuncSetAttribute(
        sparse_attn_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
    const int64_t groups = (H + kSaHeads - 1) / kSaHeads;
    sparse_attn_kernel<HD><<<static_cast<unsigned>(m * groups), kSaThreads, bytes, stream>>>(
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

size_t sparse_attn_smem_bytes(int64_t hd) {
    switch (hd) {
        case 64:
            return SaLayout<64>::bytes;
        case 128:
            return SaLayout<128>::bytes;
        case 256:
            return SaLayout<256>::bytes;
        case 512:
            return SaLayout<512>::bytes;
        default:
            return 0;
    }
}

cudaError_t launch_sparse_attn(const uint16_t* q, const uint16_t* win_kv, const uint16_t* cmp_kv,
                               const float* sink, const int32_t* idx, uint16_t* o, int64_t m, int64_t H,
                               int64_t hd, int64_t s, int64_t T, int64_t n_idx, float scale,
                               cudaStream_t stream) {
    if (m == 0 || H == 0) return cudaSuccess;
    switch (hd) {
        case 64:
            return launch_sa<64>(q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream);
        case 128:
            return launch_sa<128>(q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream);
        case 256:
            return launch_sa<256>(q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream);
        case 512:
            return launch_sa<512>(q, win_kv, cmp_kv, sink, idx, o, m, H, s, T, n_idx, scale, stream);
        default:
            return cudaErrorInvalidValue;
    }
}

}  // namespace ds4r::kern
