// Engram read engines: request planning, synchronous reads with retries, the pread pool and io_uring
// (src/io/engram_reads.h).
#include "io/engram_reads.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "ds4r/clock.h"
#include "ds4r/error.h"
#include "ds4r/log.h"

#ifdef DS4R_HAVE_URING
#include <liburing.h>
#endif

namespace ds4r::engram_reads {

namespace {

struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

AlignedBuffer aligned_buffer(size_t bytes) {
    void* p = std::aligned_alloc(kAlign, bytes);
    if (!p) throw OutOfMemoryError(strfmt("Engram gather: cannot allocate a %zu-byte read buffer", bytes));
    return AlignedBuffer(static_cast<uint8_t*>(p));
}

// Union of the intervals during which at least one request is in flight, over all threads.
class BusyClock {
public:
    void start() {
        std::lock_guard<std::mutex> lk(mu_);
        if (inflight_++ == 0) since_ = now_s();
    }
    void stop() {
        std::lock_guard<std::mutex> lk(mu_);
        if (--inflight_ == 0) busy_ += now_s() - since_;
    }
    double busy() const {
        std::lock_guard<std::mutex> lk(mu_);
        return busy_;
    }

private:
    mutable std::mutex mu_;
    int inflight_ = 0;
    double since_ = 0, busy_ = 0;
};

void copy_pieces(const Request& r, const std::vector<Piece>& pieces, const uint8_t* buf) {
    for (size_t i = r.first; i < r.first + r.count; ++i)
        std::memcpy(pieces[i].dst, buf + (pieces[i].offset - r.offset), pieces[i].len);
}

}  // namespace

std::vector<Request> plan_requests(const std::vector<Piece>& pieces) {
    std::vector<Request> out;
    uint64_t end = 0;  // aligned end of the current request
    for (size_t i = 0; i < pieces.size(); ++i) {
        const Piece& p = pieces[i];
        const uint64_t a = p.offset / kAlign * kAlign;
        const uint64_t e = (p.offset + p.len + kAlign - 1) / kAlign * kAlign;
        if (!out.empty() && a <= end && std::max(e, end) - out.back().offset <= kMaxRequest) {
            Request& r = out.back();
            end = std::max(e, end);
            r.len = static_cast<uint32_t>(end - r.offset);
            r.needed = std::max<uint32_t>(r.needed, static_cast<uint32_t>(p.offset + p.len - r.offset));
            ++r.count;
            continue;
        }
        Request r;
        r.offset = a;
        r.len = static_cast<uint32_t>(e - a);
        r.needed = static_cast<uint32_t>(p.offset + p.len - a);
        r.first = i;
        r.count = 1;
        out.push_back(r);
        end = e;
    }
    return out;
}

void read_request_sync(TableFile& f, const Request& r, const std::vector<Piece>& pieces, uint8_t* buf) {
    size_t done = 0;
    while (done < r.needed) {
        const bool direct = f.direct_fd >= 0 && f.direct_ok.load(std::memory_order_acquire) &&
                            (r.offset + done) % kAlign == 0;
        const int fd = direct ? f.direct_fd : f.buffered_fd;
        // O_DIRECT reads whole aligned blocks; the buffered descriptor reads just what is missing.
        const size_t want = direct ? r.len - done : r.needed - done;
        const ssize_t got = f.pread ? f.pread(fd, buf + done, want, static_cast<off_t>(r.offset + done))
                                    : ::pread(fd, buf + done, want, static_cast<off_t>(r.offset + done));
        if (got < 0) {
            const int err = errno;
            if (err == EINTR || err == EAGAIN) continue;
            if (err == EINVAL && direct) {  // the file system takes O_DIRECT at open but not at read
                if (f.direct_ok.exchange(false))
                    log_warn(strfmt("%s: O_DIRECT refused at read (%s): Engram rows through the page cache",
                                    f.path.c_str(), errno_text(err).c_str()));
                continue;
            }
            DS4R_THROW(RuntimeError, "%s: Engram read of %zu bytes at offset %llu failed (%s)",
                       f.path.c_str(), want, (unsigned long long)(r.offset + done), errno_text(err).c_str());
        }
        if (got == 0) {
            struct stat st {};
            const long long size = ::fstat(f.buffered_fd, &st) == 0 ? (long long)st.st_size : -1;
            DS4R_THROW(CheckpointError,
                       "%s: shard truncated: the Engram table needs bytes up to %llu, the file ends at %lld",
                       f.path.c_str(), (unsigned long long)(r.offset + r.needed), size);
        }
        done += static_cast<size_t>(got);
    }
    copy_pieces(r, pieces, buf);
}

void read_with_threads(TableFile& f, const std::vector<Request>& reqs, const std::vector<Piece>& pieces,
                       int threads, const std::atomic<bool>* stop, ReadCounters& c) {
    threads = std::clamp<int>(threads, 1, 64);
    threads =
        static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), std::max<size_t>(reqs.size(), 1)));
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex err_mu;
    std::exception_ptr err;
    BusyClock clock;
    std::atomic<uint64_t> bytes{0};
    auto worker = [&]() {
        try {
            AlignedBuffer buf = aligned_buffer(kMaxRequest);
            for (;;) {
                if (failed.load(std::memory_order_relaxed) || (stop && stop->load(std::memory_order_relaxed)))
                    return;
                const size_t i = next.fetch_add(1);
                if (i >= reqs.size()) return;
                clock.start();
                try {
                    read_request_sync(f, reqs[i], pieces, buf.get());
                } catch (...) {
                    clock.stop();
                    throw;
                }
                clock.stop();
                bytes += reqs[i].len;
            }
        } catch (...) {
            std::lock_guard<std::mutex> lk(err_mu);
            if (!err) err = std::current_exception();
            failed = true;
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
    if (stop && stop->load()) throw RuntimeError(f.path + ": Engram gather cancelled");
    c.requests += reqs.size();
    c.bytes += bytes.load();
    c.busy_s += clock.busy();
}

#ifdef DS4R_HAVE_URING

bool uring_available(std::string* why) {
    static std::once_flag once;
    static bool ok = false;
    static std::string reason;
    std::call_once(once, [] {
        io_uring ring;
        const int rc = io_uring_queue_init(4, &ring, 0);
        if (rc < 0) {
            reason = "io_uring_queue_init: " + errno_text(-rc);
            return;
        }
        io_uring_queue_exit(&ring);
        ok = true;
    });
    if (why) *why = reason;
    return ok;
}

bool read_with_uring(TableFile& f, const std::vector<Request>& reqs, const std::vector<Piece>& pieces,
                     int depth, const std::atomic<bool>* stop, ReadCounters& c, std::string* why) {
    depth = std::clamp(depth, 1, 1024);
    const size_t slots = std::min<size_t>(static_cast<size_t>(depth), std::max<size_t>(reqs.size(), 1));
    // Declared before the ring: the ring is torn down (nothing in flight) before the buffers are freed.
    AlignedBuffer bufs = aligned_buffer(slots * kMaxRequest);
    io_uring ring;
    const int rc = io_uring_queue_init(static_cast<unsigned>(slots), &ring, 0);
    if (rc < 0) {
        if (why) *why = "io_uring_queue_init: " + errno_text(-rc);
        return false;
    }
    struct RingGuard {
        io_uring* r;
        ~RingGuard() { io_uring_queue_exit(r); }
    } guard{&ring};
    std::vector<size_t> free_slots;
    for (size_t s = slots; s-- > 0;) free_slots.push_back(s);
    std::vector<size_t> slot_req(slots, 0);
    size_t next = 0, inflight = 0;
    uint64_t bytes = 0;
    double busy = 0, since = 0;
    std::exception_ptr err;
    auto slot_buf = [&](size_t s) { return bufs.get() + s * kMaxRequest; };
    while (next < reqs.size() || inflight > 0) {
        const bool stopping = err || (stop && stop->load(std::memory_order_relaxed));
        unsigned queued = 0;
        while (!stopping && next < reqs.size() && !free_slots.empty()) {
            io_uring_sqe* sqe = io_uring_get_sqe(&ring);
            if (!sqe) break;
            const size_t s = free_slots.back();
            free_slots.pop_back();
            slot_req[s] = next;
            const Request& r = reqs[next++];
            const bool direct = f.direct_fd >= 0 && f.direct_ok.load(std::memory_order_acquire);
            io_uring_prep_read(sqe, direct ? f.direct_fd : f.buffered_fd, slot_buf(s), r.len, r.offset);
            io_uring_sqe_set_data64(sqe, s);
            ++queued;
        }
        if (queued) {
            if (inflight == 0) since = now_s();
            inflight += queued;
            int sr;
            do sr = io_uring_submit(&ring);
            while (sr == -EINTR);
            if (sr < 0) {
                // Queued entries that were not submitted never reach the kernel: only the error stays.
                err = std::make_exception_ptr(RuntimeError(
                    strfmt("%s: io_uring_submit failed (%s)", f.path.c_str(), errno_text(-sr).c_str())));
                inflight -= queued;
                if (inflight == 0) busy += now_s() - since;
            }
        }
        if (inflight == 0) {
            if (stopping || next >= reqs.size()) break;
            continue;
        }
        io_uring_cqe* cqe = nullptr;
        int wr = io_uring_wait_cqe(&ring, &cqe);
        if (wr == -EINTR) continue;
        if (wr < 0) {
            // Requests may still be in flight into the buffers: never free them (a leak on a broken ring).
            (void)bufs.release();
            DS4R_THROW(RuntimeError, "%s: io_uring_wait_cqe failed (%s)", f.path.c_str(),
                       errno_text(-wr).c_str());
        }
        // Reap every completion that is ready.
        unsigned head;
        unsigned n = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            ++n;
            const size_t s = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
            const Request& r = reqs[slot_req[s]];
            const int res = cqe->res;
            if (!err) {
                try {
                    if (res >= 0 && static_cast<uint32_t>(res) >= r.needed) {
                        copy_pieces(r, pieces, slot_buf(s));
                    } else {
                        // Short, interrupted or refused: the synchronous path retries, falls back to
                        // buffered reads or names the truncated file.
                        if (res == -EINVAL && f.direct_fd >= 0 && f.direct_ok.exchange(false))
                            log_warn(
                                strfmt("%s: O_DIRECT refused at read: Engram rows through the page cache",
                                       f.path.c_str()));
                        read_request_sync(f, r, pieces, slot_buf(s));
                    }
                    bytes += r.len;
                } catch (...) {
                    err = std::current_exception();
                }
            }
            free_slots.push_back(s);
        }
        io_uring_cq_advance(&ring, n);
        inflight -= n;
        if (inflight == 0) busy += now_s() - since;
    }
    if (err) std::rethrow_exception(err);
    if (stop && stop->load()) throw RuntimeError(f.path + ": Engram gather cancelled");
    c.requests += reqs.size();
    c.bytes += bytes;
    c.busy_s += busy;
    return true;
}

#else

bool uring_available(std::string* why) {
    if (why) *why = "this build has no io_uring (liburing was not found at configure time)";
    return false;
}

bool read_with_uring(TableFile&, const std::vector<Request>&, const std::vector<Piece>&, int,
                     const std::atomic<bool>*, ReadCounters&, std::string* why) {
    uring_available(why);
    return false;
}

#endif

}  // namespace ds4r::engram_reads
