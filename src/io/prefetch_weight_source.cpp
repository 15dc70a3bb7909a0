// The prefetching weight source (docs/DESIGN.md sections 3, 5, 8; contract in include/ds4r/weights.h).
//
// Threads and what they own:
//  - the compute thread (caller): set_schedule / acquire / stats / destructor; the only caller of
//    Backend::synchronize() and CopyQueue::compute_wait().
//  - the reader threads (reader_loop, PrefetchOptions::read_threads of them): each takes the next read
//    request from the fill cursor (claim_request: one cursor walks the schedule's layers, their plan
//    batches and their pieces in file order), reads it with DirectReader into a staging buffer (upload)
//    or the slot (direct), then accounts it (finish_request). The reader that finishes the last request
//    of a staging buffer hands it to the CopyQueue (its copies, then one fence); the one that finishes
//    the last request of a direct-mode layer makes its private copies and marks the layer Ready.
//  - the completion thread (completion_loop, upload mode only): waits for the fences in order, frees
//    their staging buffers, accounts copy-queue busy time and marks a layer Ready after its last fence.
// All shared state lives under Core::mu; the slots' memory lives in Core too, so handles may outlive
// the source. Lock order: queue_mu_ before Core::mu (a staging buffer's copies, its fence and its
// entry in pending_ are issued under queue_mu_, so pending_ holds the fences in increasing order).
// Slot states: Free -> Loading (cursor) -> Ready (last reader or completion thread) -> Held (acquire)
// -> Released (handle destroyed) -> Free (next acquire, after Backend::synchronize()). A dropped slot
// (set_schedule, resync) is Free at once but taken for a new load only when Slot::inflight is 0.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "ds4r/clock.h"
#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/weights.h"
#include "io/direct_reader.h"
#include "io/prefetch_plan.h"

namespace ds4r {

namespace {

enum class SlotState { Free, Loading, Ready, Held, Released };

struct Slot {
    // Memory, fixed at construction.
    Tensor dev;                  // upload mode: backend memory, U8 [capacity + kSlotAlign]
    std::shared_ptr<void> host;  // direct mode: host memory of capacity + kAlign bytes
    uint8_t* base = nullptr;     // aligned base (kSlotAlign upload, DirectReader::kAlign direct)
    size_t base_off = 0;         // upload mode: base - dev.data
    // State, under Core::mu.
    SlotState state = SlotState::Free;
    uint64_t load_id = 0;  // unique per load, 0 = none
    uint64_t pos = 0;      // schedule position of the layer it holds
    std::shared_ptr<const LayerPlan> plan;
    uint64_t last_fence = 0;  // upload mode: the fence after the layer's last copy
    // Read requests into the slot (direct mode) and copy hand-overs into it (upload mode) still
    // running, of this load or of a dropped one: a Free slot starts a new load only when this is 0.
    int inflight = 0;
    int reads_left = 0;        // direct mode: claimed requests of this load not finished yet
    bool all_claimed = false;  // every request of this load has been claimed
    size_t batches_left = 0;   // upload mode: staging buffers of this load whose fence has not completed
    bool any_read = false;     // first_read_at / last_read_at are set
    double first_read_at = 0, last_read_at = 0;  // seconds since the source's t0 (LayerLoadRecord::read_s)
    LayerLoadRecord rec;
};

struct Core {
    std::mutex mu;
    std::condition_variable cv;
    Slot slots[2];
};

class PrefetchedLayer : public ResidentLayer {
public:
    PrefetchedLayer(std::shared_ptr<Core> core, size_t slot, uint64_t load_id,
                    std::shared_ptr<const LayerPlan> plan, uint8_t* base)
        : core_(std::move(core)), slot_(slot), load_id_(load_id), plan_(std::move(plan)), base_(base) {}

    ~PrefetchedLayer() override {
        std::lock_guard<std::mutex> lk(core_->mu);
        Slot& s = core_->slots[slot_];
        if (s.load_id == load_id_ && s.state == SlotState::Held) s.state = SlotState::Released;
        core_->cv.notify_all();
    }

    Tensor get(const std::string& name) const override {
        auto it = plan_->tensors.find(name);
        if (it == plan_->tensors.end())
            throw CheckpointError(strfmt("tensor '%s' is not part of the resident %s (binding bug?)",
                                         name.c_str(), layer_label(plan_->layer).c_str()));
        return tensor_view(base_ + it->second.slot_off, it->second.dtype, it->second.shape);
    }

private:
    std::shared_ptr<Core> core_;
    size_t slot_;
    uint64_t load_id_;
    std::shared_ptr<const LayerPlan> plan_;
    uint8_t* base_;
};

class PrefetchWeightSource : public WeightSource {
public:
    PrefetchWeightSource(Backend& be, const Checkpoint& ckpt, const PrefetchOptions& opt);
    ~PrefetchWeightSource() override;

    void set_schedule(const std::vector<int>& order) override;
    std::shared_ptr<ResidentLayer> acquire(int layer) override;
    WeightSourceStats stats() const override;

private:
    struct StagingBuffer {
        std::shared_ptr<void> mem;
        uint8_t* base = nullptr;  // kAlign aligned
        // Under mu.
        bool busy = false;    // being filled, or its copies are in flight
        int reads_left = 0;   // claimed requests into it not finished yet
        bool sealed = false;  // no further request will be claimed into it (all claimed, or dropped)
    };
    struct PendingFence {
        uint64_t fence = 0;
        size_t staging = 0;
        size_t slot = 0;
        uint64_t load_id = 0;
        double issued_at = 0;
        uint64_t bytes = 0;
        int layer = 0;
    };
    // One read call: [offset, offset + len) of `shard` into dst (kAlign aligned, len <= read_request_).
    struct ReadRequest {
        size_t slot = 0;
        uint64_t load_id = 0, pos = 0;
        const LayerPlan* plan = nullptr;  // owned by plans_ (outlives the threads)
        size_t batch = 0;                 // index in plan->batches
        int staging = -1;                 // upload mode: the staging buffer it fills
        int shard = -1;
        uint64_t offset = 0;
        size_t len = 0;
        uint64_t need_end = 0;  // bytes before this offset must exist (ReadPiece::need_end)
        uint8_t* dst = nullptr;
    };
    // Where the readers are in the schedule: the next request to claim (under mu).
    struct FillCursor {
        bool active = false;  // a load is being claimed
        size_t slot = 0;
        uint64_t load_id = 0, pos = 0;
        const LayerPlan* plan = nullptr;
        size_t batch = 0, read = 0;  // next piece: plan->batches[batch].reads[read]
        uint64_t done = 0;           // bytes of that piece already claimed
        int staging = -1;            // upload mode: the staging buffer of the current batch, -1: none yet
    };

    // Schedule helpers (under mu).
    int layer_at(uint64_t pos) const;
    bool has_position(uint64_t pos) const { return layer_at(pos) != kNoLayer; }
    // Drops loading / loaded layers of schedule positions < keep_from.
    void discard_prefetched(uint64_t keep_from);
    void recycle_released(std::unique_lock<std::mutex>& lk);
    void resync(std::unique_lock<std::mutex>& lk, int layer);

    // Reader threads.
    void reader_loop();
    bool claim_request(ReadRequest& rq);  // under mu; false: nothing to claim now
    bool start_load();                    // under mu; false: no position or no slot
    void drop_cursor();                   // under mu
    void run_request(const ReadRequest& rq);
    void finish_request(const ReadRequest& rq, size_t got, bool direct, double t_begin, double t_end,
                        std::exception_ptr err);
    void hand_over_staging(std::unique_lock<std::mutex>& lk, const ReadRequest& rq);
    void complete_direct_load(std::unique_lock<std::mutex>& lk, const ReadRequest& rq);
    void record_error(std::exception_ptr e, uint64_t pos);                        // under mu
    bool load_failed(uint64_t pos) const { return error_ && pos >= error_pos_; }  // under mu
    DirectReader& reader(int shard, const LayerPlan& plan);

    void completion_loop();
    void shutdown();  // stops and joins every thread; idempotent

    static constexpr int kNoLayer = -1000000;

    Backend& be_;
    PrefetchOptions opt_;
    bool upload_ = true;
    bool direct_io_ = true;  // PrefetchOptions::direct_io (--io)
    size_t staging_bytes_ = 0, read_request_ = 0;
    std::map<int, std::shared_ptr<const LayerPlan>> plans_;  // immutable after construction
    std::shared_ptr<Core> core_;
    std::unique_ptr<CopyQueue> queue_;
    // Copies + fence + pending_ entry of a staging buffer, and compute_wait(): a fence's event is never
    // retired mid-wait and fences enter pending_ in increasing order.
    std::mutex queue_mu_;
    std::vector<StagingBuffer> staging_;
    double t0_ = 0;

    // Under core_->mu.
    std::vector<int> order_;
    bool scheduled_ = false;
    uint64_t acquire_pos_ = 0, next_load_pos_ = 0, load_counter_ = 0;
    FillCursor cursor_;
    std::deque<PendingFence> pending_;
    bool stop_ = false, completion_stop_ = false;
    std::exception_ptr error_;
    uint64_t error_pos_ = 0;   // schedule position of the failed load: earlier ones are still delivered
    int reads_in_flight_ = 0;  // claimed requests not finished (for stats_.read_seconds)
    double busy_since_ = 0;    // when reads_in_flight_ last left 0
    WeightSourceStats stats_;

    std::mutex readers_mu_;  // readers_ (the DirectReaders themselves are thread safe)
    std::map<int, std::unique_ptr<DirectReader>> readers_;
    // Completion thread only.
    double last_completion_ = 0;

    std::vector<std::thread> reader_threads_;
    std::thread completion_thread_;
};

PrefetchWeightSource::PrefetchWeightSource(Backend& be, const Checkpoint& ckpt, const PrefetchOptions& opt)
    : be_(be), opt_(opt), core_(std::make_shared<Core>()) {
    t0_ = now_s();
    DS4R_CHECK(opt.staging_count >= 2 && opt.staging_count <= 32,
               "prefetch: staging_count %d outside [2, 32]", opt.staging_count);
    DS4R_CHECK(opt.read_threads >= 1 && opt.read_threads <= 32, "prefetch: read_threads %d outside [1, 32]",
               opt.read_threads);
    direct_io_ = opt.direct_io;
    staging_bytes_ =
        static_cast<size_t>(align_up(std::max<size_t>(opt.staging_bytes, 1), DirectReader::kAlign));
    read_request_ =
        static_cast<size_t>(align_up(std::max<size_t>(opt.read_request_bytes, 1), DirectReader::kAlign));
    upload_ = opt.mode == PrefetchOptions::Mode::Upload ||
              (opt.mode == PrefetchOptions::Mode::Auto && !be.host_memory());
    DS4R_CHECK(upload_ || be.host_memory(), "prefetch: direct mode needs a host-memory backend (%s)",
               be.name().c_str());

    // Plans of every layer and the head; the slots fit the largest.
    size_t capacity = 0, private_tensors = 0;
    std::vector<int> ids;
    for (int L = 0; L < static_cast<int>(ckpt.config().n_layers); ++L) ids.push_back(L);
    ids.push_back(kHeadLayer);
    for (int L : ids) {
        auto plan = std::make_shared<LayerPlan>(make_layer_plan(ckpt, L, upload_, staging_bytes_));
        capacity = std::max(capacity, plan->slot_bytes);
        private_tensors += plan->private_tensors;
        plans_[L] = std::move(plan);
    }
    if (private_tensors > 0)
        log_info(strfmt(
            "weights: %zu tensors are not aligned in their shard (%s): each gets its own aligned copy in "
            "the layer slot",
            private_tensors,
            upload_ ? "file offset off a 16-byte boundary" : "offset not a multiple of the dtype size"));

    for (Slot& s : core_->slots) {
        if (upload_) {
            s.dev = be.alloc(DType::U8, {static_cast<int64_t>(capacity + kSlotAlign)});
            const auto addr = reinterpret_cast<uintptr_t>(s.dev.data);
            s.base_off = static_cast<size_t>(align_up(addr, kSlotAlign) - addr);
            s.base = static_cast<uint8_t*>(s.dev.data) + s.base_off;
            stats_.device_bytes += s.dev.nbytes();
        } else {
            s.host = be.alloc_host(capacity + DirectReader::kAlign);
            const auto addr = reinterpret_cast<uintptr_t>(s.host.get());
            s.base = static_cast<uint8_t*>(s.host.get()) + (align_up(addr, DirectReader::kAlign) - addr);
            stats_.host_bytes += capacity + DirectReader::kAlign;
        }
    }
    if (upload_) {
        be.synchronize();  // stream-ordered allocation: complete before the copy queue writes the slots
        queue_ = be.make_copy_queue();
        staging_.resize(static_cast<size_t>(opt.staging_count));
        for (StagingBuffer& b : staging_) {
            b.mem = be.alloc_host(staging_bytes_ + DirectReader::kAlign);
            const auto addr = reinterpret_cast<uintptr_t>(b.mem.get());
            b.base = static_cast<uint8_t*>(b.mem.get()) + (align_up(addr, DirectReader::kAlign) - addr);
            stats_.host_bytes += staging_bytes_ + DirectReader::kAlign;
        }
    }
    log_debug(strfmt("weights: prefetching (%s mode) with %d reader threads, requests of %zu KiB, %s reads",
                     upload_ ? "upload" : "direct", opt.read_threads, read_request_ >> 10,
                     direct_io_ ? "O_DIRECT" : "buffered"));
    try {
        if (upload_) completion_thread_ = std::thread([this] { completion_loop(); });
        for (int i = 0; i < opt.read_threads; ++i) reader_threads_.emplace_back([this] { reader_loop(); });
    } catch (...) {
        shutdown();
        throw;
    }
}

PrefetchWeightSource::~PrefetchWeightSource() {
    shutdown();
}

void PrefetchWeightSource::shutdown() {
    {
        std::lock_guard<std::mutex> lk(core_->mu);
        stop_ = true;
    }
    core_->cv.notify_all();
    for (std::thread& t : reader_threads_)
        if (t.joinable()) t.join();  // each finishes the request it is reading (at most read_request_)
    if (completion_thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lk(core_->mu);
            completion_stop_ = true;  // after the readers: every fence they issued is waited for
        }
        core_->cv.notify_all();
        completion_thread_.join();
    }
    queue_.reset();  // waits for the copies still in flight before the staging buffers go
    staging_.clear();
}

int PrefetchWeightSource::layer_at(uint64_t pos) const {
    const uint64_t n = order_.size();
    if (n == 0 || (!opt_.repeat_schedule && pos >= n)) return kNoLayer;
    return order_[static_cast<size_t>(pos % n)];
}

void PrefetchWeightSource::discard_prefetched(uint64_t keep_from) {
    // Requests and copies already issued into a dropped slot finish on their own: Slot::inflight keeps
    // the slot from a new load until they are done, and the cursor notices at its next claim.
    for (Slot& s : core_->slots)
        if ((s.state == SlotState::Loading || s.state == SlotState::Ready) && s.pos < keep_from) {
            s.state = SlotState::Free;
            s.load_id = 0;
            s.plan.reset();
        }
}

void PrefetchWeightSource::recycle_released(std::unique_lock<std::mutex>& lk) {
    bool any = false;
    for (const Slot& s : core_->slots) any = any || s.state == SlotState::Released;
    if (!any) return;
    // Work already queued on the compute stream may still read the released layer: let it finish
    // before its slot is overwritten (the contract's rule 2).
    lk.unlock();
    be_.synchronize();
    lk.lock();
    for (Slot& s : core_->slots)
        if (s.state == SlotState::Released) {
            s.state = SlotState::Free;
            s.load_id = 0;
            s.plan.reset();
        }
    core_->cv.notify_all();
}

void PrefetchWeightSource::resync(std::unique_lock<std::mutex>&, int layer) {
    const uint64_t n = order_.size();
    const uint64_t limit = opt_.repeat_schedule ? acquire_pos_ + n : n;
    uint64_t p = acquire_pos_;
    while (p < limit && layer_at(p) != layer) ++p;
    const int expected = layer_at(acquire_pos_);
    if (p >= limit)
        DS4R_THROW(RuntimeError, "weights: acquire(%s) does not occur in the %sschedule (next expected: %s)",
                   layer_label(layer).c_str(), opt_.repeat_schedule ? "" : "rest of the ",
                   expected == kNoLayer ? "none, the schedule is over" : layer_label(expected).c_str());
    log_warn(strfmt("weights: acquire(%s) out of schedule order (expected %s): prefetch restarted there",
                    layer_label(layer).c_str(), layer_label(expected).c_str()));
    // Positions from p on that are loading or loaded stay (loads run in schedule order).
    discard_prefetched(p);
    acquire_pos_ = p;
    next_load_pos_ = std::max(next_load_pos_, p);
    core_->cv.notify_all();
}

void PrefetchWeightSource::set_schedule(const std::vector<int>& order) {
    DS4R_CHECK(!order.empty(), "weights: empty schedule");
    for (int L : order)
        DS4R_CHECK(plans_.count(L),
                   "weights: schedule entry %d is neither a layer of the checkpoint nor the head", L);
    std::lock_guard<std::mutex> lk(core_->mu);
    if (error_) std::rethrow_exception(error_);
    discard_prefetched(UINT64_MAX);
    order_ = order;
    scheduled_ = true;
    acquire_pos_ = next_load_pos_ = 0;
    core_->cv.notify_all();
}

std::shared_ptr<ResidentLayer> PrefetchWeightSource::acquire(int layer) {
    const double t_begin = now_s();
    DS4R_CHECK(plans_.count(layer), "weights: acquire(%d): neither a layer of the checkpoint nor the head",
               layer);
    std::unique_lock<std::mutex> lk(core_->mu);
    DS4R_CHECK(scheduled_, "weights: acquire(%s) before set_schedule()", layer_label(layer).c_str());
    recycle_released(lk);
    if (layer_at(acquire_pos_) != layer) resync(lk, layer);
    size_t si = 0;
    for (;;) {
        bool found = false, all_held = true, released = false;
        for (size_t i = 0; i < 2; ++i) {
            const Slot& s = core_->slots[i];
            if (s.state == SlotState::Ready && s.pos == acquire_pos_) {
                si = i;
                found = true;
            }
            all_held = all_held && s.state == SlotState::Held;
            released = released || s.state == SlotState::Released;
        }
        if (found) break;
        if (error_) {
            // A layer before the failed one had every request claimed before the failure: its
            // requests and copies still complete. Anything else will never arrive (the readers stopped).
            bool coming = false;
            for (const Slot& s : core_->slots)
                coming = coming || (s.state == SlotState::Loading && s.pos == acquire_pos_ && s.all_claimed);
            if (!coming || acquire_pos_ >= error_pos_) std::rethrow_exception(error_);
        }
        if (released) {  // a handle was destroyed on another thread while we waited
            recycle_released(lk);
            continue;
        }
        if (all_held)
            DS4R_THROW(
                RuntimeError,
                "weights: acquire(%s) while the handles of both weight slots are held: destroy the previous "
                "layer's handle before acquiring the next",
                layer_label(layer).c_str());
        core_->cv.wait(lk);
    }
    Slot& s = core_->slots[si];
    s.state = SlotState::Held;
    ++acquire_pos_;
    const double t_end = now_s();
    s.rec.wait_s = t_end - t_begin;
    s.rec.acquired_at_s = t_end - t0_;
    stats_.wait_seconds += s.rec.wait_s;
    stats_.layers.push_back(s.rec);
    const uint64_t fence = s.last_fence;
    auto handle = std::make_shared<PrefetchedLayer>(core_, si, s.load_id, s.plan, s.base);
    lk.unlock();
    if (upload_ && fence != 0) {
        std::lock_guard<std::mutex> q(queue_mu_);
        queue_->compute_wait(fence);
    }
    return handle;
}

WeightSourceStats PrefetchWeightSource::stats() const {
    std::lock_guard<std::mutex> lk(core_->mu);
    WeightSourceStats st = stats_;
    // Readers that never went idle (a read-bound run) leave their busy interval open: count it.
    if (reads_in_flight_ > 0) st.read_seconds += now_s() - busy_since_;
    return st;
}

// ---------------------------------------------------------------------------------------------
// Reader threads

void PrefetchWeightSource::reader_loop() {
    for (;;) {
        ReadRequest rq;
        {
            std::unique_lock<std::mutex> lk(core_->mu);
            for (;;) {
                if (stop_ || error_) return;  // the first failure stops every reader
                if (claim_request(rq)) break;
                core_->cv.wait(lk);
            }
        }
        run_request(rq);
    }
}

bool PrefetchWeightSource::start_load() {
    if (!scheduled_ || !has_position(next_load_pos_)) return false;
    int si = -1;
    for (int i = 0; i < 2 && si < 0; ++i)
        if (core_->slots[i].state == SlotState::Free && core_->slots[i].inflight == 0) si = i;
    if (si < 0) return false;
    const uint64_t pos = next_load_pos_++;
    const uint64_t load_id = ++load_counter_;
    const std::shared_ptr<const LayerPlan>& plan = plans_.at(layer_at(pos));
    Slot& s = core_->slots[si];
    s.state = SlotState::Loading;
    s.load_id = load_id;
    s.pos = pos;
    s.plan = plan;
    s.last_fence = 0;
    s.reads_left = 0;
    s.all_claimed = plan->batches.empty();
    s.batches_left = plan->batches.size();
    s.any_read = false;
    s.rec = LayerLoadRecord{};
    s.rec.layer = plan->layer;
    s.rec.position = pos;
    s.rec.bytes = plan->tensor_bytes;
    s.rec.load_begin_at_s = now_s() - t0_;
    if (plan->batches.empty()) {  // nothing to read (no such layer in practice; the plan allows it)
        s.state = SlotState::Ready;
        s.rec.ready_at_s = s.rec.load_begin_at_s;
        core_->cv.notify_all();
        return true;
    }
    cursor_ = FillCursor{true, static_cast<size_t>(si), load_id, pos, plan.get(), 0, 0, 0, -1};
    return true;
}

void PrefetchWeightSource::drop_cursor() {
    if (upload_ && cursor_.staging >= 0) {
        StagingBuffer& b = staging_[static_cast<size_t>(cursor_.staging)];
        b.sealed = true;
        if (b.reads_left == 0) b.busy = false;  // else the last request in flight frees it
    }
    cursor_ = FillCursor{};
}

bool PrefetchWeightSource::claim_request(ReadRequest& rq) {
    for (;;) {
        if (!cursor_.active) {
            if (!start_load()) return false;
            continue;
        }
        Slot& s = core_->slots[cursor_.slot];
        if (s.load_id != cursor_.load_id || s.state != SlotState::Loading) {  // dropped by the compute thread
            drop_cursor();
            continue;
        }
        const LayerPlan& plan = *cursor_.plan;
        const PlanBatch& batch = plan.batches[cursor_.batch];
        uint8_t* buf = s.base;
        if (upload_) {
            if (cursor_.staging < 0) {
                for (size_t i = 0; i < staging_.size() && cursor_.staging < 0; ++i)
                    if (!staging_[i].busy) cursor_.staging = static_cast<int>(i);
                if (cursor_.staging < 0) return false;  // every buffer is filling or uploading
                StagingBuffer& b = staging_[static_cast<size_t>(cursor_.staging)];
                b.busy = true;
                b.reads_left = 0;
                b.sealed = false;
            }
            buf = staging_[static_cast<size_t>(cursor_.staging)].base;
        }
        const ReadPiece& p = batch.reads[cursor_.read];
        const uint64_t piece_len = p.file_end - p.file_begin;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(read_request_, piece_len - cursor_.done));
        rq = ReadRequest{cursor_.slot,
                         cursor_.load_id,
                         cursor_.pos,
                         cursor_.plan,
                         cursor_.batch,
                         cursor_.staging,
                         p.shard,
                         p.file_begin + cursor_.done,
                         n,
                         p.need_end,
                         buf + p.buf_off + static_cast<size_t>(cursor_.done)};
        if (upload_) {
            ++staging_[static_cast<size_t>(cursor_.staging)].reads_left;
        } else {
            ++s.reads_left;
            ++s.inflight;
        }
        cursor_.done += n;
        if (cursor_.done == piece_len) {
            cursor_.done = 0;
            if (++cursor_.read == batch.reads.size()) {  // the batch is fully claimed
                cursor_.read = 0;
                if (upload_) {
                    staging_[static_cast<size_t>(cursor_.staging)].sealed = true;
                    cursor_.staging = -1;
                }
                if (++cursor_.batch == plan.batches.size()) {  // and so is the layer
                    s.all_claimed = true;
                    cursor_ = FillCursor{};
                }
            }
        }
        ++stats_.read_requests;
        if (reads_in_flight_++ == 0) busy_since_ = now_s();
        return true;
    }
}

DirectReader& PrefetchWeightSource::reader(int shard, const LayerPlan& plan) {
    std::lock_guard<std::mutex> lk(readers_mu_);
    auto it = readers_.find(shard);
    if (it == readers_.end()) {
        const auto mode = direct_io_ ? DirectReader::Mode::Auto : DirectReader::Mode::Buffered;
        it = readers_
                 .emplace(shard, std::make_unique<DirectReader>(
                                     plan.shard_paths.at(static_cast<size_t>(shard)), mode))
                 .first;
    }
    return *it->second;
}

void PrefetchWeightSource::run_request(const ReadRequest& rq) {
    size_t got = 0;
    bool direct = false;
    std::exception_ptr err;
    const double t_begin = now_s();
    try {
        DirectReader& r = reader(rq.shard, *rq.plan);
        got = r.read_aligned(rq.dst, rq.offset, rq.len, &direct);
        // Bytes past need_end may be missing (past the end of the file); those before it must be there.
        if (rq.offset + got < std::min<uint64_t>(rq.offset + rq.len, rq.need_end))
            DS4R_THROW(
                CheckpointError,
                "%s: truncated shard: the %s needs its bytes up to offset %llu but the file ends at %llu",
                r.path().c_str(), layer_label(rq.plan->layer).c_str(), (unsigned long long)rq.need_end,
                (unsigned long long)r.file_size());
    } catch (...) {
        err = with_context(std::current_exception(),
                           strfmt("weights: loading the %s (schedule position %llu)",
                                  layer_label(rq.plan->layer).c_str(), (unsigned long long)rq.pos));
    }
    finish_request(rq, got, direct, t_begin, now_s(), err);
}

void PrefetchWeightSource::record_error(std::exception_ptr e, uint64_t pos) {
    // The earliest failed position wins: acquire() delivers every layer before it.
    if (!error_ || pos < error_pos_) {
        error_ = std::move(e);
        error_pos_ = pos;
    }
}

void PrefetchWeightSource::finish_request(const ReadRequest& rq, size_t got, bool direct, double t_begin,
                                          double t_end, std::exception_ptr err) {
    std::unique_lock<std::mutex> lk(core_->mu);
    stats_.bytes_read += got;
    if (direct) stats_.bytes_read_direct += got;
    if (--reads_in_flight_ == 0) stats_.read_seconds += now_s() - busy_since_;
    Slot& s = core_->slots[rq.slot];
    const bool current = s.load_id == rq.load_id && s.state == SlotState::Loading;
    if (current) {
        s.rec.bytes_read += got;
        s.first_read_at = s.any_read ? std::min(s.first_read_at, t_begin - t0_) : t_begin - t0_;
        s.last_read_at = s.any_read ? std::max(s.last_read_at, t_end - t0_) : t_end - t0_;
        s.any_read = true;
        s.rec.read_s = s.last_read_at - s.first_read_at;
        if (err) record_error(err, rq.pos);
    } else if (err) {
        // The load was dropped (new schedule, resync): its bytes are not needed any more. A real
        // problem with the shard shows again when the layer is loaded for a later position.
        try {
            std::rethrow_exception(err);
        } catch (const std::exception& e) {
            log_warn(strfmt("%s (a dropped prefetch; ignored)", e.what()));
        }
    }
    if (upload_) {
        StagingBuffer& b = staging_[static_cast<size_t>(rq.staging)];
        if (--b.reads_left == 0 && b.sealed) hand_over_staging(lk, rq);
    } else {
        --s.inflight;
        if (current && --s.reads_left == 0 && s.all_claimed) complete_direct_load(lk, rq);
    }
    core_->cv.notify_all();  // a slot's inflight may have reached 0, a buffer or a layer may be ready
}

// Upload mode, every request of a staging buffer is in: its copies and one fence go to the queue.
void PrefetchWeightSource::hand_over_staging(std::unique_lock<std::mutex>& lk, const ReadRequest& rq) {
    StagingBuffer& b = staging_[static_cast<size_t>(rq.staging)];
    Slot& s = core_->slots[rq.slot];
    if (s.load_id != rq.load_id || s.state != SlotState::Loading || stop_ || load_failed(rq.pos)) {
        b.busy = false;  // dropped, stopping, or failed: nothing to upload
        return;
    }
    ++s.inflight;  // the slot is not reloaded while its copies are being issued
    lk.unlock();
    const PlanBatch& batch = rq.plan->batches[rq.batch];
    const double issued = now_s();
    uint64_t bytes = 0, fence = 0;
    std::exception_ptr err;
    std::lock_guard<std::mutex> q(queue_mu_);
    try {
        for (const SlotCopy& c : batch.copies) {
            queue_->copy(s.dev, s.base_off + c.dst_off, b.base + c.src_off, c.bytes);
            bytes += c.bytes;
        }
        fence = queue_->fence();
    } catch (...) {
        err = with_context(std::current_exception(),
                           strfmt("weights: uploading the %s (schedule position %llu)",
                                  layer_label(rq.plan->layer).c_str(), (unsigned long long)rq.pos));
    }
    lk.lock();  // queue_mu_ before Core::mu
    --s.inflight;
    if (err) {
        record_error(err, rq.pos);  // b stays busy: copies already queued may still read it
        return;
    }
    pending_.push_back(PendingFence{fence, static_cast<size_t>(rq.staging), rq.slot, rq.load_id, issued,
                                    bytes, rq.plan->layer});
}

// Direct mode, the layer's last request is in: its private copies (slot -> slot), then Ready.
void PrefetchWeightSource::complete_direct_load(std::unique_lock<std::mutex>& lk, const ReadRequest& rq) {
    Slot& s = core_->slots[rq.slot];
    if (stop_ || load_failed(rq.pos)) return;
    ++s.inflight;
    lk.unlock();
    for (const SlotCopy& c : rq.plan->private_copies)
        std::memcpy(s.base + c.dst_off, s.base + c.src_off, c.bytes);
    lk.lock();
    --s.inflight;
    if (s.load_id == rq.load_id && s.state == SlotState::Loading) {
        s.state = SlotState::Ready;
        s.rec.ready_at_s = now_s() - t0_;
    }
}

// ---------------------------------------------------------------------------------------------
// Completion thread (upload mode)

void PrefetchWeightSource::completion_loop() {
    for (;;) {
        PendingFence p;
        {
            std::unique_lock<std::mutex> lk(core_->mu);
            core_->cv.wait(lk, [&] { return !pending_.empty() || completion_stop_; });
            if (pending_.empty()) return;
            p = pending_.front();
            pending_.pop_front();
        }
        std::exception_ptr err;
        try {
            queue_->host_wait(p.fence);
        } catch (...) {
            err = std::current_exception();
        }
        const double done = now_s();
        std::lock_guard<std::mutex> lk(core_->mu);
        staging_[p.staging].busy = false;
        Slot& s = core_->slots[p.slot];
        if (err) {
            if (!error_ || error_pos_ > 0) {  // a failed copy queue is fatal: every further acquire() throws
                error_ = with_context(
                    err, strfmt("weights: waiting for the upload of the %s", layer_label(p.layer).c_str()));
                error_pos_ = 0;
            }
        } else {
            // The queue runs copies in order: a buffer's busy time starts when it was issued or when the
            // previous one completed, whichever is later.
            const double busy = done - std::max(p.issued_at, last_completion_);
            last_completion_ = done;
            stats_.upload_seconds += busy;
            stats_.bytes_uploaded += p.bytes;
            if (s.load_id == p.load_id && s.state == SlotState::Loading) {
                s.rec.upload_s += busy;
                s.rec.bytes_uploaded += p.bytes;
                if (--s.batches_left == 0) {  // fences complete in order: this is the layer's last
                    s.state = SlotState::Ready;
                    s.last_fence = p.fence;
                    s.rec.ready_at_s = done - t0_;
                }
            }
        }
        core_->cv.notify_all();
    }
}

}  // namespace

std::unique_ptr<WeightSource> make_prefetch_weight_source(Backend& be, const Checkpoint& ckpt,
                                                          const PrefetchOptions& opt) {
    return std::make_unique<PrefetchWeightSource>(be, ckpt, opt);
}

}  // namespace ds4r
