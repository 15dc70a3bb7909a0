// Launch wrappers: hyper-connection (mHC) ops (MODEL.md 4.5, 5.5, 8.2). Raw device pointers, sizes,
// stream. Callers (src/backend/cuda/cuda_ops_misc.cpp) validate shapes and check the launch.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// The only hc the kernels are built for (V4.1: hc_mult = 4, mix = (2 + hc) * hc = 24).
constexpr int kHcMult = 4;
constexpr int kHcMix = (2 + kHcMult) * kHcMult;

// Per token r: z = fp32(X[r]) (hc * D values), ssq = sum z^2, dot_m = sum_c z_c * fn[m, c]
// (fp32 FFMA, fixed order), r = rsqrtf(ssq * inv_n + norm_eps), mixes = dot * r, then
// hc_split_sinkhorn (MODEL.md 5.5) -> pre, post, comb.
// X: BF16 bits [M, hc, D]; fn: F32 [mix, hc * D]; scale: F32 [3]; base: F32 [mix];
// pre, post: F32 [M, hc]; comb: F32 [M, hc, hc]; inv_n = fp32(1) / fp32(hc * D).
void launch_hc_mixes(const uint16_t* X, const float* fn, const float* scale, const float* base, int64_t M,
                     int64_t D, float inv_n, float norm_eps, float hc_eps, int iters, float* pre, float* post,
                     float* comb, cudaStream_t stream);

// y[r, d] = bf16(((0 + m0*X0) + m1*X1) + ...) in fp32; X: BF16 bits [M, hc, D]; mix: F32 [M, hc];
// y: BF16 bits [M, D].
void launch_hc_pre(const uint16_t* X, const float* mix, uint16_t* y, int64_t M, int64_t hc, int64_t D,
                   cudaStream_t stream);

// out[r, k, d] = bf16(post_k * x + S_k), S_k = ((0 + c0k*R0) + c1k*R1) + ... in fp32.
// x: BF16 bits [M, D]; R: BF16 bits [M, hc, D] (may alias out); post: F32 [M, hc];
// comb: F32 [M, hc, hc]; out: BF16 bits [M, hc, D]. hc <= 8.
void launch_hc_post(const uint16_t* x, const uint16_t* R, const float* post, const float* comb, uint16_t* out,
                    int64_t M, int64_t hc, int64_t D, cudaStream_t stream);

}  // namespace ds4r::kern
