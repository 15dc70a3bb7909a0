// A test-only Backend for the prefetching weight source: host memory (so tests read every byte) but a
// CopyQueue that behaves like a GPU copy stream: copies are queued and executed later, in order, on a
// worker thread after random delays; fences complete when the worker reaches them. Everything else is
// the CPU backend's (the fake derives from it).
//
// It also watches the slot-recycling rule: the test registers the byte ranges of the tensors it holds
// (guard_hold) and, when it drops a handle, moves them to "compute pending" (guard_release), emulating
// kernels still queued on the compute stream; only synchronize() clears those. A queued copy whose
// destination overlaps a held or pending range is counted as a violation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ds4r/backend.h"

namespace ds4r::test {

class FakeAsyncBackend;

class FakeCopyQueue : public CopyQueue {
public:
    FakeCopyQueue(FakeAsyncBackend& be, unsigned seed, int max_delay_us);
    ~FakeCopyQueue() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        worker_.join();  // the worker drains the queue first: nothing is left half-copied
    }
    void copy(const Tensor& dst, size_t off, const void* src, size_t bytes) override {
        DS4R_CHECK(off + bytes <= dst.nbytes(), "fake copy queue: %zu bytes at %zu past a %zu-byte tensor",
                   bytes, off, dst.nbytes());
        std::lock_guard<std::mutex> lk(mu_);
        ops_.push_back(Op{0, static_cast<uint8_t*>(dst.data) + off, static_cast<const uint8_t*>(src), bytes});
        cv_.notify_all();
    }
    void download(void* dst, const Tensor& src, size_t off, size_t bytes) override {
        DS4R_CHECK(off + bytes <= src.nbytes(), "fake copy queue: %zu bytes at %zu past a %zu-byte tensor",
                   bytes, off, src.nbytes());
        std::lock_guard<std::mutex> lk(mu_);
        ops_.push_back(Op{0, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src.data) + off, bytes});
        cv_.notify_all();
    }
    // The fake's compute is host code that has completed when its call returned.
    void wait_compute() override {}
    uint64_t fence() override {
        std::lock_guard<std::mutex> lk(mu_);
        ops_.push_back(Op{++issued_, nullptr, nullptr, 0});
        cv_.notify_all();
        return issued_;
    }
    void host_wait(uint64_t f) override {
        std::unique_lock<std::mutex> lk(mu_);
        DS4R_CHECK(f <= issued_, "fake copy queue: unknown fence %llu", (unsigned long long)f);
        cv_.wait(lk, [&] { return completed_ >= f; });
    }
    // The fake's compute is host code run by the caller: honouring "compute waits for the fence" means
    // blocking until it completed.
    void compute_wait(uint64_t f) override {
        compute_waits_.fetch_add(1);
        host_wait(f);
    }
    int compute_waits() const { return compute_waits_.load(); }

private:
    struct Op {
        uint64_t fence;  // != 0: a fence
        uint8_t* dst;
        const uint8_t* src;
        size_t bytes;
    };
    void run();

    FakeAsyncBackend& be_;
    std::mt19937 rng_;
    int max_delay_us_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Op> ops_;
    uint64_t issued_ = 0, completed_ = 0;
    bool stop_ = false;
    std::atomic<int> compute_waits_{0};
    std::thread worker_;  // last: starts after everything above is built
};

// The CPU backend with a GPU-like copy queue: only what the tests observe is overridden (allocation
// counts, the emulated compute stream's drain, host allocations, the copy queue); every op is the
// CPU backend's own, so a new Backend op needs nothing here.
class FakeAsyncBackend : public CpuBackend {
public:
    FakeAsyncBackend(unsigned seed, int max_delay_us) : seed_(seed), max_delay_us_(max_delay_us) {}

    std::string name() const override { return "fake-async"; }
    Tensor alloc(DType t, const Shape& shape) override {
        Tensor x = CpuBackend::alloc(t, shape);
        allocs_.fetch_add(1);
        alloc_bytes_.fetch_add(x.nbytes());
        return x;
    }
    void synchronize() override {
        std::lock_guard<std::mutex> lk(guard_mu_);
        pending_.clear();  // the emulated compute stream has drained
        syncs_.fetch_add(1);
    }
    std::shared_ptr<void> alloc_host(size_t bytes) override {
        host_allocs_.fetch_add(1);
        return CpuBackend::alloc_host(bytes);
    }
    std::unique_ptr<CopyQueue> make_copy_queue() override {
        auto q = std::make_unique<FakeCopyQueue>(*this, seed_, max_delay_us_);
        last_queue_ = q.get();
        return q;
    }

    // ---- the recycling guard
    using Range = std::pair<uintptr_t, uintptr_t>;  // [begin, end) addresses
    void guard_hold(const std::vector<Range>& r) {
        std::lock_guard<std::mutex> lk(guard_mu_);
        held_.insert(held_.end(), r.begin(), r.end());
    }
    // The handle is about to be dropped: its ranges stay protected until the next synchronize().
    void guard_release() {
        std::lock_guard<std::mutex> lk(guard_mu_);
        pending_.insert(pending_.end(), held_.begin(), held_.end());
        held_.clear();
    }
    void check_copy(const uint8_t* dst, size_t bytes) {
        const auto lo = reinterpret_cast<uintptr_t>(dst), hi = lo + bytes;
        std::lock_guard<std::mutex> lk(guard_mu_);
        for (const auto* v : {&held_, &pending_})
            for (const Range& r : *v)
                if (lo < r.second && r.first < hi) {
                    violations_.fetch_add(1);
                    return;
                }
    }

    int violations() const { return violations_.load(); }
    int allocs() const { return allocs_.load(); }
    size_t alloc_bytes() const { return alloc_bytes_.load(); }
    int host_allocs() const { return host_allocs_.load(); }
    int syncs() const { return syncs_.load(); }
    FakeCopyQueue* last_queue() const { return last_queue_; }

private:
    unsigned seed_;
    int max_delay_us_;
    std::mutex guard_mu_;
    std::vector<Range> held_, pending_;
    std::atomic<int> violations_{0}, allocs_{0}, host_allocs_{0}, syncs_{0};
    std::atomic<size_t> alloc_bytes_{0};
    FakeCopyQueue* last_queue_ = nullptr;
};

inline FakeCopyQueue::FakeCopyQueue(FakeAsyncBackend& be, unsigned seed, int max_delay_us)
    : be_(be), rng_(seed), max_delay_us_(max_delay_us), worker_([this] { run(); }) {}

inline void FakeCopyQueue::run() {
    for (;;) {
        Op op;
        {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !ops_.empty(); });
            if (ops_.empty()) return;
            op = ops_.front();
            ops_.pop_front();
        }
        if (max_delay_us_ > 0)
            std::this_thread::sleep_for(
                std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_delay_us_)(rng_)));
        if (op.fence == 0) {
            be_.check_copy(op.dst, op.bytes);
            std::memcpy(op.dst, op.src, op.bytes);
            continue;
        }
        std::lock_guard<std::mutex> lk(mu_);
        completed_ = op.fence;
        cv_.notify_all();
    }
}

}  // namespace ds4r::test
