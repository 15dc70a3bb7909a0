// One weight reader for several backends (contract in src/io/fanout_weight_source.h).
#include "io/fanout_weight_source.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>

#include "ds4r/clock.h"
#include "ds4r/binding.h"
#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "io/direct_reader.h"

namespace ds4r {

namespace {

constexpr uint64_t kTensorAlign = 256;  // every tensor of a device copy starts on this boundary

}  // namespace

// A host-memory target's layer: views into the host layer; its share is given back when destroyed.
class HostShare : public ResidentLayer {
public:
    HostShare(std::shared_ptr<ResidentLayer> host, std::function<void()> release)
        : host_(std::move(host)), release_(std::move(release)) {}
    ~HostShare() override {
        host_.reset();  // before the share goes back: the host source may then reuse the slot at once
        release_();
    }
    Tensor get(const std::string& name) const override { return host_->get(name); }

private:
    std::shared_ptr<ResidentLayer> host_;
    std::function<void()> release_;
};

// A device target's layer: its own copy of every tensor in one backend allocation.
class DeviceCopy : public ResidentLayer {
public:
    Tensor get(const std::string& name) const override {
        auto it = views_.find(name);
        if (it == views_.end())
            throw CheckpointError(strfmt("tensor '%s' is not part of the resident %s (binding bug?)",
                                         name.c_str(), layer_label(layer_).c_str()));
        return it->second;
    }
    int layer_ = 0;
    Tensor memory_;                        // U8 [sum of the aligned tensor sizes + kTensorAlign]
    std::map<std::string, Tensor> views_;  // name -> view into memory_
};

class FanoutWeightSource::Target : public WeightSource {
public:
    Target(FanoutWeightSource& owner, size_t index, Backend& be) : owner_(owner), index_(index), be_(be) {}

    void set_schedule(const std::vector<int>& order) override { owner_.set_order(order); }

    std::shared_ptr<ResidentLayer> acquire(int layer) override {
        const double t0 = now_s();
        std::shared_ptr<Entry> e = owner_.take(index_, layer);
        const double t1 = now_s();
        FanoutWeightSource* owner = &owner_;
        if (be_.host_memory()) {
            {
                std::lock_guard<std::mutex> lk(owner_.mu_);
                owner_.wait_seconds_ += t1 - t0;
            }
            return std::make_shared<HostShare>(e->host, [owner, e] { owner->give_back(e); });
        }
        // The share goes back whatever happens below (an out-of-memory error included).
        struct GiveBack {
            FanoutWeightSource* o;
            std::shared_ptr<Entry> e;
            ~GiveBack() { o->give_back(e); }
        } give_back{owner, e};
        auto out = std::make_shared<DeviceCopy>();
        out->layer_ = layer;
        const auto& tensors = owner_.tensors_of(layer);
        uint64_t total = 0;
        for (const TensorInfo& t : tensors) total += align_up(t.nbytes, kTensorAlign);
        out->memory_ = be_.alloc(DType::U8, {static_cast<int64_t>(total + kTensorAlign)});
        const auto addr = reinterpret_cast<uintptr_t>(out->memory_.data);
        uint64_t off = align_up(addr, kTensorAlign) - addr;
        for (const TensorInfo& t : tensors) {
            const Tensor src = e->host->get(t.name);
            be_.upload(out->memory_, off, src.data, t.nbytes);
            out->views_[t.name] =
                tensor_view(static_cast<uint8_t*>(out->memory_.data) + off, t.dtype, t.shape);
            off += align_up(t.nbytes, kTensorAlign);
        }
        be_.synchronize();  // the host layer may be reused once every target gave its share back
        std::lock_guard<std::mutex> lk(owner_.mu_);
        owner_.wait_seconds_ += t1 - t0;
        owner_.upload_seconds_ += now_s() - t1;
        owner_.bytes_uploaded_ += total;
        return out;
    }

    WeightSourceStats stats() const override { return owner_.stats(); }

private:
    FanoutWeightSource& owner_;
    size_t index_;
    Backend& be_;
};

FanoutWeightSource::FanoutWeightSource(std::unique_ptr<WeightSource> host, const Checkpoint& ckpt,
                                       std::vector<Backend*> targets)
    : host_(std::move(host)) {
    DS4R_CHECK(!targets.empty(), "weights: a fan-out needs at least one target");
    for (size_t i = 0; i < targets.size(); ++i) {
        for (size_t j = 0; j < i; ++j)
            DS4R_CHECK(targets[i] != targets[j], "weights: fan-out targets %zu and %zu are one backend", j,
                       i);
        targets_.push_back(std::make_unique<Target>(*this, i, *targets[i]));
    }
    const int n = static_cast<int>(ckpt.config().n_layers);
    auto info = [](const TensorLocation& t) { return TensorInfo{t.name, t.dtype, t.shape, t.nbytes}; };
    for (int L = 0; L < n; ++L) {
        std::vector<TensorInfo> v;
        for (const ByteRun& r : ckpt.layer_runs(L))
            for (const TensorLocation* t : r.tensors) v.push_back(info(*t));
        layer_tensors_.push_back(std::move(v));
    }
    layer_tensors_.push_back({info(ckpt.at(kFinalNormTensorName)), info(ckpt.at(kHeadTensorName))});
    next_pos_.assign(targets_.size(), 0);
    active_.assign(targets_.size(), false);
}

FanoutWeightSource::~FanoutWeightSource() {
    std::lock_guard<std::mutex> lk(mu_);
    live_.clear();  // the host layers go back before the host source goes away
}

WeightSource& FanoutWeightSource::target(size_t i) {
    DS4R_CHECK(i < targets_.size(), "weights: fan-out target %zu of %zu", i, targets_.size());
    return *targets_[i];
}

const std::vector<FanoutWeightSource::TensorInfo>& FanoutWeightSource::tensors_of(int layer) const {
    const size_t i = layer == kHeadLayer ? layer_tensors_.size() - 1 : static_cast<size_t>(layer);
    DS4R_CHECK(layer == kHeadLayer || (layer >= 0 && i + 1 < layer_tensors_.size()),
               "weights: %s is not a layer of the checkpoint", layer_label(layer).c_str());
    return layer_tensors_[i];
}

void FanoutWeightSource::set_order(const std::vector<int>& order) {
    std::lock_guard<std::mutex> lk(mu_);
    if (order_.empty()) {
        DS4R_CHECK(!order.empty(), "weights: empty schedule");
        host_->set_schedule(order);
        order_ = order;
        return;
    }
    DS4R_CHECK(order == order_, "weights: the fan-out's targets were given different schedules");
}

void FanoutWeightSource::begin_pass(const std::vector<bool>& active) {
    std::unique_lock<std::mutex> lk(mu_);
    DS4R_CHECK(active.size() == targets_.size(), "weights: begin_pass with %zu flags for %zu targets",
               active.size(), targets_.size());
    DS4R_CHECK(!order_.empty(), "weights: begin_pass before set_schedule");
    live_.clear();  // a stopped pass's layers (their handles are gone with its workers)
    const bool mid_schedule = next_read_pos_ % order_.size() != 0;
    active_ = active;
    n_active_ = static_cast<int>(std::count(active.begin(), active.end(), true));
    next_pos_.assign(targets_.size(), 0);
    next_read_pos_ = 0;
    stop_ = false;
    // A pass that stopped half way: the host source drops what it prefetched and starts again at layer 0.
    if (mid_schedule) host_->set_schedule(order_);
}

void FanoutWeightSource::stop() {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
}

std::shared_ptr<FanoutWeightSource::Entry> FanoutWeightSource::take(size_t target, int layer) {
    std::unique_lock<std::mutex> lk(mu_);
    DS4R_CHECK(!order_.empty(), "weights: acquire(%s) before set_schedule()", layer_label(layer).c_str());
    DS4R_CHECK(active_.at(target), "weights: worker %zu acquires the %s in a pass it takes no part in",
               target, layer_label(layer).c_str());
    const uint64_t p = next_pos_[target];
    const int expected = order_[p % order_.size()];
    if (expected != layer)
        DS4R_THROW(RuntimeError, "weights: worker %zu acquires the %s where the schedule has the %s", target,
                   layer_label(layer).c_str(), layer_label(expected).c_str());
    for (;;) {
        if (stop_) throw FanoutStopped();
        std::shared_ptr<Entry> e;
        for (const auto& x : live_)
            if (x->pos == p) e = x;
        if (e && !e->loading) {
            ++next_pos_[target];
            if (e->error) {
                const std::exception_ptr err = e->error;
                lk.unlock();
                give_back(e);
                std::rethrow_exception(err);
            }
            return e;
        }
        if (!e) {
            DS4R_CHECK(p == next_read_pos_, "weights: fan-out position %llu lost (next read %llu)",
                       (unsigned long long)p, (unsigned long long)next_read_pos_);
            // The host source holds two layers: read a third only after the oldest was given back.
            if (live_.size() < 2) {
                e = std::make_shared<Entry>();
                e->pos = p;
                e->layer = layer;
                e->users_left = n_active_;
                live_.push_back(e);
                ++next_read_pos_;
                lk.unlock();
                std::shared_ptr<ResidentLayer> host;
                std::exception_ptr err;
                try {
                    host = host_->acquire(layer);
                } catch (...) {
                    err = std::current_exception();
                }
                lk.lock();
                e->host = std::move(host);
                e->error = err;
                e->loading = false;
                cv_.notify_all();
                continue;
            }
        }
        cv_.wait(lk);
    }
}

void FanoutWeightSource::give_back(const std::shared_ptr<Entry>& e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (--e->users_left == 0) {
        // Released under the lock (lock order: ours, then the host source's): a worker that sees the
        // entry gone may acquire the next layer from the host source at once.
        e->host.reset();
        live_.erase(std::remove(live_.begin(), live_.end(), e), live_.end());
        cv_.notify_all();
    }
}

WeightSourceStats FanoutWeightSource::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    WeightSourceStats st = host_->stats();
    st.bytes_uploaded += bytes_uploaded_;
    st.upload_seconds += upload_seconds_;
    st.wait_seconds = wait_seconds_;
    return st;
}

}  // namespace ds4r
