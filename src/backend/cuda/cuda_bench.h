// GEMM micro-benchmarks for `ds4replay bench` (DESIGN.md 8: fp8/fp4 dequant-GEMM vs cuBLAS bf16 on
// pre-dequantized weights of the same shape). Each builds random operands of the given shape on the
// device, runs 2 warm-up calls, then times `iters` calls with CUDA events; the result is
// 2 * M * N * K * iters / elapsed, in TFLOP/s. Not tests: they assert nothing.
#pragma once

#include <cstdint>

namespace ds4r {

class CudaBackend;

// The whole linear_fp8 op (activation quant + block-scaled fp8 GEMM): x bf16 [M, K], W e4m3 [N, K].
double bench_linear_fp8_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);
// The whole linear_fp4 op: x bf16 [M, K], W packed e2m1 [N, K / 2].
double bench_linear_fp4_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);
// Our bf16 tensor-core GEMM (linear_bf16): x bf16 [M, K], W bf16 [N, K] -> bf16.
double bench_linear_bf16_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);
// cuBLAS reference: cublasGemmEx bf16 x bf16 -> bf16 with CUBLAS_COMPUTE_32F, in the default math
// mode for the measurement (bf16 inputs involve no TF32); the handle's pedantic mode is restored after.
double bench_cublas_bf16_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);

}  // namespace ds4r
