// Output safety and safe --resume (issue 10), through the binary on the golden tiny-a checkpoint with
// the CPU backend: a run never overwrites what it did not write (--overwrite aside); --resume checks
// the sidecar <output>.run.json, the records and the hidden files' .npy headers and refuses (exit 2,
// naming the difference) a different run, leaving every file as it was; --skip-bad error records are
// scored on resume once their line is fixed; a pass interrupted at layer 3 of 6 is saved and --resume
// finishes it with the bytes of an uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/progress.h"
#include "ds4r/score.h"
#include "ds4r/sha256.h"

namespace ds4r {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::slurp;
using test::split_lines;

// Sequences of 4..23 tokens cut from the golden tokens.
std::vector<std::string> sequence_lines(int n) {
    std::vector<int> src;
    for (const std::string& line : split_lines(slurp(test::data_dir() + "/tiny-a/tokens.jsonl"))) {
        const json v = json::parse(line);
        if (v.at("id") == "seq11") src = v.at("tokens").get<std::vector<int>>();
    }
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
        const int len = 4 + (i * 7) % 20, start = (i * 13) % 200;
        json toks = json::array();
        for (int j = 0; j < len; ++j) toks.push_back(src.at(static_cast<size_t>(start + j)));
        out.push_back(json{{"id", strfmt("s%02d", i)}, {"tokens", toks}}.dump());
    }
    return out;
}

std::string lines_text(const std::vector<std::string>& lines) {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
}

struct RunDir {
    std::string dir, in, out, hidden;
};

RunDir make_run(const std::string& input_text) {
    RunDir r;
    r.dir = test::temp_dir("safety");
    r.in = r.dir + "/in.jsonl";
    r.out = r.dir + "/out.jsonl";
    r.hidden = r.dir + "/hidden";
    test::write_text(r.in, input_text);
    return r;
}

int score(const RunDir& r, const std::string& extra, std::string* log = nullptr,
          const std::string& input = "") {
    std::string text;
    const int rc = test::run_ds4replay("score --model " + test::shell_quote(test::tiny_model_dir()) +
                                           " --backend cpu --progress none --pass-tokens 24 --input " +
                                           test::shell_quote(input.empty() ? r.in : input) + " --output " +
                                           test::shell_quote(r.out) + " " + extra,
                                       &text);
    if (log) *log = text;
    return rc;
}

std::string hidden_flags(const RunDir& r, const std::string& layers = "2,6") {
    return "--capture-layers " + layers + " --hidden-dir " + test::shell_quote(r.hidden);
}

// Every file under the run's directory (input excluded) -> its bytes.
std::map<std::string, std::string> snapshot(const RunDir& r) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(r.dir)) {
        if (e.path() == r.in) continue;
        files[e.path().string()] = e.is_regular_file() ? slurp(e.path().string()) : std::string("<dir>");
    }
    return files;
}

void expect_unchanged(const std::map<std::string, std::string>& before, const RunDir& r,
                      const std::string& ctx) {
    const auto after = snapshot(r);
    EXPECT_EQ(before.size(), after.size()) << ctx << ": files were added or removed";
    for (const auto& [path, bytes] : before) {
        auto it = after.find(path);
        ASSERT_NE(it, after.end()) << ctx << ": " << path << " was removed";
        EXPECT_TRUE(it->second == bytes) << ctx << ": " << path << " changed";
    }
}

void expect_refused(const RunDir& r, const std::string& extra, const std::string& message, int code = 2,
                    const std::string& input = "") {
    const auto before = snapshot(r);
    std::string log;
    EXPECT_EQ(score(r, extra, &log, input), code) << log;
    EXPECT_NE(log.find(message), std::string::npos) << "expected '" << message << "' in:\n" << log;
    expect_unchanged(before, r, extra);
}

// The uninterrupted run of 8 sequences with hidden states of layers 2 and 6 (the final state).
struct Reference {
    std::string out;
    std::map<std::string, std::string> hidden;
};
const Reference& reference() {
    static Reference ref;
    if (!ref.out.empty()) return ref;
    const RunDir r = make_run(lines_text(sequence_lines(8)));
    std::string log;
    EXPECT_EQ(score(r, hidden_flags(r), &log), 0) << log;
    ref.out = slurp(r.out);
    for (const char* f : {"hidden_L2.npy", "hidden_L6.npy"}) ref.hidden[f] = slurp(r.hidden + "/" + f);
    return ref;
}

// The state of a run killed after its first `keep` records were committed (the hidden files hold
// rows of later passes too: those are cut away by --resume).
RunDir partial_run(int keep) {
    const RunDir r = make_run(lines_text(sequence_lines(8)));
    std::string log;
    EXPECT_EQ(score(r, hidden_flags(r), &log), 0) << log;
    auto out = split_lines(slurp(r.out));
    out.resize(static_cast<size_t>(keep));
    test::write_text(r.out, lines_text(out));
    return r;
}

TEST(OutputSafety, ExistingOutputOrHiddenFileIsNotOverwrittenWithoutOverwrite) {
    const Reference& ref = reference();
    {
        RunDir r = make_run(lines_text(sequence_lines(8)));
        test::write_text(r.out, "my notes\n");
        expect_refused(
            r, "",
            r.out + ": exists and is not empty; use --resume to continue it, --overwrite to replace it");
        std::string log;
        ASSERT_EQ(score(r, hidden_flags(r) + " --overwrite", &log), 0) << log;
        EXPECT_EQ(slurp(r.out), ref.out);
    }
    {
        // The issue's case: another output, the same hidden dir.
        RunDir r = make_run(lines_text(sequence_lines(8)));
        fs::create_directories(r.hidden);
        test::write_text(r.hidden + "/hidden_L6.npy", "an earlier run's rows");
        expect_refused(r, hidden_flags(r),
                       r.hidden + "/hidden_L6.npy: exists (a hidden file this run would write)");
        EXPECT_FALSE(fs::exists(r.out));
        EXPECT_FALSE(fs::exists(r.hidden + "/hidden_L2.npy"));
        std::string log;
        ASSERT_EQ(score(r, hidden_flags(r) + " --overwrite", &log), 0) << log;
        EXPECT_EQ(slurp(r.out), ref.out);
        EXPECT_TRUE(slurp(r.hidden + "/hidden_L6.npy") == ref.hidden.at("hidden_L6.npy"));
    }
    RunDir r = make_run(lines_text(sequence_lines(2)));
    std::string log;
    EXPECT_EQ(score(r, "--resume --overwrite", &log), 2);
    EXPECT_NE(log.find("--resume and --overwrite exclude each other"), std::string::npos) << log;
}

TEST(OutputSafety, SidecarRecordsInputOptionsModelAndHiddenLayout) {
    const RunDir r = make_run(lines_text(sequence_lines(3)) + "\n");
    std::string log;
    ASSERT_EQ(score(r, hidden_flags(r) + " --top-k 5 --hidden-mode copies", &log), 0) << log;
    const json s = json::parse(slurp(r.out + ".run.json"));
    EXPECT_EQ(s.at("format"), "ds4replay-run");
    EXPECT_EQ(s.at("version"), 1);
    EXPECT_EQ(s.at("input").at("path"), r.in);
    EXPECT_EQ(s.at("input").at("sha256"), sha256_file(r.in));
    EXPECT_EQ(s.at("input").at("records"), 3);
    EXPECT_EQ(s.at("options").at("top_k"), 5);
    EXPECT_EQ(s.at("options").at("capture_layers"), json::parse("[2, 6]"));
    EXPECT_EQ(s.at("options").at("hidden_mode"), "copies");
    EXPECT_EQ(s.at("options").at("skip_bad"), false);
    EXPECT_GT(s.at("options").at("max_seq_len").get<int64_t>(), 0);
    EXPECT_EQ(s.at("model").at("n_layers"), 6);
    EXPECT_EQ(s.at("model").at("fingerprint").get<std::string>().size(), 64u);
    EXPECT_EQ(s.at("hidden").at("layers").at("2"), json::parse(R"({"dtype": "<u2", "row_shape": [4, 256]})"));
    EXPECT_EQ(s.at("hidden").at("layers").at("6"), json::parse(R"({"dtype": "<f2", "row_shape": [256]})"));
    EXPECT_EQ(s.at("backend"), "cpu");
    EXPECT_TRUE(s.at("shard").is_null());
    // stdin: no hash, no record count.
    ASSERT_EQ(
        test::run_command("cat " + test::shell_quote(r.in) + " | " + test::shell_quote(test::binary_path()) +
                              " score --model " + test::shell_quote(test::tiny_model_dir()) +
                              " --backend cpu --progress none --input - --output " +
                              test::shell_quote(r.dir + "/stdin.jsonl"),
                          &log),
        0)
        << log;
    const json t = json::parse(slurp(r.dir + "/stdin.jsonl.run.json"));
    EXPECT_TRUE(t.at("input").at("sha256").is_null());
    EXPECT_TRUE(t.at("input").at("records").is_null());
}

TEST(OutputSafety, ResumeOfAnotherRunIsRefusedNamingTheDifferenceAndChangesNothing) {
    const RunDir r = partial_run(4);
    expect_refused(r, hidden_flags(r) + " --resume --top-k 3",
                   "--top-k 3 but the output was written with --top-k 8");
    expect_refused(r, hidden_flags(r, "3,6") + " --resume",
                   "--capture-layers 3,6 but the output was written with --capture-layers 2,6");
    // The issue's case: a copies file must not be cut to a mean file.
    expect_refused(r, hidden_flags(r) + " --resume --hidden-mode copies",
                   "--hidden-mode copies but the output was written with --hidden-mode mean");
    expect_refused(r, hidden_flags(r) + " --resume --skip-bad",
                   "--skip-bad but the output was written with no --skip-bad");
    expect_refused(r, hidden_flags(r) + " --resume --max-seq-len 100",
                   "--max-seq-len 100 but the output was written with --max-seq-len");
    // Another input (the same ids in another order: the old code counted them as done).
    auto lines = sequence_lines(8);
    std::swap(lines[0], lines[5]);
    test::write_text(r.dir + "/other.jsonl", lines_text(lines));
    expect_refused(r, hidden_flags(r) + " --resume", "but the output was written with input " + r.in, 2,
                   r.dir + "/other.jsonl");
    fs::remove(r.dir + "/other.jsonl");
}

TEST(OutputSafety, ResumeWithoutSidecarChecksWhatTheRecordsShow) {
    // An output of an older ds4replay: no sidecar.
    const Reference& ref = reference();
    RunDir r = partial_run(4);
    fs::remove(r.out + ".run.json");
    expect_refused(r, hidden_flags(r) + " --resume --top-k 3",
                   "--top-k 3 but the output was written with --top-k 8");
    expect_refused(r, hidden_flags(r, "3,6") + " --resume",
                   "--capture-layers 3,6 but the output was written with --capture-layers 2,6");
    // The hidden file's header read back: mean rows, not copies.
    expect_refused(r, hidden_flags(r) + " --resume --hidden-mode copies",
                   "hidden_L2.npy: --hidden-mode copies writes <u2 [4, 256] rows but the file holds <f2");
    auto lines = sequence_lines(8);
    std::swap(lines[0], lines[5]);
    test::write_text(r.dir + "/other.jsonl", lines_text(lines));
    expect_refused(r, hidden_flags(r) + " --resume", "not the input the output was written from", 2,
                   r.dir + "/other.jsonl");
    fs::remove(r.dir + "/other.jsonl");
    std::string log;
    ASSERT_EQ(score(r, hidden_flags(r) + " --resume", &log), 0) << log;
    EXPECT_NE(log.find(".run.json is missing"), std::string::npos) << log;
    EXPECT_EQ(slurp(r.out), ref.out);
    EXPECT_TRUE(fs::exists(r.out + ".run.json"));  // written now: the next resume is checked in full
}

TEST(OutputSafety, FailedResumeLeavesEveryFileAsItFoundIt) {
    // The records reference hidden rows, the hidden dir is gone: no new dir, no 0-byte .npy.
    RunDir r = partial_run(4);
    fs::remove_all(r.hidden);
    expect_refused(r, hidden_flags(r) + " --resume",
                   "hidden_L2.npy: missing, but the results file references", 1);
    EXPECT_FALSE(fs::exists(r.hidden));
    // A partial last line is not cut when the resume is refused.
    RunDir p = partial_run(4);
    test::write_text(p.out, slurp(p.out) + "{\"id\": \"s04\", \"n_tok");
    expect_refused(p, hidden_flags(p) + " --resume --top-k 3", "--top-k 3");
}

TEST(OutputSafety, SkipBadErrorRecordsAreScoredOnResumeOnceTheLineIsFixed) {
    const Reference& ref = reference();
    auto lines = sequence_lines(8);
    const std::string good = lines[3];
    lines[3] = "{\"id\": \"s03\", \"tokens\": [1, 2";  // truncated line
    const RunDir r = make_run(lines_text(lines));
    std::string log;
    ASSERT_EQ(score(r, hidden_flags(r) + " --skip-bad", &log), 0) << log;
    auto out = split_lines(slurp(r.out));
    ASSERT_EQ(out.size(), 8u);
    EXPECT_NE(out[3].find("\"error\""), std::string::npos);
    // Still bad: resuming changes nothing.
    ASSERT_EQ(score(r, hidden_flags(r) + " --skip-bad --resume", &log), 0) << log;
    EXPECT_EQ(split_lines(slurp(r.out)), out);
    // Fixed: the record is scored in place of the error record, the others stay.
    lines[3] = good;
    test::write_text(r.in, lines_text(lines));
    ASSERT_EQ(score(r, hidden_flags(r) + " --skip-bad --resume", &log), 0) << log;
    EXPECT_NE(log.find("is good now: scoring it in place of its error record"), std::string::npos) << log;
    // The other records are the same; the retried record's hidden rows were appended at the end of
    // the files, so the row ranges differ from an uninterrupted run's, not the rows.
    const auto fixed = split_lines(slurp(r.out));
    const auto want = split_lines(ref.out);
    ASSERT_EQ(fixed.size(), want.size());
    for (size_t i = 0; i < fixed.size(); ++i) {
        json a = json::parse(fixed[i]), b = json::parse(want[i]);
        ASSERT_TRUE(a.contains("hidden")) << "record " << i;
        for (size_t h = 0; h < a.at("hidden").size(); ++h) {
            const std::string file = a["hidden"][h]["file"];
            const auto ra = a["hidden"][h]["rows"].get<std::vector<int64_t>>();
            const auto rb = b["hidden"][h]["rows"].get<std::vector<int64_t>>();
            ASSERT_EQ(ra[1] - ra[0], rb[1] - rb[0]);
            const std::string mine = slurp(r.hidden + "/" + file), theirs = ref.hidden.at(file);
            const size_t row = 256 * 2, hdr = 128;
            EXPECT_TRUE(mine.substr(hdr + ra[0] * row, (ra[1] - ra[0]) * row) ==
                        theirs.substr(hdr + rb[0] * row, (rb[1] - rb[0]) * row))
                << "record " << i << ", " << file;
        }
        if (i == 3) {
            EXPECT_EQ(a["hidden"][0]["rows"][0], 88 - 5) << "appended after the other records' rows";
        }
        a.erase("hidden");
        b.erase("hidden");
        EXPECT_TRUE(a == b) << "record " << i;
    }
}

// In-process runs: the interrupt is requested from the test hook after a given layer.
ScoreOptions in_process_options(const RunDir& r) {
    ScoreOptions o;
    o.model_dir = test::tiny_model_dir();
    o.input = r.in;
    o.output = r.out;
    o.backend = "cpu";
    o.progress = "none";
    o.pass_tokens = 60;
    o.capture_layers = {2, 6};
    o.hidden_dir = r.hidden;
    o.skip_bad = true;
    return o;
}

TEST(OutputSafety, InterruptAtLayer3Of6SavesThePassAndResumeGivesTheSameBytes) {
    // 12 sequences and a bad line, passes of <= 60 tokens; the second pass is interrupted after its
    // third layer (index 2).
    auto lines = sequence_lines(12);
    lines.insert(lines.begin() + 5, "{\"id\": \"bad\", \"tokens\": [-1]}");
    const RunDir ref_run = make_run(lines_text(lines));
    ASSERT_NO_THROW(run_score(in_process_options(ref_run)));
    RunDir r = make_run("");
    r.in = ref_run.in;  // error records quote the input's path
    ScoreOptions o = in_process_options(r);
    int pass = 0;
    o.on_layer_for_tests = [&](const LayerTiming& t) {
        if (t.layer == 0) ++pass;
        if (pass == 2 && t.layer == 2) request_interrupt();
    };
    std::string saved;
    int64_t records = -1;
    try {
        run_score(o);
        ADD_FAILURE() << "not interrupted";
    } catch (const Interrupted& e) {
        saved = e.pass_saved;
        records = e.sequences_saved;
    }
    clear_interrupt();
    EXPECT_GT(records, 0);
    EXPECT_EQ(static_cast<int64_t>(split_lines(slurp(r.out)).size()), records);
    EXPECT_NE(saved.find(" saved at layer 3 of 6"), std::string::npos) << saved;
    EXPECT_EQ(saved.rfind("pass of ", 0), 0u) << saved;
    ASSERT_TRUE(fs::exists(r.out + ".pass"));
    // Resume continues from layer 3: the saved pass's first layers are not run again.
    ScoreOptions again = in_process_options(r);
    again.resume = true;
    again.pass_tokens = 1000;  // another pass size: the saved pass keeps its own
    std::vector<int> first_layers;
    int passes = 0;
    again.on_layer_for_tests = [&](const LayerTiming& t) {
        if (passes == 0) first_layers.push_back(t.layer);
        if (t.layer == kHeadLayer) ++passes;
    };
    ASSERT_NO_THROW(run_score(again));
    ASSERT_FALSE(first_layers.empty());
    EXPECT_EQ(first_layers.front(), 3);
    EXPECT_FALSE(fs::exists(r.out + ".pass"));
    EXPECT_TRUE(slurp(r.out) == slurp(ref_run.out));
    for (const char* f : {"hidden_L2.npy", "hidden_L6.npy"})
        EXPECT_TRUE(slurp(r.hidden + "/" + f) == slurp(ref_run.hidden + "/" + f)) << f;
}

}  // namespace
}  // namespace ds4r
