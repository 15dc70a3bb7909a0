// CudaBackend core: device selection, memory, copies, the copy queue.
#include "backend/cuda/cuda_backend.h"

#include <unistd.h>

#include <cstdlib>
#include <deque>

#include "ds4r/log.h"
#include "ds4r/settings.h"

namespace ds4r {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    throw RuntimeError(
        strfmt("CUDA error %s (%s) in %s", cudaGetErrorName(err), cudaGetErrorString(err), expr), file, line);
}

void throw_cublas_error(cublasStatus_t st, const char* expr, const char* file, int line) {
    throw RuntimeError(strfmt("cuBLAS error %d in %s", static_cast<int>(st), expr), file, line);
}

namespace {

// GPU memory budget: the product targets a 24 GB card (docs/DESIGN.md 5): <= 22 GB whatever the GPU unless
// --gpu-memory-gb says otherwise (benchmarks on bigger GPUs keep the default on purpose).
size_t memory_budget_bytes(double gpu_memory_gb) {
    return static_cast<size_t>(gpu_memory_gb > 0 ? gpu_memory_gb * 1e9 : 22e9);
}

class CudaCopyQueue : public CopyQueue {
public:
    CudaCopyQueue(CudaBackend& be) : be_(be) {
        DS4R_CUDA_CHECK(cudaSetDevice(be.device()));
        DS4R_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    }
    ~CudaCopyQueue() override {
        cudaSetDevice(be_.device());
        cudaStreamSynchronize(stream_);
        events_.clear();
        if (compute_ev_) cudaEventDestroy(compute_ev_);
        cudaStreamDestroy(stream_);
    }
    // The queue is used from the prefetcher's threads: every call selects the backend's device
    // (the CUDA current device is per host thread).
    void copy(const Tensor& dst, size_t off, const void* src, size_t bytes) override {
        DS4R_CHECK(off + bytes <= dst.nbytes(), "copy queue: %zu bytes at %zu past a %zu-byte tensor", bytes,
                   off, dst.nbytes());
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        DS4R_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + off, src, bytes,
                                        cudaMemcpyHostToDevice, stream_));
    }
    void download(void* dst, const Tensor& src, size_t off, size_t bytes) override {
        DS4R_CHECK(off + bytes <= src.nbytes(),
                   "copy queue: download of %zu bytes at %zu past a %zu-byte tensor", bytes, off,
                   src.nbytes());
        if (bytes == 0) return;
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        DS4R_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const uint8_t*>(src.data) + off, bytes,
                                        cudaMemcpyDeviceToHost, stream_));
    }
    // One event, re-recorded per call: a stream wait captures the event's state when it is issued.
    void wait_compute() override {
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        if (!compute_ev_) DS4R_CUDA_CHECK(cudaEventCreateWithFlags(&compute_ev_, cudaEventDisableTiming));
        DS4R_CUDA_CHECK(cudaEventRecord(compute_ev_, be_.stream()));
        DS4R_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ev_, 0));
    }
    uint64_t fence() override {
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        auto ev = std::make_shared<Event>();
        DS4R_CUDA_CHECK(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming));
        DS4R_CUDA_CHECK(cudaEventRecord(ev->e, stream_));
        std::lock_guard<std::mutex> lk(mu_);
        events_.emplace_back(++next_, ev);
        // Keep the recent ones only: fences are waited on in order. An event being waited on by
        // another thread stays alive through its shared_ptr.
        while (events_.size() > 64) events_.pop_front();
        return next_;
    }
    void host_wait(uint64_t f) override {
        auto ev = find(f);
        if (!ev) return;
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        DS4R_CUDA_CHECK(cudaEventSynchronize(ev->e));
    }
    void compute_wait(uint64_t f) override {
        auto ev = find(f);
        if (!ev) return;
        DS4R_CUDA_CHECK(cudaSetDevice(be_.device()));
        DS4R_CUDA_CHECK(cudaStreamWaitEvent(be_.stream(), ev->e, 0));
    }

private:
    struct Event {
        cudaEvent_t e = nullptr;
        ~Event() {
            if (e) cudaEventDestroy(e);
        }
    };
    std::shared_ptr<Event> find(uint64_t f) {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& e : events_)
            if (e.first == f) return e.second;
        DS4R_CHECK(f <= next_ && (events_.empty() || f < events_.front().first),
                   "copy queue: unknown fence %llu", (unsigned long long)f);
        return nullptr;  // older than the kept window: long complete (waited in order)
    }
    CudaBackend& be_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t compute_ev_ = nullptr;  // wait_compute(): compute thread only
    std::mutex mu_;
    std::deque<std::pair<uint64_t, std::shared_ptr<Event>>> events_;
    uint64_t next_ = 0;
};

}  // namespace

CudaBackend::CudaBackend(int device, size_t budget, GpuKernels kernels) : device_(device), budget_(budget) {
    DS4R_CUDA_CHECK(cudaSetDevice(device));
    gemm_ = select_gemm_kernels(kernels, device);
    DS4R_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
    DS4R_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DS4R_CUDA_CHECK(cudaStreamCreateWithFlags(&prep_stream_, cudaStreamNonBlocking));
    DS4R_CUDA_CHECK(cudaEventCreateWithFlags(&prep_start_, cudaEventDisableTiming));
    DS4R_CUDA_CHECK(cudaEventCreateWithFlags(&prep_done_, cudaEventDisableTiming));
    DS4R_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device));
    // Keep freed blocks in the pool: per-chunk temporaries are reused without new cudaMalloc calls.
    uint64_t threshold = UINT64_MAX;
    DS4R_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
}

CudaBackend::~CudaBackend() {
    if (prep_stream_) cudaStreamSynchronize(prep_stream_);
    if (stream_) cudaStreamSynchronize(stream_);
    prepared_ = PreparedExperts{};  // its buffer returns to the pool while the streams still exist
    if (cublas_) cublasDestroy(cublas_);
    if (prep_done_) cudaEventDestroy(prep_done_);
    if (prep_start_) cudaEventDestroy(prep_start_);
    if (prep_stream_) cudaStreamDestroy(prep_stream_);
    if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
    return strfmt("cuda:%d (%s, sm_%d%d, %.1f GiB, budget %.1f GB, %s kernels)", device_, props_.name,
                  props_.major, props_.minor, props_.totalGlobalMem / 1073741824.0, budget_ / 1e9,
                  gemm_.name());
}

Tensor CudaBackend::alloc(DType t, const Shape& shape) {
    std::string why;
    std::optional<Tensor> x = allocate(t, shape, &why);
    if (!x) throw OutOfMemoryError(why);
    return *x;
}

std::optional<Tensor> CudaBackend::try_alloc(DType t, const Shape& shape) {
    return allocate(t, shape, nullptr);
}

// alloc's rule, once: nothing (and *why, when asked for) where the budget or the pool has no room;
// other CUDA failures throw.
std::optional<Tensor> CudaBackend::allocate(DType t, const Shape& shape, std::string* why) {
    Tensor x;
    x.dtype = t;
    x.shape = shape;
    for (int64_t d : shape) DS4R_CHECK(d >= 0, "alloc: negative dimension in %s", shape_str(shape).c_str());
    const size_t bytes = x.nbytes();
    if (bytes == 0) return x;
    const size_t rounded = (bytes + 255) / 256 * 256;
    if (in_use_.load() + rounded > budget_) {
        if (why)
            *why = strfmt(
                "GPU memory budget exceeded: %zu bytes in use + %zu requested > %zu budget (lower "
                "--max-batch-tokens / --pass-tokens, or raise --gpu-memory-gb)",
                in_use_.load(), rounded, budget_);
        return std::nullopt;
    }
    void* p = nullptr;
    cudaError_t err = cudaMallocAsync(&p, rounded, stream_);
    if (err != cudaSuccess) {
        cudaGetLastError();  // an allocation failure is not sticky: clear it
        const std::string msg = strfmt("cudaMallocAsync of %zu bytes failed (%s); %zu bytes in use", rounded,
                                       cudaGetErrorString(err), in_use_.load());
        if (err != cudaErrorMemoryAllocation) throw RuntimeError(msg);
        if (why) *why = msg;
        return std::nullopt;
    }
    size_t now = in_use_.fetch_add(rounded) + rounded;
    size_t hw = high_water_.load();
    while (now > hw && !high_water_.compare_exchange_weak(hw, now)) {
    }
    cudaStream_t s = stream_;
    auto* counter = &in_use_;
    x.data = p;
    x.hold = std::shared_ptr<void>(p, [s, counter, rounded](void* q) {
        cudaFreeAsync(q, s);
        counter->fetch_sub(rounded);
    });
    return x;
}

void CudaBackend::upload(const Tensor& dst, size_t off, const void* src, size_t bytes) {
    if (bytes == 0) return;
    DS4R_CHECK(off + bytes <= dst.nbytes(), "upload: %zu bytes at %zu past a %zu-byte tensor", bytes, off,
               dst.nbytes());
    DS4R_CUDA_CHECK(
        cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + off, src, bytes, cudaMemcpyHostToDevice, stream_));
    // The contract: src may be reused as soon as upload returns.
    DS4R_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* dst, const Tensor& src, size_t off, size_t bytes) {
    if (bytes == 0) return;
    DS4R_CHECK(off + bytes <= src.nbytes(), "download: %zu bytes at %zu past a %zu-byte tensor", bytes, off,
               src.nbytes());
    DS4R_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const uint8_t*>(src.data) + off, bytes,
                                    cudaMemcpyDeviceToHost, stream_));
    DS4R_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(const Tensor& dst, size_t doff, const Tensor& src, size_t soff, size_t bytes) {
    if (bytes == 0) return;
    DS4R_CHECK(doff + bytes <= dst.nbytes() && soff + bytes <= src.nbytes(),
               "copy: range outside the tensors");
    DS4R_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + doff,
                                    static_cast<const uint8_t*>(src.data) + soff, bytes,
                                    cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(const Tensor& t, uint8_t byte) {
    if (t.nbytes() == 0) return;
    DS4R_CUDA_CHECK(cudaMemsetAsync(t.data, byte, t.nbytes(), stream_));
}

void CudaBackend::synchronize() {
    DS4R_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

size_t CudaBackend::free_memory() const {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
    const size_t used = in_use_.load();
    const size_t by_budget = budget_ > used ? budget_ - used : 0;
    return std::min(free_b, by_budget);
}

std::shared_ptr<void> CudaBackend::alloc_host(size_t bytes) {
    void* p = nullptr;
    DS4R_CUDA_CHECK(cudaMallocHost(&p, std::max<size_t>(bytes, 1)));
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

std::unique_ptr<CopyQueue> CudaBackend::make_copy_queue() {
    return std::make_unique<CudaCopyQueue>(*this);
}

void CudaBackend::range_push(const char* name) {
    if (!profiling_enabled()) return;
    Range r{name, nullptr, nullptr};
    DS4R_CUDA_CHECK(cudaEventCreate(&r.start));
    DS4R_CUDA_CHECK(cudaEventCreate(&r.stop));
    DS4R_CUDA_CHECK(cudaEventRecord(r.start, stream_));
    open_ranges_.push_back(r);
}

void CudaBackend::range_pop() {
    if (!profiling_enabled() || open_ranges_.empty()) return;
    Range r = open_ranges_.back();
    open_ranges_.pop_back();
    DS4R_CUDA_CHECK(cudaEventRecord(r.stop, stream_));
    closed_ranges_.push_back(r);
    if (closed_ranges_.size() > 4096) profile_totals();  // fold, keeping the event count bounded
}

std::vector<std::pair<std::string, double>> CudaBackend::profile_totals() {
    if (!closed_ranges_.empty()) {
        DS4R_CUDA_CHECK(cudaStreamSynchronize(stream_));
        for (const Range& r : closed_ranges_) {
            float ms = 0;
            DS4R_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
            bool found = false;
            for (auto& [n, v] : profile_)
                if (n == r.name) {
                    v += ms * 1e-3;
                    found = true;
                }
            if (!found) profile_.emplace_back(r.name, ms * 1e-3);
            cudaEventDestroy(r.start);
            cudaEventDestroy(r.stop);
        }
        closed_ranges_.clear();
    }
    return profile_;
}

void CudaBackend::profile_reset() {
    profile_totals();
    profile_.clear();
}

cublasHandle_t CudaBackend::cublas() {
    if (!cublas_) {
        DS4R_CUBLAS_CHECK(cublasCreate(&cublas_));
        DS4R_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        // No TF32 anywhere (docs/DESIGN.md 4).
        DS4R_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH));
    }
    return cublas_;
}

std::unique_ptr<Backend> make_cuda_backend(int device, std::string* why, double gpu_memory_gb,
                                           GpuKernels kernels) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        cudaGetLastError();
        if (why) {
            // Without a loaded NVIDIA driver the runtime answers "driver version is insufficient",
            // which reads like an old driver: say what it means here.
            const bool driver_loaded = ::access("/proc/driver/nvidia/version", F_OK) == 0;
            if (err == cudaSuccess || err == cudaErrorNoDevice)
                *why = "no GPU found";
            else if (err == cudaErrorInsufficientDriver && !driver_loaded)
                *why = "no GPU found: no NVIDIA driver is loaded";
            else
                *why = strfmt("no usable GPU: %s", cudaGetErrorString(err));
        }
        return nullptr;
    }
    if (device < 0 || device >= n) {
        if (why) *why = strfmt("device %d does not exist (%d found)", device, n);
        return nullptr;
    }
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess || p.major < 8) {
        if (why)
            *why = strfmt("device %d (%s) is sm_%d%d; ds4replay needs sm_80 or newer", device, p.name,
                          p.major, p.minor);
        return nullptr;
    }
    try {
        return std::make_unique<CudaBackend>(device, memory_budget_bytes(gpu_memory_gb), kernels);
    } catch (const Error& e) {
        if (why) *why = e.what();
        return nullptr;
    }
}

}  // namespace ds4r
