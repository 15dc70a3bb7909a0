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

// The block-scaled GEMM alone (activations already quantized; linear_fp8 / linear_fp4 minus their
// act quant): q e4m3 [M, K] . W [N, K]^T -> bf16.
double bench_gemm_fp8_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);
double bench_gemm_fp4_tflops(CudaBackend& be, int64_t M, int64_t N, int64_t K, int iters);
// The routed experts' grouped fp4 GEMM as the MoE launches it (activations already quantized):
// `experts` experts with distinct weights [N, K / 2], `rows_per_expert` pairs each, `n_proj`
// projections (2: w1 + w3 on the same gathered activation rows, 1: w2). FLOPs: 2 * experts *
// rows_per_expert * N * K * n_proj.
double bench_grouped_fp4_tflops(CudaBackend& be, int experts, int64_t rows_per_expert, int64_t N, int64_t K,
                                int n_proj, int iters);
// The instruction-level ceiling of the portable tensor-core path on this GPU: back-to-back
// independent mma.sync.m16n8k16 bf16 -> fp32 from registers on every SM (kernels/gemm_peak.cu), in
// TFLOP/s. Our GEMMs use exactly this instruction (fp16 operands in the block-scaled ones, the same
// rate on sm_80 .. sm_90): ours / this = the fraction of the portable path's ceiling.
double bench_mma_sync_peak_tflops(CudaBackend& be);

}  // namespace ds4r
