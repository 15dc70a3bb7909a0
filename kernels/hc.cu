// Hyper-connection kernels (docs/MODEL.md 4.5, 5.5, 8.2): the mixes (fp32 projection + Sinkhorn split),
// the pre-collapse and the post-expansion. Separately rounded reference ops are written as explicit
// __f*_rn intrinsics so nvcc's FMA contraction cannot merge them.
#include <initializer_list>

#include "common.cuh"
#include "fixed_reduce.cuh"
#include "hc.cuh"

namespace ds4r::kern {

namespace {

// ------------------------------------------------------------------ hc_mixes
// Tokens per block. fn (mix x hc*D fp32, 1.97 MB for V4.1) is streamed from L2 once per block, so it
// is read M / tokens-per-block times per call; each thread keeps tokens * (mix + 1) accumulators:
// 100 fp32 for the legacy fp32 sum (4 tokens), 50 pairs / doubles (2 tokens) for the accurate ones,
// so that no variant spills. (Performance idea: split the 24 mixes over two thread groups to double
// the tokens per block at the same register cost.)
template <HcMixAccum A>
__host__ __device__ constexpr int mix_tokens() {
    return A == HcMixAccum::Fp32 ? 4 : 2;
}
template <HcMixAccum A>
__host__ __device__ constexpr int mix_vals() {  // [tok][mix] dots, then [tok] sums of squares
    return mix_tokens<A>() * (kHcMix + 1);
}

// hc_split_sinkhorn for one token (docs/MODEL.md 5.5), the exact operation order of the CPU backend's
// cpuref::hc_split_sinkhorn: sums sequential from 0, true divisions, expf, separate roundings.
__device__ void sinkhorn_split_one(const float* m, const float* __restrict__ scale,
                                   const float* __restrict__ base, float hc_eps, int iters, float* pre,
                                   float* post, float* comb) {
    constexpr int hc = kHcMult;
    const float s0 = scale[0], s1 = scale[1], s2 = scale[2];
#pragma unroll
    for (int k = 0; k < hc; ++k)
        pre[k] = __fadd_rn(ref_sigmoid(__fadd_rn(__fmul_rn(m[k], s0), base[k])), hc_eps);
#pragma unroll
    for (int k = 0; k < hc; ++k)
        post[k] = __fmul_rn(2.0f, ref_sigmoid(__fadd_rn(__fmul_rn(m[hc + k], s1), base[hc + k])));
    float c[hc * hc];
#pragma unroll
    for (int i = 0; i < hc * hc; ++i) c[i] = __fadd_rn(__fmul_rn(m[2 * hc + i], s2), base[2 * hc + i]);
        // Row softmax (max-subtracted), then + eps.
#pragma unroll
    for (int j = 0; j < hc; ++j) {
        float mx = c[j * hc];
#pragma unroll
        for (int k = 1; k < hc; ++k) mx = (mx < c[j * hc + k]) ? c[j * hc + k] : mx;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < hc; ++k) {
            c[j * hc + k] = expf(__fsub_rn(c[j * hc + k], mx));
            s = __fadd_rn(s, c[j * hc + k]);
        }
#pragma unroll
        for (int k = 0; k < hc; ++k) c[j * hc + k] = __fadd_rn(__fdiv_rn(c[j * hc + k], s), hc_eps);
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {  // row normalize (the first row step is the softmax above)
#pragma unroll
            for (int j = 0; j < hc; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < hc; ++k) s = __fadd_rn(s, c[j * hc + k]);
                const float d = __fadd_rn(s, hc_eps);
#pragma unroll
                for (int k = 0; k < hc; ++k) c[j * hc + k] = __fdiv_rn(c[j * hc + k], d);
            }
        }
        // column normalize
#pragma unroll
        for (int k = 0; k < hc; ++k) {
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < hc; ++j) s = __fadd_rn(s, c[j * hc + k]);
            const float d = __fadd_rn(s, hc_eps);
#pragma unroll
            for (int j = 0; j < hc; ++j) c[j * hc + k] = __fdiv_rn(c[j * hc + k], d);
        }
    }
#pragma unroll
    for (int i = 0; i < hc * hc; ++i) comb[i] = c[i];
}

// Per-token finish: r = rsqrt(mean(z^2) + norm_eps), mean = sum * fp32(1/n) (CUDA torch.mean);
// mixes = dot * r, then the Sinkhorn split. tot: the token's kHcMix dots, then its sum of squares.
__device__ void mixes_finish(const float* tot, const float* __restrict__ scale,
                             const float* __restrict__ base, float inv_n, float norm_eps, float hc_eps,
                             int iters, float* pre, float* post, float* comb) {
    const float r = ref_rsqrt(__fadd_rn(__fmul_rn(tot[kHcMix], inv_n), norm_eps));
    float mixes[kHcMix];
#pragma unroll
    for (int m = 0; m < kHcMix; ++m) mixes[m] = __fmul_rn(tot[m], r);
    sinkhorn_split_one(mixes, scale, base, hc_eps, iters, pre, post, comb);
}

// Token row's rounded sums tot (its kHcMix dots, then its sum of squares): into dots (F32 [M, mix + 1])
// when given, else the mixes and the Sinkhorn split into pre / post / comb.
__device__ __forceinline__ void mixes_store(const float (&tot)[kHcMix + 1], int64_t row,
                                            const float* __restrict__ scale, const float* __restrict__ base,
                                            float inv_n, float norm_eps, float hc_eps, int iters,
                                            float* __restrict__ pre, float* __restrict__ post,
                                            float* __restrict__ comb, float* __restrict__ dots) {
    if (dots) {
#pragma unroll
        for (int m = 0; m <= kHcMix; ++m) dots[row * (kHcMix + 1) + m] = tot[m];
        return;
    }
    mixes_finish(tot, scale, base, inv_n, norm_eps, hc_eps, iters, pre + row * kHcMult, post + row * kHcMult,
                 comb + row * kHcMult * kHcMult);
}

// After the block's sums: thread t < ntok finishes token r0 + t from `totals` (shared, [kTok][mix] dots
// then [kTok] sums of squares): its rounded sums into dots (F32 [M, mix + 1]) when given, else the mixes
// and the Sinkhorn split into pre / post / comb.
template <int kTok>
__device__ __forceinline__ void mixes_from_totals(const float* totals, int64_t r0, int ntok,
                                                  const float* __restrict__ scale,
                                                  const float* __restrict__ base, float inv_n, float norm_eps,
                                                  float hc_eps, int iters, float* __restrict__ pre,
                                                  float* __restrict__ post, float* __restrict__ comb,
                                                  float* __restrict__ dots) {
    const int t = threadIdx.x;
    if (t >= ntok) return;
    float tot[kHcMix + 1];
#pragma unroll
    for (int m = 0; m < kHcMix; ++m) tot[m] = totals[t * kHcMix + m];
    tot[kHcMix] = totals[kTok * kHcMix + t];
    mixes_store(tot, r0 + t, scale, base, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
}

// One column k of the mixes' sums: fn[m][k] for every mix and X[r0 + t][k] for the block's tokens (zeros
// past K or past its tokens). The loops load column k + 256 while they add column k: the loads' L2
// latency overlaps the arithmetic (the sums' operations and order are unchanged).
template <int kTok>
struct ColumnLoads {
    float f[kHcMix];
    uint16_t x[kTok];
    __device__ __forceinline__ void load(const float* __restrict__ fn, const uint16_t* __restrict__ X,
                                         int64_t r0, int ntok, int64_t K, int64_t k) {
        const bool in = k < K;
#pragma unroll
        for (int m = 0; m < kHcMix; ++m) f[m] = in ? fn[m * K + k] : 0.0f;
#pragma unroll
        for (int t = 0; t < kTok; ++t) x[t] = in && t < ntok ? X[(r0 + t) * K + k] : uint16_t{0};
    }
};

// One block of 256 threads per mix_tokens<A>() consecutive tokens. Thread t accumulates columns t,
// t+256, ... in order for every (token, mix) and the sums of squares (HcMixAccum says in what);
// then the fixed block reduction (fp32 for Fp32; double for Fp64; compensated fp32 pairs over the
// warp, double across the 8 warps for Compensated). The double total is rounded to fp32 once, as
// the CPU backend rounds its fp64 sums. A token's bits depend only on its own row
// (missing tail tokens are skipped, never mixed in), so the result is independent of M and of the
// token's slot in the block. dots (may be null): F32 [M, kHcMix + 1], the rounded sums themselves
// (accuracy checks and the bench); when given, the Sinkhorn split is skipped.
template <HcMixAccum A>
__global__ void __launch_bounds__(kFixedReduceThreads)
    hc_mixes_kernel(const uint16_t* __restrict__ X, const float* __restrict__ fn,
                    const float* __restrict__ scale, const float* __restrict__ base, int64_t M, int64_t K,
                    float inv_n, float norm_eps, float hc_eps, int iters, float* __restrict__ pre,
                    float* __restrict__ post, float* __restrict__ comb, float* __restrict__ dots) {
    constexpr int kTok = mix_tokens<A>();
    constexpr int kVals = mix_vals<A>();
    __shared__ float totals[kVals];
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTok;
    const int ntok = static_cast<int>(M - r0 < kTok ? M - r0 : kTok);
    if constexpr (A == HcMixAccum::Fp32) {
        __shared__ float scratch[kFixedReduceWarps * kVals];
        float acc[kVals];
#pragma unroll
        for (int i = 0; i < kVals; ++i) acc[i] = 0.0f;
        ColumnLoads<kTok> cur;
        cur.load(fn, X, r0, ntok, K, threadIdx.x);
        for (int64_t k = threadIdx.x; k < K; k += kFixedReduceThreads) {
            ColumnLoads<kTok> next;
            next.load(fn, X, r0, ntok, K, k + kFixedReduceThreads);
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
                if (t < ntok) {
                    const float z = bf16_bits_to_f32(cur.x[t]);
#pragma unroll
                    for (int m = 0; m < kHcMix; ++m)
                        acc[t * kHcMix + m] = __fmaf_rn(z, cur.f[m], acc[t * kHcMix + m]);
                    acc[kTok * kHcMix + t] = __fmaf_rn(z, z, acc[kTok * kHcMix + t]);  // z^2 exact
                }
            }
            cur = next;
        }
        block_sum_fixed<kVals>(acc, scratch);
        if (threadIdx.x == 0) {
#pragma unroll
            for (int i = 0; i < kVals; ++i) totals[i] = acc[i];
        }
    } else {
        __shared__ double scratch[kF64ScratchDoubles<kVals>];
        double acc[kVals];
        if constexpr (A == HcMixAccum::Fp64) {
#pragma unroll
            for (int i = 0; i < kVals; ++i) acc[i] = 0.0;
            ColumnLoads<kTok> cur;
            cur.load(fn, X, r0, ntok, K, threadIdx.x);
            for (int64_t k = threadIdx.x; k < K; k += kFixedReduceThreads) {
                ColumnLoads<kTok> next;
                next.load(fn, X, r0, ntok, K, k + kFixedReduceThreads);
#pragma unroll
                for (int t = 0; t < kTok; ++t) {
                    if (t < ntok) {
                        const float zf = bf16_bits_to_f32(cur.x[t]);
                        const double z = zf;
                        // bf16 x fp32 products are exact in double: one rounding per addition.
#pragma unroll
                        for (int m = 0; m < kHcMix; ++m)
                            acc[t * kHcMix + m] =
                                __fma_rn(z, static_cast<double>(cur.f[m]), acc[t * kHcMix + m]);
                        acc[kTok * kHcMix + t] = __dadd_rn(acc[kTok * kHcMix + t], __fmul_rn(zf, zf));
                    }
                }
                cur = next;
            }
        } else {
            CompSum cs[kVals];
#pragma unroll
            for (int i = 0; i < kVals; ++i) comp_zero(cs[i]);
            ColumnLoads<kTok> cur;
            cur.load(fn, X, r0, ntok, K, threadIdx.x);
            for (int64_t k = threadIdx.x; k < K; k += kFixedReduceThreads) {
                ColumnLoads<kTok> next;
                next.load(fn, X, r0, ntok, K, k + kFixedReduceThreads);
#pragma unroll
                for (int t = 0; t < kTok; ++t) {
                    if (t < ntok) {
                        const float z = bf16_bits_to_f32(cur.x[t]);
#pragma unroll
                        for (int m = 0; m < kHcMix; ++m) comp_fma(cs[t * kHcMix + m], z, cur.f[m]);
                        comp_add(cs[kTok * kHcMix + t], __fmul_rn(z, z));  // z^2 exact
                    }
                }
                cur = next;
            }
            block_sum_comp<kVals>(cs, acc, scratch, threadIdx.x);
        }
        if constexpr (A == HcMixAccum::Fp64) block_sum_fixed_f64<kVals>(acc, scratch);
        if (threadIdx.x == 0) {
#pragma unroll
            for (int i = 0; i < kVals; ++i) totals[i] = __double2float_rn(acc[i]);
        }
    }
    __syncthreads();
    mixes_from_totals<kTok>(totals, r0, ntok, scale, base, inv_n, norm_eps, hc_eps, iters, pre, post, comb,
                            dots);
}

// The compensated sums of hc_mixes_kernel<Compensated> with the mixes split over G groups of 256 threads:
// group g (threadIdx.x / 256) accumulates mixes g * 24 / G .. (g + 1) * 24 / G - 1 of the block's two
// tokens, group 0 also their sums of squares. Every sum is accumulated by the 256 threads of one group
// exactly as hc_mixes_kernel's 256 threads do (thread t: columns t, t + 256, ... in order, comp_fma /
// comp_add) and combined by the same fixed reduction (block_sum_comp over the group's 8 warps), so the
// totals are the same bits. What differs is the instruction stream around the sums (Nsight Compute,
// eleventh session: hc_mixes_kernel issues 814 instructions per column per warp for ~510 of arithmetic,
// 109 of them register copies of the next column's loads and ~100 address computations, and its 2
// warps per scheduler stall on the sums' dependent chains): G x 8 warps per SM; two column buffers in
// turn instead of a copy; with KC (the columns K known at compile time: V4.1's 4 x 5120) every load of a
// column is one instruction at a fixed offset from one address; columns past K are never added, so the
// loads ahead clamp their column instead of zeroing the values. G = 2 (3.20 ms per 8,192 tokens against
// hc_mixes_kernel's 3.99 on the H200); G = 4 measured 3.41 ms (more instructions per sum, now
// issue-bound) and was dropped.
template <int G, int KC>
__global__ void __launch_bounds__(G* kFixedReduceThreads, 1)
    hc_mixes_groups_kernel(const uint16_t* __restrict__ X, const float* __restrict__ fn,
                           const float* __restrict__ scale, const float* __restrict__ base, int64_t M,
                           int64_t K, float inv_n, float norm_eps, float hc_eps, int iters,
                           float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb,
                           float* __restrict__ dots) {
    static_assert(kHcMix % G == 0, "the mixes split evenly");
    constexpr int kTok = mix_tokens<HcMixAccum::Compensated>();
    constexpr int kGm = kHcMix / G;        // mixes per group
    constexpr int kNV = kTok * (kGm + 1);  // [tok][kGm] dots, then [tok] sums of squares (group 0's)
    constexpr int kStep = kFixedReduceThreads;
    __shared__ double scratch[G][kF64ScratchDoubles<kNV>];
    __shared__ float totals[mix_vals<HcMixAccum::Compensated>()];  // hc_mixes_kernel's layout
    const int Kn = KC > 0 ? KC : static_cast<int>(K);              // K < 2^31 (the launcher checks)
    const int grp = static_cast<int>(threadIdx.x) / kStep;
    const int tid = static_cast<int>(threadIdx.x) % kStep;
    const int m0 = grp * kGm;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTok;
    const int ntok = static_cast<int>(M - r0 < kTok ? M - r0 : kTok);
    const float* __restrict__ fg = fn + static_cast<int64_t>(m0) * Kn;  // the group's mixes' rows
    const uint16_t* xrow[kTok];  // the tokens' rows (a token past M reads the last one: never added)
#pragma unroll
    for (int t = 0; t < kTok; ++t) xrow[t] = X + (r0 + (t < ntok ? t : ntok - 1)) * Kn;
    CompSum cs[kNV];
#pragma unroll
    for (int i = 0; i < kNV; ++i) comp_zero(cs[i]);
    auto load = [&](float(&f)[kGm], uint16_t(&x)[kTok], int k) {
        const int kk = k < Kn ? k : Kn - 1;  // past K: loaded ahead, never added
        const float* fp = fg + kk;
#pragma unroll
        for (int m = 0; m < kGm; ++m) f[m] = fp[m * Kn];
#pragma unroll
        for (int t = 0; t < kTok; ++t) x[t] = xrow[t][kk];
    };
    auto add = [&](const float(&f)[kGm], const uint16_t(&x)[kTok]) {
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
            if (t < ntok) {
                const float z = bf16_bits_to_f32(x[t]);
#pragma unroll
                for (int m = 0; m < kGm; ++m) comp_fma(cs[t * kGm + m], z, f[m]);
                if (grp == 0) comp_add(cs[kTok * kGm + t], __fmul_rn(z, z));  // z^2 exact
            }
        }
    };
    // columns k, k + 256 per iteration, each loaded one column ahead into the other buffer
    float fa[kGm], fb[kGm];
    uint16_t xa[kTok], xb[kTok];
    load(fa, xa, tid);
    for (int k = tid; k < Kn; k += 2 * kStep) {
        load(fb, xb, k + kStep);
        add(fa, xa);
        if (k + kStep < Kn) {
            load(fa, xa, k + 2 * kStep);
            add(fb, xb);
        }
    }
    double acc[kNV];
    block_sum_comp<kNV>(cs, acc, scratch[grp], tid);
    if (tid == 0) {
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
#pragma unroll
            for (int m = 0; m < kGm; ++m) totals[t * kHcMix + m0 + m] = __double2float_rn(acc[t * kGm + m]);
            if (grp == 0) totals[kTok * kHcMix + t] = __double2float_rn(acc[kTok * kGm + t]);
        }
    }
    __syncthreads();
    mixes_from_totals<kTok>(totals, r0, ntok, scale, base, inv_n, norm_eps, hc_eps, iters, pre, post, comb,
                            dots);
}

// V4.1's columns per token (hc 4 x D 5120): the groups kernel's loads at fixed offsets.
constexpr int kHcMixReleaseK = kHcMult * 5120;

template <int G>
void launch_mixes_groups(const uint16_t* X, const float* fn, const float* scale, const float* base, int64_t M,
                         int64_t D, float inv_n, float norm_eps, float hc_eps, int iters, float* pre,
                         float* post, float* comb, float* dots, cudaStream_t stream) {
    const int64_t blocks = cdiv(M, mix_tokens<HcMixAccum::Compensated>());
    const int64_t K = kHcMult * D;
    if (K == kHcMixReleaseK)
        hc_mixes_groups_kernel<G, kHcMixReleaseK>
            <<<static_cast<unsigned>(blocks), G * kFixedReduceThreads, 0, stream>>>(
                X, fn, scale, base, M, K, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
    else
        hc_mixes_groups_kernel<G, 0><<<static_cast<unsigned>(blocks), G * kFixedReduceThreads, 0, stream>>>(
            X, fn, scale, base, M, K, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
}

// ------------------------------------------------------------------ hc_mixes on fp64 tensor cores
// HcMixAccum::Fp64Mma: the 24 mix dots of 32 tokens per block as an fp64 GEMM on the tensor cores
// (mma.sync m8n8k4 .f64, sm_80+; fast on GPUs with fp64 tensor cores: the H100 / H200, A100), the sums
// of squares beside it in fp64 on the CUDA cores. bf16 x fp32 products are exact in fp64, so every sum
// is an fp64 sum of exact terms rounded once to fp32, as the CPU backend's (its order differs: fp64
// rounding only, a flipped fp32 rounding is as rare as for HcMixAccum::Fp64). Why: the compensated
// kernels stream fn (1.97 MB) from L2 once per 2 tokens and spend ~10 fp32 operations per term; here
// fn is read once per 32 tokens and one DMMA does 256 terms (docs/PERFORMANCE.md, fourteenth session).
//
// Block: 4 warps x the same 32 tokens (4 m8 tiles); warp w takes the 32-column chunks c = w, w + 4, ...
// of K in order. In chunk c, lane (g = lane / 4, q = lane % 4) holds columns c * 32 + 8 q .. + 7 of its
// tokens' rows (A: row g of m-tile mt = token 8 mt + g) and of fn rows g + 8 nt (B: column g of n-tile
// nt); mma step s (0 .. 7) takes column c * 32 + 8 q + s as the k index q of the m8n8k4 (A column q,
// B row q): any bijection of k works, this one lets each lane load 8 consecutive columns at once. The
// 4 warps' fp64 totals add in warp order (smem), then round once to fp32: a fixed order per token that
// no other row touches (tokens past M read row M - 1 and are never written), so batch invariant.
constexpr int kMmaWarps = 4;
constexpr int kMmaTokens = 32;
constexpr int kMmaMt = kMmaTokens / 8;  // m8 tiles per warp (all the block's tokens)
constexpr int kMmaNt = kHcMix / 8;      // n8 tiles (the 24 mixes)
constexpr int kMmaChunk = 32;           // K columns per warp step: 4 lanes x 8
static_assert(kHcMix % 8 == 0, "the mixes fill n8 tiles");

// d{0,1} += a * b over one m8n8k4 fp64 tile (fragments: A row g col q, B row q col g, D row g cols
// 2q, 2q + 1; PTX ISA, mma.m8n8k4 .f64).
__device__ __forceinline__ void dmma_m8n8k4(double& d0, double& d1, double a, double b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(d0), "+d"(d1)
                 : "d"(a), "d"(b));
#else
    __trap();  // not built for pre-sm_80 targets (CMake's architectures are all >= 8.6)
#endif
}

// A lane's 8 columns of one chunk: x [kMmaMt][8] bf16 of its tokens, f [kMmaNt][8] fp32 of its fn rows,
// zeros past K. kVec: 16-byte loads (K % 8 == 0, aligned tensors) where the 8 columns lie inside K.
template <bool kVec>
struct MmaChunk {
    uint4 x[kMmaMt];
    float4 f[kMmaNt][2];
    __device__ __forceinline__ void load(const uint16_t* const (&xr)[kMmaMt],
                                         const float* const (&fr)[kMmaNt], int k, int K) {
        if (kVec && k + 8 <= K) {
#pragma unroll
            for (int mt = 0; mt < kMmaMt; ++mt) x[mt] = *reinterpret_cast<const uint4*>(xr[mt] + k);
#pragma unroll
            for (int nt = 0; nt < kMmaNt; ++nt) {
                f[nt][0] = *reinterpret_cast<const float4*>(fr[nt] + k);
                f[nt][1] = *reinterpret_cast<const float4*>(fr[nt] + k + 4);
            }
            return;
        }
#pragma unroll
        for (int mt = 0; mt < kMmaMt; ++mt) {
            uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
            for (int s = 0; s < 8; ++s)
                if (k + s < K) w[s / 2] |= static_cast<uint32_t>(xr[mt][k + s]) << (16 * (s & 1));
            x[mt] = make_uint4(w[0], w[1], w[2], w[3]);
        }
#pragma unroll
        for (int nt = 0; nt < kMmaNt; ++nt) {
            float v[8];
#pragma unroll
            for (int s = 0; s < 8; ++s) v[s] = k + s < K ? fr[nt][k + s] : 0.0f;
            f[nt][0] = make_float4(v[0], v[1], v[2], v[3]);
            f[nt][1] = make_float4(v[4], v[5], v[6], v[7]);
        }
    }
    __device__ __forceinline__ float xs(int mt, int s) const {
        const uint32_t w = reinterpret_cast<const uint32_t*>(&x[mt])[s / 2];
        return __uint_as_float((s & 1) ? (w & 0xFFFF0000u) : (w << 16));  // bf16 -> fp32, exact
    }
    __device__ __forceinline__ float fs(int nt, int s) const {
        return reinterpret_cast<const float*>(&f[nt][s / 4])[s % 4];
    }
};

template <bool kVec>
__global__ void __launch_bounds__(kMmaWarps * 32)
    hc_mixes_mma_kernel(const uint16_t* __restrict__ X, const float* __restrict__ fn,
                        const float* __restrict__ scale, const float* __restrict__ base, int64_t M, int K,
                        float inv_n, float norm_eps, float hc_eps, int iters, float* __restrict__ pre,
                        float* __restrict__ post, float* __restrict__ comb, float* __restrict__ dots) {
    // [warp][token][mix dots, then the sum of squares]: each warp's fp64 totals of its columns
    __shared__ double part[kMmaWarps][kMmaTokens][kHcMix + 1];
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int g = lane / 4, q = lane % 4;
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaTokens;
    const uint16_t* xr[kMmaMt];  // the lane's token rows (past M: row M - 1, never written)
#pragma unroll
    for (int mt = 0; mt < kMmaMt; ++mt) {
        const int64_t r = r0 + 8 * mt + g;
        xr[mt] = X + (r < M ? r : M - 1) * static_cast<int64_t>(K);
    }
    const float* fr[kMmaNt];  // the lane's fn rows
#pragma unroll
    for (int nt = 0; nt < kMmaNt; ++nt) fr[nt] = fn + static_cast<int64_t>(8 * nt + g) * K;
    double acc[kMmaMt][kMmaNt][2], ssq[kMmaMt];
#pragma unroll
    for (int mt = 0; mt < kMmaMt; ++mt) {
        ssq[mt] = 0.0;
#pragma unroll
        for (int nt = 0; nt < kMmaNt; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = 0.0;
    }
    const int chunks = (K + kMmaChunk - 1) / kMmaChunk;
    auto add = [&](const MmaChunk<kVec>& ch) {
#pragma unroll
        for (int s = 0; s < 8; ++s) {
            double a[kMmaMt], b[kMmaNt];
#pragma unroll
            for (int mt = 0; mt < kMmaMt; ++mt) {
                a[mt] = static_cast<double>(ch.xs(mt, s));
                ssq[mt] = __fma_rn(a[mt], a[mt], ssq[mt]);  // z^2 exact in fp64
            }
#pragma unroll
            for (int nt = 0; nt < kMmaNt; ++nt) b[nt] = static_cast<double>(ch.fs(nt, s));
#pragma unroll
            for (int mt = 0; mt < kMmaMt; ++mt)
#pragma unroll
                for (int nt = 0; nt < kMmaNt; ++nt) dmma_m8n8k4(acc[mt][nt][0], acc[mt][nt][1], a[mt], b[nt]);
        }
    };
    // chunks c = warp, warp + 4, ... in order, the next one loaded while this one is added
    MmaChunk<kVec> cur, next;
    if (warp < chunks) cur.load(xr, fr, warp * kMmaChunk + 8 * q, K);
    for (int c = warp; c < chunks; c += kMmaWarps) {
        if (c + kMmaWarps < chunks) next.load(xr, fr, (c + kMmaWarps) * kMmaChunk + 8 * q, K);
        add(cur);
        cur = next;
    }
    // the lane's sums of squares over its 4 column lanes (xor butterfly: the same bits on all four)
#pragma unroll
    for (int mt = 0; mt < kMmaMt; ++mt) {
        ssq[mt] = __dadd_rn(ssq[mt], __shfl_xor_sync(0xffffffffu, ssq[mt], 1));
        ssq[mt] = __dadd_rn(ssq[mt], __shfl_xor_sync(0xffffffffu, ssq[mt], 2));
    }
#pragma unroll
    for (int mt = 0; mt < kMmaMt; ++mt) {
        double* row = part[warp][8 * mt + g];
#pragma unroll
        for (int nt = 0; nt < kMmaNt; ++nt) {
            row[8 * nt + 2 * q] = acc[mt][nt][0];
            row[8 * nt + 2 * q + 1] = acc[mt][nt][1];
        }
        if (q == 0) row[kHcMix] = ssq[mt];
    }
    __syncthreads();
    const int t = static_cast<int>(threadIdx.x);
    if (t >= kMmaTokens || r0 + t >= M) return;
    float tot[kHcMix + 1];
#pragma unroll
    for (int m = 0; m <= kHcMix; ++m) {
        double s = part[0][t][m];
#pragma unroll
        for (int w = 1; w < kMmaWarps; ++w) s = __dadd_rn(s, part[w][t][m]);
        tot[m] = __double2float_rn(s);
    }
    mixes_store(tot, r0 + t, scale, base, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
}

void launch_mixes_mma(const uint16_t* X, const float* fn, const float* scale, const float* base, int64_t M,
                      int64_t D, float inv_n, float norm_eps, float hc_eps, int iters, float* pre,
                      float* post, float* comb, float* dots, cudaStream_t stream) {
    const int64_t blocks = cdiv(M, kMmaTokens);
    const int K = static_cast<int>(kHcMult * D);  // < 2^31 (launch_mixes_any checks)
    const bool vec =
        K % 8 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0 && reinterpret_cast<uintptr_t>(fn) % 16 == 0;
    if (vec)
        hc_mixes_mma_kernel<true><<<static_cast<unsigned>(blocks), kMmaWarps * 32, 0, stream>>>(
            X, fn, scale, base, M, K, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
    else
        hc_mixes_mma_kernel<false><<<static_cast<unsigned>(blocks), kMmaWarps * 32, 0, stream>>>(
            X, fn, scale, base, M, K, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
}

template <HcMixAccum A>
void launch_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base, int64_t M,
                  int64_t D, float inv_n, float norm_eps, float hc_eps, int iters, float* pre, float* post,
                  float* comb, float* dots, cudaStream_t stream) {
    const int64_t blocks = cdiv(M, mix_tokens<A>());
    hc_mixes_kernel<A><<<static_cast<unsigned>(blocks), kFixedReduceThreads, 0, stream>>>(
        X, fn, scale, base, M, kHcMult * D, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots);
}

cudaError_t launch_mixes_any(HcMixAccum accum, const uint16_t* X, const float* fn, const float* scale,
                             const float* base, int64_t M, int64_t D, float inv_n, float norm_eps,
                             float hc_eps, int iters, float* pre, float* post, float* comb, float* dots,
                             cudaStream_t stream) {
    if (M <= 0) return cudaSuccess;
    if (kHcMult * D > INT32_MAX) return cudaErrorInvalidValue;  // the groups kernels' 32-bit columns
    switch (accum) {
        case HcMixAccum::Fp32:
            launch_mixes<HcMixAccum::Fp32>(X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters, pre,
                                           post, comb, dots, stream);
            break;
        case HcMixAccum::Fp64:
            launch_mixes<HcMixAccum::Fp64>(X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters, pre,
                                           post, comb, dots, stream);
            break;
        case HcMixAccum::Compensated:
            launch_mixes<HcMixAccum::Compensated>(X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters,
                                                  pre, post, comb, dots, stream);
            break;
        case HcMixAccum::CompensatedG2:
            launch_mixes_groups<2>(X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters, pre, post, comb,
                                   dots, stream);
            break;
        case HcMixAccum::Fp64Mma:
            launch_mixes_mma(X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters, pre, post, comb, dots,
                             stream);
            break;
    }
    return cudaGetLastError();
}

// ------------------------------------------------------------------ hc_pre / hc_post
__global__ void hc_pre_kernel(const uint16_t* __restrict__ X, const float* __restrict__ mix,
                              uint16_t* __restrict__ y, int64_t M, int64_t hc, int64_t D) {
    const int64_t total = M * D;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = e / D, d = e - r * D;
        float acc = 0.0f;  // torch.sum starts from 0 (so an all -0 sum is +0, as on the CPU)
        for (int64_t k = 0; k < hc; ++k)
            acc = __fadd_rn(acc, __fmul_rn(mix[r * hc + k], bf16_bits_to_f32(X[(r * hc + k) * D + d])));
        y[e] = f32_to_bf16_bits(acc);
    }
}

// The 8-element kernels' pieces: rows row0 .. row0 + N - 1 of a [rows, D] bf16 tensor at columns d .. d + 7,
// element h of such a group, and 8 bf16 results packed back.
template <int N>
__device__ __forceinline__ void load_rows8(uint4 (&out)[N], const uint16_t* t, int64_t row0, int64_t D,
                                           int64_t d) {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = *reinterpret_cast<const uint4*>(t + (row0 + j) * D + d);
}
__device__ __forceinline__ float bf16x8_elem(const uint4& q, int h) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(&q)[h / 2];
    return bf16_bits_to_f32(static_cast<uint16_t>(w >> (16 * (h & 1))));
}
__device__ __forceinline__ void pack_bf16(uint32_t (&out)[4], int h, float v) {
    const uint32_t b = f32_to_bf16_bits(v);
    out[h / 2] = (h & 1) ? (out[h / 2] | (b << 16)) : b;
}

// The same per element with 8 consecutive elements per thread (16-byte loads and stores; hc = kHcMult,
// D % 8 == 0, 16-byte aligned tensors): the elements' operations are the scalar kernel's, in its order.
// X [M, kHcMult, D], mix [M, kHcMult], y [M, D]; v: index of a group of 8 elements of y.
__global__ void hc_pre_vec8_kernel(const uint16_t* __restrict__ X, const float* __restrict__ mix,
                                   uint16_t* __restrict__ y, int64_t M, int64_t D) {
    constexpr int hc = kHcMult;
    const int64_t D8 = D / 8, total = M * D8;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = v / D8, d = (v - r * D8) * 8;
        uint4 xs[hc];
        load_rows8(xs, X, r * hc, D, d);
        float m[hc];
#pragma unroll
        for (int k = 0; k < hc; ++k) m[k] = mix[r * hc + k];
        uint32_t out[4];
#pragma unroll
        for (int h = 0; h < 8; ++h) {
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < hc; ++k) acc = __fadd_rn(acc, __fmul_rn(m[k], bf16x8_elem(xs[k], h)));
            pack_bf16(out, h, acc);
        }
        *reinterpret_cast<uint4*>(y + r * D + d) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}

constexpr int kPostMaxHc = 8;

// One thread per (row, d): all hc residual values of the element are read before any output copy of
// it is written, so out may alias R (each element is touched by this thread only).
__global__ void hc_post_kernel(const uint16_t* __restrict__ x, const uint16_t* R,
                               const float* __restrict__ post, const float* __restrict__ comb, uint16_t* out,
                               int64_t M, int64_t hc, int64_t D) {
    const int64_t total = M * D;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = e / D, d = e - r * D;
        float res[kPostMaxHc];
#pragma unroll
        for (int j = 0; j < kPostMaxHc; ++j)
            res[j] = j < hc ? bf16_bits_to_f32(R[(r * hc + j) * D + d]) : 0.0f;
        const float xv = bf16_bits_to_f32(x[e]);
        const float* c = comb + r * hc * hc;
        float o[kPostMaxHc];
#pragma unroll
        for (int k = 0; k < kPostMaxHc; ++k) {
            if (k < hc) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < kPostMaxHc; ++j)
                    if (j < hc) s = __fadd_rn(s, __fmul_rn(c[j * hc + k], res[j]));
                o[k] = __fadd_rn(__fmul_rn(post[r * hc + k], xv), s);
            }
        }
#pragma unroll
        for (int k = 0; k < kPostMaxHc; ++k)
            if (k < hc) out[(r * hc + k) * D + d] = f32_to_bf16_bits(o[k]);
    }
}

// hc_post_kernel with 8 consecutive elements per thread (hc = kHcMult, D % 8 == 0, 16-byte aligned
// tensors): every residual value of the 8 elements is read before any output is written (out may alias
// R), each element's operations are the scalar kernel's, in its order.
__global__ void hc_post_vec8_kernel(const uint16_t* __restrict__ x, const uint16_t* R,
                                    const float* __restrict__ post, const float* __restrict__ comb,
                                    uint16_t* out, int64_t M, int64_t D) {
    constexpr int hc = kHcMult;
    const int64_t D8 = D / 8, total = M * D8;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t r = v / D8, d = (v - r * D8) * 8;
        uint4 rs[hc], xv[1];
        load_rows8(rs, R, r * hc, D, d);
        load_rows8(xv, x, r, D, d);
        float c[hc * hc], p[hc];
#pragma unroll
        for (int i = 0; i < hc * hc; ++i) c[i] = comb[r * hc * hc + i];
#pragma unroll
        for (int k = 0; k < hc; ++k) p[k] = post[r * hc + k];
        uint32_t o[hc][4];
#pragma unroll
        for (int h = 0; h < 8; ++h) {
            float res[hc];
#pragma unroll
            for (int j = 0; j < hc; ++j) res[j] = bf16x8_elem(rs[j], h);
            const float xh = bf16x8_elem(xv[0], h);
#pragma unroll
            for (int k = 0; k < hc; ++k) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < hc; ++j) s = __fadd_rn(s, __fmul_rn(c[j * hc + k], res[j]));
                pack_bf16(o[k], h, __fadd_rn(__fmul_rn(p[k], xh), s));
            }
        }
#pragma unroll
        for (int k = 0; k < hc; ++k)
            *reinterpret_cast<uint4*>(out + (r * hc + k) * D + d) =
                make_uint4(o[k][0], o[k][1], o[k][2], o[k][3]);
    }
}

// The 8-element kernels apply: the model's hc, whole 16-byte groups, aligned tensors.
bool vec8_ok(int64_t hc, int64_t D, std::initializer_list<const void*> ptrs) {
    if (hc != kHcMult || D % 8 != 0) return false;
    for (const void* q : ptrs)
        if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
    return true;
}

}  // namespace

cudaError_t launch_hc_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base,
                            int64_t M, int64_t D, float inv_n, float norm_eps, float hc_eps, int iters,
                            float* pre, float* post, float* comb, cudaStream_t stream, HcMixAccum accum) {
    return launch_mixes_any(accum, X, fn, scale, base, M, D, inv_n, norm_eps, hc_eps, iters, pre, post, comb,
                            nullptr, stream);
}

cudaError_t launch_hc_mix_dots(const uint16_t* X, const float* fn, int64_t M, int64_t D, float* dots,
                               cudaStream_t stream, HcMixAccum accum) {
    return launch_mixes_any(accum, X, fn, nullptr, nullptr, M, D, 0.0f, 0.0f, 0.0f, 0, nullptr, nullptr,
                            nullptr, dots, stream);
}

int64_t hc_mixes_blocks(int64_t M, HcMixAccum accum) {
    if (accum == HcMixAccum::Fp64Mma) return cdiv(M, kMmaTokens);
    return cdiv(M, accum == HcMixAccum::Fp32 ? mix_tokens<HcMixAccum::Fp32>()
                                             : mix_tokens<HcMixAccum::Compensated>());
}

cudaError_t launch_hc_pre(const uint16_t* X, const float* mix, uint16_t* y, int64_t M, int64_t hc, int64_t D,
                          cudaStream_t stream) {
    if (M <= 0 || D <= 0) return cudaSuccess;
    if (vec8_ok(hc, D, {X, y}))
        hc_pre_vec8_kernel<<<elem_blocks(M * D / 8), kElemThreads, 0, stream>>>(X, mix, y, M, D);
    else
        hc_pre_kernel<<<elem_blocks(M * D), kElemThreads, 0, stream>>>(X, mix, y, M, hc, D);
    return cudaGetLastError();
}

cudaError_t launch_hc_post(const uint16_t* x, const uint16_t* R, const float* post, const float* comb,
                           uint16_t* out, int64_t M, int64_t hc, int64_t D, cudaStream_t stream) {
    if (M <= 0 || D <= 0) return cudaSuccess;
    if (vec8_ok(hc, D, {x, R, out}))
        hc_post_vec8_kernel<<<elem_blocks(M * D / 8), kElemThreads, 0, stream>>>(x, R, post, comb, out, M, D);
    else
        hc_post_kernel<<<elem_blocks(M * D), kElemThreads, 0, stream>>>(x, R, post, comb, out, M, hc, D);
    return cudaGetLastError();
}

}  // namespace ds4r::kern
