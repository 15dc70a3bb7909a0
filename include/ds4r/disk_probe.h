// Measures the disk under a file (io/): what `bench` reports every I/O figure against (issue 14).
// Reads bypass the page cache with O_DIRECT (where the file system refuses it the figures are of the
// page cache and `direct` says so).
#pragma once

#include <string>

namespace ds4r {

struct DiskRates {
    std::string file;           // the file read
    bool direct = false;        // O_DIRECT was used
    double seq_mb_s = 0;        // sequential reads, 8 MiB requests, 4 in flight (MB = 1e6 bytes)
    double iops_qd1 = 0;        // random 4 KiB reads, 1 in flight
    double iops_qd32 = 0;       // 32 in flight
    double iops_qd256 = 0;      // 256 in flight
    std::string random_engine;  // "io_uring" or "pread threads"
    double best_iops() const;
};

// Each measurement runs about `seconds` (random offsets come from a fixed seed). RuntimeError naming the
// file when it cannot be read.
DiskRates measure_disk(const std::string& path, double seconds);

}  // namespace ds4r
