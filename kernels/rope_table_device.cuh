// The RoPE table kernel (docs/MODEL.md 4.0, 8.3), parameterized by its (cos, sin) function: the product
// (kernels/norm_rope.cu) uses the glibc port; the CUDA test kit instantiates it with CUDA's libdevice
// cosf / sinf to measure how far those are from the golden tables. Device code only.
#pragma once

#include "common.cuh"

namespace ds4r::kern {

// table F32 [n_pos, half, 2]: angle = fp32(pos) * inv_freq[i] (torch.outer in fp32), then
// torch.polar's (cos, sin) = SinCos{}(angle). inv_freq F32 [half]. Grid-stride over n_pos * half.
template <class SinCos>
__global__ void rope_table_kernel(const float* __restrict__ inv_freq, int64_t n_pos, int64_t half,
                                  float* table) {
    const int64_t total = n_pos * half;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t pos = e / half, i = e - pos * half;
        const float angle = __fmul_rn(__ll2float_rn(static_cast<long long>(pos)), inv_freq[i]);
        float c, s;
        SinCos{}(angle, &c, &s);
        table[2 * e] = c;
        table[2 * e + 1] = s;
    }
}

}  // namespace ds4r::kern
