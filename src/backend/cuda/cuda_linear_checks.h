// Argument checks shared by the CUDA quantization / GEMM / MoE ops (cuda_ops_linear.cpp,
// cuda_ops_moe.cpp). Each throws RuntimeError naming the op, the argument and what was expected.
#pragma once

#include <cstdint>

#include "ds4r/backend.h"
#include "ds4r/error.h"

namespace ds4r::cuda_linear {

inline void check_dtype(const char* op, const char* name, const Tensor& t, DType want) {
    DS4R_CHECK(t.dtype == want, "cuda %s: %s must be %s, got %s %s", op, name, dtype_name(want), dtype_name(t.dtype),
               shape_str(t.shape).c_str());
}
inline void check_data(const char* op, const char* name, const Tensor& t) {
    for (int64_t d : t.shape)
        DS4R_CHECK(d >= 0, "cuda %s: %s has a negative dim %s", op, name, shape_str(t.shape).c_str());
    DS4R_CHECK(t.numel() == 0 || t.data != nullptr, "cuda %s: %s %s has no data", op, name, shape_str(t.shape).c_str());
}
inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
    DS4R_CHECK(t.shape == want, "cuda %s: %s must have shape %s, got %s", op, name, shape_str(want).c_str(),
               shape_str(t.shape).c_str());
    check_data(op, name, t);
}
inline void check_numel(const char* op, const char* name, const Tensor& t, int64_t want) {
    check_data(op, name, t);
    DS4R_CHECK(t.numel() == want, "cuda %s: %s %s must have %lld elements", op, name, shape_str(t.shape).c_str(),
               (long long)want);
}
// Rows of a tensor viewed as [rows, row_len] (its last dim must be row_len).
inline int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t row_len) {
    check_data(op, name, t);
    DS4R_CHECK(t.ndim() >= 1 && t.dim(-1) == row_len, "cuda %s: %s %s must have last dim %lld", op, name,
               shape_str(t.shape).c_str(), (long long)row_len);
    return row_len == 0 ? 0 : t.numel() / row_len;
}
inline void check_disjoint(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
    if (a.nbytes() == 0 || b.nbytes() == 0) return;
    const auto* pa = static_cast<const uint8_t*>(a.data);
    const auto* pb = static_cast<const uint8_t*>(b.data);
    DS4R_CHECK(pa + a.nbytes() <= pb || pb + b.nbytes() <= pa, "cuda %s: %s must not overlap %s", op, a_name, b_name);
}
// The tensor-core kernels stream operands with 16-byte cp.async copies.
inline void check_aligned16(const char* op, const char* name, const Tensor& t) {
    DS4R_CHECK(reinterpret_cast<uintptr_t>(t.data) % 16 == 0,
               "cuda %s: %s %s must start on a 16-byte boundary (weights in a layer slot must be 16-byte aligned)",
               op, name, shape_str(t.shape).c_str());
}

// fp8 weight: w F8_E4M3 [N, K] with s F8_E8M0 [ceil(N / 32), ceil(K / 32)] (MODEL.md 3.6).
inline void check_fp8_weight(const char* op, const char* name, const Fp8Linear& w) {
    DS4R_CHECK(w.w.dtype == DType::F8_E4M3 && w.s.dtype == DType::F8_E8M0,
               "cuda %s: %s must be F8_E4M3 + F8_E8M0 scales, got %s + %s", op, name, dtype_name(w.w.dtype),
               dtype_name(w.s.dtype));
    DS4R_CHECK(w.w.ndim() == 2, "cuda %s: %s must be 2-d, got %s", op, name, shape_str(w.w.shape).c_str());
    const int64_t N = w.w.dim(0), K = w.w.dim(1);
    DS4R_CHECK(w.s.shape == Shape({(N + 31) / 32, (K + 31) / 32}), "cuda %s: %s scale must be [%lld, %lld], got %s",
               op, name, (long long)((N + 31) / 32), (long long)((K + 31) / 32), shape_str(w.s.shape).c_str());
    check_data(op, name, w.w);
    check_data(op, name, w.s);
}
// fp4 weight: w I8 [N, K / 2] (two e2m1 codes per byte) with s F8_E8M0 [N, K / 32]; returns K.
inline int64_t check_fp4_weight(const char* op, const char* name, const Fp4Linear& w) {
    DS4R_CHECK((w.w.dtype == DType::I8 || w.w.dtype == DType::U8) && w.s.dtype == DType::F8_E8M0,
               "cuda %s: %s must be I8 (packed e2m1) + F8_E8M0 scales, got %s + %s", op, name, dtype_name(w.w.dtype),
               dtype_name(w.s.dtype));
    DS4R_CHECK(w.w.ndim() == 2, "cuda %s: %s must be 2-d, got %s", op, name, shape_str(w.w.shape).c_str());
    const int64_t N = w.w.dim(0), K = 2 * w.w.dim(1);
    DS4R_CHECK(K % 32 == 0, "cuda %s: %s has K = %lld, not a multiple of 32", op, name, (long long)K);
    DS4R_CHECK(w.s.shape == Shape({N, K / 32}), "cuda %s: %s scale must be [%lld, %lld], got %s", op, name,
               (long long)N, (long long)(K / 32), shape_str(w.s.shape).c_str());
    check_data(op, name, w.w);
    check_data(op, name, w.s);
    return K;
}

}  // namespace ds4r::cuda_linear
