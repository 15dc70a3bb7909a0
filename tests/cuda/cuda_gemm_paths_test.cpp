// The portable tensor-core GEMMs against their reference kernels, BITWISE (kernels/gemm_tile.cuh NUMERICS):
// every output element of linear_fp8 / linear_fp4 / linear_bf16 / linear_f32 / linear_wo_a and of the
// experts' grouped kernel must equal, bit for bit, what tests/cuda/testkit/gemm_oracle.cu computes with the
// plain per-element instruction sequence (one warp per 16 x 8 block, canonical activation codes, the
// original (P * sa) * sw scale expression). This pins down, on the GPU at hand:
// - the fragment-ordered activation codes (quant.cuh Fp8CodeOrder::GemmFragment) and their widening;
// - the fused block-scale form fma(P, sa * sw, acc) inside its exponent window, and the fall-back to
//   the three-rounding form outside it (extreme weight scales, huge activations, NaN / inf blocks);
// - independence from the tile shape (256 x 128 above 128 rows, 128 x 128 at or below, the grouped
//   kernel's 128 x 128 with gathered rows) and from partial tiles (warps skipping empty row blocks).
// Shapes: the model's (dim 5120, q_lora 1280, 64 x 512 heads, expert 2304, wo_b 8192) at modest M,
// and odd ones (M = 1, 3, 17, 64, 128, 129, 130, 300; N and K off the tiles).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/numeric.h"

#ifdef DS4R_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "testkit/cuda_gemm_check.h"
#endif

using namespace ds4r;
using namespace ds4r::test;

#ifdef DS4R_HAVE_CUDA

namespace {

// The portable kernels are the subject here whatever the GPU (the Hopper kernels are compared with
// them in cuda_gemm_sm90_test.cpp): a backend of their own.
CudaBackend& gpu() {
    if (!dynamic_cast<CudaBackend*>(cuda())) throw RuntimeError("the CUDA test backend is not a CudaBackend");
    static CudaBackend portable(0, size_t{8} << 30, GpuKernels::Portable);
    return portable;
}

Tensor upload(DType t, const Shape& shape, const void* host) {
    Tensor d = gpu().alloc(t, shape);
    if (d.nbytes()) gpu().upload(d, 0, host, d.nbytes());
    return d;
}
Tensor poisoned(DType t, const Shape& shape) {
    Tensor d = gpu().alloc(t, shape);
    gpu().fill(d, 0xA5);  // neither value: an unwritten element shows
    return d;
}

// x bf16 [M, K] ~ N(0, 1) * row_scale(r) (row_scale = 1: plain activations).
Tensor make_x(int64_t M, int64_t K, uint64_t seed, const std::vector<float>& row_scale = {}) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> h(static_cast<size_t>(M * K));
    for (int64_t r = 0; r < M; ++r) {
        const float sc = row_scale.empty()
                             ? 1.0f
                             : row_scale[static_cast<size_t>(r % static_cast<int64_t>(row_scale.size()))];
        for (int64_t k = 0; k < K; ++k) h[static_cast<size_t>(r * K + k)] = f32_to_bf16(nd(rng) * sc);
    }
    return upload(DType::BF16, {M, K}, h.data());
}

// Scale bytes: `extreme` cycles through every finite e8m0 byte 0 .. 254 (2^-127 .. 2^127, far outside
// the fused form's window); otherwise realistic weight scales 2^-14 .. 2^-4.
uint8_t scale_byte(std::mt19937_64& rng, bool extreme) {
    return extreme ? static_cast<uint8_t>(rng() % 255) : static_cast<uint8_t>(113 + rng() % 11);
}

Fp8Linear make_fp8(int64_t N, int64_t K, uint64_t seed, bool extreme = false) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> w(static_cast<size_t>(N * K)),
        s(static_cast<size_t>(((N + 31) / 32) * ((K + 31) / 32)));
    for (auto& b : w) {
        b = static_cast<uint8_t>(rng());
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
    }
    for (auto& b : s) b = scale_byte(rng, extreme);
    return {upload(DType::F8_E4M3, {N, K}, w.data()),
            upload(DType::F8_E8M0, {(N + 31) / 32, (K + 31) / 32}, s.data())};
}

Fp4Linear make_fp4(int64_t N, int64_t K, uint64_t seed, bool extreme = false) {
    std::mt19937_64 rng(seed);
    std::vector<uint8_t> w(static_cast<size_t>(N * K / 2)), s(static_cast<size_t>(N * (K / 32)));
    for (auto& b : w) b = static_cast<uint8_t>(rng());  // every e2m1 code pair is valid
    for (auto& b : s) b = scale_byte(rng, extreme);
    return {upload(DType::I8, {N, K / 2}, w.data()), upload(DType::F8_E8M0, {N, K / 32}, s.data())};
}

Tensor make_bf16_w(int64_t N, int64_t K, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<uint16_t> h(static_cast<size_t>(N * K));
    for (auto& v : h) v = f32_to_bf16(nd(rng));
    return upload(DType::BF16, {N, K}, h.data());
}

std::vector<uint8_t> host(const Tensor& t) {
    std::vector<uint8_t> v(t.nbytes());
    if (!v.empty()) gpu().download(v.data(), t, 0, v.size());
    return v;
}

// Bitwise equality of two [rows, cols] outputs, printing the first mismatches (row, column, both values).
void expect_same_bits(const Tensor& fast, const Tensor& ref, int64_t cols, const std::string& what) {
    const auto a = host(fast), b = host(ref);
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t es = dtype_size(fast.dtype);
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i += es) {
        if (std::memcmp(&a[i], &b[i], es) == 0) continue;
        if (bad < 8) {
            const size_t e = i / es;
            double fa, fb;
            if (es == 2) {
                uint16_t ha, hb;
                std::memcpy(&ha, &a[i], 2);
                std::memcpy(&hb, &b[i], 2);
                fa = bf16_to_f32(ha), fb = bf16_to_f32(hb);
            } else {
                float xa, xb;
                std::memcpy(&xa, &a[i], 4);
                std::memcpy(&xb, &b[i], 4);
                fa = xa, fb = xb;
            }
            ADD_FAILURE() << what << ": element " << e << " (row " << static_cast<int64_t>(e) / cols
                          << ", col " << static_cast<int64_t>(e) % cols << ") fast " << fa << " reference "
                          << fb;
        }
        ++bad;
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() / es
                       << " elements differ from the reference";
}

const std::vector<int64_t>& odd_ms() {
    static const std::vector<int64_t> full{1, 3, 17, 64, 128, 129, 130, 300}, small{1, 17, 130};
    return sanitizer_run() ? small : full;
}

void check_fp8(int64_t N, int64_t K, int64_t M, const Fp8Linear& w, uint64_t seed,
               const std::vector<float>& row_scale = {}) {
    const std::string what =
        "linear_fp8 " + std::to_string(N) + "x" + std::to_string(K) + " M=" + std::to_string(M);
    Tensor x = make_x(M, K, seed, row_scale);
    Tensor y = poisoned(DType::BF16, {M, N}), r = poisoned(DType::BF16, {M, N});
    gpu().linear_fp8(x, w, y);
    linear_fp8_oracle(gpu(), x, w, r);
    expect_same_bits(y, r, N, what);
}

void check_fp4(int64_t N, int64_t K, int64_t M, const Fp4Linear& w, uint64_t seed,
               const std::vector<float>& row_scale = {}, bool grouped = true) {
    const std::string what =
        "linear_fp4 " + std::to_string(N) + "x" + std::to_string(K) + " M=" + std::to_string(M);
    Tensor x = make_x(M, K, seed, row_scale);
    Tensor y = poisoned(DType::BF16, {M, N}), r = poisoned(DType::BF16, {M, N});
    gpu().linear_fp4(x, w, y);
    linear_fp4_oracle(gpu(), x, w, r);
    expect_same_bits(y, r, N, what);
    if (!grouped) return;
    Tensor g = poisoned(DType::BF16, {M, N});
    linear_fp4_grouped(gpu(), x, w, g, false);
    expect_same_bits(g, r, N, what + " (grouped kernel)");
    // gathered in reverse: output row i is x row M - 1 - i
    Tensor gr = poisoned(DType::BF16, {M, N});
    linear_fp4_grouped(gpu(), x, w, gr, true);
    const auto a = host(gr), b = host(r);
    const size_t row = static_cast<size_t>(N) * 2;
    size_t bad_rows = 0;
    for (int64_t i = 0; i < M; ++i)
        if (std::memcmp(a.data() + static_cast<size_t>(i) * row,
                        b.data() + static_cast<size_t>(M - 1 - i) * row, row) != 0)
            if (bad_rows++ < 4)
                ADD_FAILURE() << what << " (grouped, gathered rows): output row " << i << " != reference row "
                              << M - 1 - i;
    EXPECT_EQ(bad_rows, 0u) << what << " (grouped, gathered rows)";
}

void check_bf16(int64_t N, int64_t K, int64_t M, const Tensor& w, bool f32_out, uint64_t seed) {
    const std::string what = std::string(f32_out ? "linear_f32 " : "linear_bf16 ") + std::to_string(N) + "x" +
                             std::to_string(K) + " M=" + std::to_string(M);
    const DType yt = f32_out ? DType::F32 : DType::BF16;
    Tensor x = make_x(M, K, seed);
    Tensor y = poisoned(yt, {M, N}), r = poisoned(yt, {M, N});
    if (f32_out)
        gpu().linear_f32(x, w, y);
    else
        gpu().linear_bf16(x, w, y);
    linear_bf16_oracle(gpu(), x, w, r);
    expect_same_bits(y, r, N, what);
}

}  // namespace

TEST(CudaGemmPaths, Fp8MatchesReferenceBitwise) {
    DS4R_REQUIRE_CUDA();
    if (!sanitizer_run()) {
        // wq_a 1280x5120, wq_b 32768x1280, wkv 512x5120, wo_b 5120x8192, shared w1 2304x5120 / w2 5120x2304
        const int64_t shapes[][2] = {{1280, 5120}, {32768, 1280}, {512, 5120},
                                     {5120, 8192}, {2304, 5120},  {5120, 2304}};
        uint64_t seed = 1;
        for (const auto& s : shapes) {
            const Fp8Linear w = make_fp8(s[0], s[1], seed);
            for (int64_t M : {int64_t{130}, int64_t{300}}) check_fp8(s[0], s[1], M, w, 100 + seed++);
        }
    }
    const Fp8Linear odd = make_fp8(1000, 1056, 7);  // N off the 32 / 64 / 128 tiles, 33 K blocks
    for (int64_t M : odd_ms()) check_fp8(1000, 1056, M, odd, 200 + M);
    check_fp8(77, 32, 130, make_fp8(77, 32, 8), 301);  // one K block
    check_fp8(1, 64, 17, make_fp8(1, 64, 9), 302);     // a single output column
}

TEST(CudaGemmPaths, Fp4AndGroupedMatchReferenceBitwise) {
    DS4R_REQUIRE_CUDA();
    if (!sanitizer_run()) {
        const Fp4Linear w13 = make_fp4(2304, 5120, 11),
                        w2 = make_fp4(5120, 2304, 12);  // routed expert w1 / w3, w2
        for (int64_t M : {int64_t{100}, int64_t{130}, int64_t{300}}) {
            check_fp4(2304, 5120, M, w13, 400 + M);
            check_fp4(5120, 2304, M, w2, 500 + M);
        }
    }
    const Fp4Linear odd = make_fp4(250, 1056, 13);
    for (int64_t M : odd_ms()) check_fp4(250, 1056, M, odd, 600 + M);
    check_fp4(1, 32, 130, make_fp4(1, 32, 14), 701);
    check_fp4(129, 96, 131, make_fp4(129, 96, 15), 702);
}

TEST(CudaGemmPaths, ScalesOutsideTheFusedWindowMatchReferenceBitwise) {
    DS4R_REQUIRE_CUDA();
    // weight scales over the whole e8m0 range; activation rows from 1e-30 to 1e36 (block scales up
    // to 2^111), so that blocks leave the window through either operand; rows with NaN and +inf
    // (NaN-marker scale bytes) are added below
    const std::vector<float> row_scale{1.0f, 1e-30f, 1e-3f, 1e20f, 1e30f, 1e36f, 3.0f, 1e10f};
    const int64_t M = sanitizer_run() ? 17 : 130, N = 384, K = 1024;
    const Fp8Linear w8 = make_fp8(N, K, 21, true);
    const Fp4Linear w4 = make_fp4(N, K, 22, true);
    check_fp8(N, K, M, w8, 801, row_scale);
    check_fp4(N, K, M, w4, 802, row_scale);
    // non-finite activations: a NaN in row 2, +inf in row 5 (their blocks carry the NaN marker)
    std::vector<uint16_t> h(static_cast<size_t>(M * K));
    std::mt19937_64 rng(803);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto& v : h) v = f32_to_bf16(nd(rng));
    h[static_cast<size_t>(2 * K + 40)] = 0x7fc0;
    h[static_cast<size_t>(5 * K + 700)] = 0x7f80;
    Tensor x = upload(DType::BF16, {M, K}, h.data());
    const Fp8Linear w = make_fp8(N, K, 23);
    Tensor y = poisoned(DType::BF16, {M, N}), r = poisoned(DType::BF16, {M, N});
    gpu().linear_fp8(x, w, y);
    linear_fp8_oracle(gpu(), x, w, r);
    expect_same_bits(y, r, N, "linear_fp8 with NaN / inf activations");
    const auto out = host(y);
    uint16_t v;
    std::memcpy(&v, out.data() + static_cast<size_t>(2 * N) * 2, 2);
    EXPECT_TRUE(std::isnan(bf16_to_f32(v))) << "a row with a NaN activation must give NaN outputs";
}

TEST(CudaGemmPaths, Bf16MatchesReferenceBitwise) {
    DS4R_REQUIRE_CUDA();
    if (!sanitizer_run()) {
        const Tensor w = make_bf16_w(512, 5120, 31);
        for (int64_t M : {int64_t{130}, int64_t{300}}) {
            check_bf16(512, 5120, M, w, false, 900 + M);
            check_bf16(512, 5120, M, w, true, 910 + M);
        }
        const Tensor router = make_bf16_w(384, 5120, 32);  // router logits (f32)
        check_bf16(384, 5120, 130, router, true, 920);
    }
    const Tensor tail = make_bf16_w(1000, 1000, 33);  // K % 32 = 8: a zero-filled K tail
    const Tensor small = make_bf16_w(129, 136, 34);
    for (int64_t M : odd_ms()) {
        check_bf16(1000, 1000, M, tail, false, 930 + M);
        check_bf16(129, 136, M, small, true, 940 + M);
    }
}

TEST(CudaGemmPaths, WoAMatchesReferenceBitwise) {
    DS4R_REQUIRE_CUDA();
    struct Case {
        int64_t G, R, Kg;
    };
    std::vector<Case> cases{{3, 40, 96}, {4, 128, 512}};
    if (!sanitizer_run()) cases.push_back({8, 1024, 4096});  // o_groups 8, o_lora_rank 1024, 64 x 512 / 8
    uint64_t seed = 41;
    for (const Case& c : cases) {
        const Fp8Linear w = make_fp8(c.G * c.R, c.Kg, seed++);
        for (int64_t M : {int64_t{3}, int64_t{130}}) {
            const std::string what = "linear_wo_a " + std::to_string(c.G) + "x" + std::to_string(c.R) + "x" +
                                     std::to_string(c.Kg) + " M=" + std::to_string(M);
            Tensor o = make_x(M, c.G * c.Kg, 1000 + seed + M);
            Tensor y = poisoned(DType::BF16, {M, c.G * c.R}), r = poisoned(DType::BF16, {M, c.G * c.R});
            gpu().linear_wo_a(o, w, c.G, y);
            linear_wo_a_oracle(gpu(), o, w, c.G, r);
            expect_same_bits(y, r, c.G * c.R, what);
        }
    }
}

#else  // !DS4R_HAVE_CUDA

TEST(CudaGemmPaths, NeedsTheCudaBuild) {
    GTEST_SKIP() << "built without CUDA: the GEMM reference comparisons run on the GPU machine only";
}

#endif
