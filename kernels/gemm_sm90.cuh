// Launch wrappers of the Hopper (sm_90a) wgmma GEMMs (kernels/hopper/gemm_sm90.cu): the same
// problems, parameters and numerics contracts as the portable kernels of gemm.cuh, run on wgmma.
// Plain declarations: included by g++-compiled backend code.
//
// Chosen at run time (src/backend/cuda/cuda_gemm_kernels.cpp, `--kernels auto|portable`) on devices of
// compute capability 9.0 only (sm_90a machine code only: elsewhere a launch fails with
// cudaErrorNoKernelImageForDevice).
//
// Differences from the portable kernels' operands:
// - the block-scaled GEMMs take the activation codes in sm90_act_order(partials) (quant.cuh): the
//   widened partials (the default) the portable kernels' fragment order, the fp8 wgmma partials
//   Fp8CodeOrder::Canonical;
// - the block-scaled partial of each 32-wide K block: see Sm90Partials below.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "gemm.cuh"
#include "quant.cuh"

namespace ds4r::kern {

// True when this build holds the sm_90a kernels and `device` is a compute capability 9.0 GPU.
bool sm90_gemm_usable(int device);
// Whether the driver gives the tensor-map encoder the TMA launches need (the prepared fp16 experts have
// no cp.async fallback; the plain problems fall back by themselves).
bool sm90_tensor_maps_usable();

// As launch_gemm_bf16 (gemm.cuh), on bf16 wgmma. Same support condition (gemm_bf16_supported).
cudaError_t launch_gemm_bf16_sm90(const uint16_t* x, int64_t lda, int64_t x_goff, const uint16_t* w,
                                  int64_t ldw, int64_t w_goff, void* y, bool y_f32, int64_t ldc,
                                  int64_t y_goff, int64_t M, int64_t N, int64_t K, int64_t groups,
                                  cudaStream_t stream);

// How the bf16 and block-scaled kernels fill their shared-memory stages: Auto: TMA copies (one thread, tensor
// maps built per launch) where the operands allow a tensor map (16-byte aligned base and pitches), else the
// cp.async loaders; CpAsync: always the loaders; Tma: TMA or cudaErrorNotSupported; TmaWideK: the
// fp16-weight GEMM (launch_gemm_fp8_sm90_f16w) by TMA in stages of 128 K elements instead of 64, or
// cudaErrorNotSupported (Auto's choice there where TMA applies; every other kernel takes it as Tma).
// Outputs are the same bits.
enum class Sm90Loads : int { Auto = 0, CpAsync = 1, Tma = 2, TmaWideK = 3 };
cudaError_t launch_gemm_bf16_sm90_loads(Sm90Loads loads, const uint16_t* x, int64_t lda, int64_t x_goff,
                                        const uint16_t* w, int64_t ldw, int64_t w_goff, void* y, bool y_f32,
                                        int64_t ldc, int64_t y_goff, int64_t M, int64_t N, int64_t K,
                                        int64_t groups, cudaStream_t stream);

// As launch_gemm_fp8 / launch_gemm_fp4 (gemm.cuh) with q in sm90_act_order(kSm90DefaultPartials).
cudaError_t launch_gemm_fp8_sm90(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                 uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                 cudaStream_t stream);
cudaError_t launch_gemm_fp4_sm90(const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw,
                                 uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K,
                                 cudaStream_t stream);

// As launch_grouped_gemm_fp4 (gemm.cuh) with g.q in sm90_act_order(kSm90DefaultPartials). Also takes the
// weights as e5m2 bytes (g.w_e5m2) or as fp16 with the scales folded in (g.w_f16; B by TMA:
// cudaErrorNotSupported where the experts do not lie at one stride), the prepared experts, the same bits,
// with the widened partials (Fp8Wgmma partials: cudaErrorInvalidValue).
cudaError_t launch_grouped_gemm_fp4_sm90(const GroupedFp4Gemm& g, cudaStream_t stream);

// How the block-scaled kernels form each 32-wide K block's partial: one fp8 wgmma (k32) on the codes
// (the tensor core's fp8 sum: not always the exact one, docs/PERFORMANCE.md), or two fp16 wgmma (k16)
// on the codes widened to fp16 (the portable kernels' arithmetic, bit for bit: the weights in shared
// memory by the converter warps, the activations in the consumers' registers, from fragment-ordered
// codes as the portable kernels load them).
// The launchers above use kSm90DefaultPartials; the *_partials variants take it (tests, bench).
enum class Sm90Partials : int { Fp8Wgmma = 0, Fp16Widened = 1 };
constexpr Sm90Partials kSm90DefaultPartials = Sm90Partials::Fp16Widened;
// The activation code order each variant reads (the fp8 wgmma reads A from shared memory in K order).
constexpr Fp8CodeOrder sm90_act_order(Sm90Partials p) {
    return p == Sm90Partials::Fp16Widened ? Fp8CodeOrder::GemmFragment : Fp8CodeOrder::Canonical;
}
// loads: as the bf16 kernel's (Auto: TMA for the A and B tiles where the operands allow a tensor map;
// the scale words always take the cp.async loaders).
cudaError_t launch_gemm_fp8_sm90_partials(Sm90Partials partials, const uint8_t* q, const uint8_t* sa,
                                          const uint8_t* w, const uint8_t* sw, uint16_t* y, int64_t ldc,
                                          int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                                          Sm90Loads loads = Sm90Loads::Auto);
cudaError_t launch_gemm_fp4_sm90_partials(Sm90Partials partials, const uint8_t* q, const uint8_t* sa,
                                          const uint8_t* w, const uint8_t* sw, uint16_t* y, int64_t ldc,
                                          int64_t M, int64_t N, int64_t K, cudaStream_t stream,
                                          Sm90Loads loads = Sm90Loads::Auto);
cudaError_t launch_grouped_gemm_fp4_sm90_partials(Sm90Partials partials, const GroupedFp4Gemm& g,
                                                  cudaStream_t stream);

// As launch_gemm_fp8_sm90 with the weights widened to fp16 beforehand: w16 [N, K] the fp16 bits of w's
// codes as launch_e4m3_to_f16 (quant.cuh) makes them, sw the fp8 weights' scales. The same partials and
// bits as the widened default; its stages take B as the MMA tile itself, so no producer warps convert.
// Fp16Widened partials only (the activation codes in their GemmFragment order).
cudaError_t launch_gemm_fp8_sm90_f16w(const uint8_t* q, const uint8_t* sa, const uint16_t* w16,
                                      const uint8_t* sw, uint16_t* y, int64_t ldc, int64_t M, int64_t N,
                                      int64_t K, cudaStream_t stream, Sm90Loads loads = Sm90Loads::Auto);

// The grouped GEMM's tiles: 128 rows x 128 columns, or 64 rows x 256 columns (an expert's rows in
// blocks of 64: less idle work when experts hold few rows, e.g. ~38 each in workload b's chunks of
// 2,420 rows). Every output's instruction sequence is the same in both (bit-identical results; the
// CudaGemmSm90 tests compare them). Auto: 64 when g.pairs / g.n_experts <= 64 rows per expert.
// Mixed (g.full / g.tail set): the full list on 128-row tiles, each expert's short last tile (1 .. 64
// pairs) on a 64-row one in a second launch: less idle work at ~128 rows per expert and more (the MoE's
// chunks on the 22 GB budget); Auto takes it whenever the split is given and the experts average > 64
// rows, except for the prepared fp16 experts: on a 128-row tile whose second 64 rows are empty, that
// warpgroup idles (half the tensor work, as a 64-row tile) and the tile runs next to the expert's full
// tiles in the same launch, which read the same B (from L2 then, where the second launch reads it from
// DRAM again): 1.33-1.37x the mixed tiles on routed rows (docs/PERFORMANCE.md, fifteenth session).
// Rows128Narrow: 128-row tiles in stages of 64 K elements (the prepared fp16 experts' 128-row tiles take
// 128 elsewhere, Cfg::kWideK; the same bits): their baseline; other layouts as Rows128.
enum class Sm90GroupedRows : int { Auto = 0, Rows64 = 64, Rows128 = 128, Mixed = 1, Rows128Narrow = 2 };
// Auto's rule for the short last tiles when the split (g.full / g.tail) is given: Mixed for every layout but
// the prepared fp16 experts (w_f16), whose short tiles stay on the 128-row tiles (above). The MoE builds the
// split only where this holds.
constexpr bool sm90_grouped_auto_mixed(bool w_f16) {
    return !w_f16;
}
cudaError_t launch_grouped_gemm_fp4_sm90_tiles(Sm90Partials partials, Sm90GroupedRows rows,
                                               const GroupedFp4Gemm& g, cudaStream_t stream);

}  // namespace ds4r::kern
