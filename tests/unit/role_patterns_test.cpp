// Layer-role derivation (issue 10): every pattern DeepSeek's reference runs is accepted with the
// reference's slot semantics (docs/MODEL.md 5.6, model.py Indexer.uses_candidates); patterns in which a
// layer would read a slot nobody wrote, or one of another compress ratio, are refused with a message.
#include <gtest/gtest.h>

#include "ds4r/config.h"
#include "ds4r/error.h"
#include "ds4r/make_tiny.h"

using namespace ds4r;

namespace {

ModelConfig with_roles(std::vector<int> ratios, std::vector<int> kv, std::vector<int> index, int cand) {
    ModelConfig c = make_tiny_base_config(TinyPreset::Tiny, 0);
    c.n_layers = static_cast<int64_t>(ratios.size());
    c.compress_ratios = ratios;
    c.kv_source_layers = kv;
    c.index_source_layers = index;
    c.candidate_source_layer = cand;
    c.engram_layer_ids = {};
    return c;
}

std::string refusal(const ModelConfig& c) {
    try {
        derive_layer_roles(c, "config.json");
    } catch (const CheckpointError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST(RolePatterns, KeylessIndexerBeforeTheCandidateSourceIsAccepted) {
    // The pattern (make-tiny --preset tiny-roles).
    const ModelConfig c = make_tiny_base_config(TinyPreset::TinyRoles, 0);
    const auto r = derive_layer_roles(c, "config.json");
    ASSERT_EQ(r.size(), 8u);
    EXPECT_EQ(r[1].ratio, 0);
    EXPECT_TRUE(r[2].kv_source && r[2].owns_index_keys && !r[2].uses_candidates);
    EXPECT_EQ(r[3].kv_from, 2);
    EXPECT_EQ(r[3].topk_from, 2);
    // Layer 4: no keys of its own, reads layer 2's; no candidate pool exists yet, so none is applied.
    EXPECT_TRUE(r[4].reindex);
    EXPECT_FALSE(r[4].uses_candidates);
    EXPECT_EQ(r[4].index_keys_from, 2);
    EXPECT_EQ(r[4].kv_from, 2);
    EXPECT_EQ(r[4].topk_from, 4);
    EXPECT_TRUE(r[5].candidate_source && r[5].owns_index_keys && !r[5].uses_candidates);
    EXPECT_EQ(r[6].kv_from, 5);
    EXPECT_EQ(r[6].topk_from, 5);
    EXPECT_TRUE(r[7].reindex && r[7].uses_candidates);
    EXPECT_EQ(r[7].index_keys_from, 5);
    EXPECT_NE(r[4].describe().find("no candidates"), std::string::npos) << r[4].describe();
}

TEST(RolePatterns, GoldenPatternUnchanged) {
    const auto r = derive_layer_roles(make_tiny_base_config(TinyPreset::Tiny, 0), "config.json");
    ASSERT_EQ(r.size(), 6u);
    EXPECT_TRUE(r[3].candidate_source);
    EXPECT_TRUE(r[5].reindex && r[5].uses_candidates);
    EXPECT_EQ(r[5].index_keys_from, 3);
    for (int l : {1, 2, 3, 4}) EXPECT_FALSE(r[static_cast<size_t>(l)].uses_candidates) << l;
}

TEST(RolePatterns, KvSourceWithoutIndexerReusesTheLatestTopk) {
    // model.py: a KV source that is no index source compresses its own KV and reuses the top-k slot.
    const auto r = derive_layer_roles(with_roles({0, 2, 2, 2}, {1, 2}, {1, 3}, -1), "config.json");
    EXPECT_EQ(r[2].kv_from, 2);
    EXPECT_EQ(r[2].topk_from, 1);
    EXPECT_FALSE(r[2].owns_index_keys);
    EXPECT_TRUE(r[3].reindex);
    EXPECT_EQ(r[3].index_keys_from, 1);  // the index_k slot: the latest key owner
    EXPECT_EQ(r[3].kv_from, 2);
}

TEST(RolePatterns, KeyOwnerAfterTheCandidateSourceUsesCandidates) {
    // uses_candidates = 0 <= candidate_source_layer < layer_id, key owner or not.
    const auto r = derive_layer_roles(with_roles({0, 1, 1, 1}, {1, 3}, {1, 3}, 1), "config.json");
    EXPECT_TRUE(r[1].candidate_source);
    EXPECT_TRUE(r[3].owns_index_keys && r[3].uses_candidates);
}

TEST(RolePatterns, PatternsTheReferenceCannotRunAreRefused) {
    // A compressed layer before any KV source: the compress_kv slot is None in model.py.
    EXPECT_NE(refusal(with_roles({0, 2, 2}, {2}, {2}, -1)).find("compressed KV"), std::string::npos);
    // A ratio-1 layer reading ratio-2 KV: rows this prefill never wrote.
    EXPECT_NE(refusal(with_roles({0, 2, 1}, {1}, {1}, -1)).find("ratio"), std::string::npos);
    // A KV source with no earlier index source: the top-k slot is None.
    EXPECT_NE(refusal(with_roles({0, 2, 2}, {1}, {2}, -1)).find("top-k"), std::string::npos);
    // Indexers after a candidate source that runs no indexer: the candidates slot is None.
    EXPECT_NE(refusal(with_roles({0, 1, 1, 1}, {1}, {1, 3}, 2)).find("candidate"), std::string::npos);
    // A candidate pool of another ratio (mask shape [s, s/2] against scores [s, s]).
    EXPECT_NE(refusal(with_roles({0, 2, 2, 1, 1}, {1, 3}, {1, 2, 3, 4}, 2)).find("ratio"), std::string::npos);
    // Ratio 0 but a source.
    EXPECT_NE(refusal(with_roles({0, 2}, {0, 1}, {1}, -1)).find("ratio 0"), std::string::npos);
}
