// Comparisons of CPU vs CUDA outputs for the GEMM-based ops (linears, MoE), with an explicit
// cancellation allowance: an element whose exact value is far below the magnitudes that were summed
// into it can differ by more than one ulp of ITSELF when the two backends add in different orders
// (the CPU sums exactly and rounds once, the GPU accumulates in fp32). Such elements pass when the
// difference stays below allow(i), a small fraction of the sum of |terms| (a bug - a missing or
// wrong block - is orders of magnitude larger), and only a small share of elements may need it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ds4r/numeric.h"

namespace ds4r::test::gemm_cmp {

// bf16 ulp distance of two bf16 values (in ulps of the larger magnitude; inf for NaN mismatches).
inline double bf16_ulps(uint16_t a, uint16_t b) {
    if (a == b) return 0.0;
    const float fa = bf16_to_f32(a), fb = bf16_to_f32(b);
    if (std::isnan(fa) || std::isnan(fb)) return INFINITY;
    const float m = std::max(std::fabs(fa), std::fabs(fb));
    int e;
    std::frexp(m, &e);
    const double ulp = std::ldexp(1.0, e - 8);
    return std::fabs(static_cast<double>(fa) - fb) / ulp;
}

// bf16 outputs [n / cols, cols]: every element bitwise equal, or within max_ulps, or |a - b| <=
// allow(i); at least min_equal of them bitwise equal; at most max_allow_frac of them needing allow.
inline void compare_bf16(const std::vector<uint16_t>& cpu, const std::vector<uint16_t>& gpu, int64_t cols,
                         double max_ulps, double min_equal, double max_allow_frac,
                         const std::function<double(size_t)>& allow, const std::string& what) {
    ASSERT_EQ(cpu.size(), gpu.size()) << what;
    const size_t n = cpu.size();
    size_t equal = 0, allowed = 0, bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (cpu[i] == gpu[i]) {
            ++equal;
            continue;
        }
        const double u = bf16_ulps(cpu[i], gpu[i]);
        worst = std::max(worst, u);
        if (u <= max_ulps) continue;
        const double diff = std::fabs(static_cast<double>(bf16_to_f32(cpu[i])) - bf16_to_f32(gpu[i]));
        const double a = allow ? allow(i) : 0.0;
        if (diff <= a) {
            ++allowed;
            continue;
        }
        if (bad < 8)
            ADD_FAILURE() << what << ": element " << i << " (row " << i / cols << ", col " << i % cols
                          << ") cpu " << bf16_to_f32(cpu[i]) << " cuda " << bf16_to_f32(gpu[i]) << " (" << u
                          << " ulps, |diff| " << diff << " > allowance " << a << ")";
        ++bad;
    }
    const double frac_equal = n ? static_cast<double>(equal) / n : 1.0;
    const double frac_allowed = n ? static_cast<double>(allowed) / n : 0.0;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements beyond " << max_ulps
                       << " ulps and the cancellation allowance (worst " << worst << " ulps)";
    EXPECT_GE(frac_equal, min_equal) << what << ": only " << frac_equal * 100 << "% bitwise equal";
    EXPECT_LE(frac_allowed, max_allow_frac)
        << what << ": " << allowed << " elements needed the cancellation allowance";
    std::printf("[ compare  ] %s: %zu elements, %.4f%% bitwise equal, worst %.3g ulps, %zu by allowance\n",
                what.c_str(), n, frac_equal * 100, worst, allowed);
}

// fp32 outputs: |a - b| <= rel * |cpu| or <= allow(i) (lazy), NaN == NaN.
inline void compare_f32(const std::vector<float>& cpu, const std::vector<float>& gpu, int64_t cols,
                        double rel, double max_allow_frac, const std::function<double(size_t)>& allow,
                        const std::string& what) {
    ASSERT_EQ(cpu.size(), gpu.size()) << what;
    const size_t n = cpu.size();
    size_t equal = 0, allowed = 0, bad = 0;
    for (size_t i = 0; i < n; ++i) {
        const float a = cpu[i], b = gpu[i];
        if (a == b || (std::isnan(a) && std::isnan(b))) {
            ++equal;
            continue;
        }
        const double diff = std::fabs(static_cast<double>(a) - b);
        if (diff <= rel * std::fabs(static_cast<double>(a))) continue;
        const double al = allow ? allow(i) : 0.0;
        if (diff <= al) {
            ++allowed;
            continue;
        }
        if (bad < 8)
            ADD_FAILURE() << what << ": element " << i << " (row " << i / cols << ", col " << i % cols
                          << ") cpu " << a << " cuda " << b << " (|diff| " << diff << ", rel "
                          << diff / std::fabs(a) << ", allowance " << al << ")";
        ++bad;
    }
    const double frac_allowed = n ? static_cast<double>(allowed) / n : 0.0;
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements outside rel " << rel
                       << " and the cancellation allowance";
    EXPECT_LE(frac_allowed, max_allow_frac)
        << what << ": " << allowed << " elements needed the cancellation allowance";
    std::printf("[ compare  ] %s: %zu elements, %.4f%% bitwise equal, %zu by allowance\n", what.c_str(), n,
                n ? 100.0 * equal / n : 100.0, allowed);
}

template <class T>
std::vector<T> as_vector(const std::vector<uint8_t>& bytes) {
    std::vector<T> v(bytes.size() / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
}

}  // namespace ds4r::test::gemm_cmp
