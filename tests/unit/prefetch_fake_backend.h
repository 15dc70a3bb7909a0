// A test-only Backend for the prefetching weight source: host memory (so tests read every byte) but a
// CopyQueue that behaves like a GPU copy stream: copies are queued and executed later, in order, on a
// worker thread after random delays; fences complete when the worker reaches them. Every op and the
// memory calls are delegated to the CPU backend.
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

class FakeAsyncBackend : public Backend {
public:
    FakeAsyncBackend(unsigned seed, int max_delay_us)
        : inner_(make_cpu_backend()), seed_(seed), max_delay_us_(max_delay_us) {}

    std::string name() const override { return "fake-async"; }
    bool host_memory() const override { return true; }
    Tensor alloc(DType t, const Shape& shape) override {
        Tensor x = inner_->alloc(t, shape);
        allocs_.fetch_add(1);
        alloc_bytes_.fetch_add(x.nbytes());
        return x;
    }
    void upload(const Tensor& d, size_t o, const void* s, size_t n) override { inner_->upload(d, o, s, n); }
    void download(void* d, const Tensor& s, size_t o, size_t n) override { inner_->download(d, s, o, n); }
    void copy(const Tensor& d, size_t doff, const Tensor& s, size_t soff, size_t n) override {
        inner_->copy(d, doff, s, soff, n);
    }
    void fill(const Tensor& t, uint8_t b) override { inner_->fill(t, b); }
    void synchronize() override {
        std::lock_guard<std::mutex> lk(guard_mu_);
        pending_.clear();  // the emulated compute stream has drained
        syncs_.fetch_add(1);
    }
    size_t free_memory() const override { return inner_->free_memory(); }
    std::shared_ptr<void> alloc_host(size_t bytes) override {
        host_allocs_.fetch_add(1);
        return Backend::alloc_host(bytes);
    }
    std::unique_ptr<CopyQueue> make_copy_queue() override {
        auto q = std::make_unique<FakeCopyQueue>(*this, seed_, max_delay_us_);
        last_queue_ = q.get();
        return q;
    }

    // ---- ops: the CPU backend's
    void act_quant_fp8(const Tensor& x, const Tensor& q, const Tensor& s) override {
        inner_->act_quant_fp8(x, q, s);
    }
    void act_quant_fp8_inplace(const Tensor& x) override { inner_->act_quant_fp8_inplace(x); }
    void fp4_quant_inplace(const Tensor& x, Fp4Scale k) override { inner_->fp4_quant_inplace(x, k); }
    void linear_fp8(const Tensor& x, const Fp8Linear& w, const Tensor& y) override {
        inner_->linear_fp8(x, w, y);
    }
    void linear_fp4(const Tensor& x, const Fp4Linear& w, const Tensor& y) override {
        inner_->linear_fp4(x, w, y);
    }
    void linear_bf16(const Tensor& x, const Tensor& w, const Tensor& y) override {
        inner_->linear_bf16(x, w, y);
    }
    void linear_f32(const Tensor& x, const Tensor& w, const Tensor& y) override {
        inner_->linear_f32(x, w, y);
    }
    void linear_wo_a(const Tensor& o, const Fp8Linear& w, int64_t g, const Tensor& y) override {
        inner_->linear_wo_a(o, w, g, y);
    }
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override {
        inner_->rms_norm(x, w, eps, y);
    }
    void rope_table(double base, double factor, int64_t yo, double bf, double bs, int64_t rd,
                    const Tensor& t) override {
        inner_->rope_table(base, factor, yo, bf, bs, rd, t);
    }
    void rope_inplace(const Tensor& x, int64_t h, int64_t w, int64_t rd, const Tensor& pos,
                      const Tensor& table, bool inverse) override {
        inner_->rope_inplace(x, h, w, rd, pos, table, inverse);
    }
    void hc_mixes(const Tensor& X, const Tensor& fn, const Tensor& scale, const Tensor& base, float ne,
                  float he, int iters, const Tensor& pre, const Tensor& post, const Tensor& comb) override {
        inner_->hc_mixes(X, fn, scale, base, ne, he, iters, pre, post, comb);
    }
    void hc_pre(const Tensor& X, const Tensor& mix, const Tensor& y) override { inner_->hc_pre(X, mix, y); }
    void hc_post(const Tensor& x, const Tensor& R, const Tensor& post, const Tensor& comb,
                 const Tensor& out) override {
        inner_->hc_post(x, R, post, comb, out);
    }
    void compress_pool2(const Tensor& kv, const Tensor& sc, const Tensor& out) override {
        inner_->compress_pool2(kv, sc, out);
    }
    void index_scores(const Tensor& q, const Tensor& k, const Tensor& w, const Tensor& qpos, int ratio,
                      const Tensor& score) override {
        inner_->index_scores(q, k, w, qpos, ratio, score);
    }
    void candidate_blocks(const Tensor& score, const Tensor& qpos, int ratio, int64_t block, int64_t topk,
                          const Tensor& mask) override {
        inner_->candidate_blocks(score, qpos, ratio, block, topk, mask);
    }
    void apply_candidate_mask(const Tensor& score, const Tensor& mask, int64_t block) override {
        inner_->apply_candidate_mask(score, mask, block);
    }
    void index_topk(const Tensor& score, const Tensor& qpos, int ratio, int64_t offset,
                    const Tensor& idx) override {
        inner_->index_topk(score, qpos, ratio, offset, idx);
    }
    void window_indices(const Tensor& qpos, int64_t window, const Tensor& idx) override {
        inner_->window_indices(qpos, window, idx);
    }
    void attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) override {
        inner_->attn_indices(qpos, window, topk, idx);
    }
    void mul_scalar_bf16(const Tensor& x, float f) override { inner_->mul_scalar_bf16(x, f); }
    void sparse_attn(const Tensor& q, const Tensor& wkv, const Tensor& ckv, const Tensor& sink,
                     const Tensor& idx, float scale, const Tensor& o) override {
        inner_->sparse_attn(q, wkv, ckv, sink, idx, scale, o);
    }
    void moe(const Tensor& x, const MoeWeights& w, const MoeParams& p, const Tensor& y, const Tensor& ri,
             const Tensor& rw) override {
        inner_->moe(x, w, p, y, ri, rw);
    }
    void engram_update(const Tensor& X, const Tensor& kv, const Tensor& qw, const Tensor& kw,
                       float eps) override {
        inner_->engram_update(X, kv, qw, kw, eps);
    }
    void head_stats(const Tensor& x, const Tensor& head, const Tensor& targets, int k,
                    const HeadStatsOut& out) override {
        inner_->head_stats(x, head, targets, k, out);
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
    std::unique_ptr<Backend> inner_;
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
