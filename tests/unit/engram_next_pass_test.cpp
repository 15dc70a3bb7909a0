// The next pass's Engram gather during the current pass (--engram-next-pass; include/ds4r/engram_io.h) on a
// tiny checkpoint with dense tables (make-tiny --engram-rows): scores byte-identical with it off, auto and on
// over several passes; the next pass's rows all in before the pass ends (observed through the runner's
// counter, not timed); a next pass that is not the one run is dropped; an exception mid-pass with a next
// gather in flight neither hangs nor spoils the runner; `score` gives the same bytes with every mode. And the
// I/O sizing helpers: the disk probe's sequential request shape, workload d's pass size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli_run_util.h"
#include "ds4r/backend.h"
#include "ds4r/binding.h"
#include "ds4r/checkpoint.h"
#include "ds4r/disk_probe.h"
#include "ds4r/error.h"
#include "ds4r/make_tiny.h"
#include "ds4r/progress.h"
#include "ds4r/replay.h"
#include "replay/bench_io.h"
#include "test_util.h"

using namespace ds4r;
using namespace ds4r::test;

namespace {

// Made once per process: the tiny preset's layers, dense tables of ~20,000 rows.
const std::string& dense_model() {
    static const std::string dir = [] {
        const std::string d = temp_dir("next-pass-model") + "/model";
        MakeTinyOptions o;
        o.engram_rows = 20000;
        o.seed = 5;
        o.threads = 2;
        make_tiny(d, o);
        return d;
    }();
    return dir;
}

using Pass = std::vector<std::vector<int32_t>>;

std::vector<Pass> random_passes(int n, int64_t vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Pass> out(static_cast<size_t>(n));
    for (auto& p : out)
        for (int s = 0; s < 3; ++s) {
            std::vector<int32_t> seq(static_cast<size_t>(3 + rng() % 20));
            for (auto& t : seq) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
            p.push_back(seq);
        }
    return out;
}

bool same_scores(const std::vector<SequenceScores>& a, const std::vector<SequenceScores>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].n != b[i].n || a[i].logprob != b[i].logprob || a[i].rank != b[i].rank ||
            a[i].entropy != b[i].entropy || a[i].topk_ids != b[i].topk_ids ||
            a[i].topk_logprobs != b[i].topk_logprobs)
            return false;
    return true;
}

// Waits (up to 60 s) until the runner's next-pass gather has ended for every table; false if it never does.
bool wait_next_pass_done(const PassRunner& r, int tables) {
    for (int i = 0; i < 6000; ++i) {
        if (r.next_pass_tables_done() == tables) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

struct ModeRun {
    std::vector<std::vector<SequenceScores>> scores;  // [pass]
    EngramGatherStats stats;
    int overlapped = 0;  // passes whose next pass's rows were all in before they ended
};

// A PassRunner on the CPU backend (synchronous weights; chunks of 16 rows unless told) and what it runs
// on; the runner is destroyed first.
ReplayOptions chunks_of_16() {
    ReplayOptions ro;
    ro.chunk_rows = 16;
    return ro;
}
struct CpuRunner {
    std::unique_ptr<EngramResources> eng;
    std::unique_ptr<Backend> be;
    std::unique_ptr<WeightSource> ws;
    std::unique_ptr<PassRunner> runner;
    CpuRunner(const Checkpoint& ck, EngramNextPassMode mode, ReplayOptions ro = chunks_of_16()) {
        IoSettings io;
        io.engram_next_pass = mode;
        eng = load_engram_resources(ck, io);
        be = make_cpu_backend();
        ws = make_sync_weight_source(*be, ck);
        runner = std::make_unique<PassRunner>(*be, ck, *ws, eng.get(), ro);
    }
};

ModeRun run_passes(const Checkpoint& ck, EngramNextPassMode mode, const std::vector<Pass>& passes) {
    CpuRunner cpu(ck, mode);
    PassRunner& runner = *cpu.runner;
    const int tables = static_cast<int>(ck.config().engram_layer_ids.size());
    ModeRun out;
    for (size_t p = 0; p < passes.size(); ++p) {
        const bool has_next = p + 1 < passes.size();
        runner.set_next_pass(has_next ? passes[p + 1] : Pass{});
        out.scores.push_back(runner.run(passes[p], nullptr, [&](const LayerTiming& t) {
            // At the head, every layer of this pass has run: the next pass's gather ends during this pass.
            if (t.layer == kHeadLayer && has_next && mode != EngramNextPassMode::Off)
                out.overlapped += wait_next_pass_done(runner, tables) ? 1 : 0;
        }));
    }
    out.stats = runner.engram_stats();
    return out;
}

// The step API: each Engram layer as a sweep of its own through the host stream (run_engram), then the
// block without Engram rows (no dequant in the chunk loop, nothing prefetched). capture_layer's rows (after
// its Engram) go to *sink when given.
std::vector<SequenceScores> step_api_scores(const Checkpoint& ck, const Pass& pass, const ReplayOptions& ro,
                                            int capture_layer = -1, HiddenSink* sink = nullptr) {
    const ModelConfig& cfg = ck.config();
    CpuRunner step(ck, EngramNextPassMode::Off, ro);
    step.runner->begin(pass);
    for (int L = 0; L < cfg.n_layers; ++L) {
        auto res = step.ws->acquire(L);
        const LayerWeights w = bind_layer_weights(cfg, ck.roles()[static_cast<size_t>(L)],
                                                  [&](const std::string& n) { return res->get(n); });
        step.runner->run_engram(w);
        if (L == capture_layer && sink) step.runner->capture(L, sink);
        step.runner->run_block(w);
    }
    auto head = step.ws->acquire(kHeadLayer);
    const GlobalWeights g = bind_global_weights([&](const std::string& n) { return head->get(n); });
    return step.runner->finish(g, nullptr);
}

}  // namespace

TEST(EngramNextPass, ByteIdenticalOffAutoOnAndGatheredDuringThePassBefore) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const uint64_t tables = ck.config().engram_layer_ids.size();
    ASSERT_GE(tables, 1u);
    const std::vector<Pass> passes = random_passes(4, ck.config().vocab_size, 3);
    const ModeRun off = run_passes(ck, EngramNextPassMode::Off, passes);
    EXPECT_EQ(off.stats.next_pass_gathers, 0u);
    for (EngramNextPassMode mode : {EngramNextPassMode::Auto, EngramNextPassMode::On}) {
        const ModeRun r = run_passes(ck, mode, passes);
        for (size_t p = 0; p < passes.size(); ++p)
            EXPECT_TRUE(same_scores(r.scores[p], off.scores[p]))
                << engram_next_pass_name(mode) << ": pass " << p << " differs from --engram-next-pass off";
        // Passes 2..4 were gathered during the pass before, all their tables in before they began.
        EXPECT_EQ(r.overlapped, 3) << engram_next_pass_name(mode);
        EXPECT_EQ(r.stats.next_pass_gathers, 3u) << engram_next_pass_name(mode);
        EXPECT_EQ(r.stats.tables_ready_at_start, 3 * tables) << engram_next_pass_name(mode);
        EXPECT_EQ(r.stats.lookups, off.stats.lookups) << engram_next_pass_name(mode);
    }
}

// The pass announced is not the pass run: its rows are dropped and the run gathers its own.
TEST(EngramNextPass, AnotherPassThanAnnouncedGathersItsOwn) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const std::vector<Pass> passes = random_passes(3, ck.config().vocab_size, 4);
    const ModeRun off = run_passes(ck, EngramNextPassMode::Off, {passes[0], passes[2]});
    CpuRunner cpu(ck, EngramNextPassMode::On, ReplayOptions{});
    PassRunner& runner = *cpu.runner;
    runner.set_next_pass(passes[1]);
    EXPECT_TRUE(same_scores(runner.run(passes[0], nullptr), off.scores[0]));
    EXPECT_TRUE(same_scores(runner.run(passes[2], nullptr), off.scores[1]));
    EXPECT_EQ(runner.engram_stats().next_pass_gathers, 0u);
    EXPECT_EQ(runner.next_pass_tables_done(), -1) << "set_next_pass applies to one run only";
}

// An exception in the middle of a pass (a Ctrl-C, a failed layer) while the next pass's gather waits or
// reads: run() throws it promptly, the gather stops, and the runner scores the next passes correctly.
TEST(EngramNextPass, ExceptionWithTheNextGatherInFlightDoesNotHang) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const std::vector<Pass> passes = random_passes(2, ck.config().vocab_size, 5);
    const ModeRun off = run_passes(ck, EngramNextPassMode::Off, passes);
    const auto t0 = std::chrono::steady_clock::now();
    {
        CpuRunner cpu(ck, EngramNextPassMode::Auto, ReplayOptions{});
        PassRunner& runner = *cpu.runner;
        for (int stop_at : {0, 2}) {
            runner.set_next_pass(passes[1]);
            EXPECT_THROW(runner.run(passes[0], nullptr,
                                    [&](const LayerTiming& t) {
                                        if (t.layer == stop_at) throw Interrupted(0, "test");
                                    }),
                         Interrupted);
            EXPECT_EQ(runner.next_pass_tables_done(), -1) << "the next pass's gather outlived its run";
        }
        runner.set_next_pass(passes[1]);
        EXPECT_TRUE(same_scores(runner.run(passes[0], nullptr), off.scores[0]));
        EXPECT_TRUE(same_scores(runner.run(passes[1], nullptr), off.scores[1]));
        // Destroyed with a next pass's gather started and never used.
        runner.set_next_pass(passes[0]);
        EXPECT_TRUE(same_scores(runner.run(passes[1], nullptr), off.scores[1]));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(120)) << "a gather thread hung";
}

// score: identical bytes with every --engram-next-pass mode over several passes.
TEST(EngramNextPass, ScoreBytesDoNotDependOnIt) {
    const std::string dir = temp_dir("next-pass-score");
    Checkpoint ck = Checkpoint::open(dense_model());
    std::mt19937_64 rng(9);
    std::string input;
    for (int i = 0; i < 8; ++i) {
        input += "{\"id\": \"s" + std::to_string(i) + "\", \"tokens\": [";
        for (int k = 0; k < 12; ++k)
            input += (k ? ", " : "") + std::to_string(rng() % static_cast<uint64_t>(ck.config().vocab_size));
        input += "]}\n";
    }
    write_text(dir + "/in.jsonl", input);
    std::string want;
    for (const char* mode : {"off", "auto", "on"}) {
        std::string log;
        const std::string out = dir + "/" + mode + ".jsonl";
        ASSERT_EQ(
            run_ds4replay("score --model " + dense_model() + " --backend cpu --progress none --input " + dir +
                              "/in.jsonl --output " + out + " --pass-tokens 30 --engram-next-pass " + mode,
                          &log),
            0)
            << log;
        EXPECT_NE(log.find("in 3 passes"), std::string::npos) << log;
        if (want.empty())
            want = slurp(out);
        else
            EXPECT_EQ(slurp(out), want) << "--engram-next-pass " << mode;
    }
    EXPECT_EQ(split_lines(want).size(), 8u);
}

// The sequential disk test reads as the weight reader does: its request size (rounded up to 4 KiB) and its
// number of requests in flight; a small file gets smaller requests so that every reader has two.
TEST(DiskProbe, SequentialTestUsesTheWeightReadersRequests) {
    const uint64_t big = uint64_t{10} << 30;
    SequentialProbeShape s = sequential_probe_shape(size_t{64} << 20, 4, big);
    EXPECT_EQ(s.request_bytes, size_t{64} << 20);
    EXPECT_EQ(s.in_flight, 4);
    s = sequential_probe_shape(5000000, 7, big);
    EXPECT_EQ(s.request_bytes, 5001216u);  // 1221 pages
    EXPECT_EQ(s.in_flight, 7);
    s = sequential_probe_shape(size_t{64} << 20, 4, uint64_t{1} << 20);
    EXPECT_EQ(s.request_bytes, size_t{128} << 10);
    s = sequential_probe_shape(size_t{64} << 20, 4, 10000);
    EXPECT_EQ(s.request_bytes, 4096u);

    const std::string f = temp_dir("disk-probe") + "/data";
    write_text(f, std::string(3 << 20, 'x'));
    const DiskRates d = measure_disk(f, 0.05, {size_t{1} << 20, 2});
    EXPECT_EQ(d.seq_request_bytes, size_t{3} << 20 >> 2 >> 12 << 12);  // 3 MiB / (2 x 2), whole pages
    EXPECT_EQ(d.seq_in_flight, 2);
    EXPECT_GT(d.seq_mb_s, 0);
    EXPECT_GT(d.iops_qd32, 0);
}

// The disk is measured under a dense file: a larger sparse one (a synthetic Engram table) reads its holes
// from no disk.
TEST(DiskProbe, MeasuresUnderADenseFileNotALargerSparseOne) {
    const std::string dir = temp_dir("disk-probe-pick");
    const std::string sparse = dir + "/sparse", dense = dir + "/dense", small = dir + "/small";
    {
        const int fd = ::open(sparse.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(::ftruncate(fd, off_t{256} << 20), 0);  // 256 MiB of holes
        const std::string page(4096, 'x');
        ASSERT_EQ(::pwrite(fd, page.data(), page.size(), 0), 4096);
        ::close(fd);
    }
    write_text(dense, std::string(2 << 20, 'x'));
    write_text(small, std::string(1 << 20, 'x'));
    std::string why;
    EXPECT_EQ(pick_disk_probe_file({sparse, small, dir + "/missing", dense}, &why), dense);
    EXPECT_EQ(why, "the largest dense file");
    EXPECT_EQ(pick_disk_probe_file({sparse}, &why), sparse);
    EXPECT_NE(why.find("no file is dense"), std::string::npos) << why;
    EXPECT_EQ(pick_disk_probe_file({dir + "/missing"}, &why), "");
}

// Per-layer figures projected to the released 40 layers by role: the 4-layer full-width checkpoint's
// formula, the 2-layer one's (window, window + Engram: the dense-table runs on a small disk), else the
// mean layer x 40; the head once.
TEST(BenchProjection, ByRoleForTheFullWidthCheckpoints) {
    auto project = [](int layers, const std::vector<double>& per_layer, double head, std::string* how) {
        const std::string d = temp_dir("projection-" + std::to_string(layers)) + "/model";
        MakeTinyOptions o;
        o.preset = TinyPreset::FullWidth;
        o.layers = layers;
        o.headers_only = true;  // holes: the layout and roles only
        make_tiny(d, o);
        const Checkpoint ck = Checkpoint::open(d);
        std::vector<LayerTiming> t;
        for (size_t L = 0; L < per_layer.size(); ++L) {
            t.push_back({});
            t.back().layer = static_cast<int>(L);
            t.back().compute_s = per_layer[L];
        }
        t.push_back({});
        t.back().layer = kHeadLayer;
        t.back().compute_s = head;
        return project_40(
            ck, t, [&](size_t i) { return t[i].compute_s; }, how);
    };
    std::string how;
    EXPECT_DOUBLE_EQ(project(2, {9.0, 18.0}, 5.0, &how), 38 * 9.0 + 2 * 18.0 + 5.0);
    EXPECT_EQ(how, "by role: 38 x L0 + 2 x L1 (Engram) + head");
    EXPECT_DOUBLE_EQ(project(4, {2.0, 3.0, 2.5, 2.25}, 1.0, &how),
                     2.0 + 3.0 + 8 * 2.5 + 30 * 2.25 + 1.0 + 1.0);
    EXPECT_EQ(how, "by role: L0 + L1 + 8 x L2 + 30 x L3 + Engram(L1 - L0) + head");
    EXPECT_DOUBLE_EQ(project(3, {1.0, 2.0, 3.0}, 0.5, &how), 2.0 * 40 + 0.5);
    EXPECT_EQ(how, "mean layer x 40");
}

// Workload d: as many sequences as the host budget holds at score's bytes per token.
TEST(BenchWorkloadD, SizedFromTheHostBudget) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const ModelConfig& c = ck.config();
    IoSettings io;
    std::FILE* null = std::fopen("/dev/null", "w");
    ASSERT_NE(null, nullptr);
    const int64_t per_token = pass_host_bytes_per_token(c, io.engram_next_pass);
    EXPECT_EQ(workload_d_sequences(c, 0.5, 100, io, null), static_cast<int64_t>(0.5e9 / (per_token * 100)));
    EXPECT_EQ(workload_d_sequences(c, 1e-9, 100, io, null), 1);
    EXPECT_GT(workload_d_sequences(c, 0, 100, io, null), 0);  // half of MemAvailable
    EXPECT_THROW(workload_d_sequences(c, 1, 0, io, null), InputError);
    std::fclose(null);
    // The next pass's share: auto its hash ids, on a second full set of rows.
    const int64_t off = pass_host_bytes_per_token(c, EngramNextPassMode::Off);
    const int64_t hashes = static_cast<int64_t>(c.engram_layer_ids.size()) * c.engram_hash_cols() * 8;
    EXPECT_EQ(pass_host_bytes_per_token(c, EngramNextPassMode::Auto), off + hashes);
    EXPECT_EQ(pass_host_bytes_per_token(c, EngramNextPassMode::On),
              off + hashes + static_cast<int64_t>(engram_rows_bytes_per_token(c)));
}

// Each layer's timing puts the wait for the Engram gather's rows in engram_wait_s, not in compute_s: zero on
// the layers without Engram, and on the Engram layers the gather's own wait counter (measured inside the
// same call) plus at most the call's own overhead.
TEST(EngramNextPass, LayerTimingsSeparateTheGatherWaitFromCompute) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const auto& roles = ck.roles();
    CpuRunner cpu(ck, EngramNextPassMode::Off);
    PassRunner& runner = *cpu.runner;
    const Pass pass = random_passes(1, ck.config().vocab_size, 11)[0];
    double engram_waits = 0;
    int engram_layers = 0;
    runner.run(pass, nullptr, [&](const LayerTiming& t) {
        EXPECT_GE(t.compute_s, 0.0) << "layer " << t.layer;
        EXPECT_GE(t.engram_wait_s, 0.0) << "layer " << t.layer;
        EXPECT_DOUBLE_EQ(t.wall_s(), t.wait_s + t.engram_wait_s + t.compute_s);
        if (t.layer == kHeadLayer || !roles[static_cast<size_t>(t.layer)].engram) {
            EXPECT_EQ(t.engram_wait_s, 0.0) << "layer " << t.layer << " has no Engram";
        } else {
            engram_waits += t.engram_wait_s;
            ++engram_layers;
        }
    });
    ASSERT_EQ(engram_layers, static_cast<int>(ck.config().engram_layer_ids.size()));
    const double counted = runner.engram_stats().wait_s;
    EXPECT_GE(engram_waits, counted);
    EXPECT_LE(engram_waits, counted + 0.05 * engram_layers);
}

// Engram in the block's chunk sweep (run_pass: each chunk's rows dequantized while the chunk before
// computes, Engram applied on the backend before the chunk's attention) against Engram as a sweep of its
// own through the host stream (the step API, run_engram then run_block; also what run_pass does where an
// Engram layer's input is captured): the same scores, byte for byte, at several chunk sizes (one chunk;
// chunks cutting sequences), and the captured rows of an Engram layer are the post-Engram stream.
TEST(EngramInTheSweep, SameBytesAsEngramOnTheHostStream) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const ModelConfig& cfg = ck.config();
    ASSERT_FALSE(cfg.engram_layer_ids.empty());
    const int engram_layer = cfg.engram_layer_ids[0];
    const Pass pass = random_passes(1, cfg.vocab_size, 11)[0];
    struct Rows : HiddenSink {
        std::vector<uint16_t> rows;
        void add_rows(int, int, const uint16_t* d, int64_t n, int64_t e) override {
            rows.insert(rows.end(), d, d + n * e);
        }
    };
    for (const int64_t chunk_rows : {int64_t{4}, int64_t{16}, int64_t{1} << 20}) {
        ReplayOptions ro;
        ro.chunk_rows = chunk_rows;
        Rows step_rows;
        const std::vector<SequenceScores> want = step_api_scores(ck, pass, ro, engram_layer, &step_rows);
        // run(): Engram inside the block's sweep; only there does a layer's chunk loop wait for the rows'
        // dequant (LayerTiming::engram_dequant_wait_s, a part of its compute)
        CpuRunner fused(ck, EngramNextPassMode::Off, ro);
        std::vector<LayerTiming> timings;
        EXPECT_TRUE(same_scores(
            fused.runner->run(pass, nullptr, [&](const LayerTiming& t) { timings.push_back(t); }), want))
            << "chunks of " << chunk_rows;
        ASSERT_EQ(timings.size(), static_cast<size_t>(cfg.n_layers) + 1);
        for (const LayerTiming& t : timings) {
            const bool eng = t.layer >= 0 && ck.roles()[static_cast<size_t>(t.layer)].engram;
            if (eng) {
                EXPECT_GE(t.engram_dequant_wait_s, 0.0) << "layer " << t.layer;
                EXPECT_LE(t.engram_dequant_wait_s, t.compute_s) << "layer " << t.layer;
            } else {
                EXPECT_EQ(t.engram_dequant_wait_s, 0.0) << "layer " << t.layer;
            }
        }
        // run() with the Engram layer captured: its own sweep again, the same rows as the step API's
        ReplayOptions rc = ro;
        rc.capture_layers = {engram_layer};
        CpuRunner captured(ck, EngramNextPassMode::Off, rc);
        Rows run_rows;
        EXPECT_TRUE(same_scores(captured.runner->run(pass, &run_rows), want)) << "chunks of " << chunk_rows;
        EXPECT_FALSE(step_rows.rows.empty());
        EXPECT_EQ(run_rows.rows, step_rows.rows) << "chunks of " << chunk_rows;
    }
}

// An Engram layer whose rows are in before its chunk loop starts has its first two chunks' rows
// dequantized ahead (PassRunner::prefetch_engram_rows: during the layer before, or while its weights are
// awaited where the layer before is an Engram layer too or there is none, as in the tiny model's layers
// 0 and 1), and its chunk loop takes them from there: the same scores as the step API's, at one chunk,
// two chunks and many; LayerTiming says so for every Engram layer (the rows were gathered during the pass
// before, so they are in from the start), and for no other layer.
TEST(EngramInTheSweep, FirstChunksDequantizedDuringTheLayerBefore) {
    Checkpoint ck = Checkpoint::open(dense_model());
    const ModelConfig& cfg = ck.config();
    const int tables = static_cast<int>(cfg.engram_layer_ids.size());
    ASSERT_GE(tables, 1);
    const std::vector<bool> engram_layer = [&] {
        std::vector<bool> e(static_cast<size_t>(cfg.n_layers), false);
        for (int L : cfg.engram_layer_ids) e[static_cast<size_t>(L)] = true;
        return e;
    }();
    const std::vector<Pass> passes = random_passes(2, cfg.vocab_size, 13);
    const int64_t rows = [&] {
        int64_t n = 0;
        for (const auto& s : passes[1]) n += static_cast<int64_t>(s.size());
        return n;
    }();
    for (const int64_t chunk_rows : {rows, (rows + 3) / 2 + 1, int64_t{4}}) {
        ReplayOptions ro;
        ro.chunk_rows = chunk_rows;
        const std::vector<SequenceScores> want = step_api_scores(ck, passes[1], ro);
        CpuRunner cpu(ck, EngramNextPassMode::On, ro);
        cpu.runner->set_next_pass(passes[1]);
        const auto first = cpu.runner->run(passes[0], nullptr);
        ASSERT_EQ(first.size(), passes[0].size());
        ASSERT_TRUE(wait_next_pass_done(*cpu.runner, tables));
        std::vector<LayerTiming> timings;
        EXPECT_TRUE(same_scores(
            cpu.runner->run(passes[1], nullptr, [&](const LayerTiming& t) { timings.push_back(t); }), want))
            << "chunks of " << chunk_rows;
        int prefetched = 0;
        for (const LayerTiming& t : timings) {
            const bool eng = t.layer >= 0 && engram_layer[static_cast<size_t>(t.layer)];
            EXPECT_EQ(t.engram_rows_prefetched, eng) << "layer " << t.layer << ", chunks of " << chunk_rows;
            prefetched += t.engram_rows_prefetched ? 1 : 0;
        }
        EXPECT_EQ(prefetched, tables) << "chunks of " << chunk_rows;
    }
}
