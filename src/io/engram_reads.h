// The random-read engines of the Engram gather (include/ds4r/engram_io.h): the reads a table's row set
// needs are planned as 4 KiB-aligned requests in file order, then issued by io_uring or by a pool of
// pread threads. Each request reads into a bounce buffer and its pieces (a row, or a row's scales) are
// copied out. Internal to io/.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ds4r::engram_reads {

constexpr uint64_t kAlign = 4096;             // O_DIRECT: offsets, lengths and buffers
constexpr uint64_t kMaxRequest = 128u << 10;  // adjacent pages merge up to this (a bounce buffer)

struct Piece {
    uint64_t offset = 0;  // file offset of the bytes wanted
    uint32_t len = 0;
    uint8_t* dst = nullptr;
};
struct Request {
    uint64_t offset = 0;  // aligned
    uint32_t len = 0;     // aligned, <= kMaxRequest
    uint32_t needed = 0;  // bytes from `offset` that the pieces need (<= len; the rest may be past EOF)
    size_t first = 0, count = 0;  // pieces[first, first + count)
};

// Pieces sorted by offset -> requests (a piece joins the previous request when its aligned cover
// overlaps or touches it and the request stays <= kMaxRequest).
std::vector<Request> plan_requests(const std::vector<Piece>& pieces);

using PreadFn = std::function<ssize_t(int fd, void* buf, size_t n, off_t off)>;

// The file being read: an O_DIRECT descriptor (-1 where refused) and a buffered one. `direct_ok` turns
// false (for every thread) when a read on the O_DIRECT one fails with EINVAL.
struct TableFile {
    std::string path;
    int direct_fd = -1;
    int buffered_fd = -1;
    std::atomic<bool> direct_ok{false};
    PreadFn pread;  // ::pread unless a test replaced it
};

struct ReadCounters {
    uint64_t requests = 0, bytes = 0;
    double busy_s = 0;  // time with at least one request in flight
};

// Reads request `r` into `buf` (kMaxRequest bytes, 4 KiB aligned) with retries: EINTR, short reads
// (the rest continues, on the buffered descriptor when it would be unaligned), O_DIRECT refused (EINVAL:
// buffered from then on). EOF before `needed` bytes: CheckpointError naming the file (truncated); other
// errors: RuntimeError naming the file and offset. Then copies the request's pieces out.
void read_request_sync(TableFile& f, const Request& r, const std::vector<Piece>& pieces, uint8_t* buf);

// Issues every request with `threads` pread threads (each with its own bounce buffer).
void read_with_threads(TableFile& f, const std::vector<Request>& reqs, const std::vector<Piece>& pieces,
                       int threads, const std::atomic<bool>* stop, ReadCounters& c);

// True when this build has io_uring and the kernel lets this process set up a ring (tested once).
bool uring_available(std::string* why);
// Issues every request through one io_uring with `depth` requests in flight; completions that are short
// or failed are finished with read_request_sync. Returns false (nothing read) when the ring cannot be set
// up; `why` then says why.
bool read_with_uring(TableFile& f, const std::vector<Request>& reqs, const std::vector<Piece>& pieces,
                     int depth, const std::atomic<bool>* stop, ReadCounters& c, std::string* why);

}  // namespace ds4r::engram_reads
