// Default implementations of the few Backend members that have one (host memory only).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/numeric.h"

namespace ds4r {

std::shared_ptr<void> Backend::alloc_host(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw std::bad_alloc();
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

void Backend::attn_indices(const Tensor& qpos, int64_t window, const Tensor& topk, const Tensor& idx) {
    DS4R_CHECK(host_memory(), "%s: attn_indices default implementation needs host memory", name().c_str());
    const int64_t m = idx.dim(0), n = idx.dim(1);
    const int64_t kc = topk.empty() ? 0 : topk.dim(1);
    const int64_t W = n - kc;
    DS4R_CHECK(W >= 0 && qpos.dim(0) == m, "attn_indices: bad shapes");
    const int32_t* pos = qpos.ptr<int32_t>();
    const int32_t* tk = topk.empty() ? nullptr : topk.ptr<int32_t>();
    int32_t* out = idx.ptr<int32_t>();
    for (int64_t r = 0; r < m; ++r) {
        const int64_t p = pos[r];
        const int64_t start = std::max<int64_t>(p - window + 1, 0);
        for (int64_t c = 0; c < W; ++c) {
            const int64_t j = start + c;
            out[r * n + c] = j > p ? -1 : static_cast<int32_t>(j);
        }
        for (int64_t c = 0; c < kc; ++c) out[r * n + W + c] = tk[r * kc + c];
    }
}

void Backend::mul_scalar_bf16(const Tensor& x, float factor) {
    DS4R_CHECK(host_memory(), "%s: mul_scalar_bf16 default implementation needs host memory", name().c_str());
    uint16_t* p = x.ptr<uint16_t>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) * factor);
}

}  // namespace ds4r

namespace ds4r {

namespace {
class SyncCopyQueue : public CopyQueue {
public:
    explicit SyncCopyQueue(Backend& be) : be_(be) {}
    void copy(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) override {
        be_.upload(dst, dst_offset, src, bytes);
    }
    void download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) override {
        be_.download(dst, src, src_offset, bytes);
    }
    void wait_compute() override {}  // compute is done when its call returns: copies run after it
    bool asynchronous() const override { return false; }
    uint64_t fence() override { return ++n_; }
    void host_wait(uint64_t) override {}
    void compute_wait(uint64_t) override {}

private:
    Backend& be_;
    uint64_t n_ = 0;
};
}  // namespace

std::unique_ptr<CopyQueue> Backend::make_copy_queue() {
    return std::make_unique<SyncCopyQueue>(*this);
}

bool profiling_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("DS4R_PROFILE");
        return e && *e && std::string(e) != "0";
    }();
    return on;
}

// Host-clock profiling for synchronous backends (the CPU): region time = wall time between push/pop.
namespace {
struct HostProfile {
    std::mutex mu;
    std::vector<std::pair<const char*, std::chrono::steady_clock::time_point>> stack;
    std::map<std::string, double> totals;
};
HostProfile& host_profile(const Backend* be) {
    static std::mutex mu;
    static std::map<const Backend*, std::unique_ptr<HostProfile>> all;
    std::lock_guard<std::mutex> lk(mu);
    auto& p = all[be];
    if (!p) p = std::make_unique<HostProfile>();
    return *p;
}
}  // namespace

void Backend::range_push(const char* name) {
    if (!profiling_enabled()) return;
    auto& p = host_profile(this);
    std::lock_guard<std::mutex> lk(p.mu);
    p.stack.emplace_back(name, std::chrono::steady_clock::now());
}

void Backend::range_pop() {
    if (!profiling_enabled()) return;
    auto& p = host_profile(this);
    std::lock_guard<std::mutex> lk(p.mu);
    if (p.stack.empty()) return;
    auto [name, t0] = p.stack.back();
    p.stack.pop_back();
    p.totals[name] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::pair<std::string, double>> Backend::profile_totals() {
    auto& p = host_profile(this);
    std::lock_guard<std::mutex> lk(p.mu);
    return {p.totals.begin(), p.totals.end()};
}

void Backend::profile_reset() {
    auto& p = host_profile(this);
    std::lock_guard<std::mutex> lk(p.mu);
    p.totals.clear();
}

}  // namespace ds4r
