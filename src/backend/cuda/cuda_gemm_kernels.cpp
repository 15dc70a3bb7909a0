// GEMM kernel family selection (cuda_gemm_kernels.h).
#include "backend/cuda/cuda_gemm_kernels.h"

#include "ds4r/error.h"
#include "gemm_sm90.cuh"

namespace ds4r {

GemmKernels select_gemm_kernels(GpuKernels choice, int device) {
    GemmKernels k;
    const bool hopper_device = kern::sm90_gemm_usable(device);
    const bool forced = choice == GpuKernels::Hopper || choice == GpuKernels::HopperFp8Partials;
    if (forced && !hopper_device)
        throw RuntimeError(
            strfmt("--kernels hopper: device %d is not a compute capability 9.0 GPU (H100 / "
                   "H200); use --kernels auto or portable",
                   device));
    k.hopper = forced || (choice == GpuKernels::Auto && hopper_device);
    k.fp8_partials = choice == GpuKernels::HopperFp8Partials;
    if (k.fp8_partials) {
        using kern::Sm90Partials;
        k.act_order = kern::sm90_act_order(Sm90Partials::Fp8Wgmma);
        k.fp8 = [](const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                   int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t st) {
            return kern::launch_gemm_fp8_sm90_partials(Sm90Partials::Fp8Wgmma, q, sa, w, sw, y, ldc, M, N, K,
                                                       st);
        };
        k.fp4 = [](const uint8_t* q, const uint8_t* sa, const uint8_t* w, const uint8_t* sw, uint16_t* y,
                   int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t st) {
            return kern::launch_gemm_fp4_sm90_partials(Sm90Partials::Fp8Wgmma, q, sa, w, sw, y, ldc, M, N, K,
                                                       st);
        };
        k.grouped_fp4 = [](const kern::GroupedFp4Gemm& g, cudaStream_t st) {
            return kern::launch_grouped_gemm_fp4_sm90_partials(Sm90Partials::Fp8Wgmma, g, st);
        };
        k.bf16 = kern::launch_gemm_bf16_sm90;
    } else if (k.hopper) {
        k.act_order = kern::sm90_act_order(kern::kSm90DefaultPartials);
        k.fp8 = kern::launch_gemm_fp8_sm90;
        k.fp4 = kern::launch_gemm_fp4_sm90;
        k.grouped_fp4 = kern::launch_grouped_gemm_fp4_sm90;
        k.bf16 = kern::launch_gemm_bf16_sm90;
        k.fp8_f16w = [](const uint8_t* q, const uint8_t* sa, const uint16_t* w16, const uint8_t* sw,
                        uint16_t* y, int64_t ldc, int64_t M, int64_t N, int64_t K, cudaStream_t st) {
            return kern::launch_gemm_fp8_sm90_f16w(q, sa, w16, sw, y, ldc, M, N, K, st);
        };
    } else {
        k.act_order = kern::Fp8CodeOrder::GemmFragment;
        k.fp8 = kern::launch_gemm_fp8;
        k.fp4 = kern::launch_gemm_fp4;
        k.grouped_fp4 = kern::launch_grouped_gemm_fp4;
        k.bf16 = kern::launch_gemm_bf16;
    }
    // Both Hopper sets (compute capability 9.0: fp64 tensor cores, 227 KB of shared memory per block) take
    // the mixes' fp64 GEMM and the 64-head attention CTAs.
    if (k.hopper) {
        k.hc_mix = kern::HcMixAccum::Fp64Mma;
        k.attn_cta = kern::SparseAttnCta::Heads64;
    }
    return k;
}

}  // namespace ds4r
