// Hyper-connection kernels (MODEL.md 4.5, 5.5, 8.2): the mixes (fp32 projection + Sinkhorn split),
// the pre-collapse and the post-expansion. Separately rounded reference ops are written as explicit
// __f*_rn intrinsics so nvcc's FMA contraction cannot merge them.
#include "common.cuh"
#include "fixed_reduce.cuh"
#include "hc.cuh"

namespace ds4r::kern {

namespace {

constexpr int kElemThreads = 256;
constexpr int64_t kMaxElemBlocks = 65535LL * 16;

int elem_blocks(int64_t n) {
    const int64_t b = cdiv(n, kElemThreads);
    return static_cast<int>(b < kMaxElemBlocks ? (b > 0 ? b : 1) : kMaxElemBlocks);
}

// ------------------------------------------------------------------ hc_mixes
// Tokens per block. fn (mix x hc*D fp32, 1.97 MB for V4.1) is streamed from L2 once per block, so it
// is read M / kMixTok times per call; each thread keeps kMixTok * (mix + 1) = 100 fp32 accumulators.
// (Performance idea: split the 24 mixes over two thread groups to double kMixTok at the same
// register cost.)
constexpr int kMixTok = 4;
constexpr int kMixVals = kMixTok * (kHcMix + 1);  // [tok][mix] dots, then [tok] sums of squares

// hc_split_sinkhorn for one token (MODEL.md 5.5), the exact operation order of the CPU backend's
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

// One block of 256 threads per kMixTok consecutive tokens. Thread t accumulates columns t, t+256, ...
// in order with FFMA for every (token, mix) and the sums of squares; then the fixed block
// reduction. A token's bits depend only on its own row (missing tail tokens are skipped, never mixed
// in), so the result is independent of M and of the token's slot in the block.
__global__ void __launch_bounds__(kFixedReduceThreads)
    hc_mixes_kernel(const uint16_t* __restrict__ X, const float* __restrict__ fn,
                    const float* __restrict__ scale, const float* __restrict__ base, int64_t M, int64_t K,
                    float inv_n, float norm_eps, float hc_eps, int iters, float* __restrict__ pre,
                    float* __restrict__ post, float* __restrict__ comb) {
    __shared__ float scratch[kFixedReduceWarps * kMixVals];
    __shared__ float totals[kMixVals];
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMixTok;
    const int ntok = static_cast<int>(M - r0 < kMixTok ? M - r0 : kMixTok);
    float acc[kMixVals];
#pragma unroll
    for (int i = 0; i < kMixVals; ++i) acc[i] = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += kFixedReduceThreads) {
        float f[kHcMix];
#pragma unroll
        for (int m = 0; m < kHcMix; ++m) f[m] = fn[m * K + k];
#pragma unroll
        for (int t = 0; t < kMixTok; ++t) {
            if (t < ntok) {
                const float z = bf16_bits_to_f32(X[(r0 + t) * K + k]);
#pragma unroll
                for (int m = 0; m < kHcMix; ++m)
                    acc[t * kHcMix + m] = __fmaf_rn(z, f[m], acc[t * kHcMix + m]);
                acc[kMixTok * kHcMix + t] = __fmaf_rn(z, z, acc[kMixTok * kHcMix + t]);  // z^2 exact
            }
        }
    }
    block_sum_fixed<kMixVals>(acc, scratch);
    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < kMixVals; ++i) totals[i] = acc[i];
    }
    __syncthreads();
    const int t = threadIdx.x;
    if (t < ntok) {
        // r = rsqrt(mean(z^2) + norm_eps), mean = sum * fp32(1/n) (CUDA torch.mean); mixes = dot * r.
        const float r = ref_rsqrt(__fadd_rn(__fmul_rn(totals[kMixTok * kHcMix + t], inv_n), norm_eps));
        float mixes[kHcMix];
#pragma unroll
        for (int m = 0; m < kHcMix; ++m) mixes[m] = __fmul_rn(totals[t * kHcMix + m], r);
        const int64_t row = r0 + t;
        sinkhorn_split_one(mixes, scale, base, hc_eps, iters, pre + row * kHcMult, post + row * kHcMult,
                           comb + row * kHcMult * kHcMult);
    }
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

}  // namespace

void launch_hc_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base, int64_t M,
                     int64_t D, float inv_n, float norm_eps, float hc_eps, int iters, float* pre, float* post,
                     float* comb, cudaStream_t stream) {
    if (M <= 0) return;
    const int64_t blocks = cdiv(M, kMixTok);
    hc_mixes_kernel<<<static_cast<unsigned>(blocks), kFixedReduceThreads, 0, stream>>>(
        X, fn, scale, base, M, kHcMult * D, inv_n, norm_eps, hc_eps, iters, pre, post, comb);
}

void launch_hc_pre(const uint16_t* X, const float* mix, uint16_t* y, int64_t M, int64_t hc, int64_t D,
                   cudaStream_t stream) {
    if (M <= 0 || D <= 0) return;
    hc_pre_kernel<<<elem_blocks(M * D), kElemThreads, 0, stream>>>(X, mix, y, M, hc, D);
}

void launch_hc_post(const uint16_t* x, const uint16_t* R, const float* post, const float* comb, uint16_t* out,
                    int64_t M, int64_t hc, int64_t D, cudaStream_t stream) {
    if (M <= 0 || D <= 0) return;
    hc_post_kernel<<<elem_blocks(M * D), kElemThreads, 0, stream>>>(x, R, post, comb, out, M, hc, D);
}

}  // namespace ds4r::kern
