// Launch wrappers: RMSNorm and RoPE (docs/MODEL.md 4.0, 8.2, 8.3). Raw device pointers, sizes, stream.
// Callers (src/backend/cuda/cuda_ops_misc.cpp) validate shapes and check the returned error.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

// y = bf16(w * (x * rsqrtf(sum(x^2) * inv_n + eps))) per row; fixed-order fp32 sum of squares.
// x, y: BF16 bits [rows, n] (may alias); w: BF16 bits [n]; inv_n = fp32(1) / fp32(n) (CUDA
// torch.mean's factor).
cudaError_t launch_rms_norm(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t rows, int64_t n,
                            float inv_n, float eps, cudaStream_t stream);

// RoPE inverse frequencies in torch's CPU evaluation order (see cuda_ops_misc.cpp rope_table):
// f_i = 1 / fp32(pow(base, fp32(2i) / fp32(rd))) (pow correctly rounded via double);
// with yarn: ramp = clamp((i - low) / span, 0, 1), smooth = 1 - ramp,
// f_i = (f_i / factor) * (1 - smooth) + f_i * smooth, every op one fp32 rounding.
// inv_freq: F32 [rd / 2] (output).
cudaError_t launch_rope_inv_freqs(float base, float factor, int yarn, float low, float span, int64_t rd,
                                  float* inv_freq, cudaStream_t stream);

// table F32 [n_pos, half, 2] = (cos, sin)(fp32(pos) * inv_freq[i]) with glibc's cosf / sinf
// (kernels/libm_sincosf.cuh); inv_freq F32 [half].
cudaError_t launch_rope_table(const float* inv_freq, int64_t n_pos, int64_t half, float* table,
                              cudaStream_t stream);

// In place on x BF16 bits [rows, heads * width]: the last rd dims of each head as interleaved pairs
// (a, b) rotated by table[pos[r], i] = (c, s) (s negated when inverse):
// re = fma(a, c, -(b * s)), im = fma(a, s, b * c) in fp32, one rounding to bf16 each.
// pos I32 [rows]; table F32 [n_pos, rd / 2, 2]. A row whose pos is outside [0, n_pos) gets NaN in
// its rotated dims (a caller bug made loud; the host checks what it can).
cudaError_t launch_rope_inplace(uint16_t* x, int64_t rows, int64_t heads, int64_t width, int64_t rd,
                                const int32_t* pos, const float* table, int64_t n_pos, int inverse,
                                cudaStream_t stream);

}  // namespace ds4r::kern
