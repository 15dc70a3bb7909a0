// Default implementations of the Backend members that have one: pinned-less host allocation, the
// synchronous copy queue and host-clock profiling (for host-memory backends; CUDA overrides them).
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
#include "ds4r/error.h"
#include "ds4r/settings.h"

namespace ds4r {

// Prepared experts: a backend without a faster layout prepares nothing (ds4r/backend.h).
uint64_t Backend::prepared_experts_bytes(int64_t, int64_t, int64_t, ExpertLayout) const {
    return 0;
}
void Backend::set_prepared_experts(ExpertLayout layout) {
    DS4R_CHECK(layout == ExpertLayout::None, "backend %s has no prepared expert layout %s", name().c_str(),
               expert_layout_name(layout));
}
const char* expert_layout_name(ExpertLayout layout) {
    switch (layout) {
        case ExpertLayout::E5m2: return "e5m2";
        case ExpertLayout::F16: return "fp16";
        default: return "off";
    }
}
void Backend::prepare_experts(const MoeWeights&) {}

std::shared_ptr<void> Backend::alloc_host(size_t bytes) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p) throw std::bad_alloc();
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

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
