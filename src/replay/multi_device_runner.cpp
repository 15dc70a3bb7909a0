// score --devices: one pass on several backends at once (contract in src/replay/multi_device_runner.h).
#include "replay/multi_device_runner.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "ds4r/checkpoint.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/progress.h"
#include "ds4r/score.h"
#include "ds4r/shard.h"

namespace ds4r {

namespace {

// Hidden rows in the order of a one-device run: for each layer, worker w writes (through to `out`)
// only after every worker before it finished that layer; until then its rows wait here.
class OrderedHiddenSink {
public:
    OrderedHiddenSink(HiddenSink& out, std::vector<int64_t> first_seq, std::vector<bool> active)
        : out_(out),
          first_seq_(std::move(first_seq)),
          active_(std::move(active)),
          done_(active_.size()),
          held_(active_.size()) {}

    void add_rows(size_t w, int layer, int seq, const uint16_t* data, int64_t rows, int64_t row_elems) {
        std::lock_guard<std::mutex> lk(mu_);
        const int global = static_cast<int>(first_seq_[w] + seq);
        if (writer(layer) == w) {
            out_.add_rows(layer, global, data, rows, row_elems);
            return;
        }
        held_[w][layer].push_back(
            Rows{global, std::vector<uint16_t>(data, data + rows * row_elems), rows, row_elems});
    }

    // Worker w will add no more rows of `layer` in this pass.
    void layer_done(size_t w, int layer) {
        std::lock_guard<std::mutex> lk(mu_);
        done_[w].insert(layer);
        writer(layer);  // moves on past w if it was w's turn
    }

    bool all_written() const {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto& m : held_)
            for (const auto& [layer, rows] : m)
                if (!rows.empty()) return false;
        return true;
    }

private:
    struct Rows {
        int seq = 0;
        std::vector<uint16_t> data;  // [rows, row_elems]
        int64_t rows = 0, row_elems = 0;
    };
    // The worker whose rows of `layer` go straight out now (size(): every worker's are out).
    size_t writer(int layer) {
        auto [it, fresh] = writer_.emplace(layer, 0);
        size_t& w = it->second;
        while (w < active_.size() && (!active_[w] || done_[w].count(layer))) {
            ++w;
            if (w < active_.size()) flush(w, layer);
        }
        (void)fresh;
        return w;
    }
    void flush(size_t w, int layer) {
        auto it = held_[w].find(layer);
        if (it == held_[w].end()) return;
        for (const Rows& r : it->second) out_.add_rows(layer, r.seq, r.data.data(), r.rows, r.row_elems);
        held_[w].erase(it);
    }

    HiddenSink& out_;
    std::vector<int64_t> first_seq_;
    std::vector<bool> active_;
    mutable std::mutex mu_;
    std::map<int, size_t> writer_;                        // layer -> worker writing through
    std::vector<std::set<int>> done_;                     // per worker: layers finished
    std::vector<std::map<int, std::vector<Rows>>> held_;  // per worker: layer -> rows held back
};

class WorkerSink : public HiddenSink {
public:
    WorkerSink(OrderedHiddenSink& o, size_t w) : o_(o), w_(w) {}
    void add_rows(int layer, int seq, const uint16_t* data, int64_t rows, int64_t row_elems) override {
        o_.add_rows(w_, layer, seq, data, rows, row_elems);
    }

private:
    OrderedHiddenSink& o_;
    size_t w_;
};

}  // namespace

struct MultiDeviceRunner::Worker {
    int device = 0;
    Backend* be = nullptr;
    std::unique_ptr<PassRunner> runner;
    // The current pass.
    std::vector<SequenceScores> scores;
    std::exception_ptr error;
    double compute_s = 0, wait_s = 0;
};

MultiDeviceRunner::MultiDeviceRunner(std::vector<Backend*> backends, std::vector<int> devices,
                                     const Checkpoint& ckpt, FanoutWeightSource& weights,
                                     const EngramResources* engram, std::vector<ReplayOptions> opts)
    : weights_(weights), n_layers_(static_cast<int>(ckpt.config().n_layers)) {
    DS4R_CHECK(!backends.empty() && backends.size() == devices.size() && backends.size() == opts.size() &&
                   backends.size() == weights.size(),
               "multi-device runner: %zu backends, %zu devices, %zu options, %zu weight targets",
               backends.size(), devices.size(), opts.size(), weights.size());
    for (size_t i = 0; i < backends.size(); ++i) {
        auto w = std::make_unique<Worker>();
        w->device = devices[i];
        w->be = backends[i];
        opts[i].retry_out_of_memory = false;
        backends[i]->use_on_this_thread();  // the runner allocates on its backend
        w->runner = std::make_unique<PassRunner>(*backends[i], ckpt, weights.target(i), engram, opts[i]);
        workers_.push_back(std::move(w));
    }
}

MultiDeviceRunner::~MultiDeviceRunner() {
    for (auto& w : workers_) {
        try {
            w->be->use_on_this_thread();  // its memory is freed on its device
        } catch (const std::exception& e) {
            log_warn(strfmt("device %d: %s", w->device, e.what()));
        }
        w->runner.reset();
    }
}

int64_t MultiDeviceRunner::chunk_rows() const {
    int64_t r = workers_.front()->runner->chunk_rows();
    for (const auto& w : workers_) r = std::min(r, w->runner->chunk_rows());
    return r;
}

std::vector<SequenceScores> MultiDeviceRunner::run(const std::vector<std::vector<int32_t>>& seqs,
                                                   HiddenSink* sink,
                                                   const std::function<void(const LayerTiming&)>& on_layer) {
    const size_t n = workers_.size();
    std::vector<int64_t> lens;
    int64_t total_rows = 0;
    for (const auto& s : seqs) {
        lens.push_back(static_cast<int64_t>(s.size()));
        total_rows += static_cast<int64_t>(s.size());
    }
    split_ = balanced_boundaries(lens, static_cast<int64_t>(n));
    std::vector<bool> active(n);
    int n_active = 0;
    for (size_t w = 0; w < n; ++w) {
        active[w] = split_[w + 1] > split_[w];
        n_active += active[w] ? 1 : 0;
    }
    if (n_active == 0) return {};
    // A layer's place in the pass: block L -> L, the head -> n_layers (also the final hidden layer).
    auto ordinal = [&](int layer) { return layer == kHeadLayer ? n_layers_ : layer; };
    for (;;) {
        weights_.begin_pass(active);
        std::unique_ptr<OrderedHiddenSink> ordered;
        if (sink)
            ordered = std::make_unique<OrderedHiddenSink>(
                *sink, std::vector<int64_t>(split_.begin(), split_.end() - 1), active);
        // Shared by the worker threads of this pass.
        std::atomic<bool> stop{false};
        std::mutex mu;  // everything below, and the calls of on_layer / on_chunk_
        struct LayerAgg {
            int count = 0;
            double wait_s = 0, engram_wait_s = 0, engram_dequant_wait_s = 0, compute_s = 0;
            bool engram_rows_prefetched = true;  // on every device
        };
        std::map<int, LayerAgg> agg;
        std::vector<int> at(n, 0);             // per worker: ordinal of the layer it is in
        std::vector<int64_t> rows_done(n, 0);  // per worker: rows of that layer done
        std::vector<size_t> failed;            // workers in the order they failed
        auto stop_all = [&] {
            stop = true;
            weights_.stop();
        };
        auto body = [&](size_t w) {
            Worker& wk = *workers_[w];
            try {
                wk.be->use_on_this_thread();
                std::vector<std::vector<int32_t>> group(seqs.begin() + split_[w],
                                                        seqs.begin() + split_[w + 1]);
                std::unique_ptr<WorkerSink> ws =
                    ordered ? std::make_unique<WorkerSink>(*ordered, w) : nullptr;
                wk.runner->set_on_chunk([&](int layer, int64_t done, int64_t) {
                    if (stop) throw FanoutStopped();
                    if (!on_chunk_) return;
                    std::lock_guard<std::mutex> lk(mu);
                    at[w] = ordinal(layer);
                    rows_done[w] = done;
                    int slowest = n_layers_ + 1;
                    for (size_t v = 0; v < n; ++v)
                        if (active[v]) slowest = std::min(slowest, at[v]);
                    if (at[w] != slowest) return;
                    int64_t sum = 0;
                    for (size_t v = 0; v < n; ++v) {
                        if (!active[v]) continue;
                        int64_t rv = 0;
                        for (int64_t i = split_[v]; i < split_[v + 1]; ++i)
                            rv += lens[static_cast<size_t>(i)];
                        sum += at[v] > slowest ? rv : at[v] == slowest ? rows_done[v] : 0;
                    }
                    on_chunk_(layer, sum, total_rows);
                });
                wk.scores = wk.runner->run(group, ws.get(), [&](const LayerTiming& t) {
                    if (stop) throw FanoutStopped();
                    if (hook_) hook_(static_cast<int>(w), t);
                    if (ordered) ordered->layer_done(w, ordinal(t.layer));
                    std::lock_guard<std::mutex> lk(mu);
                    wk.compute_s += t.compute_s;
                    wk.wait_s += t.stall_s();
                    at[w] = ordinal(t.layer) + 1;
                    rows_done[w] = 0;
                    LayerAgg& a = agg[ordinal(t.layer)];
                    ++a.count;
                    a.wait_s = std::max(a.wait_s, t.wait_s);
                    a.engram_wait_s = std::max(a.engram_wait_s, t.engram_wait_s);
                    a.engram_dequant_wait_s = std::max(a.engram_dequant_wait_s, t.engram_dequant_wait_s);
                    a.compute_s = std::max(a.compute_s, t.compute_s);
                    a.engram_rows_prefetched = a.engram_rows_prefetched && t.engram_rows_prefetched;
                    if (a.count == n_active && on_layer) {
                        LayerTiming all;
                        all.layer = t.layer;
                        all.rows = total_rows;
                        all.wait_s = a.wait_s;
                        all.engram_wait_s = a.engram_wait_s;
                        all.engram_dequant_wait_s = a.engram_dequant_wait_s;
                        all.compute_s = a.compute_s;
                        all.engram_rows_prefetched = a.engram_rows_prefetched;
                        on_layer(all);  // may throw Interrupted: this worker stops the others
                    }
                });
            } catch (...) {
                wk.error = std::current_exception();
                {
                    std::lock_guard<std::mutex> lk(mu);
                    failed.push_back(w);
                }
                stop_all();
            }
        };
        std::vector<std::thread> threads;
        for (size_t w = 0; w < n; ++w) {
            workers_[w]->scores.clear();
            workers_[w]->error = nullptr;
            workers_[w]->compute_s = workers_[w]->wait_s = 0;
        }
        try {
            for (size_t w = 0; w < n; ++w)
                if (active[w]) threads.emplace_back(body, w);
        } catch (...) {  // a thread could not start: stop those that did
            stop_all();
            for (auto& t : threads) t.join();
            throw;
        }
        for (auto& t : threads) t.join();

        // The failure that stopped the pass: the first real error, else an interrupt.
        std::exception_ptr interrupted;
        size_t bad = n;
        bool oom = false;
        for (size_t w : failed) {
            try {
                std::rethrow_exception(workers_[w]->error);
            } catch (const FanoutStopped&) {
            } catch (const Interrupted&) {
                if (!interrupted) interrupted = workers_[w]->error;
            } catch (const OutOfMemoryError&) {
                if (bad == n) bad = w, oom = true;
            } catch (...) {
                if (bad == n) bad = w, oom = false;
            }
        }
        if (bad == n && interrupted) std::rethrow_exception(interrupted);
        if (bad == n && !failed.empty())
            DS4R_THROW(RuntimeError, "multi-device pass stopped without an error (worker %zu)",
                       failed.front());
        if (bad < n) {
            Worker& wk = *workers_[bad];
            const std::string who = strfmt("device %d (worker %zu of %zu)", wk.device, bad + 1, n);
            std::string what;
            try {
                std::rethrow_exception(wk.error);
            } catch (const std::exception& e) {
                what = e.what();
            }
            if (oom && wk.runner->shrink_chunks(who + ": " + what)) {
                // As the one-device runner: the whole pass again (every worker: they advance together).
                ++oom_retries_;
                if (sink) sink->restart_pass();
                for (auto& w : workers_) {
                    w->be->use_on_this_thread();
                    w->be->synchronize();
                }
                continue;
            }
            std::rethrow_exception(with_context(wk.error, who));
        }
        DS4R_CHECK(!ordered || ordered->all_written(), "multi-device pass: hidden rows left unwritten");
        std::vector<SequenceScores> out;
        out.reserve(seqs.size());
        for (size_t w = 0; w < n; ++w) {
            Worker& wk = *workers_[w];
            if (!active[w]) continue;
            int64_t tokens = 0;
            for (int64_t i = split_[w]; i < split_[w + 1]; ++i) tokens += lens[static_cast<size_t>(i)];
            log_info(
                strfmt("device %d (worker %zu of %zu): %lld sequences, %lld tokens, compute %.2f s, "
                       "I/O wait (weights, Engram rows) %.2f s",
                       wk.device, w + 1, n, (long long)(split_[w + 1] - split_[w]), (long long)tokens,
                       wk.compute_s, wk.wait_s));
            for (auto& s : wk.scores) out.push_back(std::move(s));
            wk.scores.clear();
        }
        return out;
    }
}

}  // namespace ds4r

namespace ds4r {

std::vector<int> parse_device_list(const std::string& text, int visible) {
    if (text == "all") {
        if (visible <= 0) throw InputError("--devices all: no CUDA device is visible");
        std::vector<int> all;
        for (int d = 0; d < visible; ++d) all.push_back(d);
        return all;
    }
    std::vector<int> out;
    size_t i = 0;
    for (;;) {
        int v = 0, digits = 0;
        while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 5) {
            v = v * 10 + (text[i] - '0');
            ++i, ++digits;
        }
        if (digits == 0 || digits == 5 || v >= kMaxDeviceIndex)
            throw InputError("--devices: '" + text +
                             "' is not 'all' or a comma-separated list of device "
                             "indices (0,1,2,3; 0,0 = two workers on device 0)");
        out.push_back(v);
        if (i == text.size()) break;
        if (text[i] != ',') throw InputError("--devices: '" + text + "': expected ',' after a device index");
        ++i;
    }
    if (out.size() > static_cast<size_t>(kMaxDeviceWorkers))
        throw InputError(strfmt("--devices: %zu workers, at most %d", out.size(), kMaxDeviceWorkers));
    return out;
}

}  // namespace ds4r
