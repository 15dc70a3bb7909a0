// score --devices on the CPU backend (several CPU workers: the multi-device code path in CI), golden
// tiny-a checkpoint, in process: the results JSONL and the hidden .npy files are byte-identical to a
// one-device run with 2 workers and with more workers than a pass has sequences, over several passes;
// --resume after a truncated output; a failing worker stops the run with the completed passes intact
// (no hang) and --resume finishes it; Ctrl-C drops the pass in flight and a one-device --resume
// finishes it; a pass saved mid-way by a one-device run is run again from its start by --devices; the
// device list parser and the command line's checks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_run_util.h"
#include "ds4r/error.h"
#include "ds4r/progress.h"
#include "ds4r/score.h"

namespace ds4r {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::slurp;
using test::split_lines;

const char* const kHiddenFiles[] = {"hidden_L2.npy", "hidden_L6.npy"};

// 12 sequences of 3..25 tokens and a bad line (scored as an error record with --skip-bad).
std::string input_text() {
    std::mt19937 rng(2026);
    std::string s;
    for (int i = 0; i < 12; ++i) {
        if (i == 5) s += "{\"id\": \"bad\", \"tokens\": [-1]}\n";
        json toks = json::array();
        for (int j = 0, n = 3 + (i * 9) % 23; j < n; ++j) toks.push_back(static_cast<int>(rng() % 200));
        s += json{{"id", strfmt("s%02d", i)}, {"tokens", toks}}.dump() + "\n";
    }
    return s;
}

struct RunDirs {
    std::string dir, in, out, hidden;
};

RunDirs make_run(const std::string& tag, const std::string& in = "") {
    RunDirs r;
    r.dir = test::temp_dir(tag);
    r.in = in.empty() ? r.dir + "/in.jsonl" : in;
    r.out = r.dir + "/out.jsonl";
    r.hidden = r.dir + "/hidden";
    if (in.empty()) test::write_text(r.in, input_text());
    return r;
}

ScoreOptions options(const RunDirs& r, std::vector<int> devices) {
    ScoreOptions o;
    o.model_dir = test::tiny_model_dir();
    o.input = r.in;
    o.output = r.out;
    o.backend = "cpu";
    o.progress = "none";
    o.pass_tokens = 60;  // several passes of a few sequences
    o.capture_layers = {2, 6};
    o.hidden_dir = r.hidden;
    o.skip_bad = true;
    o.devices = std::move(devices);
    return o;
}

// The one-device run every test compares with (computed once).
const RunDirs& reference() {
    static const RunDirs ref = [] {
        RunDirs r = make_run("devices-ref");
        run_score(options(r, {}));
        return r;
    }();
    return ref;
}

void expect_same_files(const RunDirs& got, const std::string& what) {
    const RunDirs& ref = reference();
    EXPECT_TRUE(slurp(got.out) == slurp(ref.out)) << what << ": results differ from the one-device run";
    for (const char* f : kHiddenFiles)
        EXPECT_TRUE(slurp(got.hidden + "/" + f) == slurp(ref.hidden + "/" + f)) << what << ": " << f;
    EXPECT_FALSE(fs::exists(got.out + ".pass")) << what;
}

TEST(ScoreDevices, TwoWorkersAndMoreWorkersThanSequencesGiveTheOneDeviceBytes) {
    ASSERT_GE(split_lines(slurp(reference().out)).size(), 13u);
    for (const std::vector<int>& devices : {std::vector<int>{0, 0}, std::vector<int>(8, 0)}) {
        const std::string what = std::to_string(devices.size()) + " workers";
        RunDirs r = make_run("devices-same", reference().in);
        test::within_seconds(300, [&] {
            const ScoreSummary s = run_score(options(r, devices));
            EXPECT_GE(s.passes, 3) << what;
        });
        expect_same_files(r, what);
    }
}

TEST(ScoreDevices, ResumeAfterATruncatedOutput) {
    RunDirs r = make_run("devices-trunc", reference().in);
    test::within_seconds(300, [&] { run_score(options(r, {0, 0})); });
    // A run killed while writing: 5 records and half of the sixth (the hidden files hold every row).
    const auto lines = split_lines(slurp(r.out));
    ASSERT_GT(lines.size(), 6u);
    std::string kept;
    for (size_t i = 0; i < 5; ++i) kept += lines[i] + "\n";
    kept += lines[5].substr(0, lines[5].size() / 2);
    test::write_text(r.out, kept);
    ScoreOptions o = options(r, {0, 0, 0});
    o.resume = true;
    test::within_seconds(300, [&] { run_score(o); });
    expect_same_files(r, "resumed with 3 workers");
}

TEST(ScoreDevices, AFailingWorkerStopsTheRunWithTheCompletedPassesIntact) {
    RunDirs r = make_run("devices-fail", reference().in);
    ScoreOptions o = options(r, {0, 0});
    std::atomic<int> passes{0};
    o.on_worker_layer_for_tests = [&](int worker, const LayerTiming& t) {
        if (worker != 1) return;
        if (t.layer == 0) ++passes;
        if (passes == 2 && t.layer == 3) throw RuntimeError("injected device failure");
    };
    test::within_seconds(300, [&] {
        try {
            run_score(o);
            ADD_FAILURE() << "no error";
        } catch (const RuntimeError& e) {
            EXPECT_NE(std::string(e.what()).find("device 0 (worker 2 of 2): injected device failure"),
                      std::string::npos)
                << e.what();
        }
    });
    // The first pass is committed: its records are the reference's first ones; nothing else is there.
    const auto got = split_lines(slurp(r.out)), want = split_lines(slurp(reference().out));
    ASSERT_FALSE(got.empty());
    ASSERT_LT(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "record " << i;
    EXPECT_FALSE(fs::exists(r.out + ".pass"));
    ScoreOptions again = options(r, {0, 0});
    again.resume = true;
    test::within_seconds(300, [&] { run_score(again); });
    expect_same_files(r, "resumed after a failed worker");
}

TEST(ScoreDevices, InterruptDropsThePassInFlightAndAOneDeviceResumeFinishes) {
    RunDirs r = make_run("devices-int", reference().in);
    ScoreOptions o = options(r, {0, 0});
    int pass = 0;  // on_layer_for_tests calls are serialized by the runner
    o.on_layer_for_tests = [&](const LayerTiming& t) {
        if (t.layer == 0) ++pass;
        if (pass == 2 && t.layer == 2) request_interrupt();
    };
    test::within_seconds(300, [&] {
        try {
            run_score(o);
            ADD_FAILURE() << "not interrupted";
        } catch (const Interrupted& e) {
            EXPECT_EQ(e.pass_saved, "") << "--devices cannot save a pass mid-way";
            EXPECT_GT(e.sequences_saved, 0);
            EXPECT_EQ(static_cast<int64_t>(split_lines(slurp(r.out)).size()), e.sequences_saved);
        }
    });
    clear_interrupt();
    EXPECT_FALSE(fs::exists(r.out + ".pass"));
    ScoreOptions again = options(r, {});
    again.resume = true;
    ASSERT_NO_THROW(run_score(again));
    expect_same_files(r, "interrupted with 2 workers, resumed with one device");
}

TEST(ScoreDevices, APassSavedByAOneDeviceRunIsRunAgainFromItsStart) {
    RunDirs r = make_run("devices-saved", reference().in);
    ScoreOptions o = options(r, {});
    int pass = 0;
    o.on_layer_for_tests = [&](const LayerTiming& t) {
        if (t.layer == 0) ++pass;
        if (pass == 2 && t.layer == 2) request_interrupt();
    };
    EXPECT_THROW(run_score(o), Interrupted);
    clear_interrupt();
    ASSERT_TRUE(fs::exists(r.out + ".pass"));
    ScoreOptions again = options(r, {0, 0});
    again.resume = true;
    std::vector<int> first_layers;
    again.on_layer_for_tests = [&](const LayerTiming& t) { first_layers.push_back(t.layer); };
    test::within_seconds(300, [&] { run_score(again); });
    ASSERT_FALSE(first_layers.empty());
    EXPECT_EQ(first_layers.front(), 0);
    expect_same_files(r, "a saved pass continued with 2 workers");
}

TEST(ScoreDevices, DeviceListParser) {
    EXPECT_EQ(parse_device_list("0,1,2,3", 0), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(parse_device_list("0,0", 0), (std::vector<int>{0, 0}));
    EXPECT_EQ(parse_device_list("7", 0), (std::vector<int>{7}));
    EXPECT_EQ(parse_device_list("all", 3), (std::vector<int>{0, 1, 2}));
    EXPECT_THROW(parse_device_list("all", 0), InputError);
    for (const char* bad :
         {"", ",", "0,", ",0", "0,,1", "-1", "a", "0 1", "1024", "99999999999", "0;1", "all,0"})
        EXPECT_THROW(parse_device_list(bad, 4), InputError) << "'" << bad << "'";
    std::string many = "0";
    for (int i = 0; i < kMaxDeviceWorkers; ++i) many += ",0";
    EXPECT_THROW(parse_device_list(many, 0), InputError);
}

TEST(ScoreDevices, CommandLineChecks) {
    const RunDirs& ref = reference();
    const std::string base = "score --model " + test::shell_quote(test::tiny_model_dir()) +
                             " --backend cpu " + test::shell_quote(ref.in) + " --output " +
                             test::shell_quote(ref.dir + "/cli.jsonl");
    std::string log;
    EXPECT_EQ(test::run_ds4replay(base + " --device 0 --devices 0,0", &log), 2) << log;
    EXPECT_EQ(test::run_ds4replay(base + " --devices all", &log), 2) << log;
    EXPECT_NE(log.find("--devices all needs the CUDA backend"), std::string::npos) << log;
    EXPECT_EQ(test::run_ds4replay(base + " --devices 0,x", &log), 2) << log;
    EXPECT_NE(log.find("--devices: '0,x'"), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(ref.dir + "/cli.jsonl"));
}

}  // namespace
}  // namespace ds4r
