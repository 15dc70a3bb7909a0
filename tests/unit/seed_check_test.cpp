// score --seed-check: Engram multipliers from numpy's default_rng(10007 * layer) vs the released model's
// published values (docs/MODEL.md 4.2).
#include <gtest/gtest.h>

#include "ds4r/engram.h"
#include "test_util.h"

using namespace ds4r;

TEST(SeedCheck, ComputedMultipliersEqualThePublishedOnes) {
    for (int L : {1, 14}) {
        const auto want = released_engram_multipliers(L, 99092, 4);
        ASSERT_EQ(want.size(), 4u) << "layer " << L;
        EXPECT_EQ(engram_multipliers(L, 99092, 4), want) << "layer " << L;
    }
    EXPECT_TRUE(released_engram_multipliers(2, 99092, 4).empty());
    EXPECT_TRUE(released_engram_multipliers(1, 405, 4).empty());
}

TEST(SeedCheck, ScoreFlagRunsOnAModelWithoutPublishedValues) {
    const std::string dir = test::temp_dir("seedcheck");
    std::string log;
    const int rc =
        test::run_command(test::binary_path() + " score --seed-check --backend cpu --progress none --model " +
                              test::data_dir() + "/tiny-a/model --input " + test::data_dir() +
                              "/tiny-a/tokens.jsonl --output " + dir + "/out.jsonl",
                          &log);
    EXPECT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("seed check: layer 0 multipliers"), std::string::npos) << log;
    EXPECT_NE(log.find("no published values"), std::string::npos) << log;
}
