#include "replay/bench_kernels.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "ds4r/error.h"

namespace ds4r {

void bench_kernels(KernelBench& kb, const ModelConfig& c, const BenchOptions& opt, int64_t pass_chunk_rows,
                   const KernelCsvRow& csv, std::FILE* out, double* bf16_peak) {
    const int it = opt.iters;
    const double peak = kb.cublas_bf16_tflops(8192, 8192, 8192, it);
    const double mma_peak = kb.mma_sync_peak_tflops();
    *bf16_peak = peak;
    std::fprintf(
        out,
        "\nkernels (M = %lld rows, %s kernels): cuBLAS bf16 8192^3 measured %.1f TFLOP/s; mma.sync bf16 "
        "instruction ceiling (the portable path's limit) %.1f TFLOP/s\n",
        (long long)opt.kernel_rows, kb.gemm_family().c_str(), peak, mma_peak);
    csv("cublas_bf16_8192", 8192, 8192, 8192, peak, "TFLOP/s", "");
    csv("mma_sync_peak", 0, 0, 0, mma_peak, "TFLOP/s", "");
    std::fprintf(out, "  %-32s %6s %6s %6s %10s %10s %8s %8s %9s\n", "shape", "M", "N", "K", "ours TF/s",
                 "cuBLAS", "ratio", "of peak", "of mma");
    struct Shape {
        const char* name;
        int64_t m, n, k;
        int kind;  // 0 fp8, 1 fp4, 2 bf16
    };
    // One table row (and its CSV row): ours against cuBLAS, the bf16 peak and the mma.sync ceiling.
    auto row = [&](const std::string& name, int64_t m, int64_t n, int64_t k, double ours, double ref,
                   const std::string& note) {
        std::fprintf(out, "  %-32s %6lld %6lld %6lld %10.1f %10.1f %7.0f%% %7.0f%% %8.0f%%\n", name.c_str(),
                     (long long)m, (long long)n, (long long)k, ours, ref, 100 * ours / ref, 100 * ours / peak,
                     100 * ours / mma_peak);
        csv(name, m, n, k, ours, "TFLOP/s", note);
    };
    const int64_t M = opt.kernel_rows;
    const int64_t per_expert =
        std::max<int64_t>(16, M * c.n_activated_experts / std::max<int64_t>(1, c.n_routed_experts));
    const Shape shapes[] = {
        {"attn.wq_a fp8", M, c.q_lora_rank, c.dim, 0},
        {"attn.wq_b fp8", M, c.n_heads * c.head_dim, c.q_lora_rank, 0},
        {"attn.wkv fp8", M, c.head_dim, c.dim, 0},
        {"attn.wo_a bf16 (1 group)", M, c.o_lora_rank, c.n_heads * c.head_dim / c.o_groups, 2},
        {"attn.wo_b fp8", M, c.dim, c.o_groups * c.o_lora_rank, 0},
        {"shared w1/w3 fp8", M, c.moe_inter_dim, c.dim, 0},
        {"shared w2 fp8", M, c.dim, c.moe_inter_dim, 0},
        {"expert w1/w3 fp4 (dense M)", M, c.moe_inter_dim, c.dim, 1},
        {"expert w2 fp4 (dense M)", M, c.dim, c.moe_inter_dim, 1},
    };
    // --kernel-filter: a row is timed only when its name contains the text
    auto wanted = [&](const std::string& name) {
        return opt.kernel_filter.empty() || name.find(opt.kernel_filter) != std::string::npos;
    };
    for (const Shape& s : shapes) {
        const std::string tma_name = strfmt("%s, GEMM alone, TMA", s.name),
                          f16_name = strfmt("%s, GEMM alone, fp16 weights, TMA", s.name),
                          f16_wide_name =
                              strfmt("%s, GEMM alone, fp16 weights, TMA, 128-wide K stages", s.name),
                          cp_name = s.kind == 2 ? strfmt("%s, cp.async loads", s.name)
                                                : strfmt("%s, GEMM alone, cp.async", s.name);
        if (!wanted(s.name) && !wanted(tma_name) && !wanted(f16_name) && !wanted(f16_wide_name) &&
            !wanted(cp_name))
            continue;
        const double ref = kb.cublas_bf16_tflops(s.m, s.n, s.k, it);
        if (wanted(s.name)) {
            const double ours = s.kind == 0   ? kb.linear_fp8_tflops(s.m, s.n, s.k, it)
                                : s.kind == 1 ? kb.linear_fp4_tflops(s.m, s.n, s.k, it)
                                              : kb.linear_bf16_tflops(s.m, s.n, s.k, it);
            row(s.name, s.m, s.n, s.k, ours, ref, strfmt("cublas=%.3f", ref));
        }
        // the Hopper kernels' baseline: the same kernel on its cp.async loaders instead of TMA (the
        // block-scaled ones as GEMMs alone, both ways: the rows above include the activation quant)
        if (s.kind == 2) {
            const double cp = wanted(cp_name) ? kb.hopper_gemm_tflops(2, s.m, s.n, s.k, false, it) : -1;
            if (cp >= 0) row(cp_name, s.m, s.n, s.k, cp, ref, "baseline");
        } else {
            const double tma =
                wanted(tma_name) || wanted(f16_name) || wanted(f16_wide_name) || wanted(cp_name)
                    ? kb.hopper_gemm_tflops(s.kind, s.m, s.n, s.k, true, it)
                    : -1;
            if (tma >= 0) {  // -1: not the Hopper kernels
                if (wanted(tma_name)) row(tma_name, s.m, s.n, s.k, tma, ref, "gemm only");
                if (s.kind == 0 && wanted(f16_name)) {
                    const double f16 = kb.hopper_gemm_tflops(4, s.m, s.n, s.k, true, it);
                    if (f16 >= 0) row(f16_name, s.m, s.n, s.k, f16, ref, "gemm only");
                }
                // the same kernel in 128-wide K stages (the default where TMA applies; the row above: 64)
                if (s.kind == 0 && wanted(f16_wide_name)) {
                    const double f16w = kb.hopper_gemm_tflops(5, s.m, s.n, s.k, true, it);
                    if (f16w >= 0) row(f16_wide_name, s.m, s.n, s.k, f16w, ref, "gemm only");
                }
                if (wanted(cp_name))
                    row(cp_name, s.m, s.n, s.k, kb.hopper_gemm_tflops(s.kind, s.m, s.n, s.k, false, it), ref,
                        "baseline");
            }
        }
    }
    // The routed experts as the MoE runs them: all experts of a chunk in one grouped launch, each with
    // the chunk's average rows per expert; cuBLAS is timed on one expert's dense GEMM of that shape.
    struct Grouped {
        const char* name;
        int64_t n, k;
        int proj;
    };
    // Rows per expert: the chunk's average (M rows), workload (b)'s pass average (b_sequences x b_tokens
    // routed to n_activated of n_routed experts: ~2,250), 128 (one tile per expert), and the average of
    // the chunks the passes run (pass_chunk_rows: --max-batch-tokens, or the default for this GPU's
    // memory budget: 8,192 rows = 128 per expert at full width on 22 GB; a small --max-batch-tokens or a
    // small pass gives fewer): the MoE runs one chunk at a time.
    const int64_t experts_n = std::max<int64_t>(1, c.n_routed_experts);
    const int64_t b_rows =
        std::max<int64_t>(1, opt.b_sequences * opt.b_tokens * c.n_activated_experts / experts_n);
    const int64_t chunk_avg = std::max<int64_t>(1, pass_chunk_rows * c.n_activated_experts / experts_n);
    const Grouped grouped[] = {{"experts w1+w3 fp4 (grouped)", c.moe_inter_dim, c.dim, 2},
                               {"experts w2 fp4 (grouped)", c.dim, c.moe_inter_dim, 1}};
    std::vector<int64_t> rows_cases{per_expert};
    for (const int64_t r : {b_rows, int64_t{128}, chunk_avg})
        if (std::find(rows_cases.begin(), rows_cases.end(), r) == rows_cases.end()) rows_cases.push_back(r);
    // One case's rows: (name, timing; < 0 where the kernel family has no such variant), timed (and
    // cuBLAS on the case's shape with them) only where --kernel-filter wants one.
    using Timed = std::pair<std::string, std::function<double()>>;
    auto emit_case = [&](const std::vector<Timed>& rows_of_case, int64_t m, int64_t n, int64_t k,
                         const std::function<std::string(double)>& note_of) {
        if (std::none_of(rows_of_case.begin(), rows_of_case.end(),
                         [&](const Timed& t) { return wanted(t.first); }))
            return;
        const double ref = kb.cublas_bf16_tflops(m, n, k, it);
        for (const Timed& t : rows_of_case) {
            if (!wanted(t.first)) continue;
            const double v = t.second();
            if (v >= 0) row(t.first, m, n, k, v, ref, note_of(ref));
        }
    };
    const int64_t E = c.n_routed_experts;
    for (const int64_t rows : rows_cases) {
        for (const Grouped& g : grouped) {
            using L = ExpertLayout;
            auto grouped_t = [&, rows](int tile_rows, bool routed, L layout) {
                return [&kb, &g, E, rows, tile_rows, routed, layout, it] {
                    return kb.grouped_fp4_tflops(E, rows, g.n, g.k, g.proj, it, tile_rows, routed, layout);
                };
            };
            std::vector<Timed> t{
                {g.name, grouped_t(0, false, L::None)},
                // the Hopper kernels on the prepared experts (--prepared-experts): e5m2
                // bytes (one per weight, no fp4 decoding per tile) and fp16 with the scales
                // folded in (B tiles by TMA, no converting at all)
                {strfmt("%s, e5m2 weights", g.name), grouped_t(0, false, L::E5m2)},
                {strfmt("%s, fp16 experts", g.name), grouped_t(0, false, L::F16)},
                // their baseline: the 128-row tiles in 64-wide K stages (the row above:
                // 128-wide ones wherever it takes 128-row tiles)
                {strfmt("%s, fp16 experts, 64-wide K stages", g.name), grouped_t(2, false, L::F16)}};
            if (rows == chunk_avg) {
                // the passes' chunk average on the Hopper kernels: each of their tile shapes (the portable
                // kernels: one tile shape, -1); the experts' rows spread as a router spreads them (Poisson
                // around the average): the family's own choice (Hopper: mixed tiles), the 128-row tiles
                // alone, and the prepared layouts
                for (const int tr : {64, 128})
                    t.push_back({strfmt("%s, %d-row tiles", g.name, tr), grouped_t(tr, false, L::None)});
                t.push_back({strfmt("%s, routed rows", g.name), grouped_t(0, true, L::None)});
                t.push_back(
                    {strfmt("%s, routed rows, 128-row tiles", g.name), grouped_t(128, true, L::None)});
                t.push_back({strfmt("%s, routed rows, e5m2 weights", g.name), grouped_t(0, true, L::E5m2)});
                t.push_back({strfmt("%s, routed rows, fp16 experts", g.name), grouped_t(0, true, L::F16)});
                // the other way to run each expert's short last tile than the layout's own (above): on
                // 64-row tiles in a second launch (mixed: packed and e5m2 weights), or on the 128-row
                // tiles of the same launch with the empty warpgroup idle (fp16 experts)
                t.push_back({strfmt("%s, routed rows, fp16 experts, mixed tiles", g.name),
                             grouped_t(1, true, L::F16)});
                t.push_back({strfmt("%s, routed rows, e5m2 weights, 128-row tiles", g.name),
                             grouped_t(128, true, L::E5m2)});
            }
            emit_case(t, rows, g.n, g.k, [&](double ref) {
                return strfmt("experts=%lld cublas_one_expert=%.3f", (long long)E, ref);
            });
        }
    }
    // The output head's logits (bf16 x bf16 -> f32), as head_stats runs them.
    emit_case({{"head logits bf16->f32", [&] { return kb.head_logits_tflops(M, c.vocab_size, c.dim, it); }},
               {"head logits, cp.async loads",
                [&] { return kb.hopper_gemm_tflops(3, M, c.vocab_size, c.dim, false, it); }}},
              M, c.vocab_size, c.dim, [](double ref) { return strfmt("cublas=%.3f", ref); });
    // one launch as head_stats makes them in a pass (its chunk of rows)
    const int64_t R = kb.head_launch_rows();
    if (R < M) {
        // and as many of them in a row as a 144k-token pass (workload b) makes: against the short burst,
        // what sustained tensor load (the clock under the power limit) costs the head (docs/PERFORMANCE.md,
        // eleventh session)
        const int pass_launches = static_cast<int>((int64_t{144000} + R - 1) / R);
        emit_case({{"head logits, one head_stats launch",
                    [&] { return kb.head_logits_tflops(R, c.vocab_size, c.dim, it); }},
                   {"head logits, one head_stats launch, a 144k-token pass's worth in a row",
                    [&] { return kb.head_logits_tflops(R, c.vocab_size, c.dim, pass_launches); }}},
                  R, c.vocab_size, c.dim, [](double) { return std::string(); });
    }
    // A whole head_stats call as a pass makes one per chunk (score's default 8 alternatives): the launches
    // above with the targets' check and each launch's row statistics between them, once and as many in a
    // row as a 144k-token pass makes (the pass's head/logits region ran at ~425 TFLOP/s against the
    // launches' ~660 sustained: docs/PERFORMANCE.md, twelfth session)
    const int64_t head_rows = std::max<int64_t>(1, pass_chunk_rows);
    const int pass_calls = static_cast<int>((int64_t{144000} + head_rows - 1) / head_rows);
    emit_case({{"head_stats, one call (logits + row statistics)",
                [&] { return kb.head_stats_tflops(head_rows, c.vocab_size, c.dim, 8, it); }},
               {"head_stats, one call, a 144k-token pass's worth in a row",
                [&] { return kb.head_stats_tflops(head_rows, c.vocab_size, c.dim, 8, pass_calls); }},
               // the head weights where a layer slot put them before slots aligned tensors to 256 bytes
               // (their file offset modulo 256: 80 in the full-width checkpoints; io/prefetch_plan.cpp)
               {"head_stats, one call, head weights 80 bytes past a 256-byte boundary",
                [&] { return kb.head_stats_tflops(head_rows, c.vocab_size, c.dim, 8, it, 80); }}},
              head_rows, c.vocab_size, c.dim, [](double) { return std::string(); });
    // The mHC mixes kernel's accumulation variants (issue 10): time per call at M rows and the model's
    // dim, hc = 4 (the kernel's only hc). "*" marks the variant the backend runs.
    if (c.hc_mult == 4 && wanted("hc_mixes")) {
        std::fprintf(out, "  hc_mixes (M = %lld, D = %lld), ms per call:", (long long)M, (long long)c.dim);
        for (int v = 0; v < kHcMixVariants; ++v) {
            const double ms = kb.hc_mixes_ms(v, M, c.dim, it);
            std::fprintf(out, "  %s%s %.3f", kHcMixVariantNames[v],
                         v == kb.hc_mix_default_variant() ? "*" : "", ms);
            csv(std::string("hc_mixes ") + kHcMixVariantNames[v], M, 4 * c.dim, 24, ms, "ms",
                v == kb.hc_mix_default_variant() ? "default" : "");
        }
        std::fprintf(out, "\n");
    }
    // The sparse attention of one sequence as workload b's compress-ratio layers run it (1,800 queries of an
    // 1,800-token sequence, ratio 1: 1,800 compressed rows, the window plus index_topk slots) with each
    // CTA shape (16 heads per CTA: the portable set's; 64: the Hopper set's). "*" marks the backend's.
    if (wanted("sparse_attn") && c.n_heads > 0 && c.head_dim > 0 && c.index_topk > 0 && c.window_size > 0) {
        const int64_t seq = 1800, topk = std::min<int64_t>(c.index_topk, seq);
        std::fprintf(out, "  sparse_attn (%lld queries, %lld heads x %lld, %lld + %lld slots), TFLOP/s:",
                     (long long)seq, (long long)c.n_heads, (long long)c.head_dim, (long long)c.window_size,
                     (long long)topk);
        for (const int hpc : {16, 64}) {
            const double v =
                kb.sparse_attn_tflops(seq, c.n_heads, c.head_dim, seq, seq, c.window_size, topk, hpc, it);
            if (v < 0) continue;
            const bool mine = hpc == kb.sparse_attn_heads_per_cta();
            std::fprintf(out, "  %d heads per CTA%s %.1f", hpc, mine ? "*" : "", v);
            csv(strfmt("sparse_attn %d heads per CTA", hpc), seq * c.n_heads, c.window_size + topk,
                c.head_dim, v, "TFLOP/s", mine ? "default" : "");
        }
        std::fprintf(out, "\n");
    }
}

}  // namespace ds4r
