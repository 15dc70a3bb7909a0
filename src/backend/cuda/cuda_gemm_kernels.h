// The GEMM kernel family a CudaBackend runs (`--kernels auto|portable|hopper|hopper-fp8`): the portable
// mma.sync kernels (kernels/gemm.cuh; sm_80+, the default everywhere but compute capability 9.0) or the
// Hopper wgmma kernels (kernels/gemm_sm90.cuh). Both keep every output element's instruction sequence
// independent of M (batch invariance); docs/PERFORMANCE.md compares their numbers and speed.
#pragma once

#include <string>
#include <vector>

#include "attention.cuh"
#include "ds4r/backend.h"
#include "gemm.cuh"
#include "hc.cuh"
#include "quant.cuh"

namespace ds4r {

struct GemmKernels {
    bool hopper = false;
    bool fp8_partials = false;  // Hopper block-scaled partials on fp8 wgmma (--kernels hopper-fp8)
    // The block-scaled GEMMs' activation code order (quant.cuh): portable fragment order, or canonical.
    kern::Fp8CodeOrder act_order = kern::Fp8CodeOrder::GemmFragment;
    decltype(&kern::launch_gemm_fp8) fp8 = nullptr;
    decltype(&kern::launch_gemm_fp4) fp4 = nullptr;
    decltype(&kern::launch_grouped_gemm_fp4) grouped_fp4 = nullptr;
    decltype(&kern::launch_gemm_bf16) bf16 = nullptr;
    // The block-scaled fp8 GEMM on weights widened to fp16 beforehand (kern::launch_e4m3_to_f16): the
    // same bits as fp8; null where the family has none (the Hopper widened kernels have it).
    using Fp8F16w = cudaError_t (*)(const uint8_t* q, const uint8_t* sa, const uint16_t* w16,
                                    const uint8_t* sw, uint16_t* y, int64_t ldc, int64_t M, int64_t N,
                                    int64_t K, cudaStream_t stream);
    Fp8F16w fp8_f16w = nullptr;
    // The mHC mixes' sums (kern::HcMixAccum): compensated fp32 on the portable set, fp64 on the tensor
    // cores with the Hopper kernels (the same accuracy contract, ~10x faster there; docs/PERFORMANCE.md).
    kern::HcMixAccum hc_mix = kern::kHcMixAccumDefault;
    // The sparse attention's CTA shape: 16 heads (<= 99 KB of shared memory, every GPU) or, with the Hopper
    // kernels, 64 heads with the next tile's gather in flight (223 KB; the same bits).
    kern::SparseAttnCta attn_cta = kern::SparseAttnCta::Heads16;
    const char* name() const {
        return fp8_partials ? "hopper wgmma (fp8 partials)" : hopper ? "hopper wgmma" : "portable mma.sync";
    }
};

// The set for `choice` on `device`: Auto = Hopper on compute capability 9.0, else portable; Hopper on
// another device throws RuntimeError naming it.
GemmKernels select_gemm_kernels(GpuKernels choice, int device);

// The routing plan's tiles split by height (kern::launch_moe_tile_split, from counts [E] and expert_begin
// [E] on the device) and attached to g as g.full / g.tail, for the Hopper kernels' mixed tiles. The
// returned tensors hold the lists: keep them alive until g's launches have run.
std::vector<Tensor> attach_grouped_tile_split(Backend& be, const int32_t* counts, const int32_t* expert_begin,
                                              int64_t E, int64_t max_tiles, kern::GroupedFp4Gemm& g,
                                              cudaStream_t stream);

// The prepared fp16 experts (g.w_f16) with gathered activation rows (g.a_rows, w1 / w3): copies each pair's
// activation codes and scales into pair order (q [pairs, K], sa [pairs, K / 32]; kern::launch_gather_rows)
// and points g at them (a_rows null), so that the Hopper grouped kernel reads A by TMA. The same bytes in
// the same rows: the outputs are unchanged. No-op (nothing returned) for other layouts, rows already in
// pair order, or an unknown pair count. The returned tensors hold the copies: keep them alive until g's
// launches have run.
std::vector<Tensor> gather_pair_rows(Backend& be, kern::GroupedFp4Gemm& g, cudaStream_t stream);

}  // namespace ds4r
