// The prefetching weight source (include/ds4r/weights.h): byte-identical tensors to the synchronous
// source across passes with 1..7 reader threads and odd request sizes, the asynchronous upload path and
// slot recycling on a fake backend whose copy queue completes late, schedule churn with requests in
// flight, error propagation (a failed request stops the other readers), stopping mid-read, the --io
// setting, plans and the O_DIRECT reader (also under concurrent use).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/io_settings.h"
#include "ds4r/weights.h"
#include "io/direct_reader.h"
#include "io/prefetch_plan.h"
#include "prefetch_fake_backend.h"
#include "test_util.h"

using namespace ds4r;
namespace fs = std::filesystem;

namespace {

std::vector<const TensorLocation*> tensors_of_layer(const Checkpoint& ckpt, int layer) {
    if (layer == kHeadLayer) return {&ckpt.at("norm.weight"), &ckpt.at("head.weight")};
    std::vector<const TensorLocation*> out;
    for (const TensorLocation& t : ckpt.tensors())
        if (t.cls == TensorClass::Layer && t.layer == layer) out.push_back(&t);
    return out;
}

// Layer L's tensor that comes first in the checkpoint's files (lowest shard, then offset).
const TensorLocation* first_tensor_of_layer(const Checkpoint& ckpt, int layer) {
    const TensorLocation* first = nullptr;
    for (const TensorLocation* t : tensors_of_layer(ckpt, layer))
        if (!first || (t->shard == first->shard ? t->offset < first->offset : t->shard < first->shard))
            first = t;
    return first;
}

std::vector<int> one_pass(const Checkpoint& ckpt) {
    std::vector<int> order;
    for (int L = 0; L < static_cast<int>(ckpt.config().n_layers); ++L) order.push_back(L);
    order.push_back(kHeadLayer);
    return order;
}

// The bytes of every streamed tensor as the synchronous source delivers them on the CPU backend,
// cross-checked against a plain Checkpoint::read of the tensor.
using LayerBytes = std::map<std::string, std::vector<uint8_t>>;
std::map<int, LayerBytes> expected_bytes(const Checkpoint& ckpt) {
    auto cpu = make_cpu_backend();
    auto sync = make_sync_weight_source(*cpu, ckpt);
    std::map<int, LayerBytes> out;
    for (int L : one_pass(ckpt)) {
        auto h = sync->acquire(L);
        for (const TensorLocation* t : tensors_of_layer(ckpt, L)) {
            const Tensor x = h->get(t->name);
            std::vector<uint8_t> b(t->nbytes), direct(t->nbytes);
            if (t->nbytes) std::memcpy(b.data(), x.data, t->nbytes);
            ckpt.read(*t, direct.data());
            EXPECT_EQ(b, direct) << t->name;
            out[L][t->name] = std::move(b);
        }
    }
    return out;
}

// Compares every tensor of `layer` in `r` with the expected bytes, dtype and shape, and checks the
// alignment rules of weights.h. Returns the number of problems (details go to the gtest log).
int check_layer(const ResidentLayer& r, const Checkpoint& ckpt, int layer,
                const std::map<int, LayerBytes>& exp, bool upload) {
    int bad = 0;
    for (const TensorLocation* t : tensors_of_layer(ckpt, layer)) {
        const Tensor x = r.get(t->name);
        if (x.dtype != t->dtype || x.shape != t->shape) {
            ADD_FAILURE() << t->name << ": dtype/shape " << dtype_name(x.dtype) << shape_str(x.shape);
            ++bad;
            continue;
        }
        const auto& want = exp.at(layer).at(t->name);
        if (t->nbytes && std::memcmp(x.data, want.data(), t->nbytes) != 0) {
            size_t i = 0;
            while (static_cast<const uint8_t*>(x.data)[i] == want[i]) ++i;
            ADD_FAILURE() << "layer " << layer << " tensor " << t->name << ": first differing byte " << i
                          << " of " << t->nbytes << " (got " << int(static_cast<const uint8_t*>(x.data)[i])
                          << ", want " << int(want[i]) << ")";
            ++bad;
        }
        const auto addr = reinterpret_cast<uintptr_t>(x.data);
        if (t->nbytes == 0) continue;
        if (upload && addr % 16 != 0) {
            ADD_FAILURE() << t->name << ": address not 16-byte aligned in upload mode";
            ++bad;
        }
        if (!upload) {
            const bool in_run = (addr - t->offset) % DirectReader::kAlign == 0;
            const bool own_copy = addr % kSlotAlign == 0 && t->offset % dtype_size(t->dtype) != 0;
            if (addr % dtype_size(t->dtype) != 0 || !(in_run || own_copy)) {
                ADD_FAILURE() << t->name << ": direct-mode placement (address mod 4096 " << addr % 4096
                              << ", file offset mod 4096 " << t->offset % 4096 << ")";
                ++bad;
            }
        }
    }
    return bad;
}

std::vector<test::FakeAsyncBackend::Range> ranges_of(const ResidentLayer& r, const Checkpoint& ckpt,
                                                     int layer) {
    std::vector<test::FakeAsyncBackend::Range> out;
    for (const TensorLocation* t : tensors_of_layer(ckpt, layer)) {
        const auto a = reinterpret_cast<uintptr_t>(r.get(t->name).data);
        if (t->nbytes) out.emplace_back(a, a + t->nbytes);
    }
    return out;
}

// "Compute" on a layer: check it, give the prefetcher time to misbehave, check again, then poison it
// so that a slot reused without a complete reload is caught later.
void use_and_poison(const ResidentLayer& r, const Checkpoint& ckpt, int layer,
                    const std::map<int, LayerBytes>& exp, bool upload, std::mt19937& rng) {
    EXPECT_EQ(check_layer(r, ckpt, layer, exp, upload), 0) << "layer " << layer << " at acquire";
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 400)(rng)));
    EXPECT_EQ(check_layer(r, ckpt, layer, exp, upload), 0) << "layer " << layer << " before release";
    for (const TensorLocation* t : tensors_of_layer(ckpt, layer))
        if (t->nbytes) std::memset(r.get(t->name).data, 0xA5, t->nbytes);
}

// Number of read calls the plan of `layer` takes with requests of `request` bytes (a multiple of 4096).
uint64_t plan_requests(const Checkpoint& ckpt, int layer, bool upload, size_t staging, size_t request) {
    const LayerPlan p = make_layer_plan(ckpt, layer, upload, align_up(staging, DirectReader::kAlign));
    uint64_t n = 0;
    for (const PlanBatch& b : p.batches)
        for (const ReadPiece& r : b.reads) n += (r.file_end - r.file_begin + request - 1) / request;
    return n;
}

// Whether the file system under `path` accepts O_DIRECT reads (tmpfs and some others do not).
bool accepts_o_direct(const std::string& path) {
    DirectReader r(path, DirectReader::Mode::Auto);
    auto buf = std::shared_ptr<void>(std::aligned_alloc(4096, 4096), [](void* p) { std::free(p); });
    bool direct = false;
    r.read_aligned(buf.get(), 0, 4096, &direct);
    return direct;
}

// The timing records of a run: each layer's reads lie inside its load (first read start to last read
// end, not a sum over the reader threads), and the union of reading time fits in the source's lifetime.
void check_read_times(const WeightSourceStats& st, double lifetime_s) {
    for (const LayerLoadRecord& r : st.layers) {
        EXPECT_GT(r.read_s, 0.0) << "layer " << r.layer;
        EXPECT_LE(r.read_s, r.ready_at_s - r.load_begin_at_s + 1e-6)
            << "layer " << r.layer << ": read_s is longer than the load itself (a sum over threads?)";
    }
    EXPECT_GT(st.read_seconds, 0.0);
    EXPECT_LE(st.read_seconds, lifetime_s + 1e-6) << "read_seconds counts overlapping reads more than once";
}

std::vector<int> repeat(const std::vector<int>& order, int times) {
    std::vector<int> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), order.begin(), order.end());
    return out;
}

class PrefetchTest : public ::testing::Test {
protected:
    void SetUp() override {
        ckpt_ = std::make_unique<Checkpoint>(Checkpoint::open(test::golden_model_dir()));
        exp_ = expected_bytes(*ckpt_);
    }
    std::unique_ptr<Checkpoint> ckpt_;
    std::map<int, LayerBytes> exp_;
};

// ---------------------------------------------------------------------------------------------
// CPU backend (direct mode): identical bytes across 3 passes, full-list and repeating schedules.
struct DirectCase {
    size_t staging;
    size_t request;  // rounded up to 4096 by the source
    bool direct_io;
    bool full_list;  // the schedule lists all three passes (else one pass, repeated)
    int threads;
};

class PrefetchDirectTest : public PrefetchTest, public ::testing::WithParamInterface<DirectCase> {};

TEST_P(PrefetchDirectTest, MatchesSyncSourceAcrossThreePasses) {
    const DirectCase c = GetParam();
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.staging_bytes = c.staging;
    o.read_request_bytes = c.request;
    o.direct_io = c.direct_io;
    o.repeat_schedule = !c.full_list;
    o.read_threads = c.threads;
    const auto born = std::chrono::steady_clock::now();
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
    const std::vector<int> pass = one_pass(*ckpt_);
    const std::vector<int> all = repeat(pass, 3);
    src->set_schedule(c.full_list ? all : pass);
    std::mt19937 rng(7);
    for (int L : all) {
        auto h = src->acquire(L);
        use_and_poison(*h, *ckpt_, L, exp_, false, rng);
    }
    const WeightSourceStats st = src->stats();
    check_read_times(st, std::chrono::duration<double>(std::chrono::steady_clock::now() - born).count());
    // Every request is counted; a full-list schedule reads exactly its positions.
    const size_t request = align_up(c.request, DirectReader::kAlign);
    uint64_t want_requests = 0;
    for (int L : all) want_requests += plan_requests(*ckpt_, L, false, c.staging, request);
    if (c.full_list) {
        EXPECT_EQ(st.read_requests, want_requests);
    } else {
        EXPECT_GE(st.read_requests, want_requests);
    }
    if (!c.direct_io) {
        EXPECT_EQ(st.bytes_read_direct, 0u) << "direct_io = false reads through the page cache";
    } else if (accepts_o_direct(ckpt_->shards().at(1).path)) {
        EXPECT_EQ(st.bytes_read_direct, st.bytes_read);
    }
    EXPECT_EQ(st.device_bytes, 0u);
    EXPECT_GT(st.host_bytes, 0u);
    EXPECT_EQ(st.bytes_uploaded, 0u);
    ASSERT_EQ(st.layers.size(), all.size());
    uint64_t tensor_bytes = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        const LayerLoadRecord& r = st.layers[i];
        EXPECT_EQ(r.layer, all[i]);
        EXPECT_EQ(r.position, i);
        uint64_t want = 0;
        for (const TensorLocation* t : tensors_of_layer(*ckpt_, all[i])) want += t->nbytes;
        EXPECT_EQ(r.bytes, want);
        EXPECT_GE(r.bytes_read, r.bytes);
        EXPECT_LE(r.load_begin_at_s, r.ready_at_s);
        EXPECT_LE(r.ready_at_s, r.acquired_at_s);
        EXPECT_GE(r.wait_s, 0.0);
        tensor_bytes += want;
    }
    EXPECT_GE(st.bytes_read, tensor_bytes);
    EXPECT_GT(st.read_seconds, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PrefetchDirectTest,
    ::testing::Values(DirectCase{size_t{128} << 20, size_t{64} << 20, true, true, 4},
                      DirectCase{size_t{128} << 20, size_t{64} << 20, true, false, 1},
                      DirectCase{8192, 4096, true, false, 2}, DirectCase{65536, 16384, false, true, 4},
                      // odd request sizes (rounded up to 4 KiB) and thread counts
                      DirectCase{65536, 5000, true, true, 7}, DirectCase{40000, 12345, false, false, 2},
                      DirectCase{size_t{1} << 20, 3, true, true, 7}, DirectCase{20480, 77777, true, false, 1},
                      DirectCase{size_t{3} << 20, 999999, false, true, 4}));

// ---------------------------------------------------------------------------------------------
// Fake asynchronous backend (upload mode): late copies, fences, slot recycling, memory bound.
struct UploadCase {
    size_t staging;
    int count;
    int delay_us;
    unsigned seed;
    int threads;
    size_t request;
};

class PrefetchUploadTest : public PrefetchTest, public ::testing::WithParamInterface<UploadCase> {};

TEST_P(PrefetchUploadTest, AsyncCopiesRecycleSlotsSafely) {
    const UploadCase c = GetParam();
    test::FakeAsyncBackend be(c.seed, c.delay_us);
    PrefetchOptions o;
    o.mode = PrefetchOptions::Mode::Upload;
    o.staging_bytes = c.staging;
    o.staging_count = c.count;
    o.read_request_bytes = c.request;
    o.read_threads = c.threads;
    o.repeat_schedule = false;
    const auto born = std::chrono::steady_clock::now();
    auto src = make_prefetch_weight_source(be, *ckpt_, o);
    // Memory bound: two slots and the ring, allocated once.
    EXPECT_EQ(be.allocs(), 2);
    EXPECT_EQ(be.host_allocs(), c.count);
    const std::vector<int> all = repeat(one_pass(*ckpt_), 3);
    src->set_schedule(all);
    std::mt19937 rng(c.seed + 1);
    for (int L : all) {
        auto h = src->acquire(L);
        be.guard_hold(ranges_of(*h, *ckpt_, L));
        use_and_poison(*h, *ckpt_, L, exp_, true, rng);
        be.guard_release();  // "kernels" may still read it until the next synchronize()
        h.reset();
    }
    EXPECT_EQ(be.violations(), 0) << "a copy landed in a slot still held or read by queued compute";
    EXPECT_EQ(be.allocs(), 2);
    EXPECT_EQ(be.host_allocs(), c.count);
    ASSERT_NE(be.last_queue(), nullptr);
    EXPECT_EQ(be.last_queue()->compute_waits(), static_cast<int>(all.size()));
    const WeightSourceStats st = src->stats();
    EXPECT_EQ(st.device_bytes, be.alloc_bytes());
    EXPECT_EQ(st.host_bytes, static_cast<uint64_t>(c.count) * (align_up(c.staging, 4096) + 4096));
    ASSERT_EQ(st.layers.size(), all.size());
    uint64_t uploaded = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        const LayerLoadRecord& r = st.layers[i];
        EXPECT_EQ(r.layer, all[i]);
        EXPECT_GE(r.bytes_uploaded, r.bytes);
        EXPECT_GE(r.bytes_read, r.bytes);
        EXPECT_GT(r.upload_s, 0.0);
        uploaded += r.bytes_uploaded;
    }
    // The full-list schedule ends with the last entry: nothing is uploaded beyond the acquired layers.
    EXPECT_EQ(st.bytes_uploaded, uploaded);
    EXPECT_GT(st.upload_seconds, 0.0);
    check_read_times(st, std::chrono::duration<double>(std::chrono::steady_clock::now() - born).count());
    uint64_t want_requests = 0;
    for (int L : all) want_requests += plan_requests(*ckpt_, L, true, c.staging, align_up(c.request, 4096));
    EXPECT_EQ(st.read_requests, want_requests);
}

INSTANTIATE_TEST_SUITE_P(Configs, PrefetchUploadTest,
                         ::testing::Values(UploadCase{4096, 2, 50, 1, 1, 16384},
                                           UploadCase{65536, 3, 200, 2, 4, 16384},
                                           UploadCase{65536, 4, 0, 3, 7, 5000},
                                           UploadCase{size_t{16} << 20, 2, 300, 4, 2, 16384},
                                           UploadCase{20000, 5, 100, 5, 3, 12345},
                                           UploadCase{size_t{1} << 20, 2, 20, 6, 7, 4097}));

// The synchronous CopyQueue default (Backend::make_copy_queue) drives the same path on the CPU backend.
TEST_F(PrefetchTest, UploadModeWithDefaultCopyQueueOnCpu) {
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.mode = PrefetchOptions::Mode::Upload;
    o.staging_bytes = 32768;
    o.staging_count = 2;
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
    const std::vector<int> pass = one_pass(*ckpt_);
    src->set_schedule(pass);
    std::mt19937 rng(3);
    for (int L : repeat(pass, 2)) {
        auto h = src->acquire(L);
        use_and_poison(*h, *ckpt_, L, exp_, true, rng);
    }
    EXPECT_GT(src->stats().bytes_uploaded, 0u);
}

// Regression: readers that stay busy across layers (a read-bound run) keep their busy interval
// open; stats() must still count it (the bench printed "31 GB in 0.00 s of reading").
TEST_F(PrefetchTest, ReadSecondsCountsAnOpenBusyInterval) {
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.read_threads = 2;
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
    const std::vector<int> pass = one_pass(*ckpt_);
    src->set_schedule(pass);
    for (int L : pass) {
        auto h = src->acquire(L);
        const WeightSourceStats st = src->stats();
        ASSERT_GT(st.bytes_read, 0u);
        EXPECT_GT(st.read_seconds, 0.0) << "bytes were read but no read time is counted (layer " << L << ")";
    }
}

// ---------------------------------------------------------------------------------------------
// Schedule order: resynchronization, unknown layers, both slots held, no schedule.
TEST_F(PrefetchTest, OutOfOrderAcquireResynchronizes) {
    test::FakeAsyncBackend be(11, 100);
    PrefetchOptions o;
    o.mode = PrefetchOptions::Mode::Upload;
    o.staging_bytes = 65536;
    o.staging_count = 3;
    auto src = make_prefetch_weight_source(be, *ckpt_, o);
    src->set_schedule(one_pass(*ckpt_));
    std::mt19937 rng(5);
    // 0, then 2 (1 skipped while it was prefetched), the same layer again (found in the next pass),
    // the head, then the next pass from its start.
    for (int L : {0, 2, 2, 3, kHeadLayer, 0, 1, 5}) {
        auto h = src->acquire(L);
        use_and_poison(*h, *ckpt_, L, exp_, true, rng);
    }
    EXPECT_THROW(src->acquire(42), RuntimeError);  // not a layer
    EXPECT_THROW(src->acquire(-1000000), RuntimeError);
    auto h = src->acquire(kHeadLayer);  // still usable after the refusal
    EXPECT_EQ(check_layer(*h, *ckpt_, kHeadLayer, exp_, true), 0);
}

TEST_F(PrefetchTest, NonRepeatingScheduleEnds) {
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.repeat_schedule = false;
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
    src->set_schedule({3, kHeadLayer});
    src->acquire(3).reset();
    src->acquire(kHeadLayer).reset();
    EXPECT_THROW(src->acquire(3), RuntimeError);
    // A new schedule restarts it.
    src->set_schedule({1});
    std::mt19937 rng(1);
    auto h = src->acquire(1);
    use_and_poison(*h, *ckpt_, 1, exp_, false, rng);
}

TEST_F(PrefetchTest, ReplacingTheScheduleDropsWhatWasPrefetched) {
    test::FakeAsyncBackend be(13, 300);
    PrefetchOptions o;
    o.mode = PrefetchOptions::Mode::Upload;
    o.staging_bytes = 8192;
    o.staging_count = 2;
    o.read_request_bytes = 4096;
    auto src = make_prefetch_weight_source(be, *ckpt_, o);
    src->set_schedule(one_pass(*ckpt_));
    std::mt19937 rng(8);
    auto h = src->acquire(0);  // layer 1 is loading into the other slot (slow fake queue)
    be.guard_hold(ranges_of(*h, *ckpt_, 0));
    src->set_schedule({4, 5});  // while layer 0 is still held
    use_and_poison(*h, *ckpt_, 0, exp_, true, rng);
    be.guard_release();
    h.reset();
    for (int L : {4, 5, 4}) {
        auto g = src->acquire(L);
        be.guard_hold(ranges_of(*g, *ckpt_, L));
        use_and_poison(*g, *ckpt_, L, exp_, true, rng);
        be.guard_release();
    }
    EXPECT_EQ(be.violations(), 0);
}

TEST_F(PrefetchTest, HoldingBothSlotsIsAnErrorNotAHang) {
    auto cpu = make_cpu_backend();
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, {});
    src->set_schedule(one_pass(*ckpt_));
    auto h0 = src->acquire(0);
    auto h1 = src->acquire(1);
    EXPECT_THROW(src->acquire(2), RuntimeError);
    h0.reset();
    auto h2 = src->acquire(2);
    EXPECT_EQ(check_layer(*h1, *ckpt_, 1, exp_, false), 0);
    EXPECT_EQ(check_layer(*h2, *ckpt_, 2, exp_, false), 0);
}

TEST_F(PrefetchTest, AcquireNeedsASchedule) {
    auto cpu = make_cpu_backend();
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, {});
    EXPECT_THROW(src->acquire(0), RuntimeError);
    EXPECT_THROW(src->set_schedule({}), RuntimeError);
    EXPECT_THROW(src->set_schedule({0, 99}), RuntimeError);
    src->set_schedule({0, 1});
    EXPECT_THROW(src->acquire(3), RuntimeError);  // a layer the (repeating) schedule never reaches
    EXPECT_NE(src->acquire(0), nullptr);
}

TEST_F(PrefetchTest, UnknownTensorNameIsACheckpointError) {
    auto cpu = make_cpu_backend();
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, {});
    src->set_schedule({0});
    auto h = src->acquire(0);
    EXPECT_THROW(h->get("layers.1.attn_norm.weight"), CheckpointError);
}

// ---------------------------------------------------------------------------------------------
// Errors of the reader thread reach acquire() with the file named.
class PrefetchErrorTest : public PrefetchTest, public ::testing::WithParamInterface<bool> {};

TEST_P(PrefetchErrorTest, TruncatedShardIsNamedByAcquire) {
    const bool upload = GetParam();
    const std::string dir = test::copy_golden_model("prefetch-trunc");
    Checkpoint ckpt = Checkpoint::open(dir);
    // Cut the shard of layer 2 inside layer 2's first tensor.
    const TensorLocation* first = first_tensor_of_layer(ckpt, 2);
    ASSERT_NE(first, nullptr);
    const ShardInfo& shard = ckpt.shards().at(static_cast<size_t>(first->shard));
    for (int L = 0; L < 2; ++L)
        for (const TensorLocation* t : tensors_of_layer(ckpt, L))
            ASSERT_NE(t->shard, first->shard) << "test premise: layers 0 and 1 are not in layer 2's shard";

    test::FakeAsyncBackend fake(9, 50);
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.mode = upload ? PrefetchOptions::Mode::Upload : PrefetchOptions::Mode::Direct;
    o.staging_bytes = 65536;
    o.staging_count = 2;
    Backend& be = upload ? static_cast<Backend&>(fake) : *cpu;
    auto src = make_prefetch_weight_source(be, ckpt, o);
    ASSERT_EQ(::truncate(shard.path.c_str(), static_cast<off_t>(first->offset + 3)), 0);
    src->set_schedule(one_pass(ckpt));
    std::mt19937 rng(2);
    for (int L : {0, 1}) {  // layer 2 fails while these are in use: they are still delivered
        auto h = src->acquire(L);
        use_and_poison(*h, ckpt, L, exp_, upload, rng);
    }
    try {
        src->acquire(2);
        FAIL() << "acquire(2) of a truncated shard did not throw";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find(shard.file_name), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("layer 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(src->acquire(3), CheckpointError);  // the source stays failed
}

INSTANTIATE_TEST_SUITE_P(Modes, PrefetchErrorTest, ::testing::Values(false, true));

// Several readers, small requests: the first failed request of layer 2 (its shard is cut inside the
// layer's first bytes) reaches acquire(), and no reader claims a request after a failure. Every
// request of layer 2 fails (all lie past the cut), and each reader has at most one request in flight,
// so at most read_threads requests of layer 2 (or later) are ever issued, out of hundreds.
class PrefetchPieceErrorTest : public PrefetchTest,
                               public ::testing::WithParamInterface<std::tuple<bool, int>> {};

TEST_P(PrefetchPieceErrorTest, FailedRequestStopsTheOtherReaders) {
    const auto [upload, threads] = GetParam();
    const std::string dir = test::copy_golden_model("prefetch-piece-err");
    Checkpoint ckpt = Checkpoint::open(dir);
    const TensorLocation* first = first_tensor_of_layer(ckpt, 2);
    ASSERT_NE(first, nullptr);
    const ShardInfo& shard = ckpt.shards().at(static_cast<size_t>(first->shard));
    for (int L : {0, 1})
        for (const TensorLocation* t : tensors_of_layer(ckpt, L))
            ASSERT_NE(t->shard, first->shard) << "test premise: layers 0 and 1 are not in layer 2's shard";
    for (const TensorLocation* t : tensors_of_layer(ckpt, 2))
        ASSERT_EQ(t->shard, first->shard) << "test premise: layer 2 lies in one shard";
    const uint64_t cut = first->offset + 3;

    const size_t staging = 65536, request = 4096;
    test::FakeAsyncBackend fake(31, 50);
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.mode = upload ? PrefetchOptions::Mode::Upload : PrefetchOptions::Mode::Direct;
    o.staging_bytes = staging;
    o.staging_count = 3;
    o.read_request_bytes = request;
    o.read_threads = threads;
    Backend& be = upload ? static_cast<Backend&>(fake) : *cpu;
    auto src = make_prefetch_weight_source(be, ckpt, o);
    ASSERT_EQ(::truncate(shard.path.c_str(), static_cast<off_t>(cut)), 0);
    const uint64_t layer2_requests = plan_requests(ckpt, 2, upload, staging, request);
    ASSERT_GT(layer2_requests, 8u * static_cast<uint64_t>(threads))
        << "test premise: layer 2 takes many requests";
    src->set_schedule(one_pass(ckpt));
    std::mt19937 rng(12);
    for (int L : {0, 1}) {
        auto h = src->acquire(L);
        use_and_poison(*h, ckpt, L, exp_, upload, rng);
    }
    try {
        src->acquire(2);
        FAIL() << "acquire(2) of a truncated shard did not throw";
    } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find(shard.file_name), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("layer 2"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
    }
    const WeightSourceStats st = src->stats();
    const uint64_t before =
        plan_requests(ckpt, 0, upload, staging, request) + plan_requests(ckpt, 1, upload, staging, request);
    EXPECT_GE(st.read_requests, before + 1);
    EXPECT_LE(st.read_requests, before + static_cast<uint64_t>(threads))
        << "readers went on claiming requests after a failure (layer 2 alone has " << layer2_requests << ")";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // No claim after a failure: the count cannot move (requests in flight only finish).
    EXPECT_EQ(src->stats().read_requests, st.read_requests) << "a reader is still claiming after the failure";
    EXPECT_THROW(src->acquire(3), CheckpointError);
    EXPECT_THROW(src->set_schedule(one_pass(ckpt)), CheckpointError);
}

INSTANTIATE_TEST_SUITE_P(ModesAndThreads, PrefetchPieceErrorTest,
                         ::testing::Combine(::testing::Values(false, true), ::testing::Values(2, 4, 7)));

// ---------------------------------------------------------------------------------------------
// Destruction while the reader and the copy queue are busy: prompt, clean, handles stay valid.
TEST_F(PrefetchTest, DestructorStopsMidPrefetch) {
    using clock = std::chrono::steady_clock;
    for (int variant = 0; variant < 9; ++variant) {
        test::FakeAsyncBackend be(21 + variant, 300);  // up to 0.3 ms per queued copy
        PrefetchOptions o;
        o.mode = PrefetchOptions::Mode::Upload;
        o.staging_bytes = variant < 3 ? 4096 : 16384;
        o.staging_count = 2 + variant % 3;
        o.read_request_bytes = 4096;
        o.read_threads = variant < 3 ? 1 : (variant < 6 ? 4 : 7);  // several requests in flight
        SCOPED_TRACE(strfmt("variant %d, %d readers", variant, o.read_threads));
        auto src = make_prefetch_weight_source(be, *ckpt_, o);
        src->set_schedule(one_pass(*ckpt_));
        std::shared_ptr<ResidentLayer> kept;
        if (variant % 3 >= 1) kept = src->acquire(0);  // then layer 1 is loading
        if (variant % 3 == 1) kept.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        const auto t0 = clock::now();
        src.reset();
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        EXPECT_LT(s, 2.0) << "variant " << variant;
        if (kept) {
            EXPECT_EQ(check_layer(*kept, *ckpt_, 0, exp_, true), 0) << "a handle outlives its source";
        }
    }
    {
        auto cpu = make_cpu_backend();
        auto src = make_prefetch_weight_source(*cpu, *ckpt_, {});
        src->set_schedule(one_pass(*ckpt_));
    }  // destroyed right after the readers started
    // Direct mode, 7 readers writing into the slots with small requests: destroyed mid-read, with and
    // without a handle kept (its bytes stay intact: no reader touches a held slot).
    for (int variant = 0; variant < 4; ++variant) {
        auto cpu = make_cpu_backend();
        PrefetchOptions o;
        o.read_request_bytes = 4096;
        o.staging_bytes = 8192;
        o.read_threads = 7;
        auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
        src->set_schedule(one_pass(*ckpt_));
        std::shared_ptr<ResidentLayer> kept;
        if (variant >= 2) kept = src->acquire(0);
        if (variant % 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const auto t0 = clock::now();
        src.reset();
        EXPECT_LT(std::chrono::duration<double>(clock::now() - t0).count(), 2.0)
            << "direct variant " << variant;
        if (kept) {
            EXPECT_EQ(check_layer(*kept, *ckpt_, 0, exp_, false), 0) << "a handle outlives its source";
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Schedule churn while several requests are in flight: out-of-order acquires (resync) and replaced
// schedules drop layers whose requests / copies are still running; a dropped slot must not be
// reloaded until they are done, or stale bytes would land in the new layer (caught by the checks).
class PrefetchChurnTest : public PrefetchTest, public ::testing::WithParamInterface<std::tuple<bool, int>> {};

TEST_P(PrefetchChurnTest, DroppedLoadsNeverCorruptLaterOnes) {
    const auto [upload, threads] = GetParam();
    test::FakeAsyncBackend fake(41 + threads, 100);
    auto cpu = make_cpu_backend();
    PrefetchOptions o;
    o.mode = upload ? PrefetchOptions::Mode::Upload : PrefetchOptions::Mode::Direct;
    o.staging_bytes = 16384;
    o.staging_count = 3;
    o.read_request_bytes = 4096;
    o.read_threads = threads;
    Backend& be = upload ? static_cast<Backend&>(fake) : *cpu;
    auto src = make_prefetch_weight_source(be, *ckpt_, o);
    const std::vector<int> pass = one_pass(*ckpt_);
    std::mt19937 rng(100 + static_cast<unsigned>(threads));
    std::vector<int> order = pass;
    src->set_schedule(order);
    size_t next = 0;  // index of the next expected entry of `order`
    for (int step = 0; step < 60; ++step) {
        const int action = std::uniform_int_distribution<int>(0, 9)(rng);
        if (action == 0) {  // a new schedule: a random rotation of the pass
            std::rotate(order.begin(),
                        order.begin() + std::uniform_int_distribution<size_t>(0, order.size() - 1)(rng),
                        order.end());
            src->set_schedule(order);
            next = 0;
            continue;
        }
        // Mostly in order; sometimes skip ahead (a resync drops what was prefetched).
        if (action <= 2) next += std::uniform_int_distribution<size_t>(1, 3)(rng);
        const int L = order[next % order.size()];
        auto h = src->acquire(L);
        if (upload) fake.guard_hold(ranges_of(*h, *ckpt_, L));
        use_and_poison(*h, *ckpt_, L, exp_, upload, rng);
        if (upload) fake.guard_release();
        h.reset();
        ++next;
    }
    EXPECT_EQ(fake.violations(), 0);
}

INSTANTIATE_TEST_SUITE_P(ModesAndThreads, PrefetchChurnTest,
                         ::testing::Combine(::testing::Values(false, true), ::testing::Values(1, 3, 7)));

// ---------------------------------------------------------------------------------------------
// The --io flag (IoSettings::direct_weights, through prefetch_options) picks O_DIRECT or buffered reads;
// out-of-range reader settings are input errors naming the flag.
TEST_F(PrefetchTest, IoSettingsPickTheIoMode) {
    auto run = [&](bool direct) {
        auto cpu = make_cpu_backend();
        IoSettings io;
        io.direct_weights = direct;
        io.read_threads = 3;
        io.read_request_mb = 1;
        PrefetchOptions o = prefetch_options(io);
        EXPECT_EQ(o.read_threads, 3);
        EXPECT_EQ(o.read_request_bytes, size_t{1} << 20);
        auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
        src->set_schedule(one_pass(*ckpt_));
        std::mt19937 rng(4);
        for (int L : one_pass(*ckpt_)) {
            auto h = src->acquire(L);
            use_and_poison(*h, *ckpt_, L, exp_, false, rng);
        }
        return src->stats();
    };
    {
        const WeightSourceStats st = run(false);
        EXPECT_GT(st.bytes_read, 0u);
        EXPECT_EQ(st.bytes_read_direct, 0u) << "--io buffered still read with O_DIRECT";
    }
    {
        const WeightSourceStats st = run(true);
        if (accepts_o_direct(ckpt_->shards().at(1).path)) {
            EXPECT_EQ(st.bytes_read_direct, st.bytes_read) << "--io direct did not use O_DIRECT";
        } else {
            EXPECT_EQ(st.bytes_read_direct, 0u);  // the file system refused it: buffered fallback
        }
    }
    auto expect_flag_error = [](IoSettings io, const char* flag) {
        try {
            prefetch_options(io);
            ADD_FAILURE() << flag << " out of range accepted";
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(flag), std::string::npos) << e.what();
        }
    };
    IoSettings bad;
    bad.read_threads = 0;
    expect_flag_error(bad, "--read-threads");
    bad = {};
    bad.read_request_mb = 0;
    expect_flag_error(bad, "--read-request-mb");
    bad = {};
    bad.engram_queue_depth = 2000;
    expect_flag_error(bad, "--engram-queue-depth");
}

TEST_F(PrefetchTest, OptionBoundsAreChecked) {
    auto cpu = make_cpu_backend();
    for (int threads : {0, 33, -1}) {
        PrefetchOptions o;
        o.read_threads = threads;
        EXPECT_THROW(make_prefetch_weight_source(*cpu, *ckpt_, o), RuntimeError) << threads;
    }
    PrefetchOptions o;
    o.read_threads = 32;
    auto src = make_prefetch_weight_source(*cpu, *ckpt_, o);
    src->set_schedule({kHeadLayer});
    EXPECT_EQ(check_layer(*src->acquire(kHeadLayer), *ckpt_, kHeadLayer, exp_, false), 0);
}

// ---------------------------------------------------------------------------------------------
// Plans: alignment, coverage and staging bounds for every layer.
TEST_F(PrefetchTest, PlansRespectAlignmentAndStagingBounds) {
    for (bool upload : {true, false})
        for (size_t staging : {size_t{4096}, size_t{65536}, size_t{1} << 24})
            for (int L : one_pass(*ckpt_)) {
                const LayerPlan p = make_layer_plan(*ckpt_, L, upload, staging);
                SCOPED_TRACE(strfmt("layer %d upload %d staging %zu", L, upload, staging));
                uint64_t copied = 0, read = 0;
                for (const PlanBatch& b : p.batches) {
                    EXPECT_LE(b.used, staging);
                    for (const ReadPiece& r : b.reads) {
                        EXPECT_EQ(r.file_begin % DirectReader::kAlign, 0u);
                        EXPECT_EQ(r.file_end % DirectReader::kAlign, 0u);
                        EXPECT_EQ(r.buf_off % DirectReader::kAlign, 0u);
                        EXPECT_LE(r.file_end - r.file_begin, staging);
                        EXPECT_LE(r.need_end, r.file_end);
                        if (upload) {
                            EXPECT_LE(r.buf_off + (r.file_end - r.file_begin), staging);
                        }
                        read += r.file_end - r.file_begin;
                    }
                    for (const SlotCopy& c : b.copies) {
                        EXPECT_LE(c.src_off + c.bytes, b.used);
                        EXPECT_LE(c.dst_off + c.bytes, p.slot_bytes);
                        copied += c.bytes;
                    }
                }
                EXPECT_EQ(read, p.read_bytes);
                EXPECT_EQ(copied, p.upload_bytes);
                if (!upload) {
                    EXPECT_EQ(p.upload_bytes, 0u);
                }
                size_t n = 0;
                for (const TensorLocation* t : tensors_of_layer(*ckpt_, L)) {
                    const auto it = p.tensors.find(t->name);
                    ASSERT_NE(it, p.tensors.end()) << t->name;
                    EXPECT_LE(it->second.slot_off + t->nbytes, p.slot_bytes);
                    if (upload) {
                        EXPECT_EQ(it->second.slot_off % kTensorAlign, 0u) << t->name;
                    }
                    ++n;
                }
                EXPECT_EQ(n, p.tensors.size());
                // upload mode: each run's tensors at its shift's residue start on kSlotAlign boundaries
                if (upload)
                    for (const ByteRun& run : plan_runs(*ckpt_, L))
                        for (const TensorLocation* t : run.tensors)
                            if (t->offset % kSlotAlign == slot_shift(run)) {
                                EXPECT_EQ(p.tensors.at(t->name).slot_off % kSlotAlign, 0u) << t->name;
                            }
            }
}

// The synchronous source's device copies (a backend whose memory is not the host's): every tensor's bytes
// as in the file, 16-byte aligned, and each run's tensors at its slot_shift residue on 256-byte boundaries.
TEST_F(PrefetchTest, SyncSourceDeviceCopiesPutMostBytesOn256ByteBoundaries) {
    struct DeviceLike : CpuBackend {
        bool host_memory() const override { return false; }
    };
    DeviceLike be;
    auto src = make_sync_weight_source(be, *ckpt_);
    size_t on_boundary = 0;
    for (int L : one_pass(*ckpt_)) {
        if (L == kHeadLayer) continue;  // its runs are the final norm's and the head's, one tensor each
        const auto r = src->acquire(L);
        EXPECT_EQ(check_layer(*r, *ckpt_, L, exp_, true), 0) << "layer " << L;
        for (const ByteRun& run : plan_runs(*ckpt_, L))
            for (const TensorLocation* t : run.tensors)
                if (t->nbytes > 0 && t->offset % kSlotAlign == slot_shift(run)) {
                    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->get(t->name).data) % kSlotAlign, 0u) << t->name;
                    ++on_boundary;
                }
    }
    EXPECT_GT(on_boundary, 0u);
}

// slot_shift: the residue modulo 256 that most tensor bytes share, among the best residue modulo 16.
TEST(PrefetchPlanTest, SlotShiftPutsMostBytesOn256ByteBoundaries) {
    auto loc = [](uint64_t offset, uint64_t nbytes) {
        TensorLocation t;
        t.name = "t" + std::to_string(offset);
        t.shard = 0;
        t.offset = offset;
        t.nbytes = nbytes;
        return t;
    };
    auto shift_of = [](const std::vector<TensorLocation>& ts) {
        ByteRun run;
        run.shard = 0;
        for (const TensorLocation& t : ts) run.tensors.push_back(&t);
        run.begin = ts.front().offset;
        run.end = ts.back().offset + ts.back().nbytes;
        return slot_shift(run);
    };
    // the full-width checkpoints: a few small tensors, then the bulk at 80 mod 256 (before the fix every
    // one of these sat 80 bytes past a 256-byte boundary in its slot)
    EXPECT_EQ(shift_of({loc(4096 + 16, 512), loc(8192 + 80, 1 << 20), loc(8192 + 80 + (1 << 20), 1 << 20),
                        loc(8192 + 80 + (2 << 20) + 48, 64)}),
              80u);
    // the 16-byte residue comes first: 8 mod 16 holds most bytes (a data section at 8 mod 16), so the
    // 256-byte residue is picked among 8, 24, ..., 248 even though 0 mod 256 holds the single largest tensor
    EXPECT_EQ(shift_of({loc(256, 1000), loc(2048 + 8, 700), loc(4096 + 24, 800)}), 24u);
    // ties: the smaller residue
    EXPECT_EQ(shift_of({loc(512 + 32, 100), loc(1024 + 64, 100)}), 32u);
}

// ---------------------------------------------------------------------------------------------
// DirectReader: aligned reads, end of file, the buffered fallback, errors.
TEST(DirectReaderTest, ReadsAlignedRangesAndFallsBack) {
    const std::string path = test::temp_dir("direct-reader") + "/f.bin";
    std::vector<uint8_t> data(10000);
    std::mt19937 rng(4);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), 10000);
    auto buf = std::shared_ptr<void>(std::aligned_alloc(4096, 16384), [](void* p) { std::free(p); });
    auto* b = static_cast<uint8_t*>(buf.get());
    for (auto mode :
         {DirectReader::Mode::Auto, DirectReader::Mode::Buffered, DirectReader::Mode::RefuseDirectForTest}) {
        DirectReader r(path, mode);
        if (mode == DirectReader::Mode::Buffered) {
            EXPECT_FALSE(r.direct());
        }
        std::memset(b, 0, 16384);
        EXPECT_EQ(r.read_aligned(b, 0, 16384), 10000u);
        EXPECT_EQ(std::memcmp(b, data.data(), 10000), 0);
        if (mode == DirectReader::Mode::RefuseDirectForTest) {
            EXPECT_FALSE(r.direct()) << "fell back to buffered";
        }
        EXPECT_EQ(r.read_aligned(b, 8192, 4096), 10000u - 8192u);
        EXPECT_EQ(std::memcmp(b, data.data() + 8192, 10000 - 8192), 0);
        EXPECT_EQ(r.read_aligned(b, 12288, 4096), 0u);
        EXPECT_THROW(r.read_aligned(b + 1, 0, 4096), RuntimeError);
        EXPECT_THROW(r.read_aligned(b, 100, 4096), RuntimeError);
        EXPECT_EQ(r.file_size(), 10000u);
    }
    // Several threads on one reader, including the switch to buffered reads in the middle of them.
    std::vector<uint8_t> big(1 << 20);
    for (auto& x : big) x = static_cast<uint8_t>(rng());
    const std::string big_path = test::temp_dir("direct-reader") + "/big.bin";
    std::ofstream(big_path, std::ios::binary).write(reinterpret_cast<const char*>(big.data()), big.size());
    for (auto mode : {DirectReader::Mode::Auto, DirectReader::Mode::RefuseDirectForTest}) {
        DirectReader r(big_path, mode);
        std::vector<std::thread> threads;
        std::atomic<int> bad{0};
        for (int t = 0; t < 6; ++t)
            threads.emplace_back([&, t] {
                auto mem =
                    std::shared_ptr<void>(std::aligned_alloc(4096, 65536), [](void* p) { std::free(p); });
                for (int i = 0; i < 40; ++i) {
                    const uint64_t off = static_cast<uint64_t>((t * 40 + i) % 240) * 4096;
                    const size_t got = r.read_aligned(mem.get(), off, 65536);
                    const size_t want = std::min<size_t>(65536, big.size() - off);
                    if (got != want || std::memcmp(mem.get(), big.data() + off, want) != 0) bad.fetch_add(1);
                }
            });
        for (auto& th : threads) th.join();
        EXPECT_EQ(bad.load(), 0);
        if (mode == DirectReader::Mode::RefuseDirectForTest) {
            EXPECT_FALSE(r.direct());
        }
    }
    try {
        DirectReader r(path + ".missing", DirectReader::Mode::Auto);
        FAIL() << "opened a missing file";
    } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find("f.bin.missing"), std::string::npos);
    }
}

}  // namespace
