// Argument checks of the CUDA ops (cuda_ops_*.cpp, tests/cuda/testkit/cuda_gemm_check.cpp). The ops'
// contracts and the generic helpers are backend/op_checks.h (shared with the CPU backend), brought in here
// under their CUDA-side names; this header adds only the limits of the CUDA kernels (grid size, alignment).
#pragma once

#include <cstdint>

#include "backend/op_checks.h"
#include "ds4r/backend.h"
#include "ds4r/error.h"

namespace ds4r::cuda_linear {

inline constexpr auto& check_dtype = opcheck::expect_dtype;
inline constexpr auto& check_data = opcheck::expect_data;
inline constexpr auto& check_shape = opcheck::expect_shape;
inline constexpr auto& check_numel = opcheck::expect_numel;
inline constexpr auto& check_disjoint = opcheck::expect_disjoint;
inline constexpr auto& check_same_or_disjoint = opcheck::expect_same_or_disjoint;
inline constexpr auto& check_fp8_weight = opcheck::fp8_weight;
inline constexpr auto& check_fp4_weight = opcheck::fp4_weight;
using opcheck::rows_of;

// The tensor-core kernels stream operands with 16-byte cp.async copies.
inline void check_aligned16(const char* op, const char* name, const Tensor& t) {
    DS4R_CHECK(
        reinterpret_cast<uintptr_t>(t.data) % 16 == 0,
        "cuda %s: %s %s must start on a 16-byte boundary (weights in a layer slot must be 16-byte aligned)",
        op, name, shape_str(t.shape).c_str());
}
// Vector loads need `align`-byte aligned bases (empty tensors have nothing to load).
inline void check_aligned(const char* op, const char* name, const Tensor& t, size_t align) {
    DS4R_CHECK(t.numel() == 0 || reinterpret_cast<uintptr_t>(t.data) % align == 0,
               "cuda %s: %s must be %zu-byte aligned (a view at an odd offset?)", op, name, align);
}
// One launch covers fewer than 2^31 thread blocks in grid x.
inline void check_grid(const char* op, int64_t blocks) {
    DS4R_CHECK(blocks < (int64_t{1} << 31), "cuda %s: %lld thread blocks exceed the grid limit", op,
               (long long)blocks);
}

}  // namespace ds4r::cuda_linear
