// CPU backend as a whole: host memory semantics, and for EVERY op the two hard rules of docs/DESIGN.md 4:
// an output row computed inside a batch of M rows is byte-identical to the same row computed alone,
// and results do not depend on the thread count.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>

#include "cpu_test_util.h"

using namespace ds4r;
using namespace ds4r::cputest;

namespace {

constexpr int64_t kRows = 6;

// Inputs of every op; per-row inputs have kRows rows (compress_pool2: 2 kv rows per output row).
struct Inputs {
    Tensor x64, o128, xr, norm_w, table, pos, X, fn, hc_scale, hc_base, mix, hx, R, post, comb;
    Tensor iq, ik, iw, qpos, score, sq, win, cmp, sink, aidx, ckv, csc, eX, ekv, eqw, ekw, hx32, head,
        targets;
    Fp8Linear l8, wo;
    Fp4Linear l4;
    Tensor wb, wf;
    MoeWeights moe;
};

Inputs make_inputs(CpuBackend& be) {
    Rng rng(2024);
    Inputs in;
    const int64_t M = kRows;
    in.x64 = random_bf16(be, {M, 64}, rng);
    in.l8 = random_fp8_linear(be, 40, 64, rng);
    in.l4 = random_fp4_linear(be, 40, 64, rng);
    in.wb = random_bf16(be, {30, 64}, rng);
    in.wf = random_f32(be, {30, 64}, rng);
    in.o128 = random_bf16(be, {M, 128}, rng);
    in.wo = random_fp8_linear(be, 48, 64, rng);
    in.norm_w = random_bf16(be, {64}, rng);
    in.table = make(be, DType::F32, {20, 4, 2});
    be.rope_table(160000.0, 16.0, 32, 32.0, 1.0, 8, in.table);
    in.xr = random_bf16(be, {M, 2 * 32}, rng);
    in.pos = i32_from(be, {M}, {0, 3, 19, 7, 7, 12});
    in.X = random_bf16(be, {M, 4, 32}, rng);
    in.fn = random_f32(be, {24, 128}, rng, 0.1f);
    in.hc_scale = f32_from(be, {3}, {0.5f, 0.8f, 1.2f});
    in.hc_base = random_f32(be, {24}, rng);
    in.mix = random_f32(be, {M, 4}, rng);
    in.hx = random_bf16(be, {M, 32}, rng);
    in.R = random_bf16(be, {M, 4, 32}, rng);
    in.post = random_f32(be, {M, 4}, rng);
    in.comb = random_f32(be, {M, 4, 4}, rng);
    in.iq = random_bf16(be, {M, 4, 32}, rng);
    in.ik = random_bf16(be, {40, 32}, rng);
    in.iw = random_bf16(be, {M, 4}, rng);
    in.qpos = i32_from(be, {M}, {39, 0, 17, 25, 4, 33});
    in.score = random_bf16(be, {M, 40}, rng);
    for (int64_t j = 0; j < 40; ++j)
        in.score.ptr<uint16_t>()[3 * 40 + j] = f32_to_bf16(0.5f);  // an all-tie row
    in.sq = random_bf16(be, {M, 3, 32}, rng, 0.3f);
    in.win = random_bf16(be, {10, 32}, rng);
    in.cmp = random_bf16(be, {8, 32}, rng);
    in.sink = random_f32(be, {3}, rng);
    in.aidx = make(be, DType::I32, {M, 70});
    for (int64_t i = 0; i < M * 70; ++i)
        in.aidx.ptr<int32_t>()[i] = rng.randint(0, 4) == 0 ? -1 : static_cast<int32_t>(rng.randint(0, 17));
    in.ckv = random_f32(be, {2 * M, 16}, rng);
    in.csc = random_f32(be, {2 * M, 16}, rng);
    in.eX = random_bf16(be, {M, 4, 32}, rng);
    in.ekv = random_bf16(be, {M, 5 * 32}, rng);
    in.eqw = random_bf16(be, {4, 32}, rng);
    in.ekw = random_bf16(be, {4, 32}, rng);
    in.hx32 = random_bf16(be, {M, 32}, rng);
    in.head = random_bf16(be, {300, 32}, rng);
    in.targets = i32_from(be, {M}, {3, -1, 299, 0, 17, 17});
    in.moe.gate_w = random_bf16(be, {8, 64}, rng, 0.3f);
    in.moe.gate_bias = random_f32(be, {8}, rng, 0.1f);
    in.moe.sw1 = random_fp8_linear(be, 32, 64, rng);
    in.moe.sw3 = random_fp8_linear(be, 32, 64, rng);
    in.moe.sw2 = random_fp8_linear(be, 64, 32, rng);
    for (int e = 0; e < 8; ++e)
        in.moe.experts.push_back({random_fp4_linear(be, 32, 64, rng), random_fp4_linear(be, 64, 32, rng),
                                  random_fp4_linear(be, 32, 64, rng)});
    return in;
}

using Outputs = std::map<std::string, std::vector<Tensor>>;

// Runs every op on rows [r0, r1) of the per-row inputs; each output has r1 - r0 rows.
Outputs run_all(CpuBackend& be, const Inputs& in, int64_t r0, int64_t r1) {
    const int64_t m = r1 - r0;
    auto rows = [&](const Tensor& t) { return copy_rows(be, t, r0, r1); };
    Outputs out;
    {
        Tensor q = make(be, DType::F8_E4M3, {m, 64}), s = make(be, DType::F8_E8M0, {m, 2});
        be.act_quant_fp8(rows(in.x64), q, s);
        Tensor a = rows(in.x64), b = rows(in.x64), c = rows(in.x64);
        be.act_quant_fp8_inplace(a);
        be.fp4_quant_inplace(b, Fp4Scale::E8M0_32);
        be.fp4_quant_inplace(c, Fp4Scale::E4M3_16);
        out["quant"] = {q, s, a, b, c};
    }
    {
        Tensor y8 = make(be, DType::BF16, {m, 40}), y4 = make(be, DType::BF16, {m, 40});
        Tensor yb = make(be, DType::BF16, {m, 30}), yf = make(be, DType::F32, {m, 30}),
               yo = make(be, DType::BF16, {m, 48});
        be.linear_fp8(rows(in.x64), in.l8, y8);
        be.linear_fp4(rows(in.x64), in.l4, y4);
        be.linear_bf16(rows(in.x64), in.wb, yb);
        be.linear_f32(rows(in.x64), in.wf, yf);
        be.linear_wo_a(rows(in.o128), in.wo, 2, yo);
        out["linear"] = {y8, y4, yb, yf, yo};
    }
    {
        Tensor y = make(be, DType::BF16, {m, 64});
        be.rms_norm(rows(in.x64), in.norm_w, 1e-20f, y);
        Tensor xr = rows(in.xr), xi = rows(in.xr);
        be.rope_inplace(xr, 2, 32, 8, rows(in.pos), in.table, false);
        be.rope_inplace(xi, 2, 32, 8, rows(in.pos), in.table, true);
        out["norm_rope"] = {y, xr, xi};
    }
    {
        Tensor pre = make(be, DType::F32, {m, 4}), post = make(be, DType::F32, {m, 4}),
               comb = make(be, DType::F32, {m, 4, 4});
        be.hc_mixes(rows(in.X), in.fn, in.hc_scale, in.hc_base, 1e-20f, 1e-6f, 20, pre, post, comb);
        Tensor y = make(be, DType::BF16, {m, 32}), o = make(be, DType::BF16, {m, 4, 32});
        be.hc_pre(rows(in.X), rows(in.mix), y);
        be.hc_post(rows(in.hx), rows(in.R), rows(in.post), rows(in.comb), o);
        out["hc"] = {pre, post, comb, y, o};
    }
    {
        Tensor sc = make(be, DType::BF16, {m, 40}), mask = make(be, DType::I32, {m, 1});
        be.index_scores(rows(in.iq), in.ik, rows(in.iw), rows(in.qpos), 1, sc);
        be.candidate_blocks(rows(in.score), rows(in.qpos), 1, 4, 3, mask);
        Tensor masked = rows(in.score);
        be.apply_candidate_mask(masked, mask, 4);
        Tensor idx = make(be, DType::I32, {m, 8}), idx2 = make(be, DType::I32, {m, 8});
        be.index_topk(rows(in.score), rows(in.qpos), 2, 100, idx);
        be.index_topk(masked, rows(in.qpos), 1, 100, idx2);
        out["indexer"] = {sc, mask, masked, idx, idx2};
    }
    {
        Tensor widx = make(be, DType::I32, {m, 16});
        be.window_indices(rows(in.qpos), 16, widx);
        Tensor o = make(be, DType::BF16, {m, 3, 32});
        be.sparse_attn(rows(in.sq), in.win, in.cmp, in.sink, rows(in.aidx), 0.17f, o);
        Tensor pooled = make(be, DType::BF16, {m, 16});
        be.compress_pool2(copy_rows(be, in.ckv, 2 * r0, 2 * r1), copy_rows(be, in.csc, 2 * r0, 2 * r1),
                          pooled);
        out["attention"] = {widx, o, pooled};
    }
    {
        Tensor X = rows(in.eX);
        be.engram_update(X, rows(in.ekv), in.eqw, in.ekw, 1e-20f);
        const int k = 4;
        HeadStatsOut h{make(be, DType::F64, {m}), make(be, DType::F64, {m}),    make(be, DType::F32, {m}),
                       make(be, DType::I32, {m}), make(be, DType::I32, {m, k}), make(be, DType::F32, {m, k})};
        be.head_stats(rows(in.hx32), in.head, rows(in.targets), k, h);
        out["engram_head"] = {X, h.lse, h.entropy, h.target_logit, h.rank, h.topk_ids, h.topk_logit};
    }
    {
        Tensor y = make(be, DType::BF16, {m, 64}), ri = make(be, DType::I32, {m, 6}),
               rw = make(be, DType::F32, {m, 6});
        be.moe(rows(in.x64), in.moe, MoeParams{}, y, ri, rw);
        out["moe"] = {y, ri, rw};
    }
    return out;
}

}  // namespace

TEST(CpuOps, HostMemoryAllocCopyFillAndRangeChecks) {
    CpuBackend be(1);
    EXPECT_EQ(be.name(), "cpu");
    EXPECT_TRUE(be.host_memory());
    EXPECT_GT(be.free_memory(), size_t{1} << 20);
    Tensor a = be.alloc(DType::F32, {3, 5});
    ASSERT_NE(a.data, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % 64, 0u);
    Tensor empty = be.alloc(DType::BF16, {0, 7});
    EXPECT_TRUE(empty.empty());
    const std::vector<float> src = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    be.upload(a, 0, src.data(), 60);
    Tensor b = be.alloc(DType::F32, {3, 5});
    be.fill(b, 0);
    be.copy(b, 20, a, 0, 20);  // row 0 of a -> row 1 of b
    std::vector<float> got(15);
    be.download(got.data(), b, 0, 60);
    for (int i = 0; i < 15; ++i) EXPECT_EQ(got[size_t(i)], i >= 5 && i < 10 ? float(i - 4) : 0.0f) << i;
    be.fill(b, 0xff);
    EXPECT_EQ(f32_bits(b.ptr<float>()[14]), 0xffffffffu);
    EXPECT_THROW(be.upload(a, 40, src.data(), 24), RuntimeError);
    EXPECT_THROW(be.download(got.data(), a, 0, 64), RuntimeError);
    EXPECT_THROW(be.copy(b, 0, a, 56, 8), RuntimeError);
    auto dflt = make_cpu_backend();
    EXPECT_EQ(dflt->name(), "cpu");
}

TEST(CpuOps, EveryOpIsBatchInvariantAndThreadCountInvariant) {
    CpuBackend one(1), many(5);
    const Inputs in = make_inputs(one);
    const Outputs a = run_all(one, in, 0, kRows);
    const Outputs b = run_all(many, in, 0, kRows);
    for (const auto& [name, ta] : a) {
        const std::vector<Tensor>& tb = b.at(name);
        for (size_t i = 0; i < ta.size(); ++i)
            EXPECT_TRUE(same_bytes(ta[i], tb[i])) << name << " output " << i;
    }
    for (int64_t r = 0; r < kRows; ++r) {
        const Outputs alone = run_all(many, in, r, r + 1);
        for (const auto& [name, ta] : a) {
            const std::vector<Tensor>& tr = alone.at(name);
            for (size_t i = 0; i < ta.size(); ++i)
                EXPECT_TRUE(rows_equal(ta[i], r, r + 1, tr[i])) << name << " output " << i << " row " << r;
        }
    }
}

TEST(CpuOps, ParallelForCoversEveryItemOnceAndRethrows) {
    CpuBackend be(7);
    std::vector<int> hits(1000, 0);
    be.parallel_for(1000, 1e6, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)] += 1;
    });
    for (int h : hits) EXPECT_EQ(h, 1);
    EXPECT_THROW(be.parallel_for(100, 1e6,
                                 [&](int64_t b, int64_t) {
                                     if (b > 0) DS4R_THROW(RuntimeError, "boom");
                                 }),
                 RuntimeError);
}
