// The multi-device runner and its one weight reader (src/replay/multi_device_runner.h,
// src/io/fanout_weight_source.h), on the golden tiny-a checkpoint. The "devices" are the asynchronous
// fake of prefetch_fake_backend.h made to say it is not host memory, so the fan-out copies every layer
// into each worker's own memory (the path a GPU takes) and the chunk copies run late on a thread:
//  - scores and captured hidden rows equal one PassRunner's bit for bit, with 2, 3 and more workers
//    than sequences, over several passes; the rows reach the sink in one-device order;
//  - each layer is read from the shards once per pass whatever the number of workers;
//  - a worker that fails stops the others (no hang), the error names its device;
//  - out of memory on one worker: its chunks are halved, the pass runs again, same scores.
#include "replay/multi_device_runner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <vector>

#include "ds4r/borrowed_host_memory.h"
#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/io_settings.h"
#include "ds4r/replay.h"
#include "io/fanout_weight_source.h"
#include "prefetch_fake_backend.h"
#include "score_compare.h"
#include "test_util.h"

namespace ds4r {
namespace {

using test::expect_identical;

// The fake asynchronous backend as a device: the fan-out copies the layers into its memory.
class DeviceLikeBackend : public test::FakeAsyncBackend {
public:
    explicit DeviceLikeBackend(unsigned seed) : FakeAsyncBackend(seed, 200) {}
    bool host_memory() const override { return false; }
};

// A device that runs out of memory for chunks of more than `max_rows` rows (state ring buffers).
class SmallDeviceBackend : public DeviceLikeBackend {
public:
    SmallDeviceBackend(const ModelConfig& c, int64_t max_rows) : DeviceLikeBackend(5), max_rows_(max_rows) {
        width_ = c.hc_mult * c.dim;
    }
    Tensor alloc(DType t, const Shape& shape) override {
        if (t == DType::BF16 && !shape.empty() && shape[0] > max_rows_ &&
            shape_numel(shape) / shape[0] == width_) {
            ++refusals;
            throw OutOfMemoryError(strfmt("fake: %lld rows refused", (long long)shape[0]));
        }
        return DeviceLikeBackend::alloc(t, shape);
    }
    int refusals = 0;

private:
    int64_t max_rows_, width_ = 0;
};

std::vector<std::vector<int32_t>> sequences(int64_t vocab, int n) {
    std::mt19937 rng(91);
    std::vector<std::vector<int32_t>> seqs;
    for (int i = 0; i < n; ++i) {
        std::vector<int32_t> s(static_cast<size_t>(1 + (i * 11) % 37));
        for (auto& t : s) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
        seqs.push_back(s);
    }
    return seqs;
}

// Captured rows by (layer, sequence), and the order in which each layer's sequences arrived.
struct OrderSink : HiddenSink {
    std::map<std::pair<int, int>, std::vector<uint16_t>> rows;
    std::map<int, std::vector<int>> order;
    int restarts = 0;
    void add_rows(int layer, int seq, const uint16_t* d, int64_t n, int64_t e) override {
        auto& r = rows[{layer, seq}];
        r.insert(r.end(), d, d + n * e);
        order[layer].push_back(seq);
    }
    void restart_pass() override {
        ++restarts;
        rows.clear();
        order.clear();
    }
};

ReplayOptions options(int64_t chunk_rows) {
    ReplayOptions ro;
    ro.chunk_rows = chunk_rows;
    ro.capture_layers = {0, 3, 6};
    return ro;
}

// The workers, their one reader and the runner.
struct Multi {
    std::vector<std::unique_ptr<Backend>> owned;
    std::unique_ptr<Backend> host;  // the reader's host memory: the first device's (as score does)
    std::unique_ptr<FanoutWeightSource> weights;
    std::unique_ptr<MultiDeviceRunner> runner;
    Multi(const Checkpoint& ck, const EngramResources* eng, std::vector<std::unique_ptr<Backend>> bes,
          int64_t chunk_rows)
        : owned(std::move(bes)), host(make_cpu_backend_with_host_memory_of(*owned.front())) {
        std::vector<Backend*> targets;
        std::vector<int> devices;
        for (auto& b : owned) {
            targets.push_back(b.get());
            devices.push_back(static_cast<int>(devices.size()));
        }
        PrefetchOptions po;
        po.mode = PrefetchOptions::Mode::Direct;
        po.direct_io = false;
        weights =
            std::make_unique<FanoutWeightSource>(make_prefetch_weight_source(*host, ck, po), ck, targets);
        runner = std::make_unique<MultiDeviceRunner>(
            targets, devices, ck, *weights, eng,
            std::vector<ReplayOptions>(targets.size(), options(chunk_rows)));
    }
};

std::vector<std::unique_ptr<Backend>> devices(int n) {
    std::vector<std::unique_ptr<Backend>> v;
    for (int i = 0; i < n; ++i)
        v.push_back(std::make_unique<DeviceLikeBackend>(static_cast<unsigned>(i + 1)));
    return v;
}

TEST(MultiDevice, WorkersGiveTheOneDeviceScoresAndRowsInOrder) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    auto eng = load_engram_resources(ck);
    const auto seqs = sequences(ck.config().vocab_size, 7);
    auto cpu = make_cpu_backend();
    auto sync = make_sync_weight_source(*cpu, ck);
    PassRunner one(*cpu, ck, *sync, eng.get(), options(4096));
    OrderSink want_rows;
    const auto want = one.run(seqs, &want_rows);
    for (int n : {2, 3, 9}) {
        test::within_seconds(120, [&] {
            Multi m(ck, eng.get(), devices(n), 16);
            for (int pass = 0; pass < 2; ++pass) {
                const std::string what = std::to_string(n) + " workers, pass " + std::to_string(pass + 1);
                OrderSink rows;
                expect_identical(want, m.runner->run(seqs, &rows), what);
                EXPECT_EQ(rows.rows, want_rows.rows) << what;
                EXPECT_EQ(rows.order, want_rows.order) << what << ": rows out of one-device order";
            }
            // The one reader delivered each layer (and the head) once per pass, not once per worker.
            EXPECT_EQ(m.weights->stats().layers.size(), static_cast<size_t>(2 * (ck.config().n_layers + 1)))
                << n << " workers";
        });
    }
}

TEST(MultiDevice, AFailingWorkerStopsTheOthersAndIsNamed) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    auto eng = load_engram_resources(ck);
    const auto seqs = sequences(ck.config().vocab_size, 6);
    for (int fail_layer : {0, 3, kHeadLayer}) {
        test::within_seconds(120, [&] {
            Multi m(ck, eng.get(), devices(3), 16);
            m.runner->set_worker_hook_for_tests([&](int w, const LayerTiming& t) {
                if (w == 1 && t.layer == fail_layer) throw CheckpointError("injected device failure");
            });
            OrderSink rows;
            try {
                m.runner->run(seqs, &rows);
                ADD_FAILURE() << "no error";
            } catch (const CheckpointError& e) {  // the kind (exit code) is kept
                EXPECT_NE(std::string(e.what()).find("device 1 (worker 2 of 3): injected device failure"),
                          std::string::npos)
                    << e.what();
            }
            // The runner is usable again: the next pass (no failure) gives the right scores.
            m.runner->set_worker_hook_for_tests({});
            OrderSink again;
            const auto got = m.runner->run(seqs, &again);
            auto cpu = make_cpu_backend();
            auto sync = make_sync_weight_source(*cpu, ck);
            PassRunner one(*cpu, ck, *sync, eng.get(), options(4096));
            expect_identical(one.run(seqs, nullptr), got, "after a failed pass");
        });
    }
}

TEST(MultiDevice, OutOfMemoryOnOneWorkerRunsThePassAgainWithSmallerChunks) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    auto eng = load_engram_resources(ck);
    const auto seqs = sequences(ck.config().vocab_size, 6);
    auto cpu = make_cpu_backend();
    auto sync = make_sync_weight_source(*cpu, ck);
    PassRunner one(*cpu, ck, *sync, eng.get(), options(4096));
    OrderSink want_rows;
    const auto want = one.run(seqs, &want_rows);
    test::within_seconds(120, [&] {
        std::vector<std::unique_ptr<Backend>> bes;
        bes.push_back(std::make_unique<DeviceLikeBackend>(3));
        auto small = std::make_unique<SmallDeviceBackend>(ck.config(), 20);
        SmallDeviceBackend* s = small.get();
        bes.push_back(std::move(small));
        Multi m(ck, eng.get(), std::move(bes), 256);
        OrderSink rows;
        const auto got = m.runner->run(seqs, &rows);
        expect_identical(want, got, "after out-of-memory retries");
        EXPECT_EQ(rows.rows, want_rows.rows);
        EXPECT_GE(s->refusals, 1);
        EXPECT_EQ(m.runner->out_of_memory_retries(), rows.restarts);
        EXPECT_EQ(m.runner->chunk_rows(), 16);  // 256 -> 128 -> 64 -> 32 -> 16: chunks of <= 20 rows fit
    });
}

TEST(MultiDevice, StopUnblocksAWorkerWaitingForItsLayer) {
    const Checkpoint ck = Checkpoint::open(test::golden_model_dir());
    auto host = make_cpu_backend();
    auto a = make_cpu_backend(), b = make_cpu_backend();
    PrefetchOptions po;
    po.mode = PrefetchOptions::Mode::Direct;
    FanoutWeightSource f(make_prefetch_weight_source(*host, ck, po), ck, {a.get(), b.get()});
    std::vector<int> order;
    for (int L = 0; L < ck.config().n_layers; ++L) order.push_back(L);
    order.push_back(kHeadLayer);
    f.target(0).set_schedule(order);
    f.target(1).set_schedule(order);
    f.begin_pass({true, true});
    test::within_seconds(60, [&] {
        // Worker 0 runs ahead: it holds layers 0 and 1 and then waits for worker 1 (the reader holds two).
        auto l0 = f.target(0).acquire(0);
        l0.reset();
        auto l1 = f.target(0).acquire(1);
        l1.reset();
        auto waiting = std::async(std::launch::async, [&] { return f.target(0).acquire(2); });
        EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
            << "a worker ran two layers ahead of another";
        f.stop();
        EXPECT_THROW(waiting.get(), FanoutStopped);
        EXPECT_THROW(f.target(1).acquire(0), FanoutStopped);
        // A new pass starts over: both take layer 0, and a wrong layer is an error, not a hang.
        f.begin_pass({true, true});
        EXPECT_THROW(f.target(1).acquire(1), RuntimeError);
        auto x = f.target(0).acquire(0);
        auto y = f.target(1).acquire(0);
        const std::string name = "layers.0.attn.kv_norm.weight";
        EXPECT_EQ(x->get(name).data, y->get(name).data) << "host-memory workers share the one read";
    });
}

}  // namespace
}  // namespace ds4r
