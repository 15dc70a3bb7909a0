// --resume and interruption (issue 6 item 2, docs/DESIGN.md section 6), through the binary on the golden
// tiny-a checkpoint with the CPU backend and small passes (many commits per run):
//  - runs killed with SIGKILL at random moments (twice per iteration, then resumed to the end) end
//    with exactly the records of an uninterrupted run, byte for byte and in order, and the same
//    hidden .npy files; after every kill the output is a prefix of the uninterrupted one (whole lines
//    plus at most one partial line) and the hidden files hold at least the rows the records reference;
//  - SIGINT / SIGTERM stop cleanly: exit 130, "interrupted: N sequences saved" (and the pass in flight
//    saved to <output>.pass), N whole lines and no partial tail, hidden headers announcing exactly the
//    referenced rows (a saved pass's rows follow them);
//  - crash states built by hand (a partial last line, hidden rows beyond the committed records) are
//    repaired by --resume.
// The kill delays come from a fixed seed (DS4R_KILL_SEED overrides it; it is printed on failure).
// DS4R_RESUME_BACKEND=cuda runs the same tests on the CUDA backend (scripts/gpu_suite.sh does).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_run_util.h"
#include "ds4r/error.h"

namespace ds4r {
namespace {

using json = nlohmann::json;
using test::slurp;
using test::split_lines;

constexpr int kPassTokens = 24;
constexpr int64_t kHeaderBytes = 128;   // HiddenNpyWriter's fixed .npy header
constexpr int64_t kRowBytes = 256 * 2;  // tiny-a: dim 256, fp16 (mean mode)

// ~30 sequences of 4..23 tokens cut from the golden tokens (many passes of <= 24 tokens).
std::vector<std::string> sequence_lines() {
    std::vector<int> src;
    for (const std::string& line : split_lines(slurp(test::data_dir() + "/tiny-a/tokens.jsonl"))) {
        const json v = json::parse(line);
        if (v.at("id") == "seq11") src = v.at("tokens").get<std::vector<int>>();
    }
    EXPECT_EQ(src.size(), 257u);
    std::vector<std::string> out;
    for (int i = 0; i < 30; ++i) {
        const int len = 4 + (i * 7) % 20, start = (i * 13) % 200;
        json toks = json::array();
        for (int j = 0; j < len; ++j) toks.push_back(src[static_cast<size_t>(start + j)]);
        out.push_back(json{{"id", strfmt("s%02d", i)}, {"tokens", toks}, {"i", i}}.dump());
    }
    return out;
}

struct Config {
    std::string name;
    std::string input;               // file contents
    std::vector<std::string> extra;  // extra flags
    bool hidden = false;
};

Config plain_config() {
    Config c{"plain", "", {}, false};
    for (const auto& l : sequence_lines()) c.input += l + "\n";
    return c;
}

// Hidden capture and --skip-bad with bad lines and a repeated id in the middle (error records, ids
// that occur twice in the output).
Config hidden_bad_config() {
    Config c{
        "hidden+skip-bad", "", {"--skip-bad", "--capture-layers", "2,6", "--hidden-dir", "HIDDEN"}, true};
    const auto lines = sequence_lines();
    for (size_t i = 0; i < lines.size(); ++i) {
        c.input += lines[i] + "\n";
        if (i == 4) c.input += "{\"id\": \"bad\", \"tokens\": [-1]}\n";
        if (i == 11) c.input += lines[2] + "\n";  // duplicate id s02
        if (i == 19) c.input += "{\"id\": \"s99\", \"tokens\": [1, 2\n";
    }
    return c;
}

struct Workdir {
    std::string dir, in, out, hidden;
};

// The input file of a config, written once: error records quote its path, so every run of a config
// reads the same file.
std::string input_path(const Config& c) {
    static std::map<std::string, std::string> paths;
    auto it = paths.find(c.name);
    if (it != paths.end()) return it->second;
    const std::string p = test::temp_dir("resume-in") + "/in.jsonl";
    test::write_text(p, c.input);
    return paths[c.name] = p;
}

Workdir make_workdir(const Config& c) {
    Workdir w;
    w.dir = test::temp_dir("resume");
    w.in = input_path(c);
    w.out = w.dir + "/out.jsonl";
    w.hidden = w.dir + "/hidden";
    return w;
}

// The backend under test: cpu unless DS4R_RESUME_BACKEND names another.
std::string backend_under_test() {
    const char* b = std::getenv("DS4R_RESUME_BACKEND");
    return b && *b ? b : "cpu";
}

std::vector<std::string> score_argv(const Config& c, const Workdir& w, bool resume) {
    std::vector<std::string> a{"score",
                               "--model",
                               test::tiny_model_dir(),
                               "--backend",
                               backend_under_test(),
                               "--progress",
                               "plain",
                               "--pass-tokens",
                               std::to_string(kPassTokens),
                               "--input",
                               w.in,
                               "--output",
                               w.out};
    for (const auto& e : c.extra) a.push_back(e == "HIDDEN" ? w.hidden : e);
    if (resume) a.push_back("--resume");
    return a;
}

const std::vector<std::string> kLayers = {"hidden_L2.npy", "hidden_L6.npy"};

// Rows announced by a hidden file's header.
int64_t header_rows(const std::string& path) {
    const std::string h = slurp(path).substr(0, kHeaderBytes);
    const size_t at = h.find("'shape': (");
    return at == std::string::npos ? -1 : std::stoll(h.substr(at + 10));
}

// Highest row end each hidden file is referenced with by the complete records.
std::map<std::string, int64_t> referenced_rows(const std::vector<std::string>& lines) {
    std::map<std::string, int64_t> r;
    for (const auto& l : lines) {
        const json v = json::parse(l);
        if (!v.contains("hidden")) continue;
        for (const auto& h : v.at("hidden")) {
            auto& x = r[h.at("file").get<std::string>()];
            x = std::max(x, h.at("rows").at(1).get<int64_t>());
        }
    }
    return r;
}

struct Reference {
    std::string out;
    std::vector<std::string> lines;
    std::map<std::string, std::string> hidden;  // file name -> bytes
    double seconds = 0;
};

// The uninterrupted run of a config (run once per config and cached).
Reference reference_run(const Config& c) {
    static std::map<std::string, Reference> cache;
    if (cache.count(c.name)) return cache.at(c.name);
    Reference ref;
    Workdir w = make_workdir(c);
    const auto t0 = std::chrono::steady_clock::now();
    test::Child child(score_argv(c, w, false), w.dir + "/stdout", w.dir + "/stderr");
    const int rc = child.wait();
    ref.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(rc, 0) << slurp(w.dir + "/stderr");
    ref.out = slurp(w.out);
    ref.lines = split_lines(ref.out);
    if (c.hidden)
        for (const auto& f : kLayers) ref.hidden[f] = slurp(w.hidden + "/" + f);
    if (rc == 0) cache[c.name] = ref;
    return ref;
}

// What a killed run may leave: whole lines that are the reference's first lines, then at most a
// prefix of the next one; hidden files announcing at least the rows those lines reference.
void check_crash_state(const Config& c, const Workdir& w, const Reference& ref, const std::string& ctx) {
    std::string tail;
    const auto lines = split_lines(slurp(w.out), &tail);
    ASSERT_LE(lines.size(), ref.lines.size()) << ctx;
    for (size_t i = 0; i < lines.size(); ++i) ASSERT_EQ(lines[i], ref.lines[i]) << ctx << ": line " << i + 1;
    if (!tail.empty()) {
        ASSERT_LT(lines.size(), ref.lines.size()) << ctx;
        EXPECT_EQ(ref.lines[lines.size()].compare(0, tail.size(), tail), 0)
            << ctx << ": partial line is not a prefix";
    }
    if (!c.hidden) return;
    for (const auto& [file, rows] : referenced_rows(lines)) {
        EXPECT_GE(header_rows(w.hidden + "/" + file), rows) << ctx << ": " << file;
        EXPECT_GE(static_cast<int64_t>(std::filesystem::file_size(w.hidden + "/" + file)),
                  kHeaderBytes + rows * kRowBytes)
            << ctx;
    }
}

void expect_equal_to_reference(const Config& c, const Workdir& w, const Reference& ref,
                               const std::string& ctx) {
    const std::string out = slurp(w.out);
    EXPECT_EQ(out.size(), ref.out.size()) << ctx;
    const auto lines = split_lines(out);
    ASSERT_EQ(lines.size(), ref.lines.size()) << ctx;
    for (size_t i = 0; i < lines.size(); ++i) ASSERT_EQ(lines[i], ref.lines[i]) << ctx << ": line " << i + 1;
    EXPECT_EQ(out, ref.out) << ctx;
    if (!c.hidden) return;
    for (const auto& [file, bytes] : ref.hidden)
        EXPECT_TRUE(slurp(w.hidden + "/" + file) == bytes) << ctx << ": " << file;
}

uint32_t kill_seed() {
    const char* s = std::getenv("DS4R_KILL_SEED");
    return s ? static_cast<uint32_t>(std::strtoul(s, nullptr, 10)) : 20261129u;
}

void kill_and_resume(const Config& c, int iterations, int kills_per_iteration) {
    const Reference ref = reference_run(c);
    ASSERT_GT(ref.lines.size(), 25u);
    const uint32_t seed = kill_seed();
    std::mt19937 rng(seed);
    // Kill while the run is still going: 30 ms .. 80% of an uninterrupted run.
    const double hi_ms = std::max(60.0, 800.0 * std::min(1.0, ref.seconds));
    std::uniform_real_distribution<double> delay(30.0, hi_ms);
    int kills = 0, early_exits = 0;
    for (int it = 0; it < iterations; ++it) {
        const Workdir w = make_workdir(c);
        for (int attempt = 0;; ++attempt) {
            const std::string ctx =
                strfmt("%s: seed %u, iteration %d, run %d", c.name.c_str(), seed, it, attempt);
            test::Child child(score_argv(c, w, attempt > 0), w.dir + "/stdout", w.dir + "/stderr");
            if (attempt == kills_per_iteration) {
                const int rc = child.wait();
                ASSERT_EQ(rc, 0) << ctx << "\n" << slurp(w.dir + "/stderr");
                break;
            }
            const double d = delay(rng);
            test::sleep_ms(d);
            if (child.exited_now()) {  // finished before the kill: still a valid state
                ++early_exits;
                ASSERT_EQ(child.wait(), 0) << ctx << "\n" << slurp(w.dir + "/stderr");
            } else {
                child.signal(SIGKILL);
                const int rc = child.wait();
                ASSERT_TRUE(rc == 128 + SIGKILL || rc == 0) << ctx << " rc " << rc;
                ++kills;
            }
            check_crash_state(c, w, ref, ctx + strfmt(" (killed after %.0f ms)", d));
            if (::testing::Test::HasFatalFailure()) return;
        }
        expect_equal_to_reference(c, w, ref,
                                  strfmt("%s: seed %u, iteration %d, final", c.name.c_str(), seed, it));
    }
    std::printf(
        "[ kill/resume ] %s: %d iterations, %d SIGKILLs, %d runs finished before their kill, reference run "
        "%.2f s\n",
        c.name.c_str(), iterations, kills, early_exits, ref.seconds);
    EXPECT_GE(kills, iterations);  // most kills land while the run is going
}

TEST(ResumeKill, RandomSigkillsThenResumeEqualAnUninterruptedRun) {
    kill_and_resume(plain_config(), 5, 2);
}

TEST(ResumeKill, RandomSigkillsWithHiddenStatesAndBadLines) {
    kill_and_resume(hidden_bad_config(), 5, 2);
}

void interrupt_once(int sig) {
    const Config c = hidden_bad_config();
    const Reference ref = reference_run(c);
    const Workdir w = make_workdir(c);
    test::Child child(score_argv(c, w, false), w.dir + "/stdout", w.dir + "/stderr");
    // The handlers are installed just before the run starts (src/cli/cmd_score.cpp): a signal before
    // that kills the process by the default action. A fixed delay races a fast GPU (on an H200 the
    // whole run takes 0.3 s and the signal landed during teardown), so signal once the progress shows
    // the second pass under way: pass 1 is committed and ten passes are still to come.
    for (int waited = 0; slurp(w.dir + "/stderr").find("pass 2 layer 1/") == std::string::npos; waited += 2) {
        ASSERT_LT(waited, 60000) << "the run did not reach pass 2 within 60 s:\n" << slurp(w.dir + "/stderr");
        ASSERT_FALSE(child.exited_now()) << "the run ended before pass 2:\n" << slurp(w.dir + "/stderr");
        test::sleep_ms(2);
    }
    ASSERT_FALSE(child.exited_now())
        << "the run finished before the signal; the machine is faster than expected";
    child.signal(sig);
    const int rc = child.wait();
    const std::string err = slurp(w.dir + "/stderr");
    ASSERT_EQ(rc, 130) << err;
    std::string tail;
    const auto lines = split_lines(slurp(w.out), &tail);
    EXPECT_TRUE(tail.empty()) << "a clean stop leaves no partial line";
    EXPECT_LT(lines.size(), ref.lines.size());
    const std::string msg = "ds4replay: interrupted: " + std::to_string(lines.size()) +
                            (lines.size() == 1 ? " sequence" : " sequences") + " saved";
    EXPECT_NE(err.find(msg), std::string::npos) << "expected '" << msg << "' in:\n" << err;
    const bool pass_saved = err.find("; --resume continues from there") != std::string::npos;
    EXPECT_EQ(pass_saved, std::filesystem::exists(w.out + ".pass")) << err;
    if (!pass_saved) {
        EXPECT_NE(err.find(msg + "; rerun with --resume"), std::string::npos) << err;
    }
    check_crash_state(c, w, ref, "after the signal");
    // Each hidden header announces exactly the rows the saved records reference; the rows of a saved
    // pass follow them (and nothing else does).
    const auto rows = referenced_rows(lines);
    for (const auto& f : kLayers) {
        const int64_t r = rows.count(f) ? rows.at(f) : 0;
        EXPECT_EQ(header_rows(w.hidden + "/" + f), r) << f;
        const auto size = static_cast<int64_t>(std::filesystem::file_size(w.hidden + "/" + f));
        if (pass_saved)
            EXPECT_GE(size, kHeaderBytes + r * kRowBytes) << f;
        else
            EXPECT_EQ(size, kHeaderBytes + r * kRowBytes) << f;
    }
    test::Child resume(score_argv(c, w, true), w.dir + "/stdout", w.dir + "/stderr2");
    ASSERT_EQ(resume.wait(), 0) << slurp(w.dir + "/stderr2");
    if (!lines.empty()) {
        EXPECT_NE(
            slurp(w.dir + "/stderr2").find("resume: " + std::to_string(lines.size()) + " records already in"),
            std::string::npos);
    }
    expect_equal_to_reference(c, w, ref, "resumed after the signal");
}

TEST(ResumeInterrupt, SigintStopsCleanlyWithExit130ThenResumeCompletes) {
    interrupt_once(SIGINT);
}

TEST(ResumeInterrupt, SigtermStopsCleanlyWithExit130ThenResumeCompletes) {
    interrupt_once(SIGTERM);
}

TEST(ResumeRepair, PartialLastLineAndUncommittedHiddenRowsAreCutAway) {
    const Config c = hidden_bad_config();
    const Reference ref = reference_run(c);
    for (size_t keep : {size_t{1}, ref.lines.size() / 2, ref.lines.size() - 1}) {
        const Workdir w = make_workdir(c);
        // The state of a crash after the hidden rows of every pass were committed, but only `keep`
        // records (and half of the next line) reached the results file.
        std::string out;
        for (size_t i = 0; i < keep; ++i) out += ref.lines[i] + "\n";
        out += ref.lines[keep].substr(0, ref.lines[keep].size() / 2);
        test::write_text(w.out, out);
        std::filesystem::create_directories(w.hidden);
        for (const auto& [file, bytes] : ref.hidden)
            test::write_text(w.hidden + "/" + file, bytes + std::string(1000, 'x'));
        test::Child child(score_argv(c, w, true), w.dir + "/stdout", w.dir + "/stderr");
        ASSERT_EQ(child.wait(), 0) << slurp(w.dir + "/stderr");
        EXPECT_NE(slurp(w.dir + "/stderr").find("dropping an incomplete last line"), std::string::npos);
        expect_equal_to_reference(c, w, ref, "resume with " + std::to_string(keep) + " records kept");
    }
}

TEST(ResumeRepair, ResumingACompleteOutputChangesNothing) {
    const Config c = plain_config();
    const Reference ref = reference_run(c);
    const Workdir w = make_workdir(c);
    test::write_text(w.out, ref.out);
    test::Child child(score_argv(c, w, true), w.dir + "/stdout", w.dir + "/stderr");
    ASSERT_EQ(child.wait(), 0);
    const std::string err = slurp(w.dir + "/stderr");
    EXPECT_NE(err.find("scored 0 sequences (0 tokens) in 0 passes"), std::string::npos) << err;
    EXPECT_NE(err.find("30 already done"), std::string::npos) << err;
    EXPECT_EQ(slurp(w.out), ref.out);
}

TEST(ResumeRepair, CorruptExistingLineIsReportedNotOverwritten) {
    const Config c = plain_config();
    const Workdir w = make_workdir(c);
    test::write_text(w.out, "{\"id\": \"s00\"}\nnot json\n");
    test::Child child(score_argv(c, w, true), w.dir + "/stdout", w.dir + "/stderr");
    EXPECT_EQ(child.wait(), 2);
    EXPECT_NE(
        slurp(w.dir + "/stderr").find(w.out + ":2: existing results line is not valid JSON; cannot resume"),
        std::string::npos)
        << slurp(w.dir + "/stderr");
    EXPECT_EQ(slurp(w.out), "{\"id\": \"s00\"}\nnot json\n");
}

}  // namespace
}  // namespace ds4r

namespace ds4r {
namespace {

TEST(ResumeRepair, MissingHiddenRowsAreReportedNotPadded) {
    // Records that reference hidden rows the .npy file no longer holds: --resume refuses (exit 1)
    // instead of appending after a hole.
    const Config c = hidden_bad_config();
    const Reference ref = reference_run(c);
    const Workdir w = make_workdir(c);
    test::write_text(w.out, ref.lines[0] + "\n" + ref.lines[1] + "\n");
    std::filesystem::create_directories(w.hidden);
    for (const auto& [file, bytes] : ref.hidden)
        test::write_text(w.hidden + "/" + file, bytes.substr(0, kHeaderBytes));
    test::Child child(score_argv(c, w, true), w.dir + "/stdout", w.dir + "/stderr");
    EXPECT_EQ(child.wait(), 1);
    const std::string err = slurp(w.dir + "/stderr");
    EXPECT_NE(err.find("hidden_L2.npy: holds fewer rows than the results file references"), std::string::npos)
        << err;
    EXPECT_EQ(slurp(w.out), ref.lines[0] + "\n" + ref.lines[1] + "\n");
}

}  // namespace
}  // namespace ds4r
