// End-to-end golden tests on the CPU backend: logprobs vs expected.jsonl, hidden states vs the dumps,
// batch invariance and determinism (issue 3 item 5), and the score CLI on the golden checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "ds4r/numeric.h"
#include "ds4r/output.h"
#include "golden_util.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {
// CPU backend vs expected.jsonl / the dumps, bounds just above today's measurements (issue 10).
constexpr double kCpuE2eMedian = 0.0347 * 1.15, kCpuE2eP95 = 0.228 * 1.15;
// Measured 2026-12-02: median 0.0347, p95 0.2277, top-1 agreement 711/809 = 0.8789; hidden states
// rel L2 0.00795 (layer 2) and 0.111 (layer 6).
constexpr double kCpuE2eTop1 = 0.875;
constexpr double kCpuHiddenL2 = 0.0092, kCpuHiddenL6 = 0.128;
// The score CLI's records vs expected.jsonl, measured: target ranks equal 0.1731, top-1 0.8789, top-8
// id sets equal 0.4685, |d top-k logprob| p95 0.1489 (tiny-a's random weights: flat distributions,
// so ranks and the lower top-k entries move with small logit differences).
constexpr double kCliRanksEqual = 0.17, kCliTop1 = 0.875, kCliTopkSets = 0.46, kCliTopkLogprobP95 = 0.171;
}  // namespace

TEST(GoldenEndToEnd, CpuLogprobsMatchReference) {
    MemSink sink;
    auto t0 = std::chrono::steady_clock::now();
    auto recs = score_golden({all_golden_indices()}, 4096, &sink);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string path = temp_dir("e2e") + "/out.jsonl";
    {
        FILE* f = std::fopen(path.c_str(), "w");
        for (auto& [i, r] : recs) std::fprintf(f, "%s\n", r.c_str());
        std::fclose(f);
    }
    auto ours = read_records(path);
    auto ref = read_records(golden_dir() + "/expected.jsonl");
    ASSERT_EQ(ours.size(), ref.size());
    std::vector<double> d;
    int top1 = 0, positions = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        ASSERT_EQ(ours[i].id, ref[i].id);
        ASSERT_EQ(ours[i].logprob.size(), ref[i].logprob.size());
        for (size_t t = 0; t < ref[i].logprob.size(); ++t) {
            d.push_back(ours[i].logprob[t] - ref[i].logprob[t]);
            top1 += ours[i].topk_ids_flat[t * 8] == ref[i].topk_ids_flat[t * 8];
            ++positions;
        }
    }
    const double med = quantile(d, 0.5), p95 = quantile(d, 0.95), mx = quantile(d, 1.0);
    double mean = 0;
    for (double x : d) mean += std::fabs(x);
    mean /= d.size();
    std::printf(
        "end to end vs expected.jsonl (%d positions): |d logprob| median %.4f mean %.4f p95 %.4f max %.4f; "
        "top-1 agreement %.1f%%; CPU time %.1fs\n",
        positions, med, mean, p95, mx, 100.0 * top1 / positions, secs);
    // Measured on the CPU backend: median 0.0347, p95 0.228 (the reference's own CPU-vs-GPU spread on
    // this model is 0.057 / 0.33); bounds ~15% above, so a regression fails.
    EXPECT_LE(med, kCpuE2eMedian);
    EXPECT_LE(p95, kCpuE2eP95);
    EXPECT_GE(static_cast<double>(top1) / positions, kCpuE2eTop1) << "top-1 agreement with the reference";
    // Captured hidden states vs the dumps (layer 2 mean of copies, layer 6 collapsed), fp16.
    auto seqs = golden_sequences();
    for (int L : {2, 6}) {
        double num = 0, den = 0;
        for (size_t i = 0; i < seqs.size(); ++i) {
            char name[64];
            std::snprintf(name, sizeof name, "seq%02zu_hidden_L%d_fp16.npy", i, L);
            NpyArray ref_h = dump(name);
            const auto& mine = sink.rows.at({L, static_cast<int>(i)});
            ASSERT_EQ(mine.size(), static_cast<size_t>(ref_h.numel()));
            for (size_t k = 0; k < mine.size(); ++k) {
                const double a = f16_to_f32(mine[k]), b = f16_to_f32(ref_h.as<uint16_t>()[k]);
                num += (a - b) * (a - b);
                den += b * b;
            }
        }
        const double rel = std::sqrt(num / den);
        std::printf("hidden L%d: relative L2 vs reference dumps %.3g\n", L, rel);
        EXPECT_LE(rel, L == 2 ? kCpuHiddenL2 : kCpuHiddenL6) << "captured hidden state of layer " << L;
    }
}

TEST(GoldenEndToEnd, BatchInvarianceAndDeterminism) {
    const auto all = all_golden_indices();
    auto together = score_golden({all}, 4096);
    // each alone
    std::vector<std::vector<int>> singles;
    for (int i : all) singles.push_back({i});
    auto alone = score_golden(singles, 4096);
    // two other groupings and orders, with chunk sizes that split sequences
    std::vector<int> rev(all.rbegin(), all.rend());
    auto reversed = score_golden(
        {std::vector<int>(rev.begin(), rev.begin() + 5), std::vector<int>(rev.begin() + 5, rev.end())}, 7);
    std::vector<int> shuf = all;
    std::mt19937 rng(7);
    std::shuffle(shuf.begin(), shuf.end(), rng);
    auto shuffled = score_golden(
        {std::vector<int>(shuf.begin(), shuf.begin() + 8), std::vector<int>(shuf.begin() + 8, shuf.end())},
        64);
    auto again = score_golden({all}, 4096);
    for (int i : all) {
        EXPECT_EQ(together[i], alone[i]) << "sequence " << i << ": together vs alone";
        EXPECT_EQ(together[i], reversed[i])
            << "sequence " << i << ": together vs reversed groups, 7-row chunks";
        EXPECT_EQ(together[i], shuffled[i])
            << "sequence " << i << ": together vs shuffled groups, 64-row chunks";
        EXPECT_EQ(together[i], again[i]) << "sequence " << i << ": two identical runs";
    }
}

TEST(GoldenEndToEnd, ScoreCliOnGoldenCheckpoint) {
    const std::string dir = temp_dir("cli");
    const std::string out = dir + "/out.jsonl";
    std::string log;
    auto t0 = std::chrono::steady_clock::now();
    int rc = run_command(binary_path() + " score --backend cpu --progress none --model " +
                             golden_model_dir() + " --input " + golden_dir() + "/tokens.jsonl --output " +
                             out + " --capture-layers 2,6" + " --hidden-dir " + dir + "/hidden",
                         &log);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(rc, 0) << log;
    std::printf("score CLI, 12 golden sequences on the CPU backend: %.1fs\n", secs);
    auto ours = read_records(out);
    auto ref = read_records(golden_dir() + "/expected.jsonl");
    ASSERT_EQ(ours.size(), ref.size());
    // The CLI's values are the library's (same backend, same bits), and vs the reference they stay
    // within the end-to-end bounds: log-probabilities, ranks, top-k ids and log-probabilities.
    const auto lib = score_golden({all_golden_indices()}, 4096);
    const std::string lib_path = dir + "/lib.jsonl";
    {
        FILE* f = std::fopen(lib_path.c_str(), "w");
        for (auto& [i, r] : lib) std::fprintf(f, "%s\n", r.c_str());
        std::fclose(f);
    }
    const auto mine = read_records(lib_path);
    ASSERT_EQ(mine.size(), ref.size());
    std::vector<double> d, dtop;
    int64_t positions = 0, rank_equal = 0, top1 = 0, topk_sets_equal = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_EQ(ours[i].id, ref[i].id);
        EXPECT_EQ(ours[i].n_tokens, ref[i].n_tokens);
        ASSERT_EQ(ours[i].logprob.size(), ref[i].logprob.size());
        ASSERT_EQ(ours[i].rank.size(), ref[i].rank.size());
        ASSERT_EQ(ours[i].topk_ids_flat.size(), ref[i].topk_ids_flat.size());
        ASSERT_EQ(ours[i].final_topk_ids.size(), 8u);
        EXPECT_EQ(ours[i].logprob, mine[i].logprob) << "CLI vs library, sequence " << i;
        EXPECT_EQ(ours[i].rank, mine[i].rank) << "CLI vs library, sequence " << i;
        EXPECT_EQ(ours[i].topk_ids_flat, mine[i].topk_ids_flat) << "CLI vs library, sequence " << i;
        EXPECT_EQ(ours[i].topk_logprobs_flat, mine[i].topk_logprobs_flat) << "CLI vs library, sequence " << i;
        EXPECT_EQ(ours[i].final_topk_ids, mine[i].final_topk_ids) << "CLI vs library, sequence " << i;
        for (size_t t = 0; t < ref[i].logprob.size(); ++t) {
            d.push_back(ours[i].logprob[t] - ref[i].logprob[t]);
            rank_equal += ours[i].rank[t] == ref[i].rank[t];
            ++positions;
        }
        for (size_t t = 0; t * 8 < ref[i].topk_ids_flat.size(); ++t) {
            top1 += ours[i].topk_ids_flat[t * 8] == ref[i].topk_ids_flat[t * 8];
            std::vector<int64_t> a(ours[i].topk_ids_flat.begin() + t * 8,
                                   ours[i].topk_ids_flat.begin() + t * 8 + 8),
                b(ref[i].topk_ids_flat.begin() + t * 8, ref[i].topk_ids_flat.begin() + t * 8 + 8);
            std::sort(a.begin(), a.end());
            std::sort(b.begin(), b.end());
            topk_sets_equal += a == b;
            for (size_t k = 0; k < 8; ++k)
                dtop.push_back(ours[i].topk_logprobs_flat[t * 8 + k] - ref[i].topk_logprobs_flat[t * 8 + k]);
        }
    }
    const int64_t rows = static_cast<int64_t>(dtop.size() / 8);
    std::printf(
        "score CLI vs expected.jsonl: |d logprob| median %.4f p95 %.4f; ranks equal %.4f; top-1 %.4f; top-8 "
        "id "
        "sets equal %.4f; |d top-k logprob| median %.4f p95 %.4f\n",
        quantile(d, 0.5), quantile(d, 0.95), static_cast<double>(rank_equal) / positions,
        static_cast<double>(top1) / rows, static_cast<double>(topk_sets_equal) / rows, quantile(dtop, 0.5),
        quantile(dtop, 0.95));
    EXPECT_LE(quantile(d, 0.5), kCpuE2eMedian);
    EXPECT_LE(quantile(d, 0.95), kCpuE2eP95);
    EXPECT_GE(static_cast<double>(rank_equal) / positions, kCliRanksEqual);
    EXPECT_GE(static_cast<double>(top1) / rows, kCliTop1);
    EXPECT_GE(static_cast<double>(topk_sets_equal) / rows, kCliTopkSets);
    EXPECT_LE(quantile(dtop, 0.95), kCliTopkLogprobP95);
    NpyArray h2 = load_npy(dir + "/hidden/hidden_L2.npy");
    int64_t total = 0;
    for (const auto& s : golden_sequences()) total += static_cast<int64_t>(s.tokens.size());
    EXPECT_EQ(h2.descr, "<f2");
    EXPECT_EQ(h2.shape, (Shape{total, 256}));
}
