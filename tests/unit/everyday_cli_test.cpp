// Everyday use (issue 11), through the binary on the golden tiny-a checkpoint with the CPU backend:
//  - -q / -v before or after the subcommand; -q silences progress and info lines;
//  - --hidden-dir without --capture-layers is an error; --max-seq-len beyond the model's context warns;
//  - a make-tiny --headers-only checkpoint (weights read as zeros) is refused by score;
//  - "reading token sequences from stdin" only when stdin is a terminal;
//  - records carry the input token ids ("tokens", --no-tokens drops them); --top-k 0 writes no
//    topk_* fields, and compare reads such files;
//  - compare prints n/a / null when no position is comparable; counts take singular nouns;
//  - results to a full stdout fail with the reason (errno);
//  - progress within a long layer (Progress::chunk_done) and the pass runner's chunk callback.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_run_util.h"
#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/progress.h"
#include "ds4r/replay.h"
#include "ds4r/weights.h"
#include "ds4r/zero_weights.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::shell_quote;
using test::slurp;
using test::split_lines;
using test::write_text;

const std::string kInput =
    "{\"id\": \"a\", \"tokens\": [1, 2, 3]}\n{\"id\": \"c\", \"tokens\": [4, 5, 9, 7]}\n";

std::string model_arg() {
    return "--model " + shell_quote(test::tiny_model_dir()) + " --backend cpu";
}

// Scores kInput; returns the exit code, the output lines in *lines, stderr+stdout in *log.
int score(const std::string& dir, const std::string& extra, std::vector<std::string>* lines,
          std::string* log) {
    write_text(dir + "/in.jsonl", kInput);
    std::filesystem::remove(dir + "/out.jsonl");
    const int rc = test::run_ds4replay("score " + model_arg() + " --input " + shell_quote(dir + "/in.jsonl") +
                                           " --output " + shell_quote(dir + "/out.jsonl") + " " + extra,
                                       log);
    if (lines) *lines = split_lines(slurp(dir + "/out.jsonl"));
    return rc;
}

bool has_line_starting(const std::string& log, const std::string& prefix) {
    for (const auto& l : split_lines(log))
        if (l.rfind(prefix, 0) == 0) return true;
    return false;
}

TEST(EverydayCli, QuietAndVerboseBeforeOrAfterTheSubcommand) {
    const std::string dir = test::temp_dir("everyday-q");
    std::string log;
    // Progress asked for explicitly, then silenced by -q after the subcommand.
    ASSERT_EQ(score(dir, "--progress plain -q", nullptr, &log), 0) << log;
    EXPECT_FALSE(has_line_starting(log, "pass ")) << log;
    EXPECT_EQ(log.find("scored"), std::string::npos) << log;
    ASSERT_EQ(score(dir, "--progress plain", nullptr, &log), 0) << log;
    EXPECT_TRUE(has_line_starting(log, "pass 1 layer 1/")) << log;
    // -q before the subcommand too.
    write_text(dir + "/in.jsonl", kInput);
    std::filesystem::remove(dir + "/out.jsonl");
    ASSERT_EQ(test::run_ds4replay("-q score " + model_arg() + " --progress plain --input " +
                                      shell_quote(dir + "/in.jsonl") + " --output " +
                                      shell_quote(dir + "/out.jsonl"),
                                  &log),
              0)
        << log;
    EXPECT_FALSE(has_line_starting(log, "pass ")) << log;
    // -v after the subcommand: debug logging, accepted.
    EXPECT_EQ(test::run_ds4replay("inspect --model " + shell_quote(test::tiny_model_dir()) + " -v", &log), 0)
        << log;
    EXPECT_EQ(test::run_ds4replay("inspect -q --model " + shell_quote(test::tiny_model_dir()), &log), 0)
        << log;
}

TEST(EverydayCli, HiddenDirWithoutCaptureLayersIsAnError) {
    const std::string dir = test::temp_dir("everyday-hidden");
    std::string log;
    EXPECT_EQ(score(dir, "--progress none --hidden-dir " + shell_quote(dir + "/h"), nullptr, &log), 2) << log;
    EXPECT_NE(log.find("--hidden-dir needs --capture-layers"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir + "/h"));
}

TEST(EverydayCli, MaxSeqLenBeyondTheModelWarns) {
    const std::string dir = test::temp_dir("everyday-maxlen");
    std::string log;
    ASSERT_EQ(score(dir, "--progress none --max-seq-len 600", nullptr, &log), 0) << log;
    EXPECT_NE(log.find("--max-seq-len 600 is beyond the model's max_position_embeddings (512)"),
              std::string::npos)
        << log;
    ASSERT_EQ(score(dir, "--progress none --max-seq-len 100", nullptr, &log), 0) << log;
    EXPECT_EQ(log.find("beyond the model's"), std::string::npos) << log;
}

TEST(EverydayCli, HeadersOnlyCheckpointIsRefusedUnlessAllowed) {
    const std::string dir = test::temp_dir("everyday-zeros");
    std::string log;
    ASSERT_EQ(test::run_ds4replay("make-tiny " + shell_quote(dir + "/m") + " --headers-only -q", &log), 0)
        << log;
    EXPECT_EQ(log, "") << "-q: no progress, no summary";
    EXPECT_TRUE(checkpoint_has_zero_weights(Checkpoint::open(dir + "/m")));
    EXPECT_FALSE(checkpoint_has_zero_weights(Checkpoint::open(test::tiny_model_dir())));
    ASSERT_EQ(test::run_ds4replay("inspect --json --model " + shell_quote(dir + "/m"), &log), 0) << log;
    EXPECT_EQ(json::parse(log).at("zero_weights"), true) << log;
    write_text(dir + "/in.jsonl", kInput);
    const std::string args = "score --backend cpu --progress none --model " + shell_quote(dir + "/m") +
                             " --input " + shell_quote(dir + "/in.jsonl") + " --output " +
                             shell_quote(dir + "/out.jsonl");
    EXPECT_EQ(test::run_ds4replay(args, &log), 3) << log;
    EXPECT_NE(log.find("read as zeros (make-tiny --headers-only)"), std::string::npos) << log;
    EXPECT_NE(log.find("--allow-zero-weights"), std::string::npos) << log;
    EXPECT_FALSE(std::filesystem::exists(dir + "/out.jsonl"));
    // Allowed: the refusal is gone (a warning says what is being scored).
    test::run_ds4replay(args + " --allow-zero-weights", &log);
    EXPECT_EQ(log.find("not a model to score"), std::string::npos) << log;
    EXPECT_NE(log.find("weights read as zeros (--allow-zero-weights)"), std::string::npos) << log;
}

TEST(EverydayCli, StdinHintOnlyOnATerminal) {
    std::string log;
    // stdin a file: no hint.
    EXPECT_EQ(test::run_ds4replay("score --model /nonexistent-model-dir < /dev/null", &log), 3) << log;
    EXPECT_EQ(log.find("reading token sequences from stdin"), std::string::npos) << log;
    // stdin a terminal: script(1) gives the command a pseudo-terminal.
    if (test::run_command("command -v script >/dev/null 2>&1", &log) != 0)
        GTEST_SKIP() << "script(1) not installed: the terminal case needs a pseudo-terminal";
    const std::string cmd = shell_quote(test::binary_path()) + " score --model /nonexistent-model-dir";
    test::run_command("script -qec " + shell_quote(cmd) + " /dev/null < /dev/null", &log);
    EXPECT_NE(log.find("reading token sequences from stdin (Ctrl-D to end)"), std::string::npos) << log;
}

TEST(EverydayCli, RecordsCarryTokensAndTopKZeroDropsAlternatives) {
    const std::string dir = test::temp_dir("everyday-topk");
    std::vector<std::string> full, none, bare;
    std::string log;
    ASSERT_EQ(score(dir, "--progress none", &full, &log), 0) << log;
    ASSERT_EQ(score(dir, "--progress none --top-k 0", &none, &log), 0) << log;
    ASSERT_EQ(score(dir, "--progress none --top-k 0 --no-tokens", &bare, &log), 0) << log;
    ASSERT_EQ(full.size(), 2u);
    ASSERT_EQ(none.size(), 2u);
    ASSERT_EQ(bare.size(), 2u);
    const json a = json::parse(full[1]), b = json::parse(none[1]), c = json::parse(bare[1]);
    EXPECT_EQ(a.at("tokens"), json({4, 5, 9, 7}));
    EXPECT_EQ(b.at("tokens"), json({4, 5, 9, 7}));
    EXPECT_FALSE(c.contains("tokens"));
    EXPECT_EQ(a.at("topk_ids").size(), 3u);
    EXPECT_EQ(a.at("topk_ids").at(0).size(), 8u);
    for (const char* k : {"topk_ids", "topk_logprobs"}) {
        EXPECT_FALSE(b.contains(k)) << k;
        EXPECT_FALSE(b.at("final").contains(k)) << k;
    }
    // The scores themselves do not depend on top-k.
    for (const char* k : {"logprob", "rank", "entropy", "sum_logprob"}) EXPECT_EQ(a.at(k), b.at(k)) << k;
    EXPECT_EQ(a.at("final").at("entropy"), b.at("final").at("entropy"));
    // compare reads top-k 0 files: |d| defined, top-1 and KL not.
    write_text(dir + "/full.jsonl", full[0] + "\n" + full[1] + "\n");
    write_text(dir + "/none.jsonl", none[0] + "\n" + none[1] + "\n");
    ASSERT_EQ(test::run_ds4replay("compare --json " + shell_quote(dir + "/full.jsonl") + " " +
                                      shell_quote(dir + "/none.jsonl") + " 2>/dev/null",
                                  &log),
              0)
        << log;
    const json j = json::parse(log);
    EXPECT_EQ(j.at("positions"), 5);
    EXPECT_EQ(j.at("max_abs_dlogprob"), 0.0);
    EXPECT_TRUE(j.at("top1_agreement").is_null());
    EXPECT_TRUE(j.at("kl_mean").is_null());
    EXPECT_EQ(j.at("rank_agreement"), 1.0);
    // --top-k below 0 is still an error.
    EXPECT_EQ(score(dir, "--progress none --top-k -1", nullptr, &log), 2) << log;
}

TEST(EverydayCli, CompareWithoutComparablePositionsSaysNa) {
    const std::string dir = test::temp_dir("everyday-compare");
    // One-token sequences: no next token, no position to compare.
    const std::string rec =
        "{\"id\": \"x\", \"n_tokens\": 1, \"logprob\": [], \"rank\": [], \"entropy\": [], \"topk_ids\": [], "
        "\"topk_logprobs\": [], \"final\": {\"entropy\": 1.0}, \"sum_logprob\": 0.0}\n";
    write_text(dir + "/a.jsonl", rec);
    write_text(dir + "/b.jsonl", rec);
    std::string out;
    const std::string files = shell_quote(dir + "/a.jsonl") + " " + shell_quote(dir + "/b.jsonl");
    ASSERT_EQ(test::run_ds4replay("compare " + files, &out), 0) << out;
    EXPECT_NE(out.find(": 1 sequence, 0 positions"), std::string::npos) << out;
    EXPECT_NE(out.find("|d logprob|  median n/a  mean n/a  p95 n/a  max n/a"), std::string::npos) << out;
    EXPECT_NE(out.find("KL(A||B) over shared top-k (0 positions): mean n/a median n/a max n/a"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("KL 0"), std::string::npos) << out;
    ASSERT_EQ(test::run_ds4replay("compare --json " + files, &out), 0) << out;
    const json j = json::parse(out);
    for (const char* k : {"kl_mean", "kl_median", "kl_max", "median_abs_dlogprob", "mean_abs_dlogprob",
                          "p95_abs_dlogprob", "max_abs_dlogprob"})
        EXPECT_TRUE(j.at(k).is_null()) << k << " " << out;
}

TEST(EverydayCli, SingularCountsInMessages) {
    const std::string dir = test::temp_dir("everyday-plural");
    write_text(dir + "/in.jsonl", "{\"id\": \"a\", \"tokens\": [1, 2, 3]}\n");
    std::string log;
    ASSERT_EQ(test::run_ds4replay("score " + model_arg() + " --progress plain --input " +
                                      shell_quote(dir + "/in.jsonl") + " --output " +
                                      shell_quote(dir + "/out.jsonl"),
                                  &log),
              0)
        << log;
    EXPECT_NE(log.find("scored 1 sequence (3 tokens) in 1 pass on"), std::string::npos) << log;
    EXPECT_NE(log.find("pass 1 done: 1 sequence, 3 tokens"), std::string::npos) << log;
}

// `ds4replay <args>` with stdout on /dev/full; its stderr into *log (run_command adds 2>&1 outside).
int run_to_full_stdout(const std::string& args, std::string* log) {
    return test::run_command("{ " + shell_quote(test::binary_path()) + " " + args + " > /dev/full; }", log);
}

TEST(EverydayCli, FullStdoutFailsWithTheReason) {
    if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
    const std::string dir = test::temp_dir("everyday-full");
    write_text(dir + "/in.jsonl", kInput);
    std::string log;
    EXPECT_EQ(run_to_full_stdout("score " + model_arg() + " --progress none --input " +
                                     shell_quote(dir + "/in.jsonl") + " --output -",
                                 &log),
              1)
        << log;
    EXPECT_NE(log.find("writing results to stdout failed: No space left on device"), std::string::npos)
        << log;
    // Commands printing reports on stdout fail too, with the reason.
    EXPECT_EQ(run_to_full_stdout("inspect --json --model " + shell_quote(test::tiny_model_dir()), &log), 1)
        << log;
    EXPECT_NE(log.find("writing to stdout failed: No space left on device"), std::string::npos) << log;
}

// --- progress within a layer ---------------------------------------------------------------------

std::string read_all(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    return s;
}

TEST(EverydayProgress, ChunkLinesOnlyWithinSlowLayers) {
    std::FILE* f = std::tmpfile();
    ASSERT_NE(f, nullptr);
    double now = 0;
    Progress p("plain", 2, f, [&] { return now; });
    p.begin_pass(1, 400, 0);
    now = 1;
    p.chunk_done(0, 100, 400);  // the layer has run 1 s: quiet
    now = 4;
    p.chunk_done(0, 200, 400);  // 4 s: a line
    now = 5;
    p.chunk_done(0, 300, 400);  // 1 s after the last line: quiet
    now = 8;
    p.chunk_done(0, 400, 400);  // the layer is complete: its layer line follows instead
    LayerTiming t;
    t.layer = 0;
    p.layer_done(t);
    now = 9;
    p.chunk_done(1, 200, 400);  // layer 2 has run 1 s: quiet
    const std::string text = read_all(f);
    std::fclose(f);
    const auto lines = split_lines(text);
    ASSERT_EQ(lines.size(), 2u) << text;
    EXPECT_EQ(lines[0], "pass 1 layer 1/2: 200/400 tokens of the layer done (50%) in 4.0s, layer ETA 0m04s");
    EXPECT_EQ(lines[1].rfind("pass 1 layer 1/2: 400 tokens,", 0), 0u) << lines[1];
}

TEST(EverydayProgress, RunnerReportsEveryChunkOfEveryLayer) {
    const Checkpoint ck = Checkpoint::open(test::tiny_model_dir());
    auto be = make_cpu_backend();
    auto eng = load_engram_resources(ck);
    auto ws = make_sync_weight_source(*be, ck);
    ReplayOptions ro;
    ro.chunk_rows = 16;
    PassRunner runner(*be, ck, *ws, eng.get(), ro);
    std::map<int, std::vector<int64_t>> seen;  // layer -> rows done, in call order
    int64_t total = -1;
    runner.set_on_chunk([&](int layer, int64_t done, int64_t rows) {
        seen[layer].push_back(done);
        total = rows;
    });
    std::vector<std::vector<int32_t>> seqs{std::vector<int32_t>(20, 3), std::vector<int32_t>(30, 5)};
    runner.run(seqs, nullptr);
    EXPECT_EQ(total, 50);
    ASSERT_EQ(seen.size(), static_cast<size_t>(ck.config().n_layers) + 1);  // the layers and the head
    for (const auto& [layer, rows] : seen) {
        ASSERT_GE(rows.size(), 3u) << layer;  // 50 rows in chunks of <= 16
        for (size_t i = 1; i < rows.size(); ++i) EXPECT_GT(rows[i], rows[i - 1]) << layer;
        EXPECT_EQ(rows.back(), 50) << layer;
    }
    EXPECT_TRUE(seen.count(kHeadLayer));
}

}  // namespace
}  // namespace ds4r
