// The mHC mixes kernel's accumulation variants (kHcMixVariantNames in include/ds4r/kernel_bench.h)
// exposed for the CUDA accuracy test (tests/cuda/cuda_hc_accum_test.cpp); the bench reaches them
// through KernelBench.
#pragma once

#include <vector>

#include "ds4r/kernel_bench.h"

namespace ds4r {

class CudaBackend;
struct Tensor;

// Index (into kHcMixVariantNames) of the variant `be` runs (its kernel set's, GemmKernels::hc_mix).
int hc_mix_default_variant(const CudaBackend& be);
// The rounded sums of the mixes kernel alone with variant `variant`: X BF16 [M, 4, D], fn F32
// [24, 4 * D] on the device -> host F32 [M, 25]: each token's 24 mix dots, then its sum of squares.
std::vector<float> hc_mix_dots(CudaBackend& be, int variant, const Tensor& X, const Tensor& fn);

}  // namespace ds4r
