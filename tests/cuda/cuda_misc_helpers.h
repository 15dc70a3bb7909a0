// Small helpers shared by cuda_misc_test.cpp and cuda_rope_test.cpp (CUDA norms, RoPE, mHC,
// compressor pooling, Engram): host byte handling, single-row reruns, difference statistics.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/numeric.h"

namespace ds4r::test::misc {

// A GPU tensor holding the given host bytes.
inline Tensor cuda_tensor(DType t, const Shape& shape, const void* bytes) {
    Tensor x = cuda()->alloc(t, shape);
    if (x.nbytes()) cuda()->upload(x, 0, bytes, x.nbytes());
    return x;
}

// Bytes [r0, r1) rows of a host image whose rows are row_bytes long.
inline std::vector<uint8_t> row_bytes(const std::vector<uint8_t>& all, size_t row_len_bytes, int64_t r0,
                                      int64_t r1) {
    return std::vector<uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(r0 * row_len_bytes),
                                all.begin() + static_cast<std::ptrdiff_t>(r1 * row_len_bytes));
}

// Bitwise comparison of two host images with the first differing element printed (element size es).
inline void expect_bytes_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t es,
                               const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i += es)
        if (std::memcmp(&a[i], &b[i], es) != 0) {
            if (bad < 5) {
                uint32_t x = 0, y = 0;
                std::memcpy(&x, &a[i], std::min<size_t>(es, 4));
                std::memcpy(&y, &b[i], std::min<size_t>(es, 4));
                ADD_FAILURE() << what << ": element " << i / es << " bits 0x" << std::hex << x << " vs 0x"
                              << y << std::dec;
            }
            ++bad;
        }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() / es << " elements differ";
}

// bf16 agreement statistics of CPU vs CUDA outputs, printed so the log carries the measured numbers.
struct Bf16Stats {
    size_t n = 0, equal = 0;
    double max_ulps = 0;
};
inline Bf16Stats bf16_stats(const Pair& p, const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    Bf16Stats s;
    s.n = a.size() / 2;
    for (size_t i = 0; i < s.n; ++i) {
        uint16_t x, y;
        std::memcpy(&x, &a[2 * i], 2);
        std::memcpy(&y, &b[2 * i], 2);
        if (x == y) {
            ++s.equal;
            continue;
        }
        const float fx = bf16_to_f32(x), fy = bf16_to_f32(y);
        double u = INFINITY;
        if (!std::isnan(fx) && !std::isnan(fy)) {
            int e;
            std::frexp(std::max(std::fabs(fx), std::fabs(fy)), &e);
            u = std::fabs(static_cast<double>(fx) - fy) / std::ldexp(1.0, e - 8);
        }
        s.max_ulps = std::max(s.max_ulps, u);
    }
    std::printf("[stats] %s: %zu elements, %.4f%% bitwise equal, max %.2f bf16 ulp\n", what.c_str(), s.n,
                s.n ? 100.0 * s.equal / s.n : 100.0, s.max_ulps);
    return s;
}

// fp32 agreement statistics (max |a - b| and max |a - b| / |a|), printed.
inline void f32_stats(const Pair& p, const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    const size_t n = a.size() / 4;
    double max_abs = 0, max_rel = 0;
    size_t equal = 0;
    for (size_t i = 0; i < n; ++i) {
        float x, y;
        std::memcpy(&x, &a[4 * i], 4);
        std::memcpy(&y, &b[4 * i], 4);
        if (std::memcmp(&x, &y, 4) == 0) ++equal;
        const double d = std::fabs(static_cast<double>(x) - y);
        max_abs = std::max(max_abs, d);
        if (x != 0) max_rel = std::max(max_rel, d / std::fabs(static_cast<double>(x)));
    }
    std::printf("[stats] %s: %zu values, %.2f%% bitwise equal, max abs %.3g, max rel %.3g\n", what.c_str(), n,
                n ? 100.0 * equal / n : 100.0, max_abs, max_rel);
}

}  // namespace ds4r::test::misc
