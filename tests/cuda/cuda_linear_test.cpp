// CUDA linears vs the CPU backend (docs/MODEL.md 4.0, 5.3, 3.6, 4.6 f) at the model's real shapes and at
// odd shapes (M = 1, 3, 17, 130; N and K off the 128 / 32 tiles where the contract allows), plus
// batch invariance (a row alone == the same row inside 130 rows, bitwise) and determinism.
//
// Tolerances (see tests/cuda/cuda_gemm_compare.h):
// - bf16 outputs (fp8, fp4, bf16, wo_a): within 1 bf16 ulp, >= 99% bitwise equal. Why: the block-
//   scaled GEMMs follow the CPU's structure exactly (per-32 partial P, acc + (P*sa)*sw in K order);
//   only P differs - the CPU rounds the exact block sum once, the MMA rounds its two k16 halves, so
//   P can differ by an fp32 ulp, which flips the final bf16 rounding very rarely. The bf16 GEMMs
//   accumulate in fp32 where the CPU sums exactly: again fp32-ulp differences before one bf16
//   rounding. Elements whose value cancels far below the magnitudes summed into them may exceed
//   1 ulp of themselves: allowed up to 2^-16 * sum|x||w| for at most 0.1% of the elements.
// - fp32 outputs (linear_f32): |diff| <= 1e-5 * |cpu|, or <= 2^-20 * sum_k |x_k||w_k| for any number
//   of elements: with random signs |y| is often far below sum|x||w| (K = 5120: |y| ~ 0.02 of it), and
//   the fp32 accumulation error (~2^-24 * sqrt(K) * |partial sums|, ~1e-7 of sum|x||w|) then exceeds
//   1e-5 of |y| for a few percent of the elements; the bound still sits ~1000x below what a dropped
//   16-wide K chunk would cost (~1e-3 of sum|x||w|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_gemm_compare.h"
#include "cuda_test_util.h"
#include "ds4r/numeric.h"

using namespace ds4r;
using namespace ds4r::test;
using namespace ds4r::test::gemm_cmp;

namespace {

// One linear op on both backends with everything the comparisons need.
struct LinearCase {
    std::string name;
    DType x_dtype = DType::BF16;
    int64_t K = 0;  // x row length
    int64_t N = 0;  // y row length
    DType y_dtype = DType::BF16;
    std::function<void(Backend&, const Tensor&, const Tensor&)> cpu_op, gpu_op;
    // sum_k |x[m, k]| * |w[col, k]| of output column col, given |x| of row m (length K)
    std::function<double(const float*, int64_t)> abs_dot;
};

// x [M, K]: bf16 or f32 values ~ N(0, 1) (bf16: rounded), as raw bytes + |x| as floats.
struct HostX {
    std::vector<uint8_t> bytes;
    std::vector<float> abs;
};
HostX make_x(DType t, int64_t M, int64_t K, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    HostX h;
    h.abs.resize(static_cast<size_t>(M * K));
    h.bytes.resize(static_cast<size_t>(M * K) * dtype_size(t));
    for (int64_t i = 0; i < M * K; ++i) {
        float v = nd(rng);
        if (t == DType::BF16) {
            const uint16_t b = f32_to_bf16(v);
            std::memcpy(&h.bytes[static_cast<size_t>(i) * 2], &b, 2);
            v = bf16_to_f32(b);
        } else {
            std::memcpy(&h.bytes[static_cast<size_t>(i) * 4], &v, 4);
        }
        h.abs[static_cast<size_t>(i)] = std::fabs(v);
    }
    return h;
}

// Runs the case at M rows and compares CPU vs CUDA with the stated tolerances.
void check_case(const LinearCase& c, int64_t M, uint64_t seed) {
    const std::string what = c.name + " M=" + std::to_string(M);
    const HostX hx = make_x(c.x_dtype, M, c.K, seed);
    Pair x = make_pair(c.x_dtype, {M, c.K}, hx.bytes.data());
    Pair y = make_output(c.y_dtype, {M, c.N});
    c.cpu_op(cpu(), x.c, y.c);
    c.gpu_op(*cuda(), x.g, y.g);
    const auto a = to_host(cpu(), y.c), b = to_host(*cuda(), y.g);
    const int64_t N = c.N, K = c.K;
    if (c.y_dtype == DType::BF16) {
        const double f = std::ldexp(1.0, -16);
        compare_bf16(
            as_vector<uint16_t>(a), as_vector<uint16_t>(b), N, 1.0, 0.99, 1e-3,
            [&](size_t i) {
                return f * c.abs_dot(hx.abs.data() + (static_cast<int64_t>(i) / N) * K,
                                     static_cast<int64_t>(i) % N);
            },
            what);
    } else {
        const double f = std::ldexp(1.0, -20);
        compare_f32(
            as_vector<float>(a), as_vector<float>(b), N, 1e-5, 1.0,
            [&](size_t i) {
                return f * c.abs_dot(hx.abs.data() + (static_cast<int64_t>(i) / N) * K,
                                     static_cast<int64_t>(i) % N);
            },
            what);
    }
}

// GPU only: rows alone == rows inside 130 rows (bitwise), and a second run is bitwise identical.
void check_invariance(const LinearCase& c, uint64_t seed) {
    const int64_t M = 130;
    const HostX hx = make_x(c.x_dtype, M, c.K, seed);
    const size_t xrow = static_cast<size_t>(c.K) * dtype_size(c.x_dtype);
    const size_t yrow = static_cast<size_t>(c.N) * dtype_size(c.y_dtype);
    Backend& g = *cuda();
    Tensor x = g.alloc(c.x_dtype, {M, c.K});
    g.upload(x, 0, hx.bytes.data(), hx.bytes.size());
    Tensor y = g.alloc(c.y_dtype, {M, c.N});
    g.fill(y, 0xff);
    c.gpu_op(g, x, y);
    const auto full = to_host(g, y);
    g.fill(y, 0xff);
    c.gpu_op(g, x, y);
    EXPECT_TRUE(to_host(g, y) == full) << c.name << ": two runs differ (non-deterministic)";
    for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{77}, M - 1}) {
        Tensor x1 = g.alloc(c.x_dtype, {1, c.K});
        g.upload(x1, 0, hx.bytes.data() + r * xrow, xrow);
        Tensor y1 = g.alloc(c.y_dtype, {1, c.N});
        g.fill(y1, 0xff);
        c.gpu_op(g, x1, y1);
        const auto one = to_host(g, y1);
        EXPECT_EQ(0, std::memcmp(one.data(), full.data() + r * yrow, yrow))
            << c.name << ": row " << r << " computed alone differs from the same row inside " << M << " rows";
    }
    // a 3-row slice starting mid-batch (a view at a row offset)
    Tensor y3 = g.alloc(c.y_dtype, {3, c.N});
    c.gpu_op(g, x.rows(64, 67), y3);
    const auto three = to_host(g, y3);
    EXPECT_EQ(0, std::memcmp(three.data(), full.data() + 64 * yrow, 3 * yrow))
        << c.name << ": rows 64..66 as a view";
}

// ---------------------------------------------------------------- case factories

LinearCase fp8_case(int64_t N, int64_t K, uint64_t seed) {
    auto [wc, wg] = random_fp8_linear_pair(N, K, seed);
    LinearCase c;
    c.name = "linear_fp8 " + std::to_string(N) + "x" + std::to_string(K);
    c.K = K;
    c.N = N;
    c.cpu_op = [wc](Backend& be, const Tensor& x, const Tensor& y) { be.linear_fp8(x, wc, y); };
    c.gpu_op = [wg](Backend& be, const Tensor& x, const Tensor& y) { be.linear_fp8(x, wg, y); };
    const int64_t KB = (K + 31) / 32;
    c.abs_dot = [wc, K, KB](const float* xa, int64_t n) {
        const uint8_t* w = wc.w.ptr<uint8_t>() + n * K;
        const uint8_t* s = wc.s.ptr<uint8_t>() + (n / 32) * KB;
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += xa[k] * std::fabs(e4m3_to_f32(w[k]) * e8m0_to_f32(s[k / 32]));
        return acc;
    };
    return c;
}

LinearCase fp4_case(int64_t N, int64_t K, uint64_t seed) {
    auto [wc, wg] = random_fp4_linear_pair(N, K, seed);
    LinearCase c;
    c.name = "linear_fp4 " + std::to_string(N) + "x" + std::to_string(K);
    c.K = K;
    c.N = N;
    c.cpu_op = [wc](Backend& be, const Tensor& x, const Tensor& y) { linear_fp4(be, x, wc, y); };
    c.gpu_op = [wg](Backend& be, const Tensor& x, const Tensor& y) { linear_fp4(be, x, wg, y); };
    c.abs_dot = [wc, K](const float* xa, int64_t n) {
        const uint8_t* w = wc.w.ptr<uint8_t>() + n * (K / 2);
        const uint8_t* s = wc.s.ptr<uint8_t>() + n * (K / 32);
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) {
            const uint8_t code = (k & 1) ? (w[k / 2] >> 4) : (w[k / 2] & 15);
            acc += xa[k] * std::fabs(e2m1_to_f32(code) * e8m0_to_f32(s[k / 32]));
        }
        return acc;
    };
    return c;
}

// Dense weights W [N, K] bf16 or f32 ~ N(0, 0.05^2).
struct DenseW {
    Pair w;
    std::vector<float> abs;
};
DenseW dense_w(DType t, int64_t N, int64_t K, uint64_t seed) {
    HostX h = make_x(t, N, K, seed);
    DenseW d;
    // scale by 0.05 (exact for f32 via multiply then store; bf16 re-rounded)
    for (int64_t i = 0; i < N * K; ++i) {
        float v;
        if (t == DType::BF16) {
            uint16_t b;
            std::memcpy(&b, &h.bytes[static_cast<size_t>(i) * 2], 2);
            b = f32_to_bf16(bf16_to_f32(b) * 0.05f);
            std::memcpy(&h.bytes[static_cast<size_t>(i) * 2], &b, 2);
            v = bf16_to_f32(b);
        } else {
            std::memcpy(&v, &h.bytes[static_cast<size_t>(i) * 4], 4);
            v *= 0.05f;
            std::memcpy(&h.bytes[static_cast<size_t>(i) * 4], &v, 4);
        }
        h.abs[static_cast<size_t>(i)] = std::fabs(v);
    }
    d.w = make_pair(t, {N, K}, h.bytes.data());
    d.abs = std::move(h.abs);
    return d;
}

LinearCase dense_case(bool f32_out, DType xt, DType wt, int64_t N, int64_t K, uint64_t seed) {
    DenseW d = dense_w(wt, N, K, seed);
    LinearCase c;
    c.name = std::string(f32_out ? "linear_f32 " : "linear_bf16 ") + dtype_name(xt) + "x" + dtype_name(wt) +
             " " + std::to_string(N) + "x" + std::to_string(K);
    c.x_dtype = xt;
    c.K = K;
    c.N = N;
    c.y_dtype = f32_out ? DType::F32 : DType::BF16;
    Tensor wc = d.w.c, wg = d.w.g;
    if (f32_out) {
        c.cpu_op = [wc](Backend& be, const Tensor& x, const Tensor& y) { be.linear_f32(x, wc, y); };
        c.gpu_op = [wg](Backend& be, const Tensor& x, const Tensor& y) { be.linear_f32(x, wg, y); };
    } else {
        c.cpu_op = [wc](Backend& be, const Tensor& x, const Tensor& y) { be.linear_bf16(x, wc, y); };
        c.gpu_op = [wg](Backend& be, const Tensor& x, const Tensor& y) { be.linear_bf16(x, wg, y); };
    }
    auto wabs = std::make_shared<std::vector<float>>(std::move(d.abs));
    c.abs_dot = [wabs, K](const float* xa, int64_t n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
            acc += static_cast<double>(xa[k]) * (*wabs)[static_cast<size_t>(n * K + k)];
        return acc;
    };
    return c;
}

LinearCase wo_a_case(int64_t G, int64_t R, int64_t Kg, uint64_t seed) {
    auto [wc, wg] = random_fp8_linear_pair(G * R, Kg, seed);
    LinearCase c;
    c.name = "linear_wo_a " + std::to_string(G) + "x" + std::to_string(R) + "x" + std::to_string(Kg);
    c.K = G * Kg;
    c.N = G * R;
    c.cpu_op = [wc, G](Backend& be, const Tensor& x, const Tensor& y) { be.linear_wo_a(x, wc, G, y); };
    c.gpu_op = [wg, G](Backend& be, const Tensor& x, const Tensor& y) { be.linear_wo_a(x, wg, G, y); };
    const int64_t KB = (Kg + 31) / 32;
    c.abs_dot = [wc, R, Kg, KB](const float* xa, int64_t col) {
        const int64_t g = col / R;
        const uint8_t* w = wc.w.ptr<uint8_t>() + col * Kg;
        const uint8_t* s = wc.s.ptr<uint8_t>() + (col / 32) * KB;
        double acc = 0;
        for (int64_t d = 0; d < Kg; ++d)
            acc += xa[g * Kg + d] * std::fabs(round_bf16(e4m3_to_f32(w[d]) * e8m0_to_f32(s[d / 32])));
        return acc;
    };
    return c;
}

const std::vector<int64_t>& odd_ms() {
    static const std::vector<int64_t> full{1, 3, 17, 130}, small{1, 3, 17};
    return sanitizer_run() ? small : full;
}

}  // namespace

// ---------------------------------------------------------------- fp8

TEST(CudaLinear, Fp8RealShapes) {
    DS4R_REQUIRE_CUDA();
    if (sanitizer_run()) GTEST_SKIP() << "real shapes skipped under compute-sanitizer";
    // wq_a 1280x5120, wq_b 32768x1280, wo_b 5120x8192, shared expert w1 2304x5120 / w2 5120x2304
    check_case(fp8_case(1280, 5120, 1), 130, 101);
    check_case(fp8_case(32768, 1280, 2), 130, 102);
    check_case(fp8_case(5120, 8192, 3), 130, 103);
    check_case(fp8_case(2304, 5120, 4), 67, 104);
    check_case(fp8_case(5120, 2304, 5), 67, 105);
}

TEST(CudaLinear, Fp8OddShapes) {
    DS4R_REQUIRE_CUDA();
    LinearCase c = fp8_case(1000, 1056, 11);  // N off the 32 and 128 tiles; 33 K blocks
    for (int64_t m : odd_ms()) check_case(c, m, 200 + m);
    check_case(fp8_case(77, 32, 12), 130, 210);  // one K block
    check_case(fp8_case(1, 64, 13), 17, 211);    // a single output column
}

TEST(CudaLinear, Fp8BatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    check_invariance(fp8_case(300, 1024, 21), 221);
}

// ---------------------------------------------------------------- fp4

TEST(CudaLinear, Fp4RealShapes) {
    DS4R_REQUIRE_CUDA();
    if (sanitizer_run()) GTEST_SKIP() << "real shapes skipped under compute-sanitizer";
    check_case(fp4_case(2304, 5120, 31), 130, 301);  // routed expert w1 / w3
    check_case(fp4_case(5120, 2304, 32), 130, 302);  // routed expert w2
}

TEST(CudaLinear, Fp4OddShapes) {
    DS4R_REQUIRE_CUDA();
    LinearCase c = fp4_case(250, 1056, 41);
    for (int64_t m : odd_ms()) check_case(c, m, 400 + m);
    check_case(fp4_case(1, 32, 42), 130, 410);
    check_case(fp4_case(129, 96, 43), 131, 411);
}

TEST(CudaLinear, Fp4BatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    check_invariance(fp4_case(384, 2048, 51), 501);
}

// ---------------------------------------------------------------- bf16

TEST(CudaLinear, Bf16Shapes) {
    DS4R_REQUIRE_CUDA();
    if (!sanitizer_run()) {
        check_case(dense_case(false, DType::BF16, DType::BF16, 512, 5120, 61), 130, 601);  // tensor cores
        check_case(dense_case(false, DType::BF16, DType::BF16, 64, 5120, 62), 130, 602);
    }
    LinearCase tc_tail = dense_case(false, DType::BF16, DType::BF16, 1000, 1000, 63);  // K % 32 = 8: K tail
    LinearCase simt = dense_case(false, DType::BF16, DType::BF16, 77, 1001, 64);  // K % 8 != 0: FFMA path
    for (int64_t m : odd_ms()) {
        check_case(tc_tail, m, 610 + m);
        check_case(simt, m, 620 + m);
    }
}

TEST(CudaLinear, Bf16BatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    check_invariance(dense_case(false, DType::BF16, DType::BF16, 300, 1024, 71), 701);
    check_invariance(dense_case(false, DType::BF16, DType::BF16, 300, 1001, 72), 702);
}

// ---------------------------------------------------------------- f32

TEST(CudaLinear, F32Shapes) {
    DS4R_REQUIRE_CUDA();
    if (!sanitizer_run()) {
        check_case(dense_case(true, DType::BF16, DType::BF16, 384, 5120, 81), 130, 801);  // router logits
        check_case(dense_case(true, DType::BF16, DType::F32, 1024, 5120, 82), 130,
                   802);  // fp32 compressor weights
    }
    LinearCase a = dense_case(true, DType::F32, DType::BF16, 300, 700, 83);
    LinearCase b = dense_case(true, DType::F32, DType::F32, 130, 333, 84);
    LinearCase t = dense_case(true, DType::BF16, DType::BF16, 129, 136, 85);
    for (int64_t m : odd_ms()) {
        check_case(a, m, 810 + m);
        check_case(b, m, 820 + m);
        check_case(t, m, 830 + m);
    }
}

TEST(CudaLinear, F32BatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    check_invariance(dense_case(true, DType::BF16, DType::BF16, 384, 1024, 91), 901);
    check_invariance(dense_case(true, DType::BF16, DType::F32, 200, 1024, 92), 902);
}

// ---------------------------------------------------------------- wo_a

TEST(CudaLinear, WoARealShape) {
    DS4R_REQUIRE_CUDA();
    if (sanitizer_run()) GTEST_SKIP() << "real shapes skipped under compute-sanitizer";
    check_case(wo_a_case(8, 1024, 4096, 1001), 130,
               1101);  // o_groups 8, o_lora_rank 1024, 64 heads x 512 / 8
}

TEST(CudaLinear, WoAOddShapes) {
    DS4R_REQUIRE_CUDA();
    LinearCase tc = wo_a_case(3, 40, 96, 1002);     // tensor-core path, R off the tiles
    LinearCase simt = wo_a_case(2, 33, 100, 1003);  // Kg % 8 != 0: FFMA path, partial scale blocks
    for (int64_t m : odd_ms()) {
        check_case(tc, m, 1110 + m);
        check_case(simt, m, 1120 + m);
    }
}

TEST(CudaLinear, WoABatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    check_invariance(wo_a_case(4, 128, 512, 1004), 1201);
}

// ---------------------------------------------------------------- contract checks

TEST(CudaLinear, RejectsBadArguments) {
    DS4R_REQUIRE_CUDA();
    Backend& g = *cuda();
    const auto wpair = random_fp8_linear_pair(64, 64, 1301);
    const Fp8Linear& wg = wpair.second;
    Tensor x = g.alloc(DType::BF16, {4, 64}), y = g.alloc(DType::BF16, {4, 64});
    Tensor xbad = g.alloc(DType::BF16, {4, 96});
    EXPECT_THROW(g.linear_fp8(xbad, wg, y), RuntimeError);  // K mismatch
    Fp8Linear odd_k{g.alloc(DType::F8_E4M3, {64, 40}), g.alloc(DType::F8_E8M0, {2, 2})};
    Tensor x40 = g.alloc(DType::BF16, {4, 40});
    EXPECT_THROW(g.linear_fp8(x40, odd_k, y), RuntimeError);  // K % 32 != 0
    Fp8Linear unaligned = wg;
    Tensor wbuf = g.alloc(DType::F8_E4M3, {64 * 64 + 16});
    unaligned.w = tensor_view(static_cast<uint8_t*>(wbuf.data) + 8, DType::F8_E4M3, {64, 64});
    EXPECT_THROW(g.linear_fp8(x, unaligned, y), RuntimeError);  // weights must be 16-byte aligned
    Tensor yf = g.alloc(DType::F32, {4, 64});
    EXPECT_THROW(g.linear_bf16(x, x, yf), RuntimeError);     // y dtype
    EXPECT_THROW(g.linear_wo_a(x, wg, 3, y), RuntimeError);  // groups must divide N
    g.synchronize();
}
