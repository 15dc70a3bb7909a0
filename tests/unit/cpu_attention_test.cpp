// CPU sparse attention, window indices and the ratio-2 compressor pooling
// (docs/MODEL.md 4.6, 4.6.1, 5.4, 6.4).
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

struct AttnCase {
    Tensor q, win, cmp, sink, idx;
    int64_t m, H, hd, s, T, n_idx;
};

AttnCase random_attn_case(CpuBackend& be, Rng& rng, int64_t m, int64_t H, int64_t hd, int64_t s, int64_t T,
                          int64_t n_idx) {
    AttnCase c{random_bf16(be, {m, H, hd}, rng, 0.5f),
               random_bf16(be, {s, hd}, rng),
               random_bf16(be, {T, hd}, rng),
               random_f32(be, {H}, rng),
               make(be, DType::I32, {m, n_idx}),
               m,
               H,
               hd,
               s,
               T,
               n_idx};
    for (int64_t i = 0; i < m * n_idx; ++i) {
        const int64_t slot = i % n_idx;
        // a sprinkle of empty slots everywhere and an empty tail, both sources, duplicates allowed
        const bool empty = rng.randint(0, 6) == 0 || slot >= n_idx - 5;
        c.idx.ptr<int32_t>()[i] = empty ? -1 : static_cast<int32_t>(rng.randint(0, s + T - 1));
    }
    return c;
}

// softmax over the valid slots plus the sink logit (whose value row is zero), all in double.
std::vector<double> naive_attention(const AttnCase& c, float scale) {
    std::vector<double> out(static_cast<size_t>(c.m * c.H * c.hd), 0.0);
    for (int64_t r = 0; r < c.m; ++r)
        for (int64_t h = 0; h < c.H; ++h) {
            std::vector<double> logits;
            std::vector<const uint16_t*> rows;
            for (int64_t i = 0; i < c.n_idx; ++i) {
                const int32_t j = c.idx.ptr<int32_t>()[r * c.n_idx + i];
                if (j < 0) continue;
                const uint16_t* kr =
                    j < c.s ? c.win.ptr<uint16_t>() + j * c.hd : c.cmp.ptr<uint16_t>() + (j - c.s) * c.hd;
                double dot = 0;
                for (int64_t d = 0; d < c.hd; ++d)
                    dot += double(bf16_to_f32(c.q.ptr<uint16_t>()[(r * c.H + h) * c.hd + d])) *
                           bf16_to_f32(kr[d]);
                logits.push_back(dot * scale);
                rows.push_back(kr);
            }
            double mx = c.sink.ptr<float>()[h];
            for (double l : logits) mx = std::max(mx, l);
            double z = std::exp(double(c.sink.ptr<float>()[h]) - mx);
            for (double l : logits) z += std::exp(l - mx);
            for (size_t i = 0; i < logits.size(); ++i) {
                const double p = std::exp(logits[i] - mx) / z;
                for (int64_t d = 0; d < c.hd; ++d)
                    out[size_t((r * c.H + h) * c.hd + d)] += p * bf16_to_f32(rows[i][d]);
            }
        }
    return out;
}

}  // namespace

TEST(CpuSparseAttn, CloseToNaiveSoftmaxWithSink) {
    CpuBackend be(3);
    Rng rng(31);
    AttnCase c = random_attn_case(be, rng, 4, 3, 64, 40, 25, 150);  // 150 slots: three 64-slot tiles
    const float scale = 1.0f / 8.0f;
    Tensor o = make(be, DType::BF16, {c.m, c.H, c.hd});
    be.sparse_attn(c.q, c.win, c.cmp, c.sink, c.idx, scale, o);
    const std::vector<double> ref = naive_attention(c, scale);
    double worst = 0;
    for (int64_t i = 0; i < o.numel(); ++i) {
        const double got = bf16_to_f32(o.ptr<uint16_t>()[i]);
        const double err = std::fabs(got - ref[size_t(i)]);
        // bf16 probabilities (2^-9 relative each) + bf16 output rounding; |K| <~ 4
        EXPECT_LE(err, 2e-2 + 8e-3 * std::fabs(ref[size_t(i)])) << i;
        worst = std::max(worst, err);
    }
    EXPECT_GT(worst, 0.0);  // the bf16 probability rounding is really there
}

TEST(CpuSparseAttn, AllEmptyRowsGiveZerosAndTrailingEmptySlotsAreInert) {
    CpuBackend be(2);
    Rng rng(12);
    AttnCase c = random_attn_case(be, rng, 3, 2, 32, 20, 0, 70);
    for (int64_t i = 0; i < c.n_idx; ++i) c.idx.ptr<int32_t>()[c.n_idx + i] = -1;  // row 1: nothing
    Tensor o = make(be, DType::BF16, {c.m, c.H, c.hd});
    be.sparse_attn(c.q, c.win, c.cmp, c.sink, c.idx, 0.2f, o);
    for (int64_t i = 0; i < c.H * c.hd; ++i) EXPECT_EQ(o.ptr<uint16_t>()[c.H * c.hd + i], 0) << i;
    // The same rows with 130 more -1 slots (two more whole tiles plus a partial one): identical bytes.
    const int64_t wide = c.n_idx + 130;
    Tensor idx2 = make(be, DType::I32, {c.m, wide});
    for (int64_t r = 0; r < c.m; ++r)
        for (int64_t i = 0; i < wide; ++i)
            idx2.ptr<int32_t>()[r * wide + i] = i < c.n_idx ? c.idx.ptr<int32_t>()[r * c.n_idx + i] : -1;
    Tensor o2 = make(be, DType::BF16, {c.m, c.H, c.hd});
    be.sparse_attn(c.q, c.win, c.cmp, c.sink, idx2, 0.2f, o2);
    EXPECT_TRUE(same_bytes(o, o2));
    // An index outside the key rows is an error, not a crash.
    c.idx.ptr<int32_t>()[0] = 20;
    EXPECT_THROW(be.sparse_attn(c.q, c.win, c.cmp, c.sink, c.idx, 0.2f, o), RuntimeError);
}

TEST(CpuSparseAttn, ProbabilitiesAreRoundedToBf16AgainstTheRunningMax) {
    // One query, one head, hd = 1, two tiles: tile 0 holds a key whose probability relative to the
    // tile's max is not a bf16 value; the result must follow the kernel's order exactly.
    CpuBackend be(1);
    const int64_t n_idx = 128;
    Tensor q = bf16_from(be, {1, 1, 1}, {1.0f});
    std::vector<float> kv = {1.0f, 0.75f, 3.0f};
    Tensor win = bf16_from(be, {3, 1}, kv);
    Tensor cmp = make(be, DType::BF16, {0, 1});
    Tensor sink = f32_from(be, {1}, {-2.0f});
    std::vector<int32_t> iv(n_idx, -1);
    iv[0] = 0;
    iv[1] = 1;
    iv[64] = 2;
    Tensor idx = i32_from(be, {1, n_idx}, iv);
    Tensor o = make(be, DType::BF16, {1, 1, 1});
    const float scale = 0.7f;
    be.sparse_attn(q, win, cmp, sink, idx, scale, o);
    // The kernel's sequence, written out.
    const float s0 = 1.0f * scale, s1 = 0.75f * scale, s2 = 3.0f * scale;
    float M = -1e30f, sum = 0.0f, acc = 0.0f;
    float Mn = std::max(M, std::max(s0, s1));
    float alpha = std::exp(M - Mn);
    float p0 = std::exp(s0 - Mn), p1 = std::exp(s1 - Mn);
    sum = sum * alpha + (p0 + p1);
    acc = acc * alpha + static_cast<float>(double(round_bf16(p0)) * 1.0 + double(round_bf16(p1)) * 0.75);
    M = Mn;
    Mn = std::max(M, s2);
    alpha = std::exp(M - Mn);
    const float p2 = std::exp(s2 - Mn);
    sum = sum * alpha + p2;
    acc = acc * alpha + round_bf16(p2) * 3.0f;
    M = Mn;
    sum += std::exp(-2.0f - M);
    EXPECT_EQ(o.ptr<uint16_t>()[0], f32_to_bf16(acc / sum));
}

TEST(CpuWindowIndices, CausalWindowsWithTrailingEmptySlots) {
    CpuBackend be(1);
    Tensor qpos = i32_from(be, {5}, {0, 1, 2, 3, 4});
    Tensor idx = make(be, DType::I32, {5, 3});
    be.window_indices(qpos, 3, idx);
    const std::vector<int32_t> want = {0, -1, -1, 0, 1, -1, 0, 1, 2, 1, 2, 3, 2, 3, 4};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(idx.ptr<int32_t>()[i], want[i]) << i;
    // W = min(s, window) < window: rows still start at max(p - window + 1, 0).
    Tensor idx2 = make(be, DType::I32, {2, 2});
    be.window_indices(i32_from(be, {2}, {0, 1}), 128, idx2);
    EXPECT_EQ(idx2.ptr<int32_t>()[0], 0);
    EXPECT_EQ(idx2.ptr<int32_t>()[1], -1);
    EXPECT_EQ(idx2.ptr<int32_t>()[2], 0);
    EXPECT_EQ(idx2.ptr<int32_t>()[3], 1);
}

TEST(CpuCompressPool2, GroupSoftmaxPoolingInFp32) {
    CpuBackend be(2);
    Rng rng(6);
    const int64_t n = 4, hd = 24;
    Tensor kv = random_f32(be, {2 * n + 1, hd}, rng);  // odd row count: the last row is ignored
    Tensor sc = random_f32(be, {2 * n + 1, hd}, rng, 3.0f);
    Tensor out = make(be, DType::BF16, {n, hd});
    be.compress_pool2(kv, sc, out);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < hd; ++c) {
            const float a = sc.ptr<float>()[2 * j * hd + c], b = sc.ptr<float>()[(2 * j + 1) * hd + c];
            const float mx = std::max(a, b), ea = std::exp(a - mx), eb = std::exp(b - mx);
            const float want = kv.ptr<float>()[2 * j * hd + c] * (ea / (ea + eb)) +
                               kv.ptr<float>()[(2 * j + 1) * hd + c] * (eb / (ea + eb));
            EXPECT_EQ(out.ptr<uint16_t>()[j * hd + c], f32_to_bf16(want));
        }
    Tensor too_many = make(be, DType::BF16, {n + 1, hd});
    EXPECT_THROW(be.compress_pool2(kv, sc, too_many), RuntimeError);
}
