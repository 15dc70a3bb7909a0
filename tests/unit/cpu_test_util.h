// Helpers shared by the CPU backend tests (tests/unit/cpu_*_test.cpp): host tensors filled from
// vectors or random data, random quantized linears, row slicing and byte comparison.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ref.h"
#include "ds4r/numeric.h"

namespace ds4r::cputest {

struct Rng {
    std::mt19937_64 g;
    explicit Rng(uint64_t seed) : g(seed) {}
    float normal(float sd = 1.0f) { return std::normal_distribution<float>(0.0f, sd)(g); }
    float uniform(float a, float b) { return std::uniform_real_distribution<float>(a, b)(g); }
    int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
};

inline Tensor make(CpuBackend& be, DType t, const Shape& shape) {
    Tensor x = be.alloc(t, shape);
    be.fill(x, 0);
    return x;
}

// bf16 tensor holding bf16(v[i]).
inline Tensor bf16_from(CpuBackend& be, const Shape& shape, const std::vector<float>& v) {
    Tensor x = be.alloc(DType::BF16, shape);
    for (size_t i = 0; i < v.size(); ++i) x.ptr<uint16_t>()[i] = f32_to_bf16(v[i]);
    return x;
}
inline Tensor f32_from(CpuBackend& be, const Shape& shape, const std::vector<float>& v) {
    Tensor x = be.alloc(DType::F32, shape);
    std::memcpy(x.data, v.data(), v.size() * 4);
    return x;
}
inline Tensor i32_from(CpuBackend& be, const Shape& shape, const std::vector<int32_t>& v) {
    Tensor x = be.alloc(DType::I32, shape);
    std::memcpy(x.data, v.data(), v.size() * 4);
    return x;
}
inline std::vector<float> values(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
        if (t.dtype == DType::BF16)
            v[i] = bf16_to_f32(t.ptr<uint16_t>()[i]);
        else
            v[i] = t.ptr<float>()[i];
    }
    return v;
}
inline Tensor random_bf16(CpuBackend& be, const Shape& shape, Rng& rng, float sd = 1.0f) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& e : v) e = rng.normal(sd);
    return bf16_from(be, shape, v);
}
inline Tensor random_f32(CpuBackend& be, const Shape& shape, Rng& rng, float sd = 1.0f) {
    std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& e : v) e = rng.normal(sd);
    return f32_from(be, shape, v);
}

// Random fp8 linear [N, K]: e4m3 codes of N(0, 1) values, e8m0 scales around 2^-6.
inline Fp8Linear random_fp8_linear(CpuBackend& be, int64_t N, int64_t K, Rng& rng) {
    Fp8Linear l;
    l.w = be.alloc(DType::F8_E4M3, {N, K});
    l.s = be.alloc(DType::F8_E8M0, {(N + 31) / 32, (K + 31) / 32});
    for (int64_t i = 0; i < N * K; ++i) l.w.ptr<uint8_t>()[i] = f32_to_e4m3(rng.normal(1.0f));
    for (int64_t i = 0; i < l.s.numel(); ++i)
        l.s.ptr<uint8_t>()[i] = static_cast<uint8_t>(127 - 6 + rng.randint(-1, 1));
    return l;
}
// Random fp4 linear [N, K]: random e2m1 codes, e8m0 scales around 2^-3.
inline Fp4Linear random_fp4_linear(CpuBackend& be, int64_t N, int64_t K, Rng& rng) {
    Fp4Linear l;
    l.w = be.alloc(DType::I8, {N, K / 2});
    l.s = be.alloc(DType::F8_E8M0, {N, K / 32});
    for (int64_t i = 0; i < N * K / 2; ++i) l.w.ptr<uint8_t>()[i] = static_cast<uint8_t>(rng.randint(0, 255));
    for (int64_t i = 0; i < l.s.numel(); ++i)
        l.s.ptr<uint8_t>()[i] = static_cast<uint8_t>(127 - 3 + rng.randint(-1, 1));
    return l;
}

// A fresh contiguous copy of rows [r0, r1) of t (dim 0).
inline Tensor copy_rows(CpuBackend& be, const Tensor& t, int64_t r0, int64_t r1) {
    Shape s = t.shape;
    s[0] = r1 - r0;
    Tensor x = be.alloc(t.dtype, s);
    const Tensor src = t.rows(r0, r1);
    if (x.nbytes()) std::memcpy(x.data, src.data, x.nbytes());
    return x;
}
inline Tensor clone(CpuBackend& be, const Tensor& t) {
    return copy_rows(be, t, 0, t.shape.empty() ? 1 : t.dim(0));
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.data, b.data, a.nbytes()) == 0);
}
// Rows [r0, r1) of `whole` byte-equal to all of `part`.
inline bool rows_equal(const Tensor& whole, int64_t r0, int64_t r1, const Tensor& part) {
    return same_bytes(whole.rows(r0, r1), part);
}

// Distance in units in the last place between two finite floats of the same sign class.
inline int64_t ulp_distance(float a, float b) {
    auto ordered = [](float f) {
        const int32_t i = static_cast<int32_t>(f32_bits(f));
        return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
    };
    const int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

}  // namespace ds4r::cputest
