// `score --shard K/N` + `merge` end to end (issue 16), through the binary on the golden tiny-a checkpoint
// with the CPU backend: shards 1..N merged give the unsharded output byte for byte (results and the
// hidden-state .npy files), with --skip-bad error records (one a duplicate id whose first occurrence is
// in another shard) and more shards than records; a shard resumes on its own; merge refuses, naming
// it, a missing, duplicated, incomplete or foreign shard, and never replaces an existing output
// without --overwrite; --shard on stdin is a usage error.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_run_util.h"
#include "ds4r/error.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::shell_quote;
using test::slurp;
using test::split_lines;
using test::write_text;
namespace fs = std::filesystem;

const char* const kFlags =
    "--backend cpu --progress none --skip-bad --top-k 3 --capture-layers 2,6 --pass-tokens 40";

// 20 sequences of 3..31 tokens cut from the golden tokens, a bad line and a repeated id (both become
// error records with --skip-bad): 22 records.
std::string input_text() {
    std::vector<int> src;
    for (const std::string& line : split_lines(slurp(test::data_dir() + "/tiny-a/tokens.jsonl"))) {
        const json v = json::parse(line);
        if (v.at("id") == "seq11") src = v.at("tokens").get<std::vector<int>>();
    }
    std::string text;
    for (int i = 0; i < 20; ++i) {
        const int n = 3 + (i * 11) % 29;
        json toks = json::array();
        for (int j = 0; j < n; ++j) toks.push_back(src.at(static_cast<size_t>(i * 5 + j)));
        text += json{{"id", strfmt("s%02d", i)}, {"tokens", toks}, {"i", i}}.dump() + "\n";
        if (i == 4) text += "{\"id\": \"bad\", \"tokens\": [-1]}\n";
        if (i == 11) text += "{\"id\": \"s02\", \"tokens\": [1, 2]}\n";  // s02 is in shard 1 of 3
    }
    return text;
}

int score(const std::string& dir, const std::string& out, const std::string& hidden, const std::string& extra,
          std::string* log) {
    return test::run_ds4replay("score --model " + shell_quote(test::tiny_model_dir()) + " --input " +
                                   shell_quote(dir + "/in.jsonl") + " --output " + shell_quote(out) +
                                   " --hidden-dir " + shell_quote(hidden) + " " + kFlags + " " + extra,
                               log);
}

int merge(const std::string& args, std::string* log) {
    return test::run_ds4replay("merge " + args, log);
}

// The work dir holding the input (once per test process).
const std::string& work_dir() {
    static const std::string dir = [] {
        const std::string d = test::temp_dir("shard-merge");
        write_text(d + "/in.jsonl", input_text());
        return d;
    }();
    return dir;
}

// The unsharded run of the work dir's input: <work_dir>/ref.jsonl and ref-hidden/ (once).
void ensure_unsharded_run() {
    static const bool done = [] {
        std::string log;
        EXPECT_EQ(score(work_dir(), work_dir() + "/ref.jsonl", work_dir() + "/ref-hidden", "", &log), 0)
            << log;
        return true;
    }();
    (void)done;
}

// Shards 1..n of the work dir's input into <dir>/n<n>/s<k>.jsonl, hidden in <dir>/n<n>/h<k> (once per n).
std::string shards_of(int n) {
    static std::map<int, std::string> made;
    if (made.count(n)) return made[n];
    const std::string d = work_dir() + "/n" + std::to_string(n);
    fs::create_directories(d);
    for (int k = 1; k <= n; ++k) {
        std::string log;
        EXPECT_EQ(score(work_dir(), strfmt("%s/s%d.jsonl", d.c_str(), k), strfmt("%s/h%d", d.c_str(), k),
                        strfmt("--shard %d/%d", k, n), &log),
                  0)
            << log;
    }
    return made[n] = d;
}

void expect_same_as_unsharded(const std::string& out, const std::string& hidden) {
    ensure_unsharded_run();
    const std::string ref = slurp(work_dir() + "/ref.jsonl");
    ASSERT_EQ(split_lines(ref).size(), 22u);
    EXPECT_EQ(slurp(out), ref);
    for (int L : {2, 6}) {
        const std::string name = "/hidden_L" + std::to_string(L) + ".npy";
        const std::string want = slurp(work_dir() + "/ref-hidden" + name);
        EXPECT_GT(want.size(), 128u);
        EXPECT_TRUE(slurp(hidden + name) == want) << "layer " << L;
    }
}

TEST(ShardMerge, ThreeShardsMergedAreTheUnshardedOutput) {
    const std::string d = shards_of(3);
    // Every shard holds a part; concatenated, the parts are the unsharded records but for the rows.
    size_t lines = 0;
    for (int k = 1; k <= 3; ++k) {
        const size_t n = split_lines(slurp(strfmt("%s/s%d.jsonl", d.c_str(), k))).size();
        EXPECT_GT(n, 0u);
        lines += n;
    }
    EXPECT_EQ(lines, 22u);
    std::string log;
    // Shards in any order on the command line.
    ASSERT_EQ(merge(shell_quote(d + "/out.jsonl") + " " + d + "/s3.jsonl " + d + "/s1.jsonl " + d +
                        "/s2.jsonl --hidden-dir " + shell_quote(d + "/merged-hidden"),
                    &log),
              0)
        << log;
    expect_same_as_unsharded(d + "/out.jsonl", d + "/merged-hidden");
    const json side = json::parse(slurp(d + "/out.jsonl.run.json"));
    EXPECT_TRUE(side.at("shard").is_null());
    EXPECT_EQ(side.at("input").at("records"), 22);
    // The merged output is never replaced without --overwrite (nor its hidden files).
    const std::string before = slurp(d + "/out.jsonl");
    EXPECT_EQ(merge(shell_quote(d + "/out.jsonl") + " " + d + "/s1.jsonl " + d + "/s2.jsonl " + d +
                        "/s3.jsonl --hidden-dir " + shell_quote(d + "/merged-hidden"),
                    &log),
              2);
    EXPECT_NE(log.find("exists"), std::string::npos) << log;
    EXPECT_EQ(slurp(d + "/out.jsonl"), before);
    ASSERT_EQ(merge(shell_quote(d + "/out.jsonl") + " " + d + "/s1.jsonl " + d + "/s2.jsonl " + d +
                        "/s3.jsonl --overwrite --hidden-dir " + shell_quote(d + "/merged-hidden"),
                    &log),
              0)
        << log;
    expect_same_as_unsharded(d + "/out.jsonl", d + "/merged-hidden");
}

TEST(ShardMerge, MoreShardsThanRecordsGiveEmptyShards) {
    // 2 records in 4 shards: two shards are empty, the merge is still the unsharded output.
    const std::string d = test::temp_dir("shard-empty");
    const auto lines = split_lines(input_text());
    write_text(d + "/in.jsonl", lines[0] + "\n" + lines[1] + "\n");
    std::string log;
    ASSERT_EQ(score(d, d + "/ref.jsonl", d + "/ref-hidden", "", &log), 0) << log;
    std::string shards;
    for (int k = 1; k <= 4; ++k) {
        ASSERT_EQ(score(d, strfmt("%s/s%d.jsonl", d.c_str(), k), strfmt("%s/h%d", d.c_str(), k),
                        strfmt("--shard %d/4", k), &log),
                  0)
            << log;
        shards += strfmt(" %s/s%d.jsonl", d.c_str(), k);
    }
    ASSERT_EQ(merge(shell_quote(d + "/out.jsonl") + shards + " --hidden-dir " + shell_quote(d + "/mh"), &log),
              0)
        << log;
    EXPECT_EQ(slurp(d + "/out.jsonl"), slurp(d + "/ref.jsonl"));
    EXPECT_TRUE(slurp(d + "/mh/hidden_L6.npy") == slurp(d + "/ref-hidden/hidden_L6.npy"));
}

TEST(ShardMerge, AShardResumesOnItsOwn) {
    // Shard 2 of 3 cut back to its first record (as after a kill), then --resume: the same bytes.
    const std::string d = shards_of(3);
    const std::string r = test::temp_dir("shard-resume");
    const auto lines = split_lines(slurp(d + "/s2.jsonl"));
    ASSERT_GT(lines.size(), 2u);
    fs::copy(d + "/h2", r + "/h2");
    write_text(r + "/s2.jsonl", lines[0] + "\n");
    std::string log;
    ASSERT_EQ(score(work_dir(), r + "/s2.jsonl", r + "/h2", "--shard 2/3 --resume", &log), 0) << log;
    EXPECT_EQ(slurp(r + "/s2.jsonl"), slurp(d + "/s2.jsonl"));
    EXPECT_TRUE(slurp(r + "/h2/hidden_L2.npy") == slurp(d + "/h2/hidden_L2.npy"));
}

TEST(ShardMerge, RefusesMissingDuplicatedIncompleteAndForeignShards) {
    const std::string d = shards_of(3);
    const std::string e = test::temp_dir("shard-errors");
    auto refused = [&](const std::string& args, const std::string& fragment) {
        std::string log;
        EXPECT_EQ(
            merge(shell_quote(e + "/out.jsonl") + " " + args + " --hidden-dir " + shell_quote(e + "/mh"),
                  &log),
            2)
            << log;
        EXPECT_NE(log.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << log;
        EXPECT_FALSE(fs::exists(e + "/out.jsonl"));
        EXPECT_FALSE(fs::exists(e + "/mh/hidden_L2.npy"));
    };
    const std::string s1 = d + "/s1.jsonl", s2 = d + "/s2.jsonl", s3 = d + "/s3.jsonl";
    refused(s1 + " " + s3, "missing shards: 2/3");
    refused(s1 + " " + s2 + " " + s3 + " " + s2, "shard 2/3 is given 2 times");
    // Incomplete: shard 3 without its last record (its sidecar and hidden files copied along).
    fs::create_directories(e + "/cut");
    fs::copy(d + "/h3", e + "/cut/h3");
    const auto lines = split_lines(slurp(s3));
    std::string cut;
    for (size_t i = 0; i + 1 < lines.size(); ++i) cut += lines[i] + "\n";
    write_text(e + "/cut/s3.jsonl", cut);
    json side = json::parse(slurp(s3 + ".run.json"));
    side["hidden"]["dir"] = e + "/cut/h3";
    write_text(e + "/cut/s3.jsonl.run.json", side.dump(2));
    refused(s1 + " " + s2 + " " + e + "/cut/s3.jsonl", strfmt("holds %zu records", lines.size() - 1));
    // A partial last line (a shard killed mid-write).
    write_text(e + "/cut/s3.jsonl", cut + lines.back().substr(0, 20));
    refused(s1 + " " + s2 + " " + e + "/cut/s3.jsonl", "partial line");
    // A shard of another split, and one written with other options.
    refused(s1 + " " + s2 + " " + shards_of(1) + "/s1.jsonl", "different splits");
    std::string log;
    ASSERT_EQ(score(work_dir(), e + "/k3.jsonl", e + "/k3h", "--shard 3/3 --max-seq-len 1000", &log), 0)
        << log;
    refused(s1 + " " + s2 + " " + e + "/k3.jsonl", "--max-seq-len 1000 but shard 1/3");
    // A results file without a sidecar.
    write_text(e + "/plain.jsonl", slurp(s3));
    refused(s1 + " " + s2 + " " + e + "/plain.jsonl", "no run sidecar");
    // The merged output may not be a shard's own file, even with --overwrite.
    EXPECT_EQ(
        merge(s1 + " " + s1 + " " + s2 + " " + s3 + " --overwrite --hidden-dir " + shell_quote(e + "/mh"),
              &log),
        2);
    EXPECT_NE(log.find("is the results file of shard 1/3"), std::string::npos) << log;
}

TEST(ShardMerge, ShardNeedsARegularInputFile) {
    std::string log;
    const int rc = test::run_command("cat " + shell_quote(work_dir() + "/in.jsonl") + " | " +
                                         shell_quote(test::binary_path()) + " score --model " +
                                         shell_quote(test::tiny_model_dir()) +
                                         " --backend cpu --progress none --input - --output - --shard 1/2",
                                     &log);
    EXPECT_EQ(rc, 2) << log;
    EXPECT_NE(log.find("--shard needs the input as a regular file"), std::string::npos) << log;
    EXPECT_EQ(test::run_ds4replay("score --model " + shell_quote(test::tiny_model_dir()) + " --input " +
                                      shell_quote(work_dir() + "/in.jsonl") + " --output - --shard 3/2",
                                  &log),
              2);
    EXPECT_NE(log.find("the index must be in [1, 2]"), std::string::npos) << log;
}

}  // namespace
}  // namespace ds4r
