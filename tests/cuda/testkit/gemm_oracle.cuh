// Reference kernels for the tests (tests/cuda/testkit/gemm_oracle.cu): the exact per-element
// instruction sequences the tensor-core kernels of kernels/gemm.cuh must reproduce bit for bit, one
// 16 x 8 block per warp from global memory. Same arguments as their fast twins, except that q holds
// Fp8CodeOrder::Canonical codes. Plain declarations (included by g++-compiled test hooks).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace ds4r::kern {

cudaError_t launch_gemm_bf16_oracle(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w,
                                    int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                                    int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                                    cudaStream_t stream);
cudaError_t launch_gemm_fp8_oracle(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                   uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                   cudaStream_t stream);
cudaError_t launch_gemm_fp4_oracle(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                   uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                   cudaStream_t stream);

}  // namespace ds4r::kern
