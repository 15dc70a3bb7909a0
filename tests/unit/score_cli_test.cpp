// `ds4replay score` on bad input and bad paths (issue 6 item 3, docs/DESIGN.md sections 2 and 6), through
// the binary on the golden tiny-a checkpoint with the CPU backend: each bad input line gets a clear
// error naming its line and exit code 2 — or, with --skip-bad, an error record in its place in the
// output while the other lines are scored exactly as in a run without the bad line. Model problems
// exit 3, output I/O problems 1.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_run_util.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::slurp;
using test::split_lines;
using test::write_text;

const std::string kLineA = "{\"id\": \"a\", \"tokens\": [1, 2, 3]}";
const std::string kLineC = "{\"id\": \"c\", \"tokens\": [4, 5], \"note\": \"kept\"}";

std::string score_args(const std::string& in, const std::string& out, const std::string& extra = "") {
    return "score --model " + test::shell_quote(test::tiny_model_dir()) +
           " --backend cpu --progress none --input " + test::shell_quote(in) + " --output " +
           test::shell_quote(out) + " " + extra;
}

// The records of lines A and C scored in a clean run (computed once).
const std::vector<std::string>& reference_records() {
    static const std::vector<std::string> ref = [] {
        const std::string dir = test::temp_dir("score-ref");
        write_text(dir + "/in.jsonl", kLineA + "\n" + kLineC + "\n");
        std::string log;
        const int rc = test::run_ds4replay(score_args(dir + "/in.jsonl", dir + "/out.jsonl"), &log);
        EXPECT_EQ(rc, 0) << log;
        return split_lines(slurp(dir + "/out.jsonl"));
    }();
    return ref;
}

struct BadCase {
    std::string name;
    std::string input;     // the whole input file
    int bad_line;          // its 1-based line number
    std::string message;   // a fragment of the error message
    std::string error_id;  // the id of the --skip-bad error record (JSON text)
    std::string expected;  // the --skip-bad output: 'A', 'C' (reference records) or 'E' per line
    std::string extra_args = "";
};

void check_bad_case(const BadCase& c) {
    SCOPED_TRACE(c.name);
    const auto& ref = reference_records();
    ASSERT_EQ(ref.size(), 2u);
    const std::string dir = test::temp_dir("score-bad");
    const std::string in = dir + "/in.jsonl";
    write_text(in, c.input);

    // Without --skip-bad: exit 2, the message names the file and line, nothing is scored (a regular
    // input file is checked completely before any compute).
    std::string log;
    int rc = test::run_ds4replay(score_args(in, dir + "/out1.jsonl", c.extra_args), &log);
    EXPECT_EQ(rc, 2) << log;
    const std::string where = "ds4replay: error: " + in + ":" + std::to_string(c.bad_line) + ": ";
    EXPECT_NE(log.find(where), std::string::npos) << "expected '" << where << "' in:\n" << log;
    EXPECT_NE(log.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << log;
    EXPECT_TRUE(split_lines(slurp(dir + "/out1.jsonl")).empty());

    // With --skip-bad: exit 0, one output line per input line in input order, the bad one an error record.
    rc = test::run_ds4replay(score_args(in, dir + "/out2.jsonl", "--skip-bad " + c.extra_args), &log);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_NE(log.find("skipping: " + in + ":" + std::to_string(c.bad_line) + ": "), std::string::npos)
        << log;
    const auto lines = split_lines(slurp(dir + "/out2.jsonl"));
    ASSERT_EQ(lines.size(), c.expected.size()) << slurp(dir + "/out2.jsonl");
    for (size_t i = 0; i < lines.size(); ++i) {
        if (c.expected[i] == 'A') {
            EXPECT_EQ(lines[i], ref[0]) << "line " << i + 1;
        } else if (c.expected[i] == 'C') {
            EXPECT_EQ(lines[i], ref[1]) << "line " << i + 1;
        } else {
            const json e = json::parse(lines[i]);
            EXPECT_EQ(e.size(), 3u) << lines[i];
            EXPECT_EQ(e.at("id"), json::parse(c.error_id)) << lines[i];
            EXPECT_EQ(e.at("line"), c.bad_line) << lines[i];
            const std::string msg = e.at("error").get<std::string>();
            EXPECT_EQ(msg.rfind(in + ":" + std::to_string(c.bad_line) + ": ", 0), 0u) << msg;
            EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
        }
    }
}

TEST(ScoreCliBadInput, MalformedJson) {
    check_bad_case({"malformed", kLineA + "\n{\"id\": \"b\", \"tokens\": [1, 2\n" + kLineC + "\n", 2,
                    "not valid JSON", "2", "AEC"});
}

TEST(ScoreCliBadInput, MissingTokens) {
    check_bad_case({"missing tokens", kLineA + "\n{\"id\": \"b\", \"text\": \"hello\"}\n" + kLineC + "\n", 2,
                    "no \"tokens\" array", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, TokensNotAnArray) {
    check_bad_case({"non-array tokens",
                    kLineA + "\n{\"id\": \"b\", \"tokens\": {\"0\": 1}}\n" + kLineC + "\n", 2,
                    "\"tokens\" must be an array of integers", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, NonIntegerToken) {
    check_bad_case({"non-integer", kLineA + "\n{\"id\": \"b\", \"tokens\": [1, 2.5]}\n" + kLineC + "\n", 2,
                    "token 1 is 2.5, expected an integer id in [0, 512)", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, NegativeToken) {
    check_bad_case({"negative", kLineA + "\n{\"id\": \"b\", \"tokens\": [-3]}\n" + kLineC + "\n", 2,
                    "token 0 is -3, outside the vocabulary [0, 512)", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, OutOfVocabularyToken) {
    check_bad_case({"out of vocabulary", kLineA + "\n{\"id\": \"b\", \"tokens\": [7, 512]}\n" + kLineC + "\n",
                    2, "token 1 is 512, outside the vocabulary [0, 512)", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, EmptySequence) {
    check_bad_case({"empty", kLineA + "\n{\"id\": \"b\", \"tokens\": []}\n" + kLineC + "\n", 2,
                    "empty token sequence", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, OverLongSequence) {
    check_bad_case({"over-long", kLineA + "\n{\"id\": \"b\", \"tokens\": [1, 2, 3, 4, 5]}\n" + kLineC + "\n",
                    2, "sequence of 5 tokens is longer than the maximum 4 (--max-seq-len)", "\"b\"", "AEC",
                    "--max-seq-len 4"});
}

TEST(ScoreCliBadInput, OverLongForTheModel) {
    // Without --max-seq-len the limit is the checkpoint's max_position_embeddings (512 for tiny-a).
    std::string toks;
    for (int i = 0; i < 513; ++i) toks += (i ? "," : "") + std::to_string(i % 512);
    check_bad_case({"over-long (model)",
                    kLineA + "\n{\"id\": \"b\", \"tokens\": [" + toks + "]}\n" + kLineC + "\n", 2,
                    "sequence of 513 tokens is longer than the maximum 512", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, DuplicateId) {
    check_bad_case({"duplicate id", kLineA + "\n" + kLineC + "\n{\"id\": \"a\", \"tokens\": [9]}\n", 3,
                    "duplicate id \"a\" (first on line 1)", "\"a\"", "ACE"});
}

TEST(ScoreCliBadInput, HugeFloat) {
    check_bad_case({"1e400", kLineA + "\n{\"id\": \"b\", \"tokens\": [1e400]}\n" + kLineC + "\n", 2,
                    "number overflow parsing '1e400'", "2", "AEC"});
}

TEST(ScoreCliBadInput, HugeInteger) {
    check_bad_case({"99999999999999999999999",
                    kLineA + "\n{\"id\": \"b\", \"tokens\": [99999999999999999999999]}\n" + kLineC + "\n", 2,
                    "token 0 is a number too large for a token id", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, ByteOrderMark) {
    check_bad_case(
        {"BOM", "\xEF\xBB\xBF" + kLineA + "\n" + kLineC + "\n", 1, "UTF-8 byte order mark", "\"a\"", "EC"});
}

TEST(ScoreCliBadInput, CrlfLineEnd) {
    check_bad_case({"CRLF", kLineA + "\n{\"id\": \"b\", \"tokens\": [1]}\r\n" + kLineC + "\n", 2,
                    "the line ends with CRLF; convert the file to LF line ends", "\"b\"", "AEC"});
}

TEST(ScoreCliBadInput, TruncatedLastLine) {
    check_bad_case({"truncated", kLineA + "\n" + kLineC + "\n{\"id\": \"d\", \"tokens\": [1, 2", 3,
                    "the last line is not valid JSON and has no newline: truncated?", "3", "ACE"});
}

TEST(ScoreCliBadInput, BadLineInAPipeStopsAfterTheCommittedPasses) {
    // From stdin the input cannot be checked ahead: the passes before the bad line are kept (and
    // --resume continues after them once the input is fixed).
    const auto& ref = reference_records();
    const std::string dir = test::temp_dir("score-pipe");
    write_text(dir + "/in.jsonl", kLineA + "\n{\"id\": \"b\", \"tokens\": [-1]}\n" + kLineC + "\n");
    std::string log;
    const int rc = test::run_command("cat " + test::shell_quote(dir + "/in.jsonl") + " | " +
                                         test::shell_quote(test::binary_path()) + " " +
                                         score_args("-", dir + "/out.jsonl", "--pass-tokens 1"),
                                     &log);
    EXPECT_EQ(rc, 2) << log;
    EXPECT_NE(log.find("<stdin>:2: token 0 is -1, outside the vocabulary"), std::string::npos) << log;
    EXPECT_EQ(split_lines(slurp(dir + "/out.jsonl")), std::vector<std::string>{ref[0]});
}

// --- paths and files ----------------------------------------------------------------------------

// A writable copy of the tiny-a model directory.
std::string copy_model(const std::string& tag) {
    const std::string dir = test::temp_dir(tag) + "/model";
    std::filesystem::copy(test::tiny_model_dir(), dir);
    return dir;
}

void expect_failure(const std::string& args, int code, const std::string& fragment) {
    std::string log;
    const int rc = test::run_ds4replay(args, &log);
    EXPECT_EQ(rc, code) << args << "\n" << log;
    EXPECT_NE(log.find(fragment), std::string::npos) << "expected '" << fragment << "' in:\n" << log;
}

std::string good_input(const std::string& dir) {
    write_text(dir + "/in.jsonl", kLineA + "\n");
    return dir + "/in.jsonl";
}

TEST(ScoreCliPaths, MissingModelDirectory) {
    const std::string dir = test::temp_dir("paths");
    expect_failure("score --model " + dir + "/nope --backend cpu --input " + good_input(dir) + " --output " +
                       dir + "/o.jsonl",
                   3, dir + "/nope: model directory not found");
}

TEST(ScoreCliPaths, ModelWithoutConfig) {
    const std::string model = copy_model("paths-cfg");
    std::filesystem::remove(model + "/config.json");
    const std::string dir = test::temp_dir("paths");
    expect_failure("score --model " + model + " --backend cpu --input " + good_input(dir) + " --output " +
                       dir + "/o.jsonl",
                   3, model + "/config.json: missing");
}

TEST(ScoreCliPaths, MalformedConfig) {
    const std::string model = copy_model("paths-badcfg");
    write_text(model + "/config.json", "{\"vocab_size\": 512,");
    const std::string dir = test::temp_dir("paths");
    expect_failure("score --model " + model + " --backend cpu --input " + good_input(dir) + " --output " +
                       dir + "/o.jsonl",
                   3, model + "/config.json");
}

TEST(ScoreCliPaths, TruncatedShard) {
    const std::string model = copy_model("paths-trunc");
    const std::string shard = model + "/model-00003-of-00007.safetensors";
    std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
    const std::string dir = test::temp_dir("paths");
    expect_failure("score --model " + model + " --backend cpu --input " + good_input(dir) + " --output " +
                       dir + "/o.jsonl",
                   3, "model-00003-of-00007.safetensors");
}

TEST(ScoreCliPaths, MissingInput) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(dir + "/missing.jsonl", dir + "/o.jsonl"), 2,
                   dir + "/missing.jsonl: cannot open input (No such file or directory)");
}

TEST(ScoreCliPaths, InputIsADirectory) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(dir, dir + "/o.jsonl"), 2,
                   dir + ": is a directory, expected a tokens.jsonl file");
}

TEST(ScoreCliPaths, UnreadableInput) {
    if (::geteuid() == 0) GTEST_SKIP() << "running as root: file permissions do not stop reads";
    const std::string dir = test::temp_dir("paths");
    const std::string in = good_input(dir);
    ASSERT_EQ(::chmod(in.c_str(), 0), 0);
    expect_failure(score_args(in, dir + "/o.jsonl"), 2, in + ": cannot open input (Permission denied)");
}

TEST(ScoreCliPaths, OutputInAMissingDirectory) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(good_input(dir), dir + "/no/such/dir/o.jsonl"), 1,
                   dir + "/no/such/dir/o.jsonl: cannot open (No such file or directory)");
}

TEST(ScoreCliPaths, OutputIsADirectory) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(good_input(dir), dir), 1, dir + ": is a directory, expected the results file");
}

TEST(ScoreCliPaths, OutputDeviceFull) {
    // /dev/full fails every write with ENOSPC: the disk-full path, whoever runs the test.
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(good_input(dir), "/dev/full"), 1,
                   "/dev/full: write failed (No space left on device)");
}

TEST(ScoreCliPaths, HiddenDirUnderAFile) {
    const std::string dir = test::temp_dir("paths");
    const std::string in = good_input(dir);
    expect_failure(score_args(in, dir + "/o.jsonl", "--capture-layers 2 --hidden-dir " + in + "/hidden"), 1,
                   in + "/hidden");
}

TEST(ScoreCliPaths, OutputExistsWithoutResume) {
    const std::string dir = test::temp_dir("paths");
    write_text(dir + "/o.jsonl", "{\"id\": \"x\", \"error\": \"e\", \"line\": 1}\n");
    expect_failure(
        score_args(good_input(dir), dir + "/o.jsonl"), 2,
        dir +
            "/o.jsonl: exists and is not empty; use --resume to continue it, --overwrite to replace it, or "
            "remove it");
}

TEST(ScoreCliPaths, ResumeNeedsAFile) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(score_args(good_input(dir), "-", "--resume"), 2, "--resume needs --output FILE");
}

TEST(ScoreCliPaths, OutputIsTheInput) {
    const std::string dir = test::temp_dir("paths");
    const std::string in = good_input(dir);
    expect_failure(score_args(in, in), 2, in + ": the output file is the input file");
}

TEST(ScoreCliPaths, CaptureLayerOutOfRange) {
    const std::string dir = test::temp_dir("paths");
    expect_failure(
        score_args(good_input(dir), dir + "/o.jsonl", "--capture-layers 7 --hidden-dir " + dir + "/h"), 2,
        "--capture-layers: layer 7 outside [0, 6]");
}

TEST(ScoreCliPaths, ResultsToStdoutAndAFifo) {
    // stdout carries the records only; a FIFO output is written without fsync (which would fail).
    const auto& ref = reference_records();
    const std::string dir = test::temp_dir("paths");
    write_text(dir + "/in.jsonl", kLineA + "\n" + kLineC + "\n");
    std::string out;
    int rc = test::run_command("(" + test::shell_quote(test::binary_path()) + " " +
                                   score_args(dir + "/in.jsonl", "-") + " 2>/dev/null)",
                               &out);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(split_lines(out), ref);
    ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
    rc = test::run_command("{ (cat " + dir + "/fifo > " + dir + "/from_fifo &) ; " +
                               test::shell_quote(test::binary_path()) + " " +
                               score_args(dir + "/in.jsonl", dir + "/fifo") + " && sleep 0.2; }",
                           &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(split_lines(slurp(dir + "/from_fifo")), ref);
}

}  // namespace
}  // namespace ds4r
