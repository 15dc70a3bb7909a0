// Another layer-role pattern on the CPU backend (issue 10): the tiny-roles checkpoint (8 layers,
// ratios 0,0,2,2,2,1,1,1, KV sources 2,5, index sources 2,4,5,7, candidate source 5), which the
// reference runs. Scores it with batch invariance and determinism checks, checks that the key-less
// indexer of layer 4 (before the candidate source) scores without a candidate mask, as model.py's
// Indexer does (uses_candidates = 0 <= candidate_source_layer < layer_id), and that the score CLI
// accepts the checkpoint.
#include "role_pattern.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ds4r/config.h"
#include "golden_util.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

std::vector<int> all_indices() {
    std::vector<int> v(tiny_roles_sequences(512).size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
    return v;
}

}  // namespace

TEST(RolePattern, TinyRolesRolesAreTheReferences) {
    const auto& roles = tiny_roles_model("cpu").ckpt->roles();
    ASSERT_EQ(roles.size(), 8u);
    EXPECT_TRUE(roles[4].reindex && !roles[4].uses_candidates) << roles[4].describe();
    EXPECT_EQ(roles[4].index_keys_from, 2);
    EXPECT_TRUE(roles[5].candidate_source && roles[5].owns_index_keys);
    EXPECT_EQ(roles[6].topk_from, 5);
    EXPECT_TRUE(roles[7].reindex && roles[7].uses_candidates);
    EXPECT_EQ(roles[7].index_keys_from, 5);
}

TEST(RolePattern, TinyRolesBatchInvarianceAndDeterminism) {
    const auto all = all_indices();
    const auto together = score_tiny_roles("cpu", {all}, 4096);
    std::vector<std::vector<int>> singles;
    for (int i : all) singles.push_back({i});
    const auto alone = score_tiny_roles("cpu", singles, 4096);
    std::vector<int> rev(all.rbegin(), all.rend());
    const auto chunked = score_tiny_roles(
        "cpu", {std::vector<int>(rev.begin(), rev.begin() + 3), std::vector<int>(rev.begin() + 3, rev.end())},
        7);
    const auto again = score_tiny_roles("cpu", {all}, 4096);
    for (int i : all) {
        EXPECT_EQ(together.at(i), alone.at(i)) << "sequence " << i << ": together vs alone";
        EXPECT_EQ(together.at(i), chunked.at(i))
            << "sequence " << i << ": together vs reversed groups, 7-row chunks";
        EXPECT_EQ(together.at(i), again.at(i)) << "sequence " << i << ": two identical runs";
        const auto j = nlohmann::json::parse(together.at(i));
        for (const auto& v : j.at("logprob")) EXPECT_TRUE(std::isfinite(v.get<double>())) << "sequence " << i;
    }
}

// The same weights with candidate_source_layer = -1: nothing before layer 5 may change (layer 4's
// indexer sees no candidate mask either way), and layer 7's pool restriction must change something.
TEST(RolePattern, KeylessIndexerBeforeTheCandidateSourceIgnoresCandidates) {
    const std::string dir = temp_dir("tiny-roles-nocand") + "/model";
    std::filesystem::copy(tiny_roles_model_dir(), dir, std::filesystem::copy_options::recursive);
    {
        std::ifstream in(dir + "/config.json");
        nlohmann::ordered_json c = nlohmann::ordered_json::parse(in);
        ASSERT_TRUE(c.contains("text_config") && c["text_config"].contains("candidate_source_layer_id"));
        c["text_config"]["candidate_source_layer_id"] = -1;
        std::ofstream(dir + "/config.json", std::ios::trunc) << c.dump(2);
    }
    const auto all = all_indices();
    MemSink with, without;
    const auto a = score_tiny_roles("cpu", {all}, 4096, "", &with);
    const auto b = score_tiny_roles("cpu", {all}, 4096, dir, &without);
    for (int i : all)
        for (int L = 0; L <= 5; ++L)  // the stream entering layers 0..5: blocks 0..4 ran
            EXPECT_EQ(with.rows.at({L, i}), without.rows.at({L, i})) << "sequence " << i << " layer " << L;
    int differ = 0;
    for (int i : all) differ += with.rows.at({8, i}) != without.rows.at({8, i});
    EXPECT_GT(differ, 0) << "layer 7's candidate restriction changed no final hidden state";
    int records_differ = 0;
    for (int i : all) records_differ += a.at(i) != b.at(i);
    EXPECT_GT(records_differ, 0);
}

TEST(RolePattern, ScoreCliAcceptsTinyRoles) {
    const std::string dir = temp_dir("tiny-roles-cli");
    {
        std::ofstream in(dir + "/in.jsonl");
        const auto seqs = tiny_roles_sequences(512);
        for (size_t i = 0; i < 3; ++i) {
            nlohmann::json j;
            j["id"] = "s" + std::to_string(i);
            j["tokens"] = seqs[i];
            in << j.dump() << "\n";
        }
    }
    std::string log;
    const int rc =
        run_command(binary_path() + " score --backend cpu --progress none --model " + tiny_roles_model_dir() +
                        " --input " + dir + "/in.jsonl --output " + dir + "/out.jsonl",
                    &log);
    ASSERT_EQ(rc, 0) << log;
    const auto recs = read_records(dir + "/out.jsonl");
    const auto direct = score_tiny_roles("cpu", {{0, 1, 2}}, 4096);
    ASSERT_EQ(recs.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        const auto d = nlohmann::json::parse(direct.at(static_cast<int>(i)));
        EXPECT_EQ(recs[i].logprob, d.at("logprob").get<std::vector<double>>()) << "sequence " << i;
    }
}
