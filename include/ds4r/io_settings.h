// I/O settings of a run (`score` and `bench` flags; docs/DESIGN.md 8b: settings a user needs are flags, not
// environment variables). One struct, filled by the CLI, handed to the weight source and the Engram gather.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ds4r {

struct PrefetchOptions;

// How the Engram rows of a pass are read (docs/MODEL.md 4.8 step 1; include/ds4r/engram_io.h).
enum class EngramIoMode {
    Auto,   // io_uring where the kernel allows it (tested at run time), else the pread pool
    Uring,  // io_uring with O_DIRECT, `engram_queue_depth` requests in flight (falls back to pread if
            // refused)
    Pread,  // a pool of `engram_queue_depth` threads (at most 64) issuing O_DIRECT preads
    Mmap,   // the table mapped read-only, rows copied through page faults by 16 threads (the old engine)
};
// Whether a table's e8m0 scale tensor (rows x head_dim/32 bytes: ~3 GB per released table) is read
// once sequentially and kept in host memory, or read per row next to the row.
enum class EngramScalesMode {
    Auto,    // in memory when all tables' scales take at most a quarter of MemAvailable
    Memory,  // always in memory
    Disk,    // always per row
};
// Whether the next pass's Engram rows are gathered while the current pass runs (`--engram-next-pass`;
// include/ds4r/engram_io.h): hides the gather of layer 1's table behind the previous pass's layers.
enum class EngramNextPassMode {
    Auto,  // gathered during the current pass: each table once the current pass freed it (one set of rows
           // in memory), or at once when a second full set takes <= 1/4 of MemAvailable (checked per pass)
    On,    // gathered at once, always (a second full set: ~13 KB per token more of the released model)
    Off,   // never: each pass gathers its rows when it begins (the earlier behaviour)
};
struct IoSettings {
    bool direct_weights = true;  // --io direct|buffered: O_DIRECT weight reads (buffered where refused)
    int read_threads = 4;        // --read-threads: weight reader threads (requests in flight), 1..32
    int read_request_mb = 64;    // --read-request-mb: largest single weight read, MiB, 1..1024
    EngramIoMode engram_io = EngramIoMode::Auto;  // --engram-io auto|uring|pread|mmap
    // --engram-queue-depth: Engram read requests in flight, 1..1024. 256: the depth at which the H200
    // machine's disk measured best (83k random 4 KiB reads/s vs 76k at 32; docs/PERFORMANCE.md); io_uring
    // bounce buffers of 128 KiB each = 32 MiB.
    int engram_queue_depth = 256;
    EngramScalesMode engram_scales = EngramScalesMode::Auto;         // --engram-scales auto|memory|disk
    EngramNextPassMode engram_next_pass = EngramNextPassMode::Auto;  // --engram-next-pass auto|on|off
};

const char* engram_io_name(EngramIoMode m);
std::optional<EngramIoMode> engram_io_from_name(std::string_view s);
const char* engram_scales_name(EngramScalesMode m);
std::optional<EngramScalesMode> engram_scales_from_name(std::string_view s);
const char* engram_next_pass_name(EngramNextPassMode m);
std::optional<EngramNextPassMode> engram_next_pass_from_name(std::string_view s);

// Throws InputError naming the flag when a field is out of range.
void validate_io_settings(const IoSettings& io);
// The prefetching weight source's options for these settings (the rest at their defaults).
PrefetchOptions prefetch_options(const IoSettings& io);

}  // namespace ds4r
