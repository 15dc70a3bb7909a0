// GEMM micro-benchmarks and memory probes of a backend for `ds4replay bench` (docs/DESIGN.md 8: fp8/fp4
// dequant-GEMM vs cuBLAS bf16 on pre-dequantized weights of the same shape). Implemented by the CUDA
// backend (src/backend/cuda/cuda_bench.cpp); replay/bench.cpp sees only this interface. Each GEMM
// benchmark builds random operands of the given shape on the device, runs 2 warm-up calls, then
// times `iters` calls; the result is 2 * M * N * K * iters / elapsed, in TFLOP/s. Not tests: they
// assert nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ds4r/backend.h"

namespace ds4r {

// The mHC mix accumulation variants (issue 10): the legacy fp32 sum, fp64, compensated fp32 with an
// fp64 block combine, and the same compensated sums (same bits) with the mixes split over 2 thread
// groups of one block (kernels/hc.cuh HcMixAccum).
inline constexpr int kHcMixVariants = 5;
inline constexpr const char* kHcMixVariantNames[kHcMixVariants] = {"fp32", "fp64", "compensated",
                                                                   "compensated-g2", "fp64-mma"};

class KernelBench {
public:
    virtual ~KernelBench() = default;
    // The whole linear_fp8 op (activation quant + block-scaled fp8 GEMM): x bf16 [M, K], W e4m3 [N, K].
    virtual double linear_fp8_tflops(int64_t M, int64_t N, int64_t K, int iters) = 0;
    // The whole linear_fp4 op: x bf16 [M, K], W packed e2m1 [N, K / 2].
    virtual double linear_fp4_tflops(int64_t M, int64_t N, int64_t K, int iters) = 0;
    // Our bf16 tensor-core GEMM (linear_bf16): x bf16 [M, K], W bf16 [N, K] -> bf16.
    virtual double linear_bf16_tflops(int64_t M, int64_t N, int64_t K, int iters) = 0;
    // cuBLAS reference: bf16 x bf16 -> bf16 with fp32 compute, in the default math mode.
    virtual double cublas_bf16_tflops(int64_t M, int64_t N, int64_t K, int iters) = 0;
    // The routed experts' grouped fp4 GEMM as the MoE launches it (activations already quantized):
    // `experts` experts with distinct weights [N, K / 2], `rows_per_expert` pairs each, `n_proj`
    // projections (2: w1 + w3, 1: w2). FLOPs: 2 * experts * rows_per_expert * N * K * n_proj.
    // tile_rows: 0 = the family's own choice; 64 / 128 force the Hopper kernels' tile shape, 1 their
    // mixed tiles (each expert's short last tile on 64 rows), 2 the 128-row tiles in 64-wide K stages (the
    // fp16 experts' take 128-wide ones otherwise) (-1 on the portable kernels, which have one).
    // routed: the experts' rows drawn around rows_per_expert as a router spreads them (Poisson, fixed
    // seed; FLOPs counted on the rows drawn) instead of exactly rows_per_expert each, with the MoE's split
    // of the plan (launch_moe_tile_split). layout: the weights prepared as e5m2 bytes or as fp16 with the
    // scales folded in (the Hopper widened kernels' prepared experts, --prepared-experts; -1 on other
    // kernels, and where the copy does not fit the memory budget).
    virtual double grouped_fp4_tflops(int experts, int64_t rows_per_expert, int64_t N, int64_t K, int n_proj,
                                      int iters, int tile_rows = 0, bool routed = false,
                                      ExpertLayout layout = ExpertLayout::None) = 0;
    // The output head's logits GEMM as head_stats runs it: x bf16 [M, D] . head bf16 [V, D]^T -> f32.
    virtual double head_logits_tflops(int64_t M, int64_t V, int64_t D, int iters) = 0;
    // Rows of one logits launch inside head_stats (it computes the logits in chunks of this many rows).
    virtual int64_t head_launch_rows() const = 0;
    // One whole head_stats call as a pass makes one per chunk of M rows: the targets checked, then the
    // logits in launches of head_launch_rows() rows, each followed by its row statistics (log-sum-exp,
    // entropy, rank, k alternatives); TFLOP/s of the logits' 2 M V D alone. head_offset: the head weights
    // start this many bytes (a multiple of 16) past a 256-byte boundary, as a layer slot may place them.
    virtual double head_stats_tflops(int64_t M, int64_t V, int64_t D, int k, int iters,
                                     size_t head_offset = 0) = 0;
    // A Hopper GEMM kernel alone with its stages filled by TMA (tma) or by the cp.async loaders (the
    // baseline; the backend takes TMA where it can): kind 0 fp8 block-scaled, 1 fp4 block-scaled
    // (activations quantized beforehand, the default partials), 2 bf16 -> bf16, 3 bf16 -> f32, 4 fp8
    // block-scaled on the weights widened to fp16 beforehand (--fp16-weights), 5 the same kernel in
    // stages of 128 K elements (TMA only); x [M, K], w [N, K]. -1 on the portable kernels (4, 5: also on
    // the fp8 partials).
    virtual double hopper_gemm_tflops(int kind, int64_t M, int64_t N, int64_t K, bool tma, int iters) = 0;
    // The GEMM kernel family the backend runs (--kernels), e.g. "hopper wgmma".
    virtual std::string gemm_family() const = 0;
    // The instruction-level ceiling of the portable tensor-core path: back-to-back independent
    // mma.sync.m16n8k16 bf16 -> fp32 from registers on every SM, in TFLOP/s.
    virtual double mma_sync_peak_tflops() = 0;
    // The mHC mixes kernel (dots + sum of squares + Sinkhorn split) with accumulation variant `variant`
    // (kHcMixVariantNames) on random X bf16 [M, 4, D] and fn f32 [24, 4 * D]: milliseconds per call.
    virtual double hc_mixes_ms(int variant, int64_t M, int64_t D, int iters) = 0;
    // Index (into kHcMixVariantNames) of the variant the backend runs.
    virtual int hc_mix_default_variant() const = 0;
    // The sparse attention of one sequence (Backend::sparse_attn's kernel) with `heads_per_cta` heads per CTA
    // (16: the portable shape, 64: the Hopper set's; -1 where the device's shared memory cannot hold the
    // shape): M queries at positions s - M .. s - 1 of a sequence of s window rows and T compressed rows,
    // each attending its window of `window` slots and `topk` distinct random compressed rows (n_idx =
    // window + topk), H heads of hd; TFLOP/s of QK and PV, 4 M H n_idx hd.
    virtual double sparse_attn_tflops(int64_t M, int64_t H, int64_t hd, int64_t s, int64_t T, int64_t window,
                                      int64_t topk, int heads_per_cta, int iters) = 0;
    // The heads per CTA the backend's sparse attention runs.
    virtual int sparse_attn_heads_per_cta() const = 0;
    // Device memory high-water mark in bytes since the last reset.
    virtual void reset_memory_high_water() = 0;
    virtual size_t memory_high_water() const = 0;
};

// The benchmarks of `be`, or nullptr when it has none (the CPU backend, or CUDA compiled out).
std::unique_ptr<KernelBench> make_kernel_bench(Backend& be);

}  // namespace ds4r
