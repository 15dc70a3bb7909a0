// Shared by the Hopper kernel tests (cuda_gemm_sm90_test.cpp: linears, fp16 weights, bf16, loads, batch
// invariance; cuda_gemm_sm90_grouped_test.cpp: grouped experts, the routing plan's tile split, the expert
// weight conversions): the two backends, uploads, random inputs, and the bitwise / ulp agreement measures.
#pragma once
#ifdef DS4R_HAVE_CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "ds4r/numeric.h"
#include "gemm_sm90.cuh"

namespace ds4r::test {

#define DS4R_REQUIRE_HOPPER()                                                                            \
    do {                                                                                                 \
        DS4R_REQUIRE_CUDA();                                                                             \
        if (!kern::sm90_gemm_usable(0))                                                                  \
            GTEST_SKIP() << "device 0 is not a compute capability 9.0 GPU: Hopper kernel tests skipped"; \
    } while (0)

// Measured bounds (H200, CUDA 13.0; see cuda_gemm_sm90_test.cpp's file comment). The default block-scaled
// kernels widen the codes to fp16 (Sm90Partials::Fp16Widened) and must equal the portable kernels bit for
// bit, as the bf16 GEMMs do. The fp8-wgmma partials (Sm90Partials::Fp8Wgmma) are the tensor core's own fp8
// sum: a fraction of outputs differ (by up to a few percent of the row's rms: the fp8 tensor core's sum).
// Measured: 93.5% (fp8, M = 1) .. 99.8% (fp4) bitwise; max |d| / rms 3.3e-2 (fp4, M = 8193).
// the fraction of outputs bitwise equal to the portable kernels, and max |difference| / rms of the
// portable output row
inline constexpr double kFp8WgmmaMinBitwise = 0.93;
inline constexpr double kFp8WgmmaMaxRel = 4e-2;

inline CudaBackend& hop() {
    static CudaBackend b(0, size_t{24} << 30, GpuKernels::Hopper);
    return b;
}
inline CudaBackend& port() {
    static CudaBackend b(0, size_t{24} << 30, GpuKernels::Portable);
    return b;
}

inline Tensor upload(Backend& be, DType t, const Shape& shape, const void* host) {
    Tensor d = be.alloc(t, shape);
    if (d.nbytes()) be.upload(d, 0, host, d.nbytes());
    return d;
}
inline Tensor poisoned(Backend& be, DType t, const Shape& shape) {
    Tensor d = be.alloc(t, shape);
    be.fill(d, 0xA5);
    return d;
}

inline std::vector<uint16_t> rand_x(int64_t M, int64_t K, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<uint16_t> h(static_cast<size_t>(M * K));
    for (auto& v : h) v = f32_to_bf16(nd(rng));
    return h;
}
inline uint8_t scale_byte(std::mt19937_64& rng, bool extreme) {
    return extreme ? static_cast<uint8_t>(rng() % 255) : static_cast<uint8_t>(113 + rng() % 11);
}
// fp4 weight scales [rows, kb] whose exponents the Hopper widened kernels take into B (bytes 114..128,
// gemm_sm90_tile.cuh sw_foldable), except column 0 of every K block kb % 5 == 3 (byte 129, still inside the
// fused window): stages that take the scales in and stages that do not, in one problem.
inline std::vector<uint8_t> foldable_fp4_scales(int64_t rows, int64_t kb, std::mt19937_64& rng) {
    std::vector<uint8_t> s(static_cast<size_t>(rows * kb));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < kb; ++b)
            s[static_cast<size_t>(r * kb + b)] =
                r == 0 && b % 5 == 3 ? 129 : static_cast<uint8_t>(114 + rng() % 15);
    return s;
}
inline std::vector<uint8_t> rand_fp8_codes(size_t n, std::mt19937_64& rng) {
    std::vector<uint8_t> w(n);
    for (auto& b : w) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    }
    return w;
}

// Distance in ulps between two values of the same dtype (2: bf16, 4: f32) via their ordered integers;
// both NaN: 0; one NaN: a large distance.
inline int64_t ulp_distance(const uint8_t* a, const uint8_t* b, size_t es) {
    auto ordered = [es](const uint8_t* p, bool* nan) -> int64_t {
        if (es == 2) {
            uint16_t h;
            std::memcpy(&h, p, 2);
            *nan = (h & 0x7fff) > 0x7f80;
            return (h & 0x8000) ? -static_cast<int64_t>(h & 0x7fff) : static_cast<int64_t>(h);
        }
        uint32_t u;
        std::memcpy(&u, p, 4);
        *nan = (u & 0x7fffffffu) > 0x7f800000u;
        return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
    };
    bool na, nb;
    const int64_t x = ordered(a, &na), y = ordered(b, &nb);
    if (na || nb) return na && nb ? 0 : (int64_t{1} << 40);
    return x > y ? x - y : y - x;
}

inline double value_of(const uint8_t* p, size_t es) {
    if (es == 2) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_f32(h);
    }
    float f;
    std::memcpy(&f, p, 4);
    return f;
}

// Outputs a (under test) and b (reference) of `cols` columns: bitwise fraction, max ulp distance, and
// max |a - b| / rms(b's row) (the ulp distance is large for tiny values near a sign change).
struct Agreement {
    size_t n = 0, equal = 0;
    int64_t max_ulp = 0;
    double max_rel = 0;
    double fraction() const { return n ? static_cast<double>(equal) / static_cast<double>(n) : 1.0; }
};
inline Agreement agreement(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t es,
                           int64_t cols) {
    Agreement g;
    EXPECT_EQ(a.size(), b.size());
    const size_t row = static_cast<size_t>(cols) * es;
    for (size_t r0 = 0; r0 + row <= std::min(a.size(), b.size()); r0 += row) {
        double ss = 0;
        for (size_t i = r0; i < r0 + row; i += es) ss += value_of(&b[i], es) * value_of(&b[i], es);
        const double rms = std::sqrt(ss / static_cast<double>(cols));
        for (size_t i = r0; i < r0 + row; i += es) {
            ++g.n;
            if (std::memcmp(&a[i], &b[i], es) == 0) {
                ++g.equal;
                continue;
            }
            g.max_ulp = std::max(g.max_ulp, ulp_distance(&a[i], &b[i], es));
            const double d = std::fabs(value_of(&a[i], es) - value_of(&b[i], es));
            // rows whose rms is 0 or not finite (extreme scales) have no relative measure
            if (rms > 0 && std::isfinite(rms) && std::isfinite(d)) g.max_rel = std::max(g.max_rel, d / rms);
        }
    }
    return g;
}
inline void report(const std::string& what, const char* against, const Agreement& g) {
    std::printf("[sm90] %-52s vs %-8s bitwise %9.5f%% of %9zu, max %lld ulp, max |d|/rms %.2e\n",
                what.c_str(), against, 100.0 * g.fraction(), g.n, static_cast<long long>(g.max_ulp),
                g.max_rel);
}
inline void expect_equal(const std::string& what, const char* against, const Agreement& g) {
    report(what, against, g);
    EXPECT_EQ(g.equal, g.n) << what << " vs " << against << ": not bitwise equal";
}
inline void expect_fp8_wgmma(const std::string& what, const Agreement& g) {
    report(what, "portable", g);
    EXPECT_GE(g.fraction(), kFp8WgmmaMinBitwise) << what;
    EXPECT_LE(g.max_rel, kFp8WgmmaMaxRel) << what;
}

// The fp8-wgmma variant of a block-scaled linear on the Hopper backend's activation codes.
inline std::vector<uint8_t> fp8_wgmma_linear(bool fp4, const Tensor& x, const Tensor& w, const Tensor& s,
                                             int64_t M, int64_t N, int64_t K) {
    CudaBackend& be = hop();
    // the fp8 wgmma reads the codes in K order (the widened default reads them fragment-ordered)
    const CudaBackend::GemmActs a =
        be.quantize_gemm_acts(x, M, K, kern::sm90_act_order(kern::Sm90Partials::Fp8Wgmma));
    Tensor y = poisoned(be, DType::BF16, {M, N});
    auto fn = fp4 ? kern::launch_gemm_fp4_sm90_partials : kern::launch_gemm_fp8_sm90_partials;
    DS4R_CUDA_CHECK(fn(kern::Sm90Partials::Fp8Wgmma, a.q.ptr<uint8_t>(), a.s.ptr<uint8_t>(), w.ptr<uint8_t>(),
                       s.ptr<uint8_t>(), y.ptr<uint16_t>(), N, M, N, K, be.stream(), kern::Sm90Loads::Auto));
    return to_host(be, y);
}

// The conversion tests' inputs: every byte value must occur.
inline void expect_every_byte_value(const std::vector<uint8_t>& in) {
    std::vector<bool> seen(256, false);
    for (uint8_t b : in) seen[b] = true;
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 256);
}

// A weight converter refuses an input pointer off 16 bytes, a size off its 16-byte grain and an output
// pointer off 16 bytes: launch(input byte offset, input bytes, output byte offset) -> its error.
template <class Launch>
void expect_refuses_misaligned(const Launch& launch) {
    EXPECT_EQ(launch(1, 16, 0), cudaErrorInvalidValue) << "input pointer off 16 bytes";
    EXPECT_EQ(launch(0, 24, 0), cudaErrorInvalidValue) << "size off 16 bytes";
    EXPECT_EQ(launch(0, 16, 8), cudaErrorInvalidValue) << "output pointer off 16 bytes";
}

}  // namespace ds4r::test

#endif  // DS4R_HAVE_CUDA
