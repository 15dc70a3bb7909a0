// Launch wrappers: hyper-connection (mHC) ops (docs/MODEL.md 4.5, 5.5, 8.2). Raw device pointers, sizes,
// stream. Callers (src/backend/cuda/cuda_ops_misc.cpp) validate shapes and check the returned error.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// The only hc the kernels are built for (V4.1: hc_mult = 4, mix = (2 + hc) * hc = 24).
constexpr int kHcMult = 4;
constexpr int kHcMix = (2 + kHcMult) * kHcMult;

// How the mix dot products and the sum of squares (K = hc * D terms, 20480 for V4.1) are
// accumulated. The CPU backend sums them exactly in fp64 and rounds once; the GPU forms:
//   Fp32        per-thread fp32 FFMA over 256 strided partials, fp32 block combine (the old
//               kernel: a few ulps off, issue 10; kept for the bench only);
//   Fp64        per-thread fp64 (bf16 x fp32 products exact), fp64 block combine;
//   Compensated per-thread fp32 pair (TwoSum + FMA product error, Dot2), fp64 block combine;
//   CompensatedG2  the same sums, bit for bit (each sum's per-thread order and block combine
//               unchanged), with the 24 mixes split over 2 groups of 256 threads in one block (twice
//               the warps per SM at half the accumulators per thread) and a leaner loop around the
//               sums: 1.25x Compensated's speed on the H200 (docs/PERFORMANCE.md, eleventh session).
//   Fp64Mma     the dots as an fp64 GEMM on the tensor cores (mma.sync m8n8k4 .f64, 32 tokens per
//               block, K split over 4 warps added in warp order), the sums of squares in fp64 beside
//               it: Fp64's accuracy (exact products, fp64 sums, one rounding). Fast only where fp64
//               runs on tensor cores (H100 / H200, A100; 1/64 rate on the RTX cards).
// All have a fixed order per token (batch invariant, no atomics).
enum class HcMixAccum { Fp32, Fp64, Compensated, CompensatedG2, Fp64Mma };
// The variant of the portable kernel set (every GPU); the Hopper set runs Fp64Mma
// (cuda_gemm_kernels.h GemmKernels::hc_mix). scripts/gpu_hc_check.sh and `bench --kernel-filter
// hc_mixes` measure all of them.
constexpr HcMixAccum kHcMixAccumDefault = HcMixAccum::CompensatedG2;

// Per token r: z = fp32(X[r]) (hc * D values), ssq = sum z^2, dot_m = sum_c z_c * fn[m, c]
// (accumulated as `accum` says, fixed order, rounded once to fp32), r = rsqrtf(ssq * inv_n + norm_eps),
// mixes = dot * r, then hc_split_sinkhorn (docs/MODEL.md 5.5) -> pre, post, comb.
// X: BF16 bits [M, hc, D]; fn: F32 [mix, hc * D]; scale: F32 [3]; base: F32 [mix];
// pre, post: F32 [M, hc]; comb: F32 [M, hc, hc]; inv_n = fp32(1) / fp32(hc * D).
cudaError_t launch_hc_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base,
                            int64_t M, int64_t D, float inv_n, float norm_eps, float hc_eps, int iters,
                            float* pre, float* post, float* comb, cudaStream_t stream,
                            HcMixAccum accum = kHcMixAccumDefault);
// The rounded sums alone (accuracy checks, bench): dots F32 [M, mix + 1] = the mix dots of each token,
// then its sum of squares. X, fn as above.
cudaError_t launch_hc_mix_dots(const uint16_t* X, const float* fn, int64_t M, int64_t D, float* dots,
                               cudaStream_t stream, HcMixAccum accum = kHcMixAccumDefault);
// Grid size launch_hc_mixes uses for M tokens (for the caller's grid-limit check).
int64_t hc_mixes_blocks(int64_t M, HcMixAccum accum = kHcMixAccumDefault);

// y[r, d] = bf16(((0 + m0*X0) + m1*X1) + ...) in fp32; X: BF16 bits [M, hc, D]; mix: F32 [M, hc];
// y: BF16 bits [M, D].
cudaError_t launch_hc_pre(const uint16_t* X, const float* mix, uint16_t* y, int64_t M, int64_t hc, int64_t D,
                          cudaStream_t stream);

// out[r, k, d] = bf16(post_k * x + S_k), S_k = ((0 + c0k*R0) + c1k*R1) + ... in fp32.
// x: BF16 bits [M, D]; R: BF16 bits [M, hc, D] (may alias out); post: F32 [M, hc];
// comb: F32 [M, hc, hc]; out: BF16 bits [M, hc, D]. hc <= 8.
cudaError_t launch_hc_post(const uint16_t* x, const uint16_t* R, const float* post, const float* comb,
                           uint16_t* out, int64_t M, int64_t hc, int64_t D, cudaStream_t stream);

}  // namespace ds4r::kern
