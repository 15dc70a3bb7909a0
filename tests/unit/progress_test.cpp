// Progress (include/ds4r/progress.h): the exact text of the per-layer and per-pass lines under a
// fake clock, bar / plain / none modes, the ETA format, the interrupt flag; and the lines a real
// `ds4replay score --progress plain|auto|none` prints on the golden tiny-a checkpoint.
#include "ds4r/progress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/weights.h"

namespace ds4r {
namespace {

// Everything written to a temporary FILE*.
class Capture {
public:
    Capture() : f_(std::tmpfile()) {}
    ~Capture() { std::fclose(f_); }
    std::FILE* file() { return f_; }
    std::string text() {
        std::fflush(f_);
        std::rewind(f_);
        std::string s;
        char buf[4096];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f_)) > 0) s.append(buf, n);
        return s;
    }

private:
    std::FILE* f_;
};

LayerTiming timing(int layer, double wait, double compute) {
    LayerTiming t;
    t.layer = layer;
    t.wait_s = wait;
    t.compute_s = compute;
    return t;
}

TEST(Progress, PlainLinesUnderAFakeClock) {
    Capture cap;
    double now = 0;
    Progress p("plain", 2, cap.file(), [&] { return now; });
    p.set_input_size(1000);
    p.skip_input(200);  // e.g. lines already in the output (--resume)
    now = 10;
    p.set_bytes_read(0);
    p.begin_pass(3, 400, 400);
    now = 12;
    p.set_bytes_read(2000000000);
    p.layer_done(timing(0, 0.5, 1.5));
    now = 14;
    p.layer_done(timing(1, 0, 2));
    now = 15;
    p.layer_done(timing(kHeadLayer, 0.25, 0.75));
    p.end_pass();
    // Layer 1 of 2 (+ head = 3 steps) after 2 s: 1/3 done -> pass ETA 4 s, 400/3/2 = 67 tok/s, 2 GB in
    // 2 s; run: (200 skipped + 400/3) / 1000 = 33%, ETA 12 s x (800 - 133.3) / 133.3 = 60 s.
    EXPECT_EQ(cap.text(),
              "pass 1 layer 1/2: 400 tokens, 67 tok/s, read 1.00 GB/s, wait 0.50s, compute 1.50s, pass ETA "
              "0m04s, run 33% ETA 1m00s\n"
              "pass 1 layer 2/2: 400 tokens, 67 tok/s, read 0.50 GB/s, wait 0.00s, compute 2.00s, pass ETA "
              "0m02s, run 47% ETA 0m28s\n"
              "pass 1 head: 400 tokens, 80 tok/s, read 0.40 GB/s, wait 0.25s, compute 0.75s, pass ETA 0m00s, "
              "run 60% ETA 0m15s\n"
              "pass 1 done: 3 sequences, 400 tokens in 5.00s (80 tok/s); run: 400 tokens in 15.0s (27 "
              "tok/s), 60% of input, ETA 0m15s\n");
    // A second pass counts on.
    now = 20;
    p.begin_pass(1, 100, 100);
    now = 21;
    p.layer_done(timing(0, 0, 1));
    EXPECT_NE(cap.text().find("pass 2 layer 1/2: 100 tokens"), std::string::npos);
}

TEST(Progress, UnknownInputSizePrintsQuestionMarks) {
    Capture cap;
    double now = 0;
    Progress p("plain", 1, cap.file(), [&] { return now; });
    p.set_input_size(-1);  // stdin
    p.begin_pass(1, 10, 50);
    now = 1;
    p.layer_done(timing(0, 0, 1));
    now = 2;
    p.end_pass();
    EXPECT_EQ(cap.text(),
              "pass 1 layer 1/1: 10 tokens, 5 tok/s, read 0.00 GB/s, wait 0.00s, compute 1.00s, pass ETA "
              "0m01s, run ? ETA ?\n"
              "pass 1 done: 1 sequence, 10 tokens in 2.00s (5 tok/s); run: 10 tokens in 2.0s (5 tok/s), ? "
              "of input, ETA ?\n");
}

TEST(Progress, BarRedrawsOneLine) {
    Capture cap;
    double now = 0;
    Progress p("bar", 1, cap.file(), [&] { return now; });
    p.begin_pass(1, 10, 0);
    now = 1;
    p.layer_done(timing(0, 0, 1));
    const std::string first =
        "pass 1 layer 1/1: 10 tokens, 5 tok/s, read 0.00 GB/s, wait 0.00s, compute 1.00s, pass ETA 0m01s, "
        "run ? ETA ?";
    EXPECT_EQ(cap.text(), "\r" + first);
    now = 2;
    p.layer_done(timing(kHeadLayer, 0, 1));
    p.end_pass();
    const std::string text = cap.text();
    // Each update starts with '\r' and is padded to cover the previous one; the pass line ends the line.
    const std::string head =
        "pass 1 head: 10 tokens, 5 tok/s, read 0.00 GB/s, wait 0.00s, compute 1.00s, pass ETA 0m00s, run ? "
        "ETA ?";
    ASSERT_EQ(head.size(), first.size() - 5);
    EXPECT_EQ(text.substr(first.size() + 1, head.size() + 6), "\r" + head + std::string(5, ' '));
    EXPECT_EQ(text.back(), '\n');
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
}

TEST(Progress, NoneIsSilent) {
    Capture cap;
    Progress p("none", 2, cap.file());
    EXPECT_TRUE(p.silent());
    p.set_input_size(100);
    p.begin_pass(1, 10, 100);
    p.layer_done(timing(0, 0, 1));
    p.layer_done(timing(kHeadLayer, 0, 1));
    p.end_pass();
    EXPECT_EQ(cap.text(), "");
}

TEST(Progress, AutoOnAFileIsPlainAndBadModesAreRejected) {
    Capture cap;
    Progress p("auto", 1, cap.file());
    p.begin_pass(1, 1, 0);
    p.layer_done(timing(0, 0, 0));
    EXPECT_EQ(cap.text().rfind("pass 1 layer 1/1: ", 0), 0u) << cap.text();
    EXPECT_EQ(cap.text().find('\r'), std::string::npos);
    EXPECT_THROW(Progress("verbose", 1, cap.file()), InputError);
}

TEST(Progress, EtaFormat) {
    EXPECT_EQ(format_eta(0), "0m00s");
    EXPECT_EQ(format_eta(59.4), "0m59s");
    EXPECT_EQ(format_eta(59.6), "1m00s");
    EXPECT_EQ(format_eta(3599), "59m59s");
    EXPECT_EQ(format_eta(3600), "1h00m");
    EXPECT_EQ(format_eta(3725), "1h02m");
    EXPECT_EQ(format_eta(100 * 3600 + 60), "100h01m");
    EXPECT_EQ(format_eta(-1), "?");
    EXPECT_EQ(format_eta(NAN), "?");
    EXPECT_EQ(format_eta(1e12), "?");
}

TEST(Interrupt, FlagRequestAndClear) {
    clear_interrupt();
    EXPECT_FALSE(interrupt_requested());
    EXPECT_NO_THROW(throw_if_interrupted());
    request_interrupt();
    EXPECT_TRUE(interrupt_requested());
    EXPECT_THROW(throw_if_interrupted(), Interrupted);
    clear_interrupt();
    EXPECT_FALSE(interrupt_requested());
}

// --- through the CLI ----------------------------------------------------------------------------

// Four 3-token sequences with --pass-tokens 3: four passes of the 6-layer tiny-a model.
std::string progress_run(const std::string& mode, bool from_stdin, int* rc) {
    const std::string dir = test::temp_dir("progress-cli");
    std::string in;
    for (int i = 0; i < 4; ++i)
        in += "{\"id\": " + std::to_string(i) + ", \"tokens\": [" + std::to_string(10 + i) + ", 20, 30]}\n";
    test::write_text(dir + "/in.jsonl", in);
    const std::string args = "score --model " + test::shell_quote(test::tiny_model_dir()) +
                             " --backend cpu --pass-tokens 3 --output " + dir + "/out.jsonl" +
                             (mode.empty() ? std::string() : " --progress " + mode) +
                             (from_stdin ? " --input -" : " --input " + dir + "/in.jsonl");
    std::string log;
    // From a pipe the input size is unknown (a redirected regular file would have one).
    *rc = from_stdin
              ? test::run_command(
                    "cat " + dir + "/in.jsonl | " + test::shell_quote(test::binary_path()) + " " + args, &log)
              : test::run_ds4replay(args, &log);
    return log;
}

// "3m05s", "1h02m" (and "?" when `unknown_ok`).
bool is_eta(const std::string& s, bool unknown_ok) {
    if (s == "?") return unknown_ok;
    const size_t u = s.find_first_not_of("0123456789");
    if (u == 0 || u == std::string::npos || s.size() != u + 4) return false;
    const char a = s[u], b = s.back();
    return ((a == 'm' && b == 's') || (a == 'h' && b == 'm')) &&
           std::isdigit(static_cast<unsigned char>(s[u + 1])) &&
           std::isdigit(static_cast<unsigned char>(s[u + 2]));
}

// "33%" or "?" (`unknown` true).
bool is_percent(const std::string& s, bool unknown) {
    if (unknown) return s == "?";
    return s.size() >= 2 && s.back() == '%' && s.find_first_not_of("0123456789") == s.size() - 1;
}

// The documented plain lines (include/ds4r/progress.h) of four one-sequence passes of 3 tokens on
// the 6-layer model: per pass, layers 1..6 in order, the head, then the pass line.
void expect_plain_progress(const std::string& log, bool size_known) {
    int pass = 1, step = 0, passes_done = 0;
    std::string last_done;
    for (const std::string& line : test::split_lines(log)) {
        if (line.rfind("pass ", 0) != 0) continue;
        int p = 0, tokens = 0, tps = 0, seqs = 0, run_tokens = 0, run_tps = 0, end = -1;
        double gbs = 0, wait = 0, compute = 0, secs = 0, run_secs = 0;
        char what[32] = {}, pass_eta[32] = {}, run_pct[32] = {}, run_eta[32] = {};
        if (std::sscanf(line.c_str(),
                        "pass %d %31[^:]: %d tokens, %d tok/s, read %lf GB/s, wait %lfs, compute %lfs, pass "
                        "ETA %31[^,], "
                        "run %31s ETA %31s%n",
                        &p, what, &tokens, &tps, &gbs, &wait, &compute, pass_eta, run_pct, run_eta,
                        &end) == 10 &&
            end == static_cast<int>(line.size())) {
            EXPECT_EQ(p, pass) << line;
            EXPECT_EQ(std::string(what),
                      step < 6 ? "layer " + std::to_string(step + 1) + "/6" : std::string("head"))
                << line;
            EXPECT_EQ(tokens, 3) << line;
            EXPECT_TRUE(gbs >= 0 && wait >= 0 && compute >= 0) << line;
            EXPECT_TRUE(is_eta(pass_eta, false)) << line;
            EXPECT_TRUE(is_percent(run_pct, !size_known)) << line;
            EXPECT_TRUE(is_eta(run_eta, !size_known)) << line;
            EXPECT_EQ(std::string(run_eta) == "?", !size_known) << line;
            ++step;
        } else if (std::sscanf(line.c_str(),
                               "pass %d done: %d sequence, %d tokens in %lfs (%d tok/s); run: %d tokens in "
                               "%lfs (%d tok/s), "
                               "%31s of input, ETA %31s%n",
                               &p, &seqs, &tokens, &secs, &tps, &run_tokens, &run_secs, &run_tps, run_pct,
                               run_eta, &end) == 10 &&
                   end == static_cast<int>(line.size())) {
            EXPECT_EQ(p, pass) << line;
            EXPECT_EQ(step, 7) << "6 layer lines and the head line before " << line;
            EXPECT_EQ(seqs, 1) << line;
            EXPECT_EQ(tokens, 3) << line;
            EXPECT_EQ(run_tokens, 3 * pass) << line;
            EXPECT_TRUE(is_percent(run_pct, !size_known)) << line;
            EXPECT_TRUE(is_eta(run_eta, !size_known)) << line;
            last_done = run_pct;
            ++passes_done;
            ++pass;
            step = 0;
        } else if (line.find(" tokens of the layer done (") != std::string::npos) {
            // progress within a layer: only when a layer runs for seconds (a heavily loaded machine)
        } else {
            ADD_FAILURE() << "unexpected progress line: " << line;
        }
    }
    EXPECT_EQ(passes_done, 4) << log;
    if (size_known) {
        EXPECT_EQ(last_done, "100%");
    }
}

TEST(ProgressCli, PlainLinePerLayerAndPass) {
    int rc;
    const std::string log = progress_run("plain", false, &rc);
    ASSERT_EQ(rc, 0) << log;
    expect_plain_progress(log, true);
}

TEST(ProgressCli, AutoIsPlainWhenStderrIsNotATerminal) {
    int rc;
    const std::string log = progress_run("", false, &rc);
    ASSERT_EQ(rc, 0) << log;
    EXPECT_EQ(log.find('\r'), std::string::npos);
    expect_plain_progress(log, true);
}

TEST(ProgressCli, PipedInputHasNoRunEstimate) {
    int rc;
    const std::string log = progress_run("plain", true, &rc);
    ASSERT_EQ(rc, 0) << log;
    expect_plain_progress(log, false);
}

TEST(ProgressCli, NoneIsSilent) {
    int rc;
    const std::string log = progress_run("none", false, &rc);
    ASSERT_EQ(rc, 0) << log;
    for (const std::string& line : test::split_lines(log)) EXPECT_NE(line.rfind("pass ", 0), 0u) << line;
    EXPECT_NE(log.find("scored 4 sequences (12 tokens) in 4 passes"), std::string::npos) << log;
}

}  // namespace
}  // namespace ds4r
