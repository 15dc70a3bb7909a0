// The prefetching weight source (DESIGN.md sections 3, 5, 8; contract in include/ds4r/weights.h).
//
// Threads and what they own:
//  - the compute thread (caller): set_schedule / acquire / stats / destructor; the only caller of
//    Backend::synchronize() and CopyQueue::compute_wait().
//  - the reader thread (prefetch_loop): picks the next schedule position when a slot is free, reads its
//    pieces (DirectReader, O_DIRECT) into a staging buffer (upload) or the slot (direct), issues the
//    copies of each staging buffer and one fence, and hands the fence to the completion thread.
//  - the completion thread (completion_loop, upload mode only): waits for the fences in order, frees
//    their staging buffers, accounts copy-queue busy time and marks a layer Ready after its last fence.
// All shared state lives under Core::mu; the slots' memory lives in Core too, so handles may outlive
// the source. Slot states: Free -> Loading (reader) -> Ready (reader or completion thread) -> Held
// (acquire) -> Released (handle destroyed) -> Free (next acquire, after Backend::synchronize()).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/weights.h"
#include "io/direct_reader.h"
#include "io/prefetch_plan.h"

namespace ds4r {

namespace {

double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string layer_label(int layer) { return layer == kHeadLayer ? std::string("head") : strfmt("layer %d", layer); }

// The same kind of error with `context` in front of the message (a CheckpointError stays exit code 3).
std::exception_ptr with_context(std::exception_ptr e, const std::string& context) {
    try {
        std::rethrow_exception(e);
    } catch (const Error& err) {
        const std::string msg = context + ": " + err.what();
        switch (err.kind()) {
            case ErrorKind::Checkpoint: return std::make_exception_ptr(CheckpointError(msg));
            case ErrorKind::Usage: return std::make_exception_ptr(InputError(msg));
            case ErrorKind::Runtime: break;
        }
        return std::make_exception_ptr(RuntimeError(msg));
    } catch (const std::bad_alloc&) {
        return std::make_exception_ptr(RuntimeError(context + ": out of host memory"));
    } catch (const std::exception& err) {
        return std::make_exception_ptr(RuntimeError(context + ": " + err.what()));
    } catch (...) {
        return std::make_exception_ptr(RuntimeError(context + ": unknown error"));
    }
}

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
    LayerLoadRecord rec;
};

struct Core {
    std::mutex mu;
    std::condition_variable cv;
    Slot slots[2];
};

class PrefetchedLayer : public ResidentLayer {
public:
    PrefetchedLayer(std::shared_ptr<Core> core, size_t slot, uint64_t load_id, std::shared_ptr<const LayerPlan> plan,
                    uint8_t* base)
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
            throw CheckpointError(strfmt("tensor '%s' is not part of the resident %s (binding bug?)", name.c_str(),
                                         layer_label(plan_->layer).c_str()));
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
        bool busy = false;        // under mu: filled / copy in flight
    };
    struct PendingFence {
        uint64_t fence = 0;
        size_t staging = 0;
        size_t slot = 0;
        uint64_t load_id = 0;
        double issued_at = 0;
        uint64_t bytes = 0;
        int layer = 0;
        bool last = false;  // the layer's last staging buffer
    };

    // Schedule helpers (under mu).
    int layer_at(uint64_t pos) const;
    bool has_position(uint64_t pos) const { return layer_at(pos) != kNoLayer; }
    // Drops loading / loaded layers of schedule positions < keep_from.
    void discard_prefetched(uint64_t keep_from);
    void recycle_released(std::unique_lock<std::mutex>& lk);
    void resync(std::unique_lock<std::mutex>& lk, int layer);

    void prefetch_loop();
    void completion_loop();
    // One load into slot `si`; false when abandoned (stop, or the schedule changed).
    bool load(size_t si, uint64_t load_id, uint64_t gen, const LayerPlan& plan);
    bool read_pieces(const PlanBatch& batch, uint8_t* buf, size_t si, uint64_t load_id, uint64_t gen,
                     const LayerPlan& plan);
    bool abandoned(uint64_t gen) const { return stop_.load() || gen_.load() != gen; }
    DirectReader& reader(int shard, const LayerPlan& plan);

    static constexpr int kNoLayer = -1000000;

    Backend& be_;
    PrefetchOptions opt_;
    bool upload_ = true;
    size_t staging_bytes_ = 0, read_request_ = 0;
    std::map<int, std::shared_ptr<const LayerPlan>> plans_;  // immutable after construction
    std::shared_ptr<Core> core_;
    std::unique_ptr<CopyQueue> queue_;
    std::mutex queue_mu_;  // fence() vs compute_wait(): a fence's event is never retired mid-wait
    std::vector<StagingBuffer> staging_;
    double t0_ = 0;

    // Under core_->mu.
    std::vector<int> order_;
    bool scheduled_ = false;
    uint64_t acquire_pos_ = 0, next_load_pos_ = 0, load_counter_ = 0;
    std::deque<PendingFence> pending_;
    bool completion_stop_ = false;
    std::exception_ptr error_;
    uint64_t error_pos_ = 0;  // schedule position of the failed load: earlier ones are still delivered
    WeightSourceStats stats_;

    std::atomic<bool> stop_{false};
    std::atomic<uint64_t> gen_{0};  // bumped when prefetched work is dropped

    // Reader thread only.
    std::map<int, std::unique_ptr<DirectReader>> readers_;
    size_t next_staging_ = 0;
    // Completion thread only.
    double last_completion_ = 0;

    std::thread reader_thread_, completion_thread_;
};

PrefetchWeightSource::PrefetchWeightSource(Backend& be, const Checkpoint& ckpt, const PrefetchOptions& opt)
    : be_(be), opt_(opt), core_(std::make_shared<Core>()) {
    t0_ = now_s();
    DS4R_CHECK(opt.staging_count >= 2 && opt.staging_count <= 32, "prefetch: staging_count %d outside [2, 32]",
               opt.staging_count);
    staging_bytes_ = static_cast<size_t>(align_up(std::max<size_t>(opt.staging_bytes, 1), DirectReader::kAlign));
    read_request_ = static_cast<size_t>(align_up(std::max<size_t>(opt.read_request_bytes, 1), DirectReader::kAlign));
    upload_ = opt.mode == PrefetchOptions::Mode::Upload ||
              (opt.mode == PrefetchOptions::Mode::Auto && !be.host_memory());
    DS4R_CHECK(upload_ || be.host_memory(), "prefetch: direct mode needs a host-memory backend (%s)", be.name().c_str());

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
        log_info(strfmt("weights: %zu tensors are not aligned in their shard (%s): each gets its own aligned copy in "
                        "the layer slot",
                        private_tensors, upload_ ? "file offset off a 16-byte boundary" : "offset not a multiple of the dtype size"));

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
        completion_thread_ = std::thread([this] { completion_loop(); });
    }
    try {
        reader_thread_ = std::thread([this] { prefetch_loop(); });
    } catch (...) {
        if (completion_thread_.joinable()) {
            {
                std::lock_guard<std::mutex> lk(core_->mu);
                completion_stop_ = true;
            }
            core_->cv.notify_all();
            completion_thread_.join();
        }
        throw;
    }
}

PrefetchWeightSource::~PrefetchWeightSource() {
    {
        std::lock_guard<std::mutex> lk(core_->mu);
        stop_ = true;
    }
    core_->cv.notify_all();
    if (reader_thread_.joinable()) reader_thread_.join();
    if (completion_thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lk(core_->mu);
            completion_stop_ = true;  // after the reader: every fence it issued is waited for
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
    for (Slot& s : core_->slots)
        if ((s.state == SlotState::Loading || s.state == SlotState::Ready) && s.pos < keep_from) {
            if (s.state == SlotState::Loading) gen_.fetch_add(1);  // the reader abandons it at its next check
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
        DS4R_CHECK(plans_.count(L), "weights: schedule entry %d is neither a layer of the checkpoint nor the head", L);
    std::lock_guard<std::mutex> lk(core_->mu);
    if (error_) std::rethrow_exception(error_);
    discard_prefetched(UINT64_MAX);
    gen_.fetch_add(1);
    order_ = order;
    scheduled_ = true;
    acquire_pos_ = next_load_pos_ = 0;
    core_->cv.notify_all();
}

std::shared_ptr<ResidentLayer> PrefetchWeightSource::acquire(int layer) {
    const double t_begin = now_s();
    DS4R_CHECK(plans_.count(layer), "weights: acquire(%d): neither a layer of the checkpoint nor the head", layer);
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
            // A layer loaded before the failure was fully issued and still completes; anything else
            // will never arrive (the reader has stopped).
            bool coming = false;
            for (const Slot& s : core_->slots)
                coming = coming || (s.state == SlotState::Loading && s.pos == acquire_pos_);
            if (!coming || acquire_pos_ >= error_pos_) std::rethrow_exception(error_);
        }
        if (released) {  // a handle was destroyed on another thread while we waited
            recycle_released(lk);
            continue;
        }
        if (all_held)
            DS4R_THROW(RuntimeError,
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
    return stats_;
}

DirectReader& PrefetchWeightSource::reader(int shard, const LayerPlan& plan) {
    auto it = readers_.find(shard);
    if (it == readers_.end()) {
        const auto mode = opt_.direct_io ? DirectReader::Mode::Auto : DirectReader::Mode::Buffered;
        it = readers_.emplace(shard, std::make_unique<DirectReader>(plan.shard_paths.at(static_cast<size_t>(shard)), mode))
                 .first;
    }
    return *it->second;
}

bool PrefetchWeightSource::read_pieces(const PlanBatch& batch, uint8_t* buf, size_t si, uint64_t load_id,
                                       uint64_t gen, const LayerPlan& plan) {
    for (const ReadPiece& p : batch.reads) {
        DirectReader& r = reader(p.shard, plan);
        const size_t len = static_cast<size_t>(p.file_end - p.file_begin);
        size_t done = 0;
        while (done < len) {
            if (abandoned(gen)) return false;
            const size_t n = std::min(read_request_, len - done);
            const double t = now_s();
            const size_t got = r.read_aligned(buf + p.buf_off + done, p.file_begin + done, n);
            const double dt = now_s() - t;
            {
                std::lock_guard<std::mutex> lk(core_->mu);
                stats_.bytes_read += got;
                stats_.read_seconds += dt;
                Slot& s = core_->slots[si];
                if (s.load_id == load_id) {
                    s.rec.bytes_read += got;
                    s.rec.read_s += dt;
                }
            }
            done += got;
            if (got < n) break;  // end of file
        }
        if (p.file_begin + done < p.need_end)
            DS4R_THROW(CheckpointError,
                       "%s: truncated shard: the %s needs its bytes up to offset %llu but the file ends at %llu",
                       r.path().c_str(), layer_label(plan.layer).c_str(), (unsigned long long)p.need_end,
                       (unsigned long long)r.file_size());
    }
    return true;
}

bool PrefetchWeightSource::load(size_t si, uint64_t load_id, uint64_t gen, const LayerPlan& plan) {
    Slot& slot = core_->slots[si];  // memory fields are immutable; state only under mu
    if (!upload_) {
        for (const PlanBatch& b : plan.batches)
            if (!read_pieces(b, slot.base, si, load_id, gen, plan)) return false;
        for (const SlotCopy& c : plan.private_copies) std::memcpy(slot.base + c.dst_off, slot.base + c.src_off, c.bytes);
        std::lock_guard<std::mutex> lk(core_->mu);
        if (slot.load_id == load_id && slot.state == SlotState::Loading) {
            slot.state = SlotState::Ready;
            slot.rec.ready_at_s = now_s() - t0_;
        }
        core_->cv.notify_all();
        return true;
    }
    for (size_t b = 0; b < plan.batches.size(); ++b) {
        const PlanBatch& batch = plan.batches[b];
        const size_t bi = next_staging_;
        {
            std::unique_lock<std::mutex> lk(core_->mu);
            core_->cv.wait(lk, [&] { return !staging_[bi].busy || abandoned(gen) || error_; });
            if (abandoned(gen) || error_) return false;
            staging_[bi].busy = true;
        }
        next_staging_ = (next_staging_ + 1) % staging_.size();
        uint8_t* buf = staging_[bi].base;
        bool ok = false;
        try {
            ok = read_pieces(batch, buf, si, load_id, gen, plan);
        } catch (...) {
            std::lock_guard<std::mutex> lk(core_->mu);
            staging_[bi].busy = false;
            throw;
        }
        if (!ok) {
            std::lock_guard<std::mutex> lk(core_->mu);
            staging_[bi].busy = false;
            core_->cv.notify_all();
            return false;
        }
        const double issued = now_s();
        uint64_t bytes = 0;
        for (const SlotCopy& c : batch.copies) {
            queue_->copy(slot.dev, slot.base_off + c.dst_off, buf + c.src_off, c.bytes);
            bytes += c.bytes;
        }
        uint64_t fence;
        {
            std::lock_guard<std::mutex> q(queue_mu_);
            fence = queue_->fence();
        }
        std::lock_guard<std::mutex> lk(core_->mu);
        pending_.push_back(PendingFence{fence, bi, si, load_id, issued, bytes, plan.layer, b + 1 == plan.batches.size()});
        core_->cv.notify_all();
    }
    if (plan.batches.empty()) {
        std::lock_guard<std::mutex> lk(core_->mu);
        if (slot.load_id == load_id && slot.state == SlotState::Loading) slot.state = SlotState::Ready;
        core_->cv.notify_all();
    }
    return true;
}

void PrefetchWeightSource::prefetch_loop() {
    for (;;) {
        size_t si = 0;
        uint64_t load_id = 0, gen = 0, pos = 0;
        std::shared_ptr<const LayerPlan> plan;
        {
            std::unique_lock<std::mutex> lk(core_->mu);
            auto free_slot = [&]() -> int {
                for (int i = 0; i < 2; ++i)
                    if (core_->slots[i].state == SlotState::Free) return i;
                return -1;
            };
            core_->cv.wait(lk, [&] {
                return stop_.load() || error_ || (scheduled_ && has_position(next_load_pos_) && free_slot() >= 0);
            });
            if (stop_.load() || error_) return;
            si = static_cast<size_t>(free_slot());
            pos = next_load_pos_++;
            load_id = ++load_counter_;
            gen = gen_.load();
            plan = plans_.at(layer_at(pos));
            Slot& s = core_->slots[si];
            s.state = SlotState::Loading;
            s.load_id = load_id;
            s.pos = pos;
            s.plan = plan;
            s.last_fence = 0;
            s.rec = LayerLoadRecord{};
            s.rec.layer = plan->layer;
            s.rec.position = pos;
            s.rec.bytes = plan->tensor_bytes;
            s.rec.load_begin_at_s = now_s() - t0_;
        }
        try {
            load(si, load_id, gen, *plan);
        } catch (...) {
            auto e = with_context(std::current_exception(),
                                  strfmt("weights: loading the %s (schedule position %llu)",
                                         layer_label(plan->layer).c_str(), (unsigned long long)pos));
            std::lock_guard<std::mutex> lk(core_->mu);
            if (!error_) {
                error_ = e;
                error_pos_ = pos;
            }
            core_->cv.notify_all();
            return;
        }
    }
}

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
            if (!error_) {  // a failed copy queue is fatal: every further acquire() throws
                error_ = with_context(err, strfmt("weights: waiting for the upload of the %s", layer_label(p.layer).c_str()));
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
                if (p.last) {
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
