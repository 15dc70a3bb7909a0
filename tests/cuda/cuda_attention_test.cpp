// CUDA attention ops vs the CPU backend (docs/MODEL.md 4.6, 5.4, 6.4): window / full index rows
// (identical) and sparse attention (bf16 tolerance stated below) at the real shape (64 heads x 512,
// 128 window + 512 compressed slots) and the tiny one, empty rows, inert trailing -1 slots, batch
// invariance and determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "ds4r/numeric.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

Pair i32_pair(const std::vector<int32_t>& v, const Shape& shape) {
    return make_pair(DType::I32, shape, v.data());
}

std::vector<uint16_t> gpu_bf16(const Tensor& t) {
    auto b = to_host(*cuda(), t);
    std::vector<uint16_t> v(b.size() / 2);
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
}

// Index rows as the model builds them (docs/MODEL.md 4.6 b, c): [window (W = min(s, window)) ;
// compressed (Kc = min(topk, T))], window part ascending with -1 after the query itself, compressed
// part min(n_t, Kc) distinct visible groups ascending (+s), -1 tail. n_t = (p + 1) / ratio.
std::vector<int32_t> model_indices(const std::vector<int32_t>& qpos, int64_t s, int64_t window, int64_t T,
                                   int64_t topk, int ratio, uint64_t seed, int64_t* n_idx) {
    std::mt19937_64 rng(seed);
    const int64_t W = std::min(s, window), Kc = std::min(topk, T), n = W + Kc;
    *n_idx = n;
    std::vector<int32_t> idx(qpos.size() * static_cast<size_t>(n), -1);
    for (size_t r = 0; r < qpos.size(); ++r) {
        const int64_t p = qpos[r];
        const int64_t start = std::max<int64_t>(p - window + 1, 0);
        for (int64_t c = 0; c < W; ++c) {
            const int64_t j = start + c;
            idx[r * n + c] = j > p ? -1 : static_cast<int32_t>(j);
        }
        const int64_t n_t = std::min((p + 1) / ratio, T);
        std::vector<int32_t> pool(static_cast<size_t>(n_t));
        for (int64_t j = 0; j < n_t; ++j) pool[static_cast<size_t>(j)] = static_cast<int32_t>(j);
        std::shuffle(pool.begin(), pool.end(), rng);
        pool.resize(static_cast<size_t>(std::min(n_t, Kc)));
        std::sort(pool.begin(), pool.end());
        for (size_t c = 0; c < pool.size(); ++c) idx[r * n + W + c] = pool[c] + static_cast<int32_t>(s);
    }
    return idx;
}

// bf16 closeness for attention outputs o [rows, seg] (seg = hd: one head's output vector): each
// element bitwise equal, or within max_ulps bf16 ulps of max(|cpu|, |cuda|, rms of its head's cpu
// output vector); at least min_equal of all elements bitwise equal. The rms floor: when the bf16
// rounding of one large probability differs (a few-ulp fp32 difference in its score), the whole
// head vector moves by ~2^-9 * p * |v|, which is within an ulp at the vector's scale but many ulps
// of an element that happens to cancel to ~0.
void expect_attn_close(const Pair& p, int64_t seg, double max_ulps, double min_equal,
                       const std::string& what) {
    auto a = to_host(cpu(), p.c), b = to_host(*cuda(), p.g);
    ASSERT_EQ(a.size(), b.size());
    const size_t n = a.size() / 2;
    auto val = [](const std::vector<uint8_t>& v, size_t i) {
        uint16_t x;
        std::memcpy(&x, &v[2 * i], 2);
        return x;
    };
    size_t equal = 0, bad = 0;
    double worst = 0;
    for (size_t s0 = 0; s0 < n; s0 += static_cast<size_t>(seg)) {
        double ss = 0;
        for (size_t i = s0; i < s0 + static_cast<size_t>(seg); ++i) {
            const double x = bf16_to_f32(val(a, i));
            ss += x * x;
        }
        const double rms = std::sqrt(ss / static_cast<double>(seg));
        for (size_t i = s0; i < s0 + static_cast<size_t>(seg); ++i) {
            const uint16_t x = val(a, i), y = val(b, i);
            if (x == y) {
                ++equal;
                continue;
            }
            const double fx = bf16_to_f32(x), fy = bf16_to_f32(y);
            const double diff = std::fabs(fx - fy);
            int e;
            std::frexp(std::max({std::fabs(fx), std::fabs(fy), rms}), &e);
            const double ulps = diff / std::ldexp(1.0, e - 8);
            if (std::isfinite(ulps)) worst = std::max(worst, ulps);
            if (!(ulps <= max_ulps)) {
                if (bad < 8)
                    ADD_FAILURE() << what << ": element " << i << " (row*H + head " << i / seg << ", dim "
                                  << i % seg << ") cpu " << fx << " cuda " << fy << " (" << ulps
                                  << " ulps; head rms " << rms << ")";
                ++bad;
            }
        }
    }
    EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " outside tolerance (worst " << worst
                       << " ulps)";
    EXPECT_GE(static_cast<double>(equal), min_equal * n)
        << what << ": only " << equal << " of " << n << " bitwise equal";
    std::printf("[ info ] %s: %.4f%% bitwise equal, worst %.3f ulps (of max(|x|, head rms))\n", what.c_str(),
                n ? 100.0 * equal / n : 100.0, worst);
}

struct AttnCase {
    int64_t H, hd, s, T, window, topk;
    int ratio;
    std::vector<int32_t> qpos;
};

struct AttnInputs {
    Pair q, win, cmp, sink, idx;
    int64_t m, n_idx;
    std::vector<int32_t> idx_host;
    std::vector<uint16_t> q_host;
};

AttnInputs make_attn_inputs(const AttnCase& c, uint64_t seed) {
    AttnInputs in;
    in.m = static_cast<int64_t>(c.qpos.size());
    in.idx_host = model_indices(c.qpos, c.s, c.window, c.T, c.topk, c.ratio, seed, &in.n_idx);
    std::mt19937_64 rng(seed + 1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    in.q_host.resize(static_cast<size_t>(in.m * c.H * c.hd));
    for (auto& x : in.q_host) x = f32_to_bf16(nd(rng));
    in.q = make_pair(DType::BF16, {in.m, c.H, c.hd}, in.q_host.data());
    in.win = random_bf16({c.s, c.hd}, 1.0f, seed + 2);
    in.cmp = c.T > 0 ? random_bf16({c.T, c.hd}, 1.0f, seed + 3) : make_pair(DType::BF16, {0, c.hd}, nullptr);
    in.sink = random_f32({c.H}, 1.0f, seed + 4);
    in.idx = i32_pair(in.idx_host, {in.m, in.n_idx});
    return in;
}

float attn_scale(int64_t hd) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
}

Pair run_attn_both(const AttnCase& c, const AttnInputs& in) {
    Pair o = make_output(DType::BF16, {in.m, c.H, c.hd});
    const float scale = attn_scale(c.hd);
    cpu().sparse_attn(in.q.c, in.win.c, in.cmp.c, in.sink.c, in.idx.c, scale, o.c);
    cuda()->sparse_attn(in.q.g, in.win.g, in.cmp.g, in.sink.g, in.idx.g, scale, o.g);
    return o;
}

// Positions 0..300, around the window edge (126..129) and at the end of the sequence.
std::vector<int32_t> real_positions(int64_t s, bool small) {
    std::vector<int32_t> p = {0, 1, 2, 63, 64, 126, 127, 128, 129, 200, 300, static_cast<int32_t>(s - 1)};
    if (small) p = {0, 127, 128, static_cast<int32_t>(s - 1)};
    return p;
}

}  // namespace

// ---------------------------------------------------------------------------- index rows

TEST(CudaAttention, WindowAndAttnIndicesIdentical) {
    DS4R_REQUIRE_CUDA();
    std::mt19937_64 rng(5);
    for (int64_t s : {int64_t{300}, int64_t{50}, int64_t{1}}) {
        const int64_t window = 128, W = std::min<int64_t>(s, window), m = std::min<int64_t>(s, 130);
        std::vector<int32_t> qpos(static_cast<size_t>(m));
        for (int64_t r = 0; r < m; ++r) qpos[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7) % s);
        Pair pp = i32_pair(qpos, {m});
        Pair wi = make_output(DType::I32, {m, W});
        window_indices(cpu(), pp.c, window, wi.c);
        window_indices(*cuda(), pp.g, window, wi.g);
        expect_bitwise_equal(wi, "window_indices s=" + std::to_string(s));
        for (int64_t kc : {int64_t{0}, int64_t{37}}) {
            std::vector<int32_t> tk(static_cast<size_t>(m * kc));
            for (auto& x : tk) x = static_cast<int32_t>(rng() % 1000) - 1;
            Pair pt = kc > 0 ? i32_pair(tk, {m, kc}) : make_pair(DType::I32, {m, 0}, nullptr);
            Pair ai = make_output(DType::I32, {m, W + kc});
            cpu().attn_indices(pp.c, window, pt.c, ai.c);
            cuda()->attn_indices(pp.g, window, pt.g, ai.g);
            expect_bitwise_equal(ai, "attn_indices s=" + std::to_string(s) + " kc=" + std::to_string(kc));
        }
    }
}

// ---------------------------------------------------------------------------- sparse attention
//
// Tolerance: <= 2 bf16 ulps of max(|o|, rms of the head's output vector) per element and >= 90% of
// the elements bitwise equal (expect_attn_close; the achieved fractions are printed). Why not exact: the CPU
// rounds each q.K dot product exactly (double, once) and the tensor cores accumulate in fp32 in their own
// order; a few-ulp fp32 difference in a score can move exp() across a bf16 rounding boundary of p, and CUDA's
// expf differs from glibc's in the last fp32 ulp. Everything else (tiling, max seed, bf16 p, the update
// order, the sink) is the same.

TEST(CudaAttention, SparseAttnRealShape) {
    DS4R_REQUIRE_CUDA();
    const bool small = sanitizer_run();
    // 64 heads x 512; s = 1024 window rows, ratio 2 -> T = 512 compressed rows, 128 + 512 slots
    AttnCase c{64, 512, 1024, 512, 128, 512, 2, real_positions(1024, small)};
    AttnInputs in = make_attn_inputs(c, 101);
    ASSERT_EQ(in.n_idx, 640);
    Pair o = run_attn_both(c, in);
    expect_attn_close(o, c.hd, 2.0, 0.9, "sparse_attn 64x512, 640 slots");
}

TEST(CudaAttention, SparseAttnShortSequenceAndOddHeads) {
    DS4R_REQUIRE_CUDA();
    // s < 128: the compressed part starts at slot W = s (tile placement depends on s, docs/MODEL.md 6.4)
    AttnCase a{64, 512, 100, 50, 128, 512, 2, {0, 1, 49, 98, 99}};
    AttnInputs ia = make_attn_inputs(a, 201);
    expect_attn_close(run_attn_both(a, ia), a.hd, 2.0, 0.9, "sparse_attn s=100");
    // 20 heads (a partial group of 16), hd 128, ratio 1
    AttnCase b{20, 128, 300, 300, 128, 512, 1, {0, 5, 150, 299}};
    AttnInputs ib = make_attn_inputs(b, 202);
    expect_attn_close(run_attn_both(b, ib), b.hd, 2.0, 0.9, "sparse_attn 20 heads x 128");
    // hd 256, window only (T = 0: no compressed part)
    AttnCase d{16, 256, 70, 0, 128, 512, 2, {0, 33, 69}};
    AttnInputs id = make_attn_inputs(d, 203);
    expect_attn_close(run_attn_both(d, id), d.hd, 2.0, 0.9, "sparse_attn hd 256, T = 0");
}

TEST(CudaAttention, SparseAttnTinyShape) {
    DS4R_REQUIRE_CUDA();
    // tiny preset: 4 heads x 64, window 16, ratio 2, index_topk 8
    std::vector<int32_t> qpos;
    for (int32_t p = 0; p < 40; ++p) qpos.push_back(p);
    AttnCase c{4, 64, 40, 20, 16, 8, 2, qpos};
    AttnInputs in = make_attn_inputs(c, 301);
    expect_attn_close(run_attn_both(c, in), c.hd, 2.0, 0.9, "sparse_attn tiny");
}

TEST(CudaAttention, SparseAttnEmptyRowsAndInertTail) {
    DS4R_REQUIRE_CUDA();
    AttnCase c{64, 512, 200, 100, 128, 512, 2, {0, 17, 130, 199}};
    AttnInputs in = make_attn_inputs(c, 401);
    // row 1: every slot empty -> zeros (M seeded -1e30, sum = exp(sink + 1e30) = inf, 0 / inf = 0)
    for (int64_t k = 0; k < in.n_idx; ++k) in.idx_host[static_cast<size_t>(in.n_idx + k)] = -1;
    in.idx = i32_pair(in.idx_host, {in.m, in.n_idx});
    Pair o = run_attn_both(c, in);
    expect_attn_close(o, c.hd, 2.0, 0.9, "sparse_attn with an empty row");
    const auto og = gpu_bf16(o.g);
    size_t nonzero = 0;
    for (int64_t i = 0; i < c.H * c.hd; ++i) nonzero += og[static_cast<size_t>(c.H * c.hd + i)] != 0 ? 1 : 0;
    EXPECT_EQ(nonzero, 0u) << "sparse_attn: an all-(-1) row must give exact zeros";

    // the same rows with 77 extra -1 slots appended (one more full tile + a partial one): same bits
    const int64_t extra = 77, n2 = in.n_idx + extra;
    std::vector<int32_t> padded(static_cast<size_t>(in.m * n2), -1);
    for (int64_t r = 0; r < in.m; ++r)
        for (int64_t k = 0; k < in.n_idx; ++k)
            padded[static_cast<size_t>(r * n2 + k)] = in.idx_host[static_cast<size_t>(r * in.n_idx + k)];
    Pair pidx = i32_pair(padded, {in.m, n2});
    Pair o2 = make_output(DType::BF16, {in.m, c.H, c.hd});
    cuda()->sparse_attn(in.q.g, in.win.g, in.cmp.g, in.sink.g, pidx.g, attn_scale(c.hd), o2.g);
    EXPECT_EQ(gpu_bf16(o2.g), og) << "sparse_attn: trailing -1 slots changed the output";
}

TEST(CudaAttention, SparseAttnBatchInvariantAndDeterministic) {
    DS4R_REQUIRE_CUDA();
    AttnCase c{64, 512, 400, 200, 128, 512, 2, {3, 127, 128, 250, 399}};
    AttnInputs in = make_attn_inputs(c, 501);
    const float scale = attn_scale(c.hd);
    Pair a = make_output(DType::BF16, {in.m, c.H, c.hd}), b = make_output(DType::BF16, {in.m, c.H, c.hd});
    cuda()->sparse_attn(in.q.g, in.win.g, in.cmp.g, in.sink.g, in.idx.g, scale, a.g);
    cuda()->sparse_attn(in.q.g, in.win.g, in.cmp.g, in.sink.g, in.idx.g, scale, b.g);
    const auto all = gpu_bf16(a.g);
    EXPECT_EQ(all, gpu_bf16(b.g)) << "sparse_attn: two runs differ";
    const int64_t rq = c.H * c.hd;
    for (int64_t r = 0; r < in.m; ++r) {
        std::vector<uint16_t> q1(in.q_host.begin() + r * rq, in.q_host.begin() + (r + 1) * rq);
        std::vector<int32_t> i1(in.idx_host.begin() + r * in.n_idx, in.idx_host.begin() + (r + 1) * in.n_idx);
        Pair pq1 = make_pair(DType::BF16, {1, c.H, c.hd}, q1.data()), pi1 = i32_pair(i1, {1, in.n_idx});
        Pair o1 = make_output(DType::BF16, {1, c.H, c.hd});
        cuda()->sparse_attn(pq1.g, in.win.g, in.cmp.g, in.sink.g, pi1.g, scale, o1.g);
        const auto one = gpu_bf16(o1.g);
        EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + r * rq))
            << "sparse_attn: row " << r << " differs when computed alone";
    }
}

// The Hopper kernel set's CTA shape (64 heads per CTA, the next tile's gather in flight) gives the
// portable shape's bits (16 heads per CTA): the real shape, a short sequence, a partial head group (20
// heads), hd 256 without compressed rows, the tiny shape, an all-empty row and trailing empty tiles.
TEST(CudaAttention, SparseAttnWideCtaGivesTheNarrowBits) {
    DS4R_REQUIRE_CUDA();
    auto* cb = dynamic_cast<CudaBackend*>(cuda());
    ASSERT_NE(cb, nullptr);
    if (kern::sparse_attn_smem_bytes(512, kern::SparseAttnCta::Heads64) > cb->props().sharedMemPerBlockOptin)
        GTEST_SKIP() << "the 64-head CTA needs more shared memory per block than this GPU allows";
    std::vector<int32_t> tiny_pos;
    for (int32_t p = 0; p < 40; ++p) tiny_pos.push_back(p);
    const bool small = sanitizer_run();
    const AttnCase cases[] = {{64, 512, 1024, 512, 128, 512, 2, real_positions(1024, small)},
                              {64, 512, 100, 50, 128, 512, 2, {0, 1, 49, 98, 99}},
                              {20, 128, 300, 300, 128, 512, 1, {0, 5, 150, 299}},
                              {16, 256, 70, 0, 128, 512, 2, {0, 33, 69}},
                              {4, 64, 40, 20, 16, 8, 2, tiny_pos},
                              {130, 64, 200, 100, 128, 512, 2, {0, 17, 130, 199}}};
    int ci = 0;
    for (const AttnCase& c : cases) {
        AttnInputs in = make_attn_inputs(c, 700 + ci);
        // case 1: row 1 all empty, and 70 trailing empty slots on every row (a full empty tile + a part)
        int64_t n_idx = in.n_idx;
        std::vector<int32_t> idx = in.idx_host;
        if (ci == 1) {
            const int64_t n2 = n_idx + 70;
            std::vector<int32_t> padded(static_cast<size_t>(in.m * n2), -1);
            for (int64_t r = 0; r < in.m; ++r)
                for (int64_t k = 0; k < n_idx && r != 1; ++k)
                    padded[static_cast<size_t>(r * n2 + k)] = idx[static_cast<size_t>(r * n_idx + k)];
            idx = padded;
            n_idx = n2;
        }
        const Pair pidx = i32_pair(idx, {in.m, n_idx});
        std::vector<uint16_t> out[2];
        for (int w = 0; w < 2; ++w) {
            const Pair o = make_output(DType::BF16, {in.m, c.H, c.hd});
            ASSERT_EQ(cudaSuccess, kern::launch_sparse_attn(
                                       in.q.g.ptr<uint16_t>(), in.win.g.ptr<uint16_t>(),
                                       c.T > 0 ? in.cmp.g.ptr<uint16_t>() : nullptr, in.sink.g.ptr<float>(),
                                       pidx.g.ptr<int32_t>(), o.g.ptr<uint16_t>(), in.m, c.H, c.hd, c.s, c.T,
                                       n_idx, attn_scale(c.hd), cb->stream(),
                                       w ? kern::SparseAttnCta::Heads64 : kern::SparseAttnCta::Heads16));
            out[w] = gpu_bf16(o.g);
        }
        EXPECT_EQ(out[0], out[1]) << "case " << ci << " (" << c.H << " heads x " << c.hd << ", " << n_idx
                                  << " slots): the 64-head CTA differs from the 16-head one";
        ++ci;
    }
}
