// Indexer kernels (docs/MODEL.md 4.6.2 steps 4-7, 8.1, 8.2). See indexer.cuh for the contracts.
#include "attn_device.cuh"
#include "common.cuh"
#include "indexer.cuh"

namespace ds4r::kern {

namespace {

using namespace ds4r::kern::attn;

// ------------------------------------------------------------------ index scores
// One CTA = 4 warps = 4 query rows (one per warp) x a chunk of 256 keys, walked in 4 tiles of 64.
// Per tile the 64 x ihd key tile is staged in shared memory (row stride ihd + 8 bf16: the 32-bit
// fragment loads of 8 rows x 4 column pairs hit 32 distinct banks) and each warp runs
// S[32 heads, 64 keys] = q_row[32, ihd] . K^T on the tensor cores (bf16 in, fp32 accumulate, the
// q fragments held in registers for the CTA's lifetime). The weighted values bf16(relu(bf16(S)) * w)
// go to a per-warp staging array; then lane c sums key c's heads in ascending order in fp32
// (docs/MODEL.md 8.2) and rounds once. Nothing depends on m or on the other rows of the CTA.
constexpr int kIsWarps = 4;
constexpr int kIsThreads = kIsWarps * 32;
constexpr int kIsTile = 64;
constexpr int kIsTilesPerCta = 4;
constexpr int kIsStageStride = kIsTile + 8;  // bf16; 36 words: conflict-free fragment stores

// relu(bf16(S)) * w rounded to bf16 (the product of two bf16 values is exact in fp32). relu keeps
// NaN and turns -0 into +0, as the CPU reference.
__device__ __forceinline__ uint16_t weighted_score(float s, float w) {
    float S = round_bf16(s);
    if (!(S > 0.0f) && !isnan(S)) S = 0.0f;
    return f32_to_bf16_bits(__fmul_rn(S, w));
}

template <int D>
__global__ void __launch_bounds__(kIsThreads)
    index_scores_kernel(const uint16_t* __restrict__ q, const uint16_t* __restrict__ k,
                        const uint16_t* __restrict__ w, const int32_t* __restrict__ qpos, int64_t m, int nh,
                        int64_t T, int ratio, uint16_t* __restrict__ score) {
    static_assert(D % 16 == 0 && D <= 128, "index head dim");
    constexpr int KS = D + 8;  // key tile row stride (bf16)
    constexpr int KSTEPS = D / 16;
    constexpr int MT = kIndexMaxHeads / 16;  // m16 tiles over the heads
    __shared__ __align__(16) uint16_t k_s[kIsTile * KS];
    __shared__ __align__(16) uint16_t st_s[kIsWarps][kIndexMaxHeads * kIsStageStride];
    __shared__ int64_t nt_s[kIsWarps];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, qd = lane & 3;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kIsWarps + warp;
    const bool row_ok = r < m;
    const int64_t n_t = row_ok ? (static_cast<int64_t>(qpos[r]) + 1) / ratio : 0;
    if (lane == 0) nt_s[warp] = n_t;

    // q fragments of this warp's row: a[mt][ks] covers heads mt*16.., dims ks*16..
    uint32_t a[MT][KSTEPS][4];
    float wv[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int h0 = mt * 16 + g, h1 = h0 + 8;
        const bool ok0 = row_ok && h0 < nh, ok1 = row_ok && h1 < nh;
        const uint16_t* q0 = q + (r * nh + h0) * D;
        const uint16_t* q1 = q + (r * nh + h1) * D;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            const int d0 = ks * 16 + 2 * qd;
            a[mt][ks][0] = ok0 ? *reinterpret_cast<const uint32_t*>(q0 + d0) : 0u;
            a[mt][ks][1] = ok1 ? *reinterpret_cast<const uint32_t*>(q1 + d0) : 0u;
            a[mt][ks][2] = ok0 ? *reinterpret_cast<const uint32_t*>(q0 + d0 + 8) : 0u;
            a[mt][ks][3] = ok1 ? *reinterpret_cast<const uint32_t*>(q1 + d0 + 8) : 0u;
        }
        wv[mt][0] = ok0 ? bf16_bits_to_f32(w[r * nh + h0]) : 0.0f;
        wv[mt][1] = ok1 ? bf16_bits_to_f32(w[r * nh + h1]) : 0.0f;
    }
    __syncthreads();
    int64_t max_nt = 0;
#pragma unroll
    for (int i = 0; i < kIsWarps; ++i) max_nt = nt_s[i] > max_nt ? nt_s[i] : max_nt;

    uint16_t* st = st_s[warp];
    uint16_t* out = score + r * T;
    const int64_t chunk0 = static_cast<int64_t>(blockIdx.y) * (kIsTile * kIsTilesPerCta);
    for (int tile = 0; tile < kIsTilesPerCta; ++tile) {
        const int64_t j0 = chunk0 + static_cast<int64_t>(tile) * kIsTile;
        if (j0 >= T) break;  // uniform over the CTA
        if (j0 >= max_nt) {  // uniform: every row of the CTA is causally masked from here on
            if (row_ok)
                for (int c = lane; c < kIsTile; c += 32)
                    if (j0 + c < T) out[j0 + c] = kBf16NegInfBits;
            continue;
        }
        __syncthreads();  // the previous tile's k_s reads are done
        for (int c = tid; c < kIsTile * (D / 8); c += kIsThreads) {
            const int row = c / (D / 8), col = c % (D / 8);
            const int64_t j = j0 + row;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (j < T) v = *reinterpret_cast<const uint4*>(k + j * D + col * 8);
            *reinterpret_cast<uint4*>(&k_s[row * KS + col * 8]) = v;
        }
        __syncthreads();
        if (!row_ok) continue;
        if (j0 >= n_t) {
            for (int c = lane; c < kIsTile; c += 32)
                if (j0 + c < T) out[j0 + c] = kBf16NegInfBits;
            continue;
        }
        float acc[MT][8][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const uint16_t* kp = &k_s[(nt * 8 + g) * KS + ks * 16 + 2 * qd];
                const uint32_t b0 = ld_shared_u32(kp), b1 = ld_shared_u32(kp + 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) mma_bf16_16816(acc[mt][nt], a[mt][ks], b0, b1);
            }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int h = mt * 16 + g + 8 * half, col = nt * 8 + 2 * qd;
                    const uint16_t v0 = weighted_score(acc[mt][nt][2 * half], wv[mt][half]);
                    const uint16_t v1 = weighted_score(acc[mt][nt][2 * half + 1], wv[mt][half]);
                    *reinterpret_cast<uint32_t*>(&st[h * kIsStageStride + col]) = pack_bf16x2(v0, v1);
                }
        __syncwarp();
        for (int c = lane; c < kIsTile; c += 32) {
            const int64_t j = j0 + c;
            if (j >= T) continue;
            uint16_t res = kBf16NegInfBits;
            if (j < n_t) {
                float sum = 0.0f;  // torch's sum starts from its identity, +0
                for (int h = 0; h < nh; ++h)
                    sum = __fadd_rn(sum, bf16_bits_to_f32(st[h * kIsStageStride + c]));
                res = f32_to_bf16_bits(sum);
            }
            out[j] = res;
        }
        __syncwarp();  // staging reads done before the next tile overwrites it
    }
}

// ------------------------------------------------------------------ top-k and candidate blocks
constexpr int kSelThreads = 512;
constexpr int kSelItems = 8;

// One CTA per query row: exact radix select of the K-th largest bf16 key (two 8-bit digit passes
// over the row), then one ordered pass emitting the chosen positions in ascending order.
__global__ void __launch_bounds__(kSelThreads)
    index_topk_kernel(const uint16_t* __restrict__ score, const int32_t* __restrict__ qpos, int64_t T,
                      int ratio, int64_t offset, int32_t* __restrict__ idx, int64_t K) {
    __shared__ RadixSmem<kSelThreads> sm;
    const int64_t r = blockIdx.x;
    const uint16_t* row = score + r * T;
    auto key_at = [row](int64_t i) { return bf16_topk_key(row[i]); };
    uint32_t kth, n_gt;
    radix_select_kth<kSelThreads, 16>(T, static_cast<uint32_t>(K), key_at, sm, &kth, &n_gt);
    const int64_t n_t = (static_cast<int64_t>(qpos[r]) + 1) / ratio;
    int32_t* out = idx + r * K;
    auto emit = [out, n_t, offset](uint32_t pos, int64_t j) {
        out[pos] = j < n_t ? static_cast<int32_t>(j + offset) : -1;
    };
    select_ordered<kSelThreads, kSelItems>(T, static_cast<uint32_t>(K), kth, n_gt, key_at, emit, sm.scan);
}

// Block score of candidate block b: the max of its positions the way the CPU reference takes it
// (sequential, `isnan(v) || v > mx` from -inf: NaN propagates, the first of equal values wins).
__device__ __forceinline__ uint16_t block_max_bits(const uint16_t* row, int64_t T, int64_t block, int64_t b) {
    float mx = -INFINITY;
    const int64_t end = (b + 1) * block < T ? (b + 1) * block : T;
    for (int64_t j = b * block; j < end; ++j) {
        const float v = bf16_bits_to_f32(row[j]);
        if (isnan(v) || v > mx) mx = v;
        if (isnan(mx)) break;
    }
    return f32_to_bf16_bits(mx);  // a bf16 value or -inf: exact
}

// One CTA per query row. Radix select over the block keys, then one pass of 512 blocks per step:
// thread t decides block base + t (ties by ascending block index through a block scan) and each
// warp's ballot is exactly one 32-bit mask word.
__global__ void __launch_bounds__(kSelThreads)
    candidate_blocks_kernel(const uint16_t* __restrict__ score, const int32_t* __restrict__ qpos, int64_t T,
                            int ratio, int64_t block, int64_t topk_blocks, uint32_t* __restrict__ mask,
                            int64_t words) {
    __shared__ RadixSmem<kSelThreads> sm;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t r = blockIdx.x;
    const uint16_t* row = score + r * T;
    const int64_t nb = (T + block - 1) / block;
    const int64_t K = topk_blocks < nb ? topk_blocks : nb;
    const int64_t n_t = (static_cast<int64_t>(qpos[r]) + 1) / ratio;
    // model.py pins with arange(nb) == (n_t - 1) // block: n_t = 0 gives -1, which pins no block.
    const int64_t pinned = n_t >= 1 ? (n_t - 1) / block : -1;
    auto key_at = [row, T, block, pinned](int64_t b) {
        return b == pinned ? kBf16KeyPosInf : bf16_topk_key(block_max_bits(row, T, block, b));
    };
    uint32_t kth = 0, n_gt = 0;
    if (K >= 1) radix_select_kth<kSelThreads, 16>(nb, static_cast<uint32_t>(K), key_at, sm, &kth, &n_gt);
    const uint64_t need = static_cast<uint64_t>(K) - n_gt;
    uint64_t run_tie = 0;
    uint32_t* out = mask + r * words;
    for (int64_t base = 0; base < words * 32; base += kSelThreads) {
        const int64_t b = base + tid;
        uint32_t key = 0;
        bool gt = false, tie = false;
        if (K >= 1 && b < nb) {
            key = key_at(b);
            gt = key > kth;
            tie = key == kth;
        }
        uint64_t total;
        const uint64_t excl = block_exclusive_scan<kSelThreads>(tie ? 1u : 0u, sm.scan, &total);
        bool sel = gt || (tie && run_tie + excl < need);
        // drop picks whose block score is not > -inf (-inf: unreachable; NaN compares false too)
        sel = sel && key != kBf16KeyNegInf && key != kBf16KeyNaN;
        const uint32_t word = __ballot_sync(0xffffffffu, sel);
        const int64_t wi = base / 32 + warp;
        if (lane == 0 && wi < words) out[wi] = word;
        run_tie += total;
    }
}

__global__ void apply_candidate_mask_kernel(uint16_t* __restrict__ score, const uint32_t* __restrict__ mask,
                                            int64_t m, int64_t T, int64_t block, int64_t words) {
    const int64_t n = m * T;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = i / T, j = i - r * T, b = j / block;
        const uint32_t word = mask[r * words + b / 32];
        if (!((word >> (b % 32)) & 1u)) score[i] = kBf16NegInfBits;
    }
}

}  // namespace

bool index_scores_supported_dim(int ihd) {
    return ihd == 32 || ihd == 64 || ihd == 128;
}

cudaError_t launch_index_scores(const uint16_t* q, const uint16_t* k, const uint16_t* w, const int32_t* qpos,
                                int64_t m, int nh, int ihd, int64_t T, int ratio, uint16_t* score,
                                cudaStream_t stream) {
    if (m == 0 || T == 0) return cudaSuccess;
    const dim3 grid(static_cast<unsigned>((m + kIsWarps - 1) / kIsWarps),
                    static_cast<unsigned>((T + kIsTile * kIsTilesPerCta - 1) / (kIsTile * kIsTilesPerCta)));
    switch (ihd) {
        case 32:
            index_scores_kernel<32><<<grid, kIsThreads, 0, stream>>>(q, k, w, qpos, m, nh, T, ratio, score);
            break;
        case 64:
            index_scores_kernel<64><<<grid, kIsThreads, 0, stream>>>(q, k, w, qpos, m, nh, T, ratio, score);
            break;
        default:
            index_scores_kernel<128><<<grid, kIsThreads, 0, stream>>>(q, k, w, qpos, m, nh, T, ratio, score);
            break;
    }
    return cudaGetLastError();
}

cudaError_t launch_candidate_blocks(const uint16_t* score, const int32_t* qpos, int64_t m, int64_t T,
                                    int ratio, int64_t block, int64_t topk_blocks, uint32_t* mask,
                                    int64_t words, cudaStream_t stream) {
    if (m == 0 || words == 0) return cudaSuccess;
    candidate_blocks_kernel<<<static_cast<unsigned>(m), kSelThreads, 0, stream>>>(
        score, qpos, T, ratio, block, topk_blocks, mask, words);
    return cudaGetLastError();
}

cudaError_t launch_apply_candidate_mask(uint16_t* score, const uint32_t* mask, int64_t m, int64_t T,
                                        int64_t block, int64_t words, cudaStream_t stream) {
    const int64_t n = m * T;
    if (n == 0) return cudaSuccess;
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    apply_candidate_mask_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0,
                                  stream>>>(score, mask, m, T, block, words);
    return cudaGetLastError();
}

cudaError_t launch_index_topk(const uint16_t* score, const int32_t* qpos, int64_t m, int64_t T, int ratio,
                              int64_t offset, int32_t* idx, int64_t K, cudaStream_t stream) {
    if (m == 0 || K == 0) return cudaSuccess;
    index_topk_kernel<<<static_cast<unsigned>(m), kSelThreads, 0, stream>>>(score, qpos, T, ratio, offset,
                                                                            idx, K);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
