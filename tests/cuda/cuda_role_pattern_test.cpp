// The tiny-roles checkpoint (issue 10: 8 layers, ratios 0,0,2,2,2,1,1,1, KV sources 2,5, index sources
// 2,4,5,7, candidate source 5; tests/golden/role_pattern.h) on the CUDA backend: CPU vs CUDA log-
// probabilities, batch invariance and determinism on the GPU. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cuda_test_util.h"
#include "golden_util.h"
#include "role_pattern.h"

using namespace ds4r;
using namespace ds4r::test;

TEST(CudaRoles, TinyRolesCpuVsCudaAndBatchInvariance) {
    DS4R_REQUIRE_CUDA();
    std::vector<int> all(tiny_roles_sequences(512).size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    const auto gpu = score_tiny_roles("cuda", {all}, 4096);
    const auto cpu_recs = score_tiny_roles("cpu", {all}, 4096);
    std::vector<double> d;
    int top1 = 0, n = 0;
    for (int i : all) {
        const auto a = nlohmann::json::parse(gpu.at(i)), b = nlohmann::json::parse(cpu_recs.at(i));
        const auto la = a.at("logprob").get<std::vector<double>>(),
                   lb = b.at("logprob").get<std::vector<double>>();
        ASSERT_EQ(la.size(), lb.size()) << "sequence " << i;
        for (size_t t = 0; t < la.size(); ++t) {
            ASSERT_TRUE(std::isfinite(la[t])) << "sequence " << i << " position " << t;
            d.push_back(la[t] - lb[t]);
            top1 += a.at("topk_ids")[t][0] == b.at("topk_ids")[t][0];
            ++n;
        }
    }
    std::printf("tiny-roles CUDA vs CPU: |d logprob| median %.4g p95 %.4g max %.4g, top-1 agreement %d/%d\n",
                quantile(d, 0.5), quantile(d, 0.95), quantile(d, 1.0), top1, n);
    // The golden checkpoint's CPU-vs-CUDA tolerance (the reference's own CPU-vs-GPU spread).
    EXPECT_LE(quantile(d, 0.5), 0.1);
    EXPECT_LE(quantile(d, 0.95), 0.7);
    std::vector<std::vector<int>> singles;
    for (int i : all) singles.push_back({i});
    const auto alone = score_tiny_roles("cuda", singles, 4096);
    std::vector<int> rev(all.rbegin(), all.rend());
    const auto chunked = score_tiny_roles(
        "cuda",
        {std::vector<int>(rev.begin(), rev.begin() + 3), std::vector<int>(rev.begin() + 3, rev.end())}, 7);
    const auto again = score_tiny_roles("cuda", {all}, 4096);
    for (int i : all) {
        EXPECT_EQ(gpu.at(i), alone.at(i)) << "sequence " << i << ": together vs alone (GPU)";
        EXPECT_EQ(gpu.at(i), chunked.at(i)) << "sequence " << i << ": reversed groups, 7-row chunks (GPU)";
        EXPECT_EQ(gpu.at(i), again.at(i)) << "sequence " << i << ": two runs (GPU)";
    }
}
