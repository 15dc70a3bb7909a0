#include <gtest/gtest.h>

#include <cstring>

#include "ds4r/binding.h"
#include "ds4r/config.h"
#include "ds4r/numeric.h"
#include "test_util.h"

using namespace ds4r;

TEST(Numeric, Bf16RoundTrip) {
    EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
    EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
    // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1).
    EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
    EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
}

TEST(Numeric, E4m3AllCodesRoundTrip) {
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;  // NaN
        float v = e4m3_to_f32(static_cast<uint8_t>(c));
        EXPECT_EQ(f32_to_e4m3(v), c == 0x80 ? 0x80 : c) << c;
    }
    EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7e);
}

TEST(Numeric, E8m0BitsWithoutBranchesEqualE8m0ToF32) {
    for (uint32_t e = 0; e < 256; ++e) {
        const float v = e8m0_to_f32(static_cast<uint8_t>(e));
        uint32_t bits = 0;
        std::memcpy(&bits, &v, 4);
        EXPECT_EQ(e8m0_f32_bits(e), bits) << e;
    }
}

TEST(Numeric, E2m1TiesToEven) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.25f)), 0.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.75f)), 1.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.25f)), 1.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(1.75f)), 2.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(2.5f)), 2.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(3.5f)), 4.0f);
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0f)), 4.0f);
    EXPECT_EQ(f32_to_e2m1(-0.0f), 8);
}

TEST(Config, GoldenTinyARoles) {
    ModelConfig c = load_model_config(test::data_dir() + "/tiny-a/model/config.json");
    EXPECT_EQ(c.form, "hf");
    EXPECT_EQ(c.dim, 256);
    auto roles = derive_layer_roles(c, "config.json");
    ASSERT_EQ(roles.size(), 6u);
    EXPECT_EQ(roles[0].ratio, 0);
    EXPECT_TRUE(roles[0].engram);
    EXPECT_TRUE(roles[1].kv_source && roles[1].owns_index_keys && roles[1].engram);
    EXPECT_EQ(roles[2].kv_from, 1);
    EXPECT_EQ(roles[2].topk_from, 1);
    EXPECT_TRUE(roles[3].candidate_source);
    EXPECT_EQ(roles[4].topk_from, 3);
    EXPECT_TRUE(roles[5].reindex);
    EXPECT_EQ(roles[5].index_keys_from, 3);
}
