// CPU backend: construction, host memory and the row-parallel helper. The ops' argument checks are
// backend/op_checks.h, shared with the CUDA backend.
#include "cpu_backend.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "ds4r/error.h"

namespace ds4r {

CpuBackend::CpuBackend(int threads) {
    if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
    threads_ = std::max(1, threads);
}

Tensor CpuBackend::alloc(DType t, const Shape& shape) {
    for (int64_t d : shape) DS4R_CHECK(d >= 0, "cpu alloc: negative dim in %s", shape_str(shape).c_str());
    Tensor x;
    x.dtype = t;
    x.shape = shape;
    const size_t bytes = x.nbytes();
    if (bytes == 0) return x;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p)
        DS4R_THROW(RuntimeError, "cpu alloc: out of host memory for %s %s (%zu bytes)", dtype_name(t),
                   shape_str(shape).c_str(), bytes);
    x.hold = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    x.data = p;
    return x;
}

namespace {
void check_range(const char* op, const Tensor& t, size_t offset, size_t bytes) {
    DS4R_CHECK(offset <= t.nbytes() && bytes <= t.nbytes() - offset,
               "cpu %s: range [%zu, %zu) outside the %zu bytes of %s %s", op, offset, offset + bytes,
               t.nbytes(), dtype_name(t.dtype), shape_str(t.shape).c_str());
    DS4R_CHECK(bytes == 0 || t.data != nullptr, "cpu %s: tensor has no data", op);
}
}  // namespace

void CpuBackend::upload(const Tensor& dst, size_t dst_offset, const void* src, size_t bytes) {
    check_range("upload", dst, dst_offset, bytes);
    if (bytes) std::memcpy(static_cast<uint8_t*>(dst.data) + dst_offset, src, bytes);
}

void CpuBackend::download(void* dst, const Tensor& src, size_t src_offset, size_t bytes) {
    check_range("download", src, src_offset, bytes);
    if (bytes) std::memcpy(dst, static_cast<const uint8_t*>(src.data) + src_offset, bytes);
}

void CpuBackend::copy(const Tensor& dst, size_t dst_offset, const Tensor& src, size_t src_offset,
                      size_t bytes) {
    check_range("copy (dst)", dst, dst_offset, bytes);
    check_range("copy (src)", src, src_offset, bytes);
    if (bytes)
        std::memmove(static_cast<uint8_t*>(dst.data) + dst_offset,
                     static_cast<const uint8_t*>(src.data) + src_offset, bytes);
}

void CpuBackend::fill(const Tensor& t, uint8_t byte) {
    check_range("fill", t, 0, t.nbytes());
    if (t.nbytes()) std::memset(t.data, byte, t.nbytes());
}

size_t CpuBackend::free_memory() const {
    // Available physical memory; chunk sizing only, never correctness.
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page);
    return size_t{1} << 40;
}

void CpuBackend::parallel_for(int64_t n, double cost, const std::function<void(int64_t, int64_t)>& fn) const {
    if (n <= 0) return;
    constexpr double kMinWorkPerThread = 1 << 16;  // multiply-adds that amortize a thread start
    const double total = static_cast<double>(n) * std::max(cost, 1.0);
    int64_t nt = std::min<int64_t>(threads_, n);
    nt = std::min<int64_t>(nt, std::max<int64_t>(1, static_cast<int64_t>(total / kMinWorkPerThread)));
    if (nt <= 1) {
        fn(0, n);
        return;
    }
    std::vector<std::exception_ptr> errors(static_cast<size_t>(nt));
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(nt - 1));
    auto run = [&](int64_t t) {
        try {
            fn(n * t / nt, n * (t + 1) / nt);
        } catch (...) {
            errors[static_cast<size_t>(t)] = std::current_exception();
        }
    };
    for (int64_t t = 1; t < nt; ++t) pool.emplace_back(run, t);
    run(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

std::unique_ptr<CpuBackend> make_cpu_backend_threads(int threads) {
    return std::make_unique<CpuBackend>(threads);
}

std::unique_ptr<Backend> make_cpu_backend() {
    return std::make_unique<CpuBackend>(0);
}

}  // namespace ds4r
