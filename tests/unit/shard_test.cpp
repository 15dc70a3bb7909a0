// Input sharding (include/ds4r/shard.h) and the record rewriting of `merge` (include/ds4r/merge.h),
// without the model: the balanced split, --shard K/N and --shard auto from the schedulers' variables,
// the token-count scan of an input file, the row shift of a record's "hidden" entries.
#include "ds4r/shard.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/merge.h"

namespace ds4r {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
    auto m = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
    return [m](const char* name) -> const char* {
        auto it = m->find(name);
        return it == m->end() ? nullptr : it->second.c_str();
    };
}

std::string error_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const InputError& e) {
        return e.what();
    }
    return "(no InputError)";
}

TEST(Shard, BalancedBoundariesTileAndBalance) {
    // Equal weights split evenly; the boundaries always tile [0, R).
    EXPECT_EQ(balanced_boundaries({1, 1, 1, 1, 1, 1, 1, 1}, 4), (std::vector<int64_t>{0, 2, 4, 6, 8}));
    // One heavy record takes a shard of its own.
    EXPECT_EQ(balanced_boundaries({1, 1, 100, 1, 1}, 3), (std::vector<int64_t>{0, 2, 3, 5}));
    // The nearest boundary to k * total / n: prefix sums 0,3,6,9,12 for 2 parts: target 6 -> 2.
    EXPECT_EQ(balanced_boundaries({3, 3, 3, 3}, 2), (std::vector<int64_t>{0, 2, 4}));
    // A tie goes to the lower boundary: prefix sums 0,1,3,4, target 2: |1-2| == |3-2| -> boundary 1.
    EXPECT_EQ(balanced_boundaries({1, 2, 1}, 2), (std::vector<int64_t>{0, 1, 3}));
    // More shards than records: some parts are empty, still tiling.
    EXPECT_EQ(balanced_boundaries({5, 5}, 4), (std::vector<int64_t>{0, 0, 1, 1, 2}));
    EXPECT_EQ(balanced_boundaries({}, 3), (std::vector<int64_t>{0, 0, 0, 0}));
    EXPECT_EQ(balanced_boundaries({7}, 1), (std::vector<int64_t>{0, 1}));
    // Balance on a ragged input: every part within one record's weight of total / n.
    std::vector<int64_t> w;
    for (int i = 0; i < 1000; ++i) w.push_back(1 + (i * 7919) % 997);
    const int64_t total = std::accumulate(w.begin(), w.end(), int64_t{0});
    for (int64_t n : {2, 3, 7, 64}) {
        const auto b = balanced_boundaries(w, n);
        ASSERT_EQ(b.size(), static_cast<size_t>(n) + 1);
        EXPECT_EQ(b.front(), 0);
        EXPECT_EQ(b.back(), 1000);
        for (int64_t k = 0; k < n; ++k) {
            ASSERT_LE(b[k], b[k + 1]);
            int64_t part = 0;
            for (int64_t i = b[k]; i < b[k + 1]; ++i) part += w[i];
            EXPECT_LE(std::abs(part * n - total), 2 * 997 * n) << "part " << k << " of " << n;
        }
    }
}

TEST(Shard, ParsesKOfN) {
    const auto no_env = env_of({});
    const ShardSpec s = parse_shard_spec("2/4", 0, no_env);
    EXPECT_EQ(s.index, 2);
    EXPECT_EQ(s.count, 4);
    EXPECT_FALSE(parse_shard_spec("", 0, no_env).enabled());
    EXPECT_EQ(parse_shard_spec("1/1", 0, no_env).count, 1);
    for (const char* bad : {"0/4", "5/4", "4", "a/b", "1/0", "-1/4", "1/4/2", " 1/4", "1/100001"})
        EXPECT_NE(error_of([&] { parse_shard_spec(bad, 0, no_env); }), "(no InputError)") << bad;
    EXPECT_NE(error_of([&] { parse_shard_spec("1/4", 4, no_env); }).find("--shard-count"), std::string::npos);
    EXPECT_NE(error_of([&] { parse_shard_spec("", 4, no_env); }).find("--shard auto"), std::string::npos);
}

TEST(Shard, AutoFromSlurmArrays) {
    // --array=0-3: tasks 0..3 are shards 1..4.
    auto s = parse_shard_spec("auto", 0,
                              env_of({{"SLURM_ARRAY_TASK_ID", "0"},
                                      {"SLURM_ARRAY_TASK_COUNT", "4"},
                                      {"SLURM_ARRAY_TASK_MIN", "0"},
                                      {"SLURM_ARRAY_TASK_MAX", "3"}}));
    EXPECT_EQ(s.index, 1);
    EXPECT_EQ(s.count, 4);
    // --array=1-4 (arrays need not start at 0): task 4 is shard 4/4.
    s = parse_shard_spec("auto", 0,
                         env_of({{"SLURM_ARRAY_TASK_ID", "4"},
                                 {"SLURM_ARRAY_TASK_COUNT", "4"},
                                 {"SLURM_ARRAY_TASK_MIN", "1"},
                                 {"SLURM_ARRAY_TASK_MAX", "4"}}));
    EXPECT_EQ(s.index, 4);
    // --array=10-16:2 -> tasks 10,12,14,16 = shards 1..4; task 14 is shard 3.
    s = parse_shard_spec("auto", 4,
                         env_of({{"SLURM_ARRAY_TASK_ID", "14"},
                                 {"SLURM_ARRAY_TASK_COUNT", "4"},
                                 {"SLURM_ARRAY_TASK_MIN", "10"},
                                 {"SLURM_ARRAY_TASK_MAX", "16"},
                                 {"SLURM_ARRAY_TASK_STEP", "2"}}));
    EXPECT_EQ(s.index, 3);
    EXPECT_EQ(s.count, 4);
    // --array=1,3,7 (a list, not a range): refused, saying how to submit.
    EXPECT_NE(error_of([&] {
                  parse_shard_spec("auto", 0,
                                   env_of({{"SLURM_ARRAY_TASK_ID", "3"},
                                           {"SLURM_ARRAY_TASK_COUNT", "3"},
                                           {"SLURM_ARRAY_TASK_MIN", "1"},
                                           {"SLURM_ARRAY_TASK_MAX", "7"}}));
              }).find("--array=0-2"),
              std::string::npos);
    // --shard-count disagreeing with the array.
    EXPECT_NE(error_of([&] {
                  parse_shard_spec("auto", 5,
                                   env_of({{"SLURM_ARRAY_TASK_ID", "0"},
                                           {"SLURM_ARRAY_TASK_COUNT", "4"},
                                           {"SLURM_ARRAY_TASK_MIN", "0"}}));
              }).find("SLURM_ARRAY_TASK_COUNT"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  parse_shard_spec("auto", 0, env_of({{"SLURM_ARRAY_TASK_ID", "x"}}));
              }).find("SLURM_ARRAY_TASK_ID='x'"),
              std::string::npos);
}

TEST(Shard, AutoFromKubernetesIndexedJob) {
    const auto s = parse_shard_spec("auto", 8, env_of({{"JOB_COMPLETION_INDEX", "7"}}));
    EXPECT_EQ(s.index, 8);
    EXPECT_EQ(s.count, 8);
    EXPECT_NE(error_of([&] {
                  parse_shard_spec("auto", 0, env_of({{"JOB_COMPLETION_INDEX", "0"}}));
              }).find("--shard-count"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  parse_shard_spec("auto", 8, env_of({{"JOB_COMPLETION_INDEX", "8"}}));
              }),
              "(no InputError)");
    EXPECT_NE(error_of([&] { parse_shard_spec("auto", 0, env_of({})); }).find("--shard K/N"),
              std::string::npos);
}

TEST(Shard, PlanScansTheWholeInputFile) {
    const std::string dir = test::temp_dir("shard-plan");
    // Records: 4, 1 (bad: token out of range), 4, 8 tokens; blank lines are not records.
    test::write_text(dir + "/in.jsonl",
                     "{\"id\": \"a\", \"tokens\": [1, 2, 3, 4]}\n\n{\"id\": \"b\", \"tokens\": [999]}\n"
                     "[5, 6, 7, 8]\n{\"id\": \"c\", \"tokens\": [1, 1, 1, 1, 1, 1, 1, 1]}\n");
    const ShardPlan p1 = plan_shard(dir + "/in.jsonl", 512, 1000, {1, 2});
    const ShardPlan p2 = plan_shard(dir + "/in.jsonl", 512, 1000, {2, 2});
    EXPECT_EQ(p1.total_records, 4);
    EXPECT_EQ(p1.total_tokens, 17);
    EXPECT_EQ(p1.first_record, 0);
    EXPECT_EQ(p1.records, 3);  // prefix 9 is nearer 8.5 than 5
    EXPECT_EQ(p1.tokens, 9);
    EXPECT_EQ(p2.first_record, 3);
    EXPECT_EQ(p2.records, 1);
    EXPECT_TRUE(p2.contains(3));
    EXPECT_FALSE(p2.contains(2));
    EXPECT_NE(describe_shard_plan(p2).find("shard 2/2: records 4..4 of 4"), std::string::npos);
    // stdin cannot be read twice.
    EXPECT_NE(error_of([&] { plan_shard("-", 512, 1000, {1, 2}); }).find("regular file"), std::string::npos);
}

TEST(Merge, RemapsHiddenRowsAndKeepsEveryOtherByte) {
    // The id and a carried-through field contain the text "hidden": only the top-level member counts.
    const std::string line =
        "{\"id\": \"x\\\"hidden\\\": [\", \"n_tokens\": 3, \"sum_logprob\": -1.5, \"hidden\": [{\"layer\": "
        "2, "
        "\"file\": \"hidden_L2.npy\", \"rows\": [5, 8]}, {\"layer\": 6, \"file\": \"hidden_L6.npy\", "
        "\"rows\": "
        "[5, 8]}], \"note\": {\"hidden\": [1]}}";
    std::vector<std::string> seen;
    const RowMap map = [&](int layer, int64_t begin, int64_t end) -> int64_t {
        seen.push_back(strfmt("%d:%lld-%lld", layer, (long long)begin, (long long)end));
        return layer == 2 ? 10 : 20;
    };
    const std::string out = remap_hidden_rows(line, map, "t:1");
    EXPECT_EQ(
        out,
        "{\"id\": \"x\\\"hidden\\\": [\", \"n_tokens\": 3, \"sum_logprob\": -1.5, \"hidden\": [{\"layer\": "
        "2, \"file\": \"hidden_L2.npy\", \"rows\": [10, 13]}, {\"layer\": 6, \"file\": "
        "\"hidden_L6.npy\", \"rows\": [20, 23]}], \"note\": {\"hidden\": [1]}}");
    EXPECT_EQ(seen, (std::vector<std::string>{"2:5-8", "6:5-8"}));
    // Error records (no "hidden") are unchanged and the map is not called.
    seen.clear();
    const std::string err = "{\"id\": \"b\", \"error\": \"in.jsonl:2: bad \\\"hidden\\\": [\", \"line\": 2}";
    EXPECT_EQ(remap_hidden_rows(err, map, "t:2"), err);
    EXPECT_TRUE(seen.empty());
    // A layout this program does not write is refused rather than reformatted.
    const std::string odd =
        "{\"id\": 1, \"hidden\": [{\"layer\":2, \"file\": \"hidden_L2.npy\", \"rows\": [3, 5]}]}";
    EXPECT_NE(
        error_of([&] { remap_hidden_rows(odd, map, "t:3"); }).find("t:3: \"hidden\" entry not in the layout"),
        std::string::npos);
    EXPECT_NE(error_of([&] {
                  remap_hidden_rows("{\"hidden\": [{\"layer\": 2}]}", map, "t:4");
              }).find("t:4: malformed"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  remap_hidden_rows(
                      "{\"hidden\": [{\"layer\": 2, \"file\": \"hidden_L6.npy\", \"rows\": [0, 1]}]}", map,
                      "t:5");
              }).find("expected \"hidden_L2.npy\""),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  remap_hidden_rows(
                      "{\"hidden\": [{\"layer\": 2, \"file\": \"hidden_L2.npy\", \"rows\": [4, 1]}]}", map,
                      "t:6");
              }).find("not a range"),
              std::string::npos);
}

}  // namespace
}  // namespace ds4r
