// The CUDA backend on the golden checkpoint: teacher-forced per layer, end to end vs the reference,
// CUDA vs CPU on every sequence, batch invariance (incl. chunk sizes) and determinism on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "cuda_test_util.h"
#include "golden_util.h"
#include "teacher_forced.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

// The CPU backend's top-1 agreement with the reference (0.8789, 711 of 809 positions) less 0.01.
constexpr double kCudaTop1Min = 0.868;

namespace {
std::vector<double> logprob_diffs(const std::map<int, std::string>& a, const std::map<int, std::string>& b,
                                  std::vector<double>* per_seq_mean = nullptr) {
    const std::string dir = temp_dir("cmp");
    auto write = [&](const std::map<int, std::string>& m, const std::string& name) {
        FILE* f = std::fopen((dir + "/" + name).c_str(), "w");
        for (auto& [i, r] : m) std::fprintf(f, "%s\n", r.c_str());
        std::fclose(f);
        return read_records(dir + "/" + name);
    };
    auto ra = write(a, "a.jsonl"), rb = write(b, "b.jsonl");
    std::vector<double> d;
    for (size_t i = 0; i < ra.size(); ++i) {
        double s = 0;
        for (size_t t = 0; t < ra[i].logprob.size(); ++t) {
            d.push_back(ra[i].logprob[t] - rb[i].logprob[t]);
            s += std::fabs(d.back());
        }
        if (per_seq_mean) per_seq_mean->push_back(ra[i].logprob.empty() ? 0 : s / ra[i].logprob.size());
    }
    return d;
}
}  // namespace

TEST(CudaGolden, TeacherForcedPerLayer) {
    DS4R_REQUIRE_CUDA();
    check_teacher_forced_report(run_teacher_forced("cuda"), "cuda");
}

TEST(CudaGolden, EndToEndVsReferenceAndCpu) {
    DS4R_REQUIRE_CUDA();
    auto gpu = score_golden({all_golden_indices()}, 4096, nullptr, "cuda");
    auto cpu_recs = score_golden({all_golden_indices()}, 4096, nullptr, "cpu");
    std::map<int, std::string> ref;
    {
        // expected.jsonl as a record map (same order as tokens.jsonl)
        auto recs = read_records(golden_dir() + "/expected.jsonl");
        ASSERT_EQ(recs.size(), gpu.size());
    }
    const std::string dir = temp_dir("gpu");
    FILE* f = std::fopen((dir + "/gpu.jsonl").c_str(), "w");
    for (auto& [i, r] : gpu) std::fprintf(f, "%s\n", r.c_str());
    std::fclose(f);
    auto ours = read_records(dir + "/gpu.jsonl");
    auto expected = read_records(golden_dir() + "/expected.jsonl");
    std::vector<double> d;
    int64_t top1 = 0;
    for (size_t i = 0; i < expected.size(); ++i)
        for (size_t t = 0; t < expected[i].logprob.size(); ++t) {
            d.push_back(ours[i].logprob[t] - expected[i].logprob[t]);
            top1 += ours[i].topk_ids_flat[t * 8] == expected[i].topk_ids_flat[t * 8];
        }
    const double top1_frac = static_cast<double>(top1) / static_cast<double>(d.size());
    std::printf(
        "CUDA vs reference: |d logprob| median %.4f p95 %.4f max %.4f over %zu positions; top-1 agreement "
        "%.4f\n",
        quantile(d, 0.5), quantile(d, 0.95), quantile(d, 1.0), d.size(), top1_frac);
    // Bounds ~15% above what the CUDA backend measures with the accurate mHC sums of issue 10 (H200,
    // 2026-12-02: median 0.0368, p95 0.2275, top-1 0.8776; before the fix 0.040 / 0.288). Top-1: at
    // least the CPU backend's agreement less 0.01 (kCudaTop1Min).
    EXPECT_LE(quantile(d, 0.5), 0.0368 * 1.15);
    EXPECT_LE(quantile(d, 0.95), 0.2275 * 1.15);
    EXPECT_GE(top1_frac, kCudaTop1Min) << "top-1 agreement with the reference";
    std::vector<double> per_seq;
    auto dc = logprob_diffs(gpu, cpu_recs, &per_seq);
    std::printf("CUDA vs CPU backend: |d logprob| median %.4f p95 %.4f max %.4f\n", quantile(dc, 0.5),
                quantile(dc, 0.95), quantile(dc, 1.0));
    for (size_t i = 0; i < per_seq.size(); ++i) std::printf("  seq %02zu mean |d| %.4f\n", i, per_seq[i]);
    // Stated tolerance: the reference's own CPU-vs-GPU spread is median 0.057 / p95 0.33 on this model.
    EXPECT_LE(quantile(dc, 0.5), 0.1);
    EXPECT_LE(quantile(dc, 0.95), 0.7);
    for (size_t i = 0; i < per_seq.size(); ++i) EXPECT_LE(per_seq[i], 0.5) << "sequence " << i;
}

TEST(CudaGolden, BatchInvarianceAndDeterminism) {
    DS4R_REQUIRE_CUDA();
    const auto all = all_golden_indices();
    auto together = score_golden({all}, 4096, nullptr, "cuda");
    std::vector<std::vector<int>> singles;
    for (int i : all) singles.push_back({i});
    auto alone = score_golden(singles, 4096, nullptr, "cuda");
    std::vector<int> rev(all.rbegin(), all.rend());
    auto reversed = score_golden(
        {std::vector<int>(rev.begin(), rev.begin() + 5), std::vector<int>(rev.begin() + 5, rev.end())}, 7,
        nullptr, "cuda");
    std::vector<int> shuf = all;
    std::mt19937 rng(11);
    std::shuffle(shuf.begin(), shuf.end(), rng);
    auto shuffled = score_golden(
        {std::vector<int>(shuf.begin(), shuf.begin() + 8), std::vector<int>(shuf.begin() + 8, shuf.end())},
        130, nullptr, "cuda");
    auto again = score_golden({all}, 4096, nullptr, "cuda");
    for (int i : all) {
        EXPECT_EQ(together[i], alone[i]) << "sequence " << i << ": together vs alone (GPU)";
        EXPECT_EQ(together[i], reversed[i]) << "sequence " << i << ": reversed groups, 7-row chunks (GPU)";
        EXPECT_EQ(together[i], shuffled[i]) << "sequence " << i << ": shuffled groups, 130-row chunks (GPU)";
        EXPECT_EQ(together[i], again[i]) << "sequence " << i << ": two runs (GPU)";
    }
}
