// Launch wrappers: Engram gate and update (docs/MODEL.md 4.8 steps 2-5), the compressor's ratio-2 pooling
// (4.6.1) and the bf16 scalar multiply (4.6.2 step 3). Raw device pointers, sizes, stream. Callers
// (src/backend/cuda/cuda_ops_misc.cpp) validate shapes and check the returned error.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// In place on X, per row r and copy k (h = fp32(X[r, k]), key = fp32(kv[r, k*D ..]),
// value = fp32(kv[r, hc*D ..]), wt = fp32(qw[k]) * fp32(kw[k])):
//   rstd = rsqrtf(sum(h^2) * inv_d + eps) * rsqrtf(sum(key^2) * inv_d + eps);
//   dot = (sum fp32(fp32(h * wt) * key) * rstd) * inv_sqrt_d;
//   gate = sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)); X[r, k] = bf16(h + gate * value).
// Sums: fixed-order fp32 block reductions. X: BF16 bits [M, hc, D]; kv: BF16 bits [M, (hc+1)*D];
// qw, kw: BF16 bits [hc, D]; inv_d = fp32(1) / fp32(D); inv_sqrt_d = fp32(D^-0.5).
cudaError_t launch_engram_update(uint16_t* X, const uint16_t* kv, const uint16_t* qw, const uint16_t* kw,
                                 int64_t M, int64_t hc, int64_t D, float inv_d, float inv_sqrt_d, float eps,
                                 cudaStream_t stream);

// Ratio-2 gated pooling: out[j, c] = bf16((0 + kv[2j, c] * w0) + kv[2j+1, c] * w1) with
// (w0, w1) = the 2-way softmax of (sc[2j, c], sc[2j+1, c]) (exp(x - max) / sum).
// kv, sc: F32 [>= 2n, hd]; out: BF16 bits [n, hd].
cudaError_t launch_compress_pool2(const float* kv, const float* sc, uint16_t* out, int64_t n, int64_t hd,
                                  cudaStream_t stream);

// x = bf16(fp32(x) * factor) in place; x: BF16 bits [n].
cudaError_t launch_mul_scalar_bf16(uint16_t* x, int64_t n, float factor, cudaStream_t stream);

}  // namespace ds4r::kern
