// bench's kernel table (src/replay/bench_kernels.cpp) against a fake KernelBench that records what it is
// asked to time: --kernel-filter times (and prints, and writes as CSV) exactly the rows whose name holds
// its text, the cuBLAS 8192^3 reference always, and cuBLAS on a shape only where one of its rows is
// wanted; without a filter every row of the table is timed. (The CUDA backend's own timings are not
// tested: they assert nothing, ds4r/kernel_bench.h.)
#include "replay/bench_kernels.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli_run_util.h"
#include "ds4r/make_tiny.h"
#include "replay/bench_io.h"

using namespace ds4r;

namespace {

// Records each call as "what M N K" and answers 1.0 (-1 where a family has no such kernel, as the
// portable kernels answer for the Hopper-only rows when hopper is false).
struct FakeKernelBench : KernelBench {
    bool hopper = true;
    std::vector<std::string> calls;
    double rec(const std::string& what, int64_t m, int64_t n, int64_t k) {
        calls.push_back(what + " " + std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k));
        return 1.0;
    }
    double linear_fp8_tflops(int64_t M, int64_t N, int64_t K, int) override { return rec("fp8", M, N, K); }
    double linear_fp4_tflops(int64_t M, int64_t N, int64_t K, int) override { return rec("fp4", M, N, K); }
    double linear_bf16_tflops(int64_t M, int64_t N, int64_t K, int) override { return rec("bf16", M, N, K); }
    double cublas_bf16_tflops(int64_t M, int64_t N, int64_t K, int) override {
        return rec("cublas", M, N, K);
    }
    double grouped_fp4_tflops(int, int64_t rows, int64_t N, int64_t K, int, int, int tile_rows, bool routed,
                              ExpertLayout layout) override {
        const bool prepared = layout != ExpertLayout::None;
        if (!hopper && (tile_rows != 0 || prepared)) return -1;
        return rec(std::string("grouped") + (prepared ? std::string(" ") + expert_layout_name(layout) : "") +
                       (routed ? " routed" : ""),
                   rows, N, K);
    }
    double head_logits_tflops(int64_t M, int64_t V, int64_t D, int) override { return rec("head", M, V, D); }
    int64_t head_launch_rows() const override { return 1024; }
    double head_stats_tflops(int64_t M, int64_t V, int64_t D, int k, int, size_t head_offset) override {
        return rec(
            "head_stats k" + std::to_string(k) + (head_offset ? " +" + std::to_string(head_offset) : ""), M,
            V, D);
    }
    double hopper_gemm_tflops(int kind, int64_t M, int64_t N, int64_t K, bool tma, int) override {
        if (!hopper) return -1;
        return rec("hopper" + std::to_string(kind) + (tma ? " tma" : " cp"), M, N, K);
    }
    std::string gemm_family() const override { return "fake"; }
    double mma_sync_peak_tflops() override { return 1.0; }
    double hc_mixes_ms(int v, int64_t M, int64_t D, int) override {
        return rec("hc" + std::to_string(v), M, D, 0);
    }
    int hc_mix_default_variant() const override { return 2; }
    double sparse_attn_tflops(int64_t M, int64_t H, int64_t hd, int64_t, int64_t, int64_t, int64_t,
                              int heads_per_cta, int) override {
        if (!hopper && heads_per_cta == 64) return -1;
        return rec("sparse_attn " + std::to_string(heads_per_cta), M, H, hd);
    }
    int sparse_attn_heads_per_cta() const override { return hopper ? 64 : 16; }
    void reset_memory_high_water() override {}
    size_t memory_high_water() const override { return 0; }
};

struct Table {
    std::vector<std::string> rows;  // CSV row names
    std::vector<std::string> calls;
};

Table run_table(const std::string& filter, bool hopper = true) {
    const ModelConfig c = make_tiny_base_config(TinyPreset::FullWidth, 1);
    BenchOptions opt;
    opt.kernel_filter = filter;
    opt.iters = 1;
    FakeKernelBench kb;
    kb.hopper = hopper;
    Table t;
    std::FILE* out = std::tmpfile();
    double peak = 0;
    bench_kernels(
        kb, c, opt, 8192,
        [&](const std::string& name, int64_t, int64_t, int64_t, double, const std::string&,
            const std::string&) { t.rows.push_back(name); },
        out, &peak);
    std::fclose(out);
    EXPECT_EQ(peak, 1.0);
    t.calls = kb.calls;
    return t;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
    for (const auto& x : v)
        if (x == s) return true;
    return false;
}

}  // namespace

TEST(BenchKernels, FilterTimesOnlyTheRowsWhoseNameHoldsIt) {
    const ModelConfig c = make_tiny_base_config(TinyPreset::FullWidth, 1);
    const std::string wq_a = " 8192 " + std::to_string(c.q_lora_rank) + " " + std::to_string(c.dim);
    const Table t = run_table("wq_a fp8, GEMM alone, fp16");
    // the references (always) and the one row asked for
    EXPECT_EQ(t.rows, (std::vector<std::string>{
                          "cublas_bf16_8192", "mma_sync_peak", "attn.wq_a fp8, GEMM alone, fp16 weights, TMA",
                          "attn.wq_a fp8, GEMM alone, fp16 weights, TMA, 128-wide K stages"}));
    // timed: cuBLAS 8192^3, cuBLAS on wq_a's shape, the fp8-code TMA kernel (whether the Hopper kernels
    // run) and the fp16-weight kernel in both stage widths; not the whole op, the cp.async baseline or any
    // other shape
    EXPECT_EQ(t.calls,
              (std::vector<std::string>{"cublas 8192 8192 8192", "cublas" + wq_a, "hopper0 tma" + wq_a,
                                        "hopper4 tma" + wq_a, "hopper5 tma" + wq_a}));
}

TEST(BenchKernels, FilterOnTheGroupedExpertsTimesNoDenseShape) {
    const Table t = run_table("e5m2 weights");
    ASSERT_GT(t.rows.size(), 2u);
    for (size_t i = 2; i < t.rows.size(); ++i)
        EXPECT_NE(t.rows[i].find("e5m2 weights"), std::string::npos) << t.rows[i];
    for (const auto& call : t.calls) {
        if (call.rfind("cublas", 0) == 0) continue;
        EXPECT_EQ(call.rfind("grouped e5m2", 0), 0u) << call;  // only the e5m2 grouped kernels
    }
    // a filter nothing matches: the references alone
    const Table none = run_table("no such row");
    EXPECT_EQ(none.rows, (std::vector<std::string>{"cublas_bf16_8192", "mma_sync_peak"}));
    EXPECT_EQ(none.calls, (std::vector<std::string>{"cublas 8192 8192 8192"}));
}

TEST(BenchKernels, NoFilterTimesEveryRow) {
    const Table all = run_table("");
    // every family's rows, the head's three and the mHC variants
    for (const char* name : {"attn.wq_a fp8",
                             "attn.wo_a bf16 (1 group)",
                             "attn.wo_a bf16 (1 group), cp.async loads",
                             "shared w2 fp8, GEMM alone, fp16 weights, TMA",
                             "shared w2 fp8, GEMM alone, fp16 weights, TMA, 128-wide K stages",
                             "expert w2 fp4 (dense M), GEMM alone, cp.async",
                             "experts w1+w3 fp4 (grouped)",
                             "experts w2 fp4 (grouped), routed rows, e5m2 weights",
                             "experts w1+w3 fp4 (grouped), fp16 experts",
                             "experts w2 fp4 (grouped), routed rows, fp16 experts",
                             "experts w1+w3 fp4 (grouped), 64-row tiles",
                             "head logits bf16->f32",
                             "head logits, one head_stats launch",
                             "head logits, one head_stats launch, a 144k-token pass's worth in a row",
                             "head_stats, one call (logits + row statistics)",
                             "head_stats, one call, a 144k-token pass's worth in a row",
                             "head_stats, one call, head weights 80 bytes past a 256-byte boundary",
                             "experts w1+w3 fp4 (grouped), fp16 experts, 64-wide K stages",
                             "hc_mixes compensated",
                             "hc_mixes compensated-g2",
                             "hc_mixes fp64-mma",
                             "sparse_attn 16 heads per CTA",
                             "sparse_attn 64 heads per CTA"})
        EXPECT_TRUE(has(all.rows, name)) << name;
    // a head_stats call as the passes make them: a chunk's rows (8,192 here), score's 8 alternatives
    const ModelConfig c = make_tiny_base_config(TinyPreset::FullWidth, 1);
    const std::string head_vd = " 8192 " + std::to_string(c.vocab_size) + " " + std::to_string(c.dim);
    EXPECT_TRUE(has(all.calls, "head_stats k8" + head_vd));
    // and with the head weights where the slots put them before they aligned tensors to 256 bytes
    EXPECT_TRUE(has(all.calls, "head_stats k8 +80" + head_vd));
    // the portable kernels: no Hopper-only rows, the rest unchanged
    const Table portable = run_table("", false);
    for (const auto& r : portable.rows) {
        EXPECT_EQ(r.find("TMA"), std::string::npos) << r;
        EXPECT_EQ(r.find("e5m2"), std::string::npos) << r;
        EXPECT_EQ(r.find("fp16 experts"), std::string::npos) << r;
        EXPECT_EQ(r.find("-row tiles"), std::string::npos) << r;
    }
    EXPECT_TRUE(has(portable.rows, "experts w2 fp4 (grouped), routed rows"));
    // the sparse attention: the one sequence of 1,800 queries with the model's heads and slots, each CTA
    // shape the device can hold (here: the fake's 64-head shape only with the Hopper kernels)
    const std::string attn_mhd = " 1800 " + std::to_string(c.n_heads) + " " + std::to_string(c.head_dim);
    EXPECT_TRUE(has(all.calls, "sparse_attn 16" + attn_mhd));
    EXPECT_TRUE(has(all.calls, "sparse_attn 64" + attn_mhd));
    EXPECT_TRUE(has(portable.rows, "sparse_attn 16 heads per CTA"));
    EXPECT_FALSE(has(portable.rows, "sparse_attn 64 heads per CTA"));
    EXPECT_LT(portable.rows.size(), all.rows.size());
}

// bench's CSV quotes a field that holds a comma, a quote or a line break (RFC 4180) and leaves the others as
// they are: the kernel table's row names hold commas, and each of them reads back as one field.
TEST(BenchCsv, FieldsWithCommasQuotesOrLineBreaksAreQuoted) {
    EXPECT_EQ(csv_field("moe/experts_w1_w3"), "moe/experts_w1_w3");
    EXPECT_EQ(csv_field(""), "");
    EXPECT_EQ(csv_field("a, b"), "\"a, b\"");
    EXPECT_EQ(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
    const Table all = run_table("");
    int with_commas = 0;
    for (const std::string& name : all.rows) {
        with_commas += name.find(',') != std::string::npos;
        const std::string line =
            "kernels," + csv_field(name) + ",-1,0,1,2,3,4.5,TFLOP/s," + csv_field("x, y");
        const std::vector<std::string> f = test::split_csv_line(line);
        ASSERT_EQ(f.size(), 10u) << line;
        EXPECT_EQ(f[1], name);
        EXPECT_EQ(f[9], "x, y");
    }
    EXPECT_GT(with_commas, 10);  // the table's names do hold commas
}

// The layer FLOPs behind bench's TFLOP/s column: a window-only layer's attention core covers its window
// alone (it was counted with the compressed rows' top-k as well: +9.7 TFLOP per window layer of workload
// b), a compressed layer's the window plus min(top-k, s / ratio) rows, and an Engram layer adds its wkv.
TEST(BenchFlops, AttentionSlotsFollowTheLayerRole) {
    const ModelConfig c = make_tiny_base_config(TinyPreset::FullWidth, 4);
    const double D = c.dim, H = c.n_heads, hd = c.head_dim;
    const double core = 2.0 * H * hd * 2.0;  // FLOPs of QK + PV per token and attended slot
    LayerRole window, window_engram, ratio2;
    window.ratio = 0;
    window_engram.ratio = 0;
    window_engram.engram = true;
    ratio2.ratio = 2;  // a reuse layer: no compressor, no indexer
    // 1,800-token sequences: 128 window slots; 128 + 512 with the compressed rows (900 >= 512)
    const double w = layer_flops_per_token(c, window, 1800), r2 = layer_flops_per_token(c, ratio2, 1800);
    EXPECT_DOUBLE_EQ(r2 - w, core * 512);
    // short sequences: the window is the whole sequence, the top-k is s / ratio
    EXPECT_DOUBLE_EQ(layer_flops_per_token(c, window, 1800) - layer_flops_per_token(c, window, 100),
                     core * 28);
    EXPECT_DOUBLE_EQ(layer_flops_per_token(c, ratio2, 100) - layer_flops_per_token(c, window, 100),
                     core * 50);
    // Engram's wkv: 6,144 -> 25,600 (docs/MODEL.md 4.8)
    EXPECT_DOUBLE_EQ(layer_flops_per_token(c, window_engram, 1800) - w, 2.0 * 6144 * 25600);
    EXPECT_DOUBLE_EQ(D * (c.hc_mult + 1), 25600);
}
