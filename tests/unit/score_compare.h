// Bitwise comparison of two runs' scores, shared by the runner tests (chunking, several devices).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ds4r/replay.h"

namespace ds4r::test {

// Every sequence's scores equal byte for byte (floats compared as bits: -0.0 / NaN differences count).
inline void expect_identical(const std::vector<SequenceScores>& a, const std::vector<SequenceScores>& b,
                             const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    const auto same = [](const auto& x, const auto& y) {
        return x.size() == y.size() &&
               (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
    };
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].n, b[i].n) << what << " seq " << i;
        EXPECT_TRUE(same(a[i].logprob, b[i].logprob)) << what << " seq " << i << ": logprob";
        EXPECT_TRUE(same(a[i].rank, b[i].rank)) << what << " seq " << i << ": rank";
        EXPECT_TRUE(same(a[i].entropy, b[i].entropy)) << what << " seq " << i << ": entropy";
        EXPECT_TRUE(same(a[i].topk_ids, b[i].topk_ids)) << what << " seq " << i << ": top-k ids";
        EXPECT_TRUE(same(a[i].topk_logprobs, b[i].topk_logprobs)) << what << " seq " << i << ": top-k";
    }
}

}  // namespace ds4r::test
