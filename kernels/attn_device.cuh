// Device building blocks shared by the indexer, sparse-attention and output-head kernels
// (kernels/indexer.cu, attention.cu, head.cu): warp-level bf16 tensor-core MMA (m16n8k16, fp32
// accumulate), ldmatrix, cp.async, a deterministic block-wide prefix scan, CUDA torch.topk's order
// keys, an exact radix select of the K-th largest key and the ordered (ties by ascending index)
// selection pass. Portable sm_80+ instructions only. CUDA headers and common.cuh only.
#pragma once

#include <stdint.h>

#include "common.cuh"

// Nested namespace: kernels/gemm_tile.cuh has wrappers of the same names in ds4r::kern::gemm.
namespace ds4r::kern::attn {

// ------------------------------------------------------------------ tensor-core primitives
// D = A (16x16 bf16, row) * B (16x8 bf16, col) + C (fp32). Fragment layout (PTX ISA, m16n8k16):
// g = lane / 4, q = lane % 4; a0: (g, 2q..2q+1), a1: (g+8, 2q..), a2: (g, 2q+8..), a3: (g+8, 2q+8..);
// b0: (k = 2q..2q+1, n = g), b1: (k = 2q+8.., n = g); c0,c1: (g, 2q..2q+1), c2,c3: (g+8, 2q..).
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p))
                 : "memory");
}
// Two transposed 8x8 b16 matrices (lanes 0-15 supply the row addresses; 16-31 must be valid too).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(smem_addr(p))
                 : "memory");
}

// 16-byte global -> shared asynchronous copy; src_bytes = 0 writes 16 zero bytes (src not read).
__device__ __forceinline__ void cp_async16(void* smem_dst, const void* gmem_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t ld_shared_u32(const uint16_t* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}
// The A fragment of an m16n8k16 bf16 MMA from a row-major bf16 tile in shared memory: p points at element
// (row g, column 2 qd) of the 16 x 16 block (g = lane / 4, qd = lane % 4), stride = the tile's row pitch
// in elements: rows g / g + 8, columns 2 qd / 2 qd + 8 (PTX ISA, mma.m16n8k16 A fragment).
__device__ __forceinline__ void ld_a_frag(uint32_t (&a)[4], const uint16_t* p, int stride) {
    a[0] = ld_shared_u32(p);
    a[1] = ld_shared_u32(p + 8 * stride);
    a[2] = ld_shared_u32(p + 8);
    a[3] = ld_shared_u32(p + 8 * stride + 8);
}
__device__ __forceinline__ uint32_t pack_bf16x2(uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// ------------------------------------------------------------------ order keys (docs/MODEL.md 8.1)
// CUDA torch.topk's radix keys: larger key = larger value, NaN largest, -0 < +0 (distinct).
__device__ __forceinline__ uint32_t bf16_topk_key(uint16_t x) {
    if ((x & 0x7fffu) > 0x7f80u) return 0xffffu;
    return (x & 0x8000u) ? (~static_cast<uint32_t>(x) & 0xffffu) : (static_cast<uint32_t>(x) | 0x8000u);
}
constexpr uint32_t kBf16KeyNegInf = 0x007fu;  // bf16_topk_key(-inf)
constexpr uint32_t kBf16KeyPosInf = 0xff80u;  // bf16_topk_key(+inf)
constexpr uint32_t kBf16KeyNaN = 0xffffu;
constexpr uint16_t kBf16NegInfBits = 0xff80u;

// ------------------------------------------------------------------ block-wide scan
// Exclusive prefix sum of v over the NT threads of the block in thread order (fixed order, exact
// integer arithmetic: deterministic). *total = the sum over the block. ws: shared, >= NT / 32
// entries. Every thread of the block must call it (it synchronizes).
template <int NT>
__device__ __forceinline__ uint64_t block_exclusive_scan(uint64_t v, uint64_t* ws, uint64_t* total) {
    static_assert(NT % 32 == 0 && NT <= 1024, "block size");
    constexpr int NW = NT / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const uint64_t y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) ws[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint64_t w = lane < NW ? ws[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const uint64_t y = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += y;
        }
        if (lane < NW) ws[lane] = w;
    }
    __syncthreads();
    const uint64_t prefix = warp > 0 ? ws[warp - 1] : 0;
    *total = ws[NW - 1];
    __syncthreads();  // ws may be reused by the caller right away
    return prefix + x - v;
}

// ------------------------------------------------------------------ exact radix select
// Shared scratch of the radix select (per-warp histograms keep smem atomics uncontended; the
// counts are integers, so their order of arrival does not matter).
template <int NT>
struct RadixSmem {
    uint32_t whist[NT / 32][256];
    uint64_t scan[32];
    uint32_t digit, above;
};

// The K-th largest of n keys of BITS bits (16 or 32) produced by key_at(i), 1 <= K <= n:
// *kth = that key, *n_gt = the number of keys strictly greater. 8-bit digits from the top; each
// digit pass histograms the keys that match the prefix found so far. Every thread must call it;
// results are the same in every thread.
template <int NT, int BITS, class KeyAt>
__device__ void radix_select_kth(int64_t n, uint32_t K, KeyAt key_at, RadixSmem<NT>& sm, uint32_t* kth,
                                 uint32_t* n_gt) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t prefix = 0, prefix_mask = 0, above = 0, remaining = K;
    for (int shift = BITS - 8; shift >= 0; shift -= 8) {
        for (int i = tid; i < (NT / 32) * 256; i += NT) (&sm.whist[0][0])[i] = 0;
        __syncthreads();
        for (int64_t base = 0; base < n; base += NT) {
            const int64_t i = base + tid;
            uint32_t bin = 0xffffffffu;  // no bin
            if (i < n) {
                const uint32_t k = key_at(i);
                if ((k & prefix_mask) == prefix) bin = (k >> shift) & 0xffu;
            }
            // warp-aggregated increment: one atomic per distinct bin in the warp
            const uint32_t peers = __match_any_sync(0xffffffffu, bin);
            if (bin != 0xffffffffu && lane == __ffs(peers) - 1)
                atomicAdd(&sm.whist[warp][bin], __popc(peers));
        }
        __syncthreads();
        // thread t holds the count of bin 255 - t (descending key order); scan finds the bin where
        // the running count from the top reaches `remaining`.
        uint32_t h = 0;
        if (tid < 256)
            for (int w = 0; w < NT / 32; ++w) h += sm.whist[w][255 - tid];
        uint64_t tot;
        const uint64_t excl = block_exclusive_scan<NT>(h, sm.scan, &tot);
        if (tid < 256 && excl < remaining && excl + h >= remaining) {
            sm.digit = 255u - static_cast<uint32_t>(tid);
            sm.above = static_cast<uint32_t>(excl);
        }
        __syncthreads();
        const uint32_t digit = sm.digit, ab = sm.above;
        __syncthreads();  // sm.digit / whist reused by the next pass
        above += ab;
        remaining -= ab;
        prefix |= digit << shift;
        prefix_mask |= 0xffu << shift;
    }
    *kth = prefix;
    *n_gt = above;
}

// The CUDA torch.topk selection of K keys given the K-th key (radix_select_kth): every key > kth,
// then the first (K - n_gt) keys == kth in ascending index order. Calls emit(pos, i) for each
// selected index i, where pos in [0, K) is its rank among the selected in ascending index order.
// ITEMS contiguous indices per thread per step; block-wide scans in index order (deterministic).
// Every thread must call it.
template <int NT, int ITEMS, class KeyAt, class Emit>
__device__ void select_ordered(int64_t n, uint32_t K, uint32_t kth, uint32_t n_gt, KeyAt key_at, Emit emit,
                               uint64_t* scan_ws) {
    const uint64_t need = K - n_gt;  // ties to take (>= 1 when K >= 1)
    uint64_t run_gt = 0, run_tie = 0;
    for (int64_t base = 0; base < n; base += static_cast<int64_t>(NT) * ITEMS) {
        const int64_t start = base + static_cast<int64_t>(threadIdx.x) * ITEMS;
        uint32_t keys[ITEMS];
        uint32_t gt = 0, tie = 0;
#pragma unroll
        for (int e = 0; e < ITEMS; ++e) {
            keys[e] = 0;
            if (start + e < n) {
                keys[e] = key_at(start + e);
                gt += keys[e] > kth ? 1u : 0u;
                tie += keys[e] == kth ? 1u : 0u;
            }
        }
        uint64_t total;
        const uint64_t excl =
            block_exclusive_scan<NT>((static_cast<uint64_t>(gt) << 32) | tie, scan_ws, &total);
        uint64_t g = run_gt + (excl >> 32), t = run_tie + (excl & 0xffffffffu);
#pragma unroll
        for (int e = 0; e < ITEMS; ++e) {
            if (start + e >= n) break;
            if (keys[e] > kth) {
                emit(static_cast<uint32_t>(g + (t < need ? t : need)), start + e);
                ++g;
            } else if (keys[e] == kth) {
                if (t < need) emit(static_cast<uint32_t>(g + t), start + e);
                ++t;
            }
        }
        run_gt += total >> 32;
        run_tie += total & 0xffffffffu;
        if (run_gt + (run_tie < need ? run_tie : need) >= K) break;  // uniform: all K emitted
    }
}

}  // namespace ds4r::kern::attn
