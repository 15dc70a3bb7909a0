// CUDA activation quantization vs the CPU backend and the golden known answers (docs/MODEL.md 5.1, 5.2):
// bit exact everywhere (act_quant q and scale bytes even for NaN / inf inputs; the in-place round
// trips for finite inputs: NaN payloads are not compared), on random rows spanning the amax floors,
// the golden edge rows, unaligned views (the kernels' scalar path), and single rows vs batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "ds4r/npy.h"
#include "ds4r/numeric.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

std::string quant_file(const std::string& name) {
    return data_dir() + "/tiny-a/quant/" + name + ".npy";
}

// bf16 rows whose magnitudes span 1e-9 .. 1e6 (row r has scale 10^((r % 16) - 9)): below the fp8
// amax floor 1e-4, around it, and far above; every 7th row has a zero block and a -0 block.
std::vector<uint16_t> spread_rows(int64_t M, int64_t K, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> v(static_cast<size_t>(M * K));
    for (int64_t r = 0; r < M; ++r) {
        const float scale = std::pow(10.0f, static_cast<float>(r % 16) - 9.0f);
        for (int64_t k = 0; k < K; ++k) v[static_cast<size_t>(r * K + k)] = f32_to_bf16(nd(rng) * scale);
        if (r % 7 == 0 && K >= 64) {
            for (int64_t k = 0; k < 32; ++k) v[static_cast<size_t>(r * K + k)] = 0x0000;
            for (int64_t k = 32; k < 64; ++k) v[static_cast<size_t>(r * K + k)] = 0x8000;
        }
    }
    return v;
}

void run_act_quant(const Pair& x, int64_t M, int64_t K, const std::string& what) {
    Pair q = make_output(DType::F8_E4M3, {M, K});
    Pair s = make_output(DType::F8_E8M0, {M, K / 32});
    act_quant_fp8(cpu(), x.c, q.c, s.c);
    act_quant_fp8(*cuda(), x.g, q.g, s.g);
    expect_bitwise_equal(q, what + " q");
    expect_bitwise_equal(s, what + " s");
}

// In-place op on a copy of host bytes on each side; bitwise comparison of finite outputs.
template <class Op>
void run_inplace(const std::vector<uint16_t>& host, int64_t M, int64_t K, Op op, const std::string& what) {
    Pair x = make_pair(DType::BF16, {M, K}, host.data());
    op(cpu(), x.c);
    op(*cuda(), x.g);
    expect_bitwise_equal(x, what);
}

}  // namespace

TEST(CudaQuant, ActQuantFp8MatchesGoldenAndCpu) {
    DS4R_REQUIRE_CUDA();
    const NpyArray xa = load_npy(quant_file("x_bf16"));
    const NpyArray qa = load_npy(quant_file("act_quant_q_e4m3"));
    const NpyArray sa = load_npy(quant_file("act_quant_s_e8m0"));
    const int64_t M = xa.shape[0], K = xa.shape[1];
    Pair x = make_pair(DType::BF16, {M, K}, xa.data.data());
    Pair q = make_output(DType::F8_E4M3, {M, K});
    Pair s = make_output(DType::F8_E8M0, {M, K / 32});
    act_quant_fp8(cpu(), x.c, q.c, s.c);
    act_quant_fp8(*cuda(), x.g, q.g, s.g);
    expect_bitwise_equal(q, "golden act_quant q (cpu vs cuda)");
    expect_bitwise_equal(s, "golden act_quant s (cpu vs cuda)");
    EXPECT_EQ(to_host(*cuda(), q.g), qa.data) << "cuda act_quant q vs the reference's known answer";
    EXPECT_EQ(to_host(*cuda(), s.g), sa.data) << "cuda act_quant s vs the reference's known answer";
}

TEST(CudaQuant, ActQuantFp8RandomRows) {
    DS4R_REQUIRE_CUDA();
    const int64_t M = sanitizer_run() ? 17 : 130, K = sanitizer_run() ? 256 : 5120;
    const auto host = spread_rows(M, K, 11);
    run_act_quant(make_pair(DType::BF16, {M, K}, host.data()), M, K, "act_quant random");
    // odd row counts
    for (int64_t m : {1, 3, 17}) {
        Pair x = make_pair(DType::BF16, {m, K}, host.data());
        run_act_quant(x, m, K, "act_quant M=" + std::to_string(m));
    }
}

TEST(CudaQuant, ActQuantFp8NonFiniteInputsBitExact) {
    DS4R_REQUIRE_CUDA();
    // NaN / inf blocks: the scale byte comes from the bit trick on a NaN / inf amax and the codes from
    // x / s; both backends compute the same bytes (0x00 scale for a NaN block, 0xff for an inf one).
    const int64_t M = 6, K = 128;
    auto host = spread_rows(M, K, 5);
    const uint16_t nan = 0x7fc0, pinf = 0x7f80, ninf = 0xff80, nnan = 0xffc1, big = 0x7f7f;
    host[3] = nan;
    host[K + 40] = pinf;
    host[2 * K + 70] = ninf;
    host[2 * K + 71] = pinf;
    host[3 * K + 100] = nnan;
    host[3 * K + 5] = pinf;
    host[4 * K + 9] = big;     // largest finite bf16
    host[5 * K + 0] = 0x0001;  // smallest subnormal
    run_act_quant(make_pair(DType::BF16, {M, K}, host.data()), M, K, "act_quant non-finite");
}

TEST(CudaQuant, ActQuantFp8InplaceMatchesGoldenAndCpu) {
    DS4R_REQUIRE_CUDA();
    const NpyArray xa = load_npy(quant_file("x_bf16"));
    const NpyArray ref = load_npy(quant_file("act_quant_inplace_bf16"));
    const int64_t M = xa.shape[0], K = xa.shape[1];
    Pair x = make_pair(DType::BF16, {M, K}, xa.data.data());
    cpu().act_quant_fp8_inplace(x.c);
    cuda()->act_quant_fp8_inplace(x.g);
    expect_bitwise_equal(x, "golden act_quant inplace (cpu vs cuda)");
    EXPECT_EQ(to_host(*cuda(), x.g), ref.data) << "cuda act_quant inplace vs the reference's known answer";

    const int64_t Mr = sanitizer_run() ? 9 : 130, Kr = sanitizer_run() ? 512 : 4096;
    run_inplace(
        spread_rows(Mr, Kr, 21), Mr, Kr, [](Backend& be, const Tensor& t) { be.act_quant_fp8_inplace(t); },
        "act_quant inplace random");
}

TEST(CudaQuant, Fp4InplaceE8M0MatchesGoldenAndCpu) {
    DS4R_REQUIRE_CUDA();
    const NpyArray xa = load_npy(quant_file("x_bf16"));
    const NpyArray ref = load_npy(quant_file("fp4_e8m0_inplace_bf16"));
    const int64_t M = xa.shape[0], K = xa.shape[1];
    Pair x = make_pair(DType::BF16, {M, K}, xa.data.data());
    cpu().fp4_quant_inplace(x.c, Fp4Scale::E8M0_32);
    cuda()->fp4_quant_inplace(x.g, Fp4Scale::E8M0_32);
    expect_bitwise_equal(x, "golden fp4 e8m0 inplace (cpu vs cuda)");
    EXPECT_EQ(to_host(*cuda(), x.g), ref.data) << "cuda fp4 e8m0 inplace vs the reference's known answer";

    const int64_t Mr = sanitizer_run() ? 9 : 130, Kr = sanitizer_run() ? 256 : 2048;
    run_inplace(
        spread_rows(Mr, Kr, 31), Mr, Kr,
        [](Backend& be, const Tensor& t) { be.fp4_quant_inplace(t, Fp4Scale::E8M0_32); }, "fp4 e8m0 random");
}

TEST(CudaQuant, Fp4InplaceE4M3MatchesGoldenAndCpu) {
    DS4R_REQUIRE_CUDA();
    const NpyArray xa = load_npy(quant_file("x_bf16"));
    const NpyArray ref = load_npy(quant_file("fp4_e4m3_inplace_bf16"));
    const int64_t M = xa.shape[0], K = xa.shape[1];
    Pair x = make_pair(DType::BF16, {M, K}, xa.data.data());
    cpu().fp4_quant_inplace(x.c, Fp4Scale::E4M3_16);
    cuda()->fp4_quant_inplace(x.g, Fp4Scale::E4M3_16);
    expect_bitwise_equal(x, "golden fp4 e4m3 inplace (cpu vs cuda)");
    EXPECT_EQ(to_host(*cuda(), x.g), ref.data) << "cuda fp4 e4m3 inplace vs the reference's known answer";

    // K = 528: a multiple of 16 but not of 32 (blocks of 16 only)
    const int64_t Mr = sanitizer_run() ? 9 : 130, Kr = 528;
    run_inplace(
        spread_rows(Mr, Kr, 41), Mr, Kr,
        [](Backend& be, const Tensor& t) { be.fp4_quant_inplace(t, Fp4Scale::E4M3_16); }, "fp4 e4m3 random");
}

TEST(CudaQuant, UnalignedViewsUseTheScalarPath) {
    DS4R_REQUIRE_CUDA();
    // GPU tensors starting 2 bytes (x) / 1 byte (q) past an allocation: no 16-byte vector access.
    const int64_t M = 5, K = 96;
    const auto host = spread_rows(M, K, 51);
    Pair x = make_pair(DType::BF16, {M, K}, host.data());
    Tensor gbuf = cuda()->alloc(DType::BF16, {M * K + 8});
    Tensor gx = tensor_view(static_cast<uint8_t*>(gbuf.data) + 2, DType::BF16, {M, K});
    cuda()->upload(gx, 0, host.data(), host.size() * 2);
    Tensor qbuf = cuda()->alloc(DType::F8_E4M3, {M * K + 16});
    Tensor gq = tensor_view(static_cast<uint8_t*>(qbuf.data) + 1, DType::F8_E4M3, {M, K});
    Pair q{cpu().alloc(DType::F8_E4M3, {M, K}), gq};
    Pair s = make_output(DType::F8_E8M0, {M, K / 32});
    act_quant_fp8(cpu(), x.c, q.c, s.c);
    act_quant_fp8(*cuda(), gx, gq, s.g);
    expect_bitwise_equal(q, "unaligned act_quant q");
    expect_bitwise_equal(s, "unaligned act_quant s");

    cpu().fp4_quant_inplace(x.c, Fp4Scale::E8M0_32);
    cuda()->fp4_quant_inplace(gx, Fp4Scale::E8M0_32);
    expect_bitwise_equal(Pair{x.c, gx}, "unaligned fp4 inplace");
    cpu().act_quant_fp8_inplace(x.c);
    cuda()->act_quant_fp8_inplace(gx);
    expect_bitwise_equal(Pair{x.c, gx}, "unaligned act_quant inplace");
}

TEST(CudaQuant, RowsAloneEqualRowsInABatch) {
    DS4R_REQUIRE_CUDA();
    const int64_t M = 130, K = 1024;
    const auto host = spread_rows(M, K, 61);
    Backend& g = *cuda();
    Tensor x = g.alloc(DType::BF16, {M, K});
    g.upload(x, 0, host.data(), host.size() * 2);
    Tensor q = g.alloc(DType::F8_E4M3, {M, K}), s = g.alloc(DType::F8_E8M0, {M, K / 32});
    act_quant_fp8(g, x, q, s);
    const auto qa = to_host(g, q), sa = to_host(g, s);
    for (int64_t r : {0, 64, 129}) {
        Tensor x1 = g.alloc(DType::BF16, {1, K});
        g.upload(x1, 0, host.data() + r * K, static_cast<size_t>(K) * 2);
        Tensor q1 = g.alloc(DType::F8_E4M3, {1, K}), s1 = g.alloc(DType::F8_E8M0, {1, K / 32});
        act_quant_fp8(g, x1, q1, s1);
        const auto qb = to_host(g, q1), sb = to_host(g, s1);
        EXPECT_EQ(0, std::memcmp(qb.data(), qa.data() + r * K, static_cast<size_t>(K)))
            << "row " << r << " q";
        EXPECT_EQ(0, std::memcmp(sb.data(), sa.data() + r * (K / 32), static_cast<size_t>(K / 32)))
            << "row " << r << " s";
    }
}

TEST(CudaQuant, RejectsBadShapes) {
    DS4R_REQUIRE_CUDA();
    Backend& g = *cuda();
    Tensor x = g.alloc(DType::BF16, {4, 48});
    Tensor q = g.alloc(DType::F8_E4M3, {4, 48}), s = g.alloc(DType::F8_E8M0, {4, 1});
    EXPECT_THROW(act_quant_fp8(g, x, q, s), RuntimeError);  // K not a multiple of 32
    EXPECT_THROW(g.act_quant_fp8_inplace(x), RuntimeError);
    EXPECT_THROW(g.fp4_quant_inplace(x, Fp4Scale::E8M0_32), RuntimeError);
    EXPECT_NO_THROW(g.fp4_quant_inplace(x, Fp4Scale::E4M3_16));  // 48 = 3 blocks of 16
    Tensor x2 = g.alloc(DType::BF16, {4, 64});
    Tensor q2 = g.alloc(DType::F8_E4M3, {4, 64}), s2 = g.alloc(DType::F8_E8M0, {4, 3});
    EXPECT_THROW(act_quant_fp8(g, x2, q2, s2), RuntimeError);  // scale count
    g.synchronize();
}
