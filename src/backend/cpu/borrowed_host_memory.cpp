// A CPU backend whose host allocations come from another backend (include/ds4r/borrowed_host_memory.h).
#include "ds4r/borrowed_host_memory.h"

#include "backend/cpu/cpu_backend.h"

namespace ds4r {

namespace {

class BorrowedHostMemoryCpuBackend : public CpuBackend {
public:
    // One thread: this backend only holds the reader's host layers; it computes nothing.
    explicit BorrowedHostMemoryCpuBackend(Backend& memory) : CpuBackend(1), memory_(memory) {}
    std::shared_ptr<void> alloc_host(size_t bytes) override { return memory_.alloc_host(bytes); }

private:
    Backend& memory_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend_with_host_memory_of(Backend& memory) {
    return std::make_unique<BorrowedHostMemoryCpuBackend>(memory);
}

}  // namespace ds4r
