// Test hooks for the tensor-core GEMMs (tests/cuda/cuda_gemm_paths_test.cpp). The fast kernels
// (kernels/gemm_tile.cuh) promise a fixed per-element instruction sequence whatever the tile shape,
// row count, scale values or activation code order; these hooks compute the same products another
// way so that a test can hold them to it bit for bit:
// - *_oracle: through the reference kernels of tests/cuda/testkit/gemm_oracle.cu (one 16 x 8 block per warp,
//   straight from global memory, canonical activation codes, the original scale expression);
// - linear_fp4_grouped: through the routed experts' grouped kernel, all rows as one expert.
// Shapes, dtypes and the contract are those of the CudaBackend op named in each comment.
#pragma once

#include <cstdint>

#include "ds4r/backend.h"

namespace ds4r {

class CudaBackend;

// As CudaBackend::linear_fp8: x BF16 [M, K] -> y BF16 [M, N] with w F8_E4M3 [N, K] (32 x 32 scales).
void linear_fp8_oracle(CudaBackend& be, const Tensor& x, const Fp8Linear& w, const Tensor& y);
// As CudaBackend::linear_fp4: x BF16 [M, K] -> y BF16 [M, N] with w packed e2m1 [N, K / 2].
void linear_fp4_oracle(CudaBackend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y);
// As CudaBackend::linear_bf16 (y BF16) or linear_f32 (y F32) for bf16 x [M, K] and w [N, K] with
// K % 8 == 0 (the layouts the tensor-core path takes).
void linear_bf16_oracle(CudaBackend& be, const Tensor& x, const Tensor& w, const Tensor& y);
// As CudaBackend::linear_wo_a (o BF16 [M, G * Kg], w fp8 [G * R, Kg] -> y BF16 [M, G * R]), Kg % 8 == 0.
void linear_wo_a_oracle(CudaBackend& be, const Tensor& o, const Fp8Linear& w, int64_t groups,
                        const Tensor& y);
// As CudaBackend::linear_fp4, computed by the grouped expert kernel with the M rows as one expert's
// pairs; reverse_rows: the kernel gathers them through a row list, output row r from x row M - 1 - r.
void linear_fp4_grouped(CudaBackend& be, const Tensor& x, const Fp4Linear& w, const Tensor& y,
                        bool reverse_rows);

}  // namespace ds4r
