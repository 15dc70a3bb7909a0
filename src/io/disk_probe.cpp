// Disk measurement for `bench` (include/ds4r/disk_probe.h).
#include "ds4r/disk_probe.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "ds4r/clock.h"
#include "ds4r/error.h"
#include "io/engram_reads.h"

#ifdef DS4R_HAVE_URING
#include <liburing.h>
#endif

namespace ds4r {

namespace {

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
};

std::unique_ptr<uint8_t, FreeDeleter> aligned(size_t bytes) {
    void* p = std::aligned_alloc(4096, bytes);
    if (!p) throw OutOfMemoryError("disk probe: cannot allocate its buffers");
    return std::unique_ptr<uint8_t, FreeDeleter>(static_cast<uint8_t*>(p));
}

void read_or_throw(int fd, uint8_t* buf, size_t n, uint64_t off, const std::string& path) {
    for (;;) {
        const ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(off));
        if (r >= 0) return;
        if (errno == EINTR) continue;
        DS4R_THROW(RuntimeError, "%s: disk probe read at %llu failed (%s)", path.c_str(),
                   (unsigned long long)off, errno_text(errno).c_str());
    }
}

double sequential_mb_s(int fd, uint64_t size, double seconds, SequentialProbeShape shape,
                       const std::string& path) {
    const size_t req = shape.request_bytes;
    const uint64_t blocks = std::max<uint64_t>(1, size / req);
    std::atomic<uint64_t> next{0}, bytes{0};
    const double t0 = now_s();
    std::vector<std::thread> pool;
    std::exception_ptr err;
    std::atomic<bool> failed{false};
    for (int t = 0; t < shape.in_flight; ++t)
        pool.emplace_back([&] {
            try {
                auto buf = aligned(req);
                for (int mine = 0; !failed && (mine < 2 || now_s() - t0 < seconds); ++mine) {
                    const uint64_t b = next.fetch_add(1);
                    if (b >= blocks) return;
                    read_or_throw(fd, buf.get(), req, b * req, path);
                    bytes += req;
                }
            } catch (...) {
                if (!failed.exchange(true)) err = std::current_exception();
            }
        });
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
    const double dt = now_s() - t0;
    return dt > 0 ? static_cast<double>(bytes.load()) / 1e6 / dt : 0;
}

double random_iops_threads(int fd, uint64_t pages, int depth, double seconds, const std::string& path) {
    std::atomic<uint64_t> done{0};
    std::atomic<bool> failed{false};
    std::exception_ptr err;
    const double t0 = now_s();
    std::vector<std::thread> pool;
    for (int t = 0; t < depth; ++t)
        pool.emplace_back([&, t] {
            try {
                auto buf = aligned(4096);
                std::mt19937_64 rng(1234 + static_cast<uint64_t>(t));
                while (!failed && now_s() - t0 < seconds) {
                    read_or_throw(fd, buf.get(), 4096, (rng() % pages) * 4096, path);
                    ++done;
                }
            } catch (...) {
                if (!failed.exchange(true)) err = std::current_exception();
            }
        });
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
    return static_cast<double>(done.load()) / (now_s() - t0);
}

#ifdef DS4R_HAVE_URING
// Returns < 0 when the ring cannot be set up.
double random_iops_uring(int fd, uint64_t pages, int depth, double seconds, const std::string& path) {
    auto bufs = aligned(static_cast<size_t>(depth) * 4096);
    io_uring ring;
    if (io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0) < 0) return -1;
    std::mt19937_64 rng(1234);
    uint64_t done = 0;
    int inflight = 0;
    const double t0 = now_s();
    std::string error;
    auto submit = [&](int slot) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        io_uring_prep_read(sqe, fd, bufs.get() + static_cast<size_t>(slot) * 4096, 4096,
                           (rng() % pages) * 4096);
        io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(slot));
        ++inflight;
    };
    for (int s = 0; s < depth; ++s) submit(s);
    io_uring_submit(&ring);
    while (inflight > 0) {
        io_uring_cqe* cqe = nullptr;
        const int rc = io_uring_wait_cqe(&ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc < 0) {
            error = errno_text(-rc);
            break;
        }
        const int slot = static_cast<int>(io_uring_cqe_get_data64(cqe));
        if (cqe->res < 0 && error.empty()) error = errno_text(-cqe->res);
        io_uring_cqe_seen(&ring, cqe);
        --inflight;
        ++done;
        if (error.empty() && now_s() - t0 < seconds) {
            submit(slot);
            io_uring_submit(&ring);
        }
    }
    const double dt = now_s() - t0;
    io_uring_queue_exit(&ring);
    if (!error.empty())
        DS4R_THROW(RuntimeError, "%s: disk probe io_uring read failed (%s)", path.c_str(), error.c_str());
    return static_cast<double>(done) / dt;
}
#endif

}  // namespace

double DiskRates::best_iops() const {
    return std::max({iops_qd1, iops_qd32, iops_qd256});
}

SequentialProbeShape sequential_probe_shape(size_t read_request_bytes, int read_threads, uint64_t file_size) {
    constexpr size_t kPage = 4096;
    SequentialProbeShape s;
    s.in_flight = std::clamp(read_threads, 1, 32);
    s.request_bytes = (std::max<size_t>(read_request_bytes, 1) + kPage - 1) / kPage * kPage;
    const uint64_t per_request = file_size / (static_cast<uint64_t>(s.in_flight) * 2);
    if (per_request < s.request_bytes)
        s.request_bytes = std::max<size_t>(kPage, static_cast<size_t>(per_request / kPage * kPage));
    return s;
}

std::string pick_disk_probe_file(const std::vector<std::string>& paths, std::string* why) {
    std::string dense, any;
    uint64_t dense_bytes = 0, any_bytes = 0, any_size = 0;
    for (const std::string& p : paths) {
        struct stat st {};
        if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        const auto size = static_cast<uint64_t>(st.st_size);
        const uint64_t on_disk = std::min<uint64_t>(static_cast<uint64_t>(st.st_blocks) * 512, size);
        if (on_disk * 10 >= size * 9 && size > 0 && on_disk > dense_bytes) dense_bytes = on_disk, dense = p;
        if (on_disk > any_bytes || any.empty()) any_bytes = on_disk, any = p, any_size = size;
    }
    if (!dense.empty()) {
        if (why) *why = "the largest dense file";
        return dense;
    }
    if (why && !any.empty())
        *why = strfmt("no file is dense: %.1f of %.1f GB allocated, the rest holes that read from no disk",
                      any_bytes / 1e9, any_size / 1e9);
    return any;
}

DiskRates measure_disk(const std::string& path, double seconds, SequentialProbeShape seq) {
    DiskRates d;
    d.file = path;
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    d.direct = f.fd >= 0;
    if (f.fd < 0) f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) DS4R_THROW(RuntimeError, "%s: cannot open (%s)", path.c_str(), errno_text(errno).c_str());
    struct stat st {};
    if (::fstat(f.fd, &st) != 0 || st.st_size < 8192)
        DS4R_THROW(RuntimeError, "%s: too small to measure the disk with", path.c_str());
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    const uint64_t pages = size / 4096;
    seq = sequential_probe_shape(seq.request_bytes, seq.in_flight, size);
    d.seq_request_bytes = seq.request_bytes;
    d.seq_in_flight = seq.in_flight;
    d.seq_mb_s = sequential_mb_s(f.fd, size, seconds, seq, path);
    double* out[] = {&d.iops_qd1, &d.iops_qd32, &d.iops_qd256};
    const int depths[] = {1, 32, 256};
    d.random_engine = "pread threads";
    for (int i = 0; i < 3; ++i) {
        double v = -1;
#ifdef DS4R_HAVE_URING
        if (engram_reads::uring_available(nullptr)) {
            v = random_iops_uring(f.fd, pages, depths[i], seconds, path);
            if (v >= 0) d.random_engine = "io_uring";
        }
#endif
        if (v < 0) v = random_iops_threads(f.fd, pages, depths[i], seconds, path);
        *out[i] = v;
    }
    return d;
}

}  // namespace ds4r
