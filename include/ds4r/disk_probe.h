// Measures the disk under a file (io/): what `bench` reports every I/O figure against (issue 14).
// Reads bypass the page cache with O_DIRECT (where the file system refuses it the figures are of the
// page cache and `direct` says so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds4r {

struct DiskRates {
    std::string file;     // the file read
    bool direct = false;  // O_DIRECT was used
    double seq_mb_s = 0;  // sequential O_DIRECT reads as the weight reader issues them (MB = 1e6 bytes)
    size_t seq_request_bytes = 0;  // of those reads: request size
    int seq_in_flight = 0;         // and requests in flight
    double iops_qd1 = 0;           // random 4 KiB reads, 1 in flight
    double iops_qd32 = 0;          // 32 in flight
    double iops_qd256 = 0;         // 256 in flight
    std::string random_engine;     // "io_uring" or "pread threads"
    double best_iops() const;
};

// The sequential test's requests: the weight reader's (PrefetchOptions::read_request_bytes rounded up to
// 4 KiB, read_threads in flight), so that "weight reads as a fraction of the disk's sequential rate" compares
// like with like. A file smaller than request x in_flight x 2 gets smaller requests (>= 4 KiB), so that
// every reader has at least two.
struct SequentialProbeShape {
    size_t request_bytes = 0;
    int in_flight = 0;
};
SequentialProbeShape sequential_probe_shape(size_t read_request_bytes, int read_threads, uint64_t file_size);

// The file to measure the disk under, of `paths`: the one with the most bytes on disk among those at least
// 90% allocated (a synthetic checkpoint's Engram tables are sparse files whose holes read as zeros from no
// disk at all, at page-cache speed); when none is, the one with the most bytes on disk. `why` says which.
// Files that cannot be stat'ed are skipped; "" when none can.
std::string pick_disk_probe_file(const std::vector<std::string>& paths, std::string* why = nullptr);

// Each measurement runs about `seconds` (random offsets come from a fixed seed); the sequential one at
// least two requests per reader. RuntimeError naming the file when it cannot be read.
DiskRates measure_disk(const std::string& path, double seconds, SequentialProbeShape seq);

}  // namespace ds4r
