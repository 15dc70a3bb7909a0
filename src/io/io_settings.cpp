// IoSettings: names, validation and the weight source's options (include/ds4r/io_settings.h).
#include "ds4r/io_settings.h"

#include "ds4r/error.h"
#include "ds4r/weights.h"

namespace ds4r {

const char* engram_io_name(EngramIoMode m) {
    switch (m) {
        case EngramIoMode::Auto:
            return "auto";
        case EngramIoMode::Uring:
            return "uring";
        case EngramIoMode::Pread:
            return "pread";
        case EngramIoMode::Mmap:
            return "mmap";
    }
    return "?";
}

std::optional<EngramIoMode> engram_io_from_name(std::string_view s) {
    for (EngramIoMode m : {EngramIoMode::Auto, EngramIoMode::Uring, EngramIoMode::Pread, EngramIoMode::Mmap})
        if (s == engram_io_name(m)) return m;
    return std::nullopt;
}

const char* engram_scales_name(EngramScalesMode m) {
    switch (m) {
        case EngramScalesMode::Auto:
            return "auto";
        case EngramScalesMode::Memory:
            return "memory";
        case EngramScalesMode::Disk:
            return "disk";
    }
    return "?";
}

std::optional<EngramScalesMode> engram_scales_from_name(std::string_view s) {
    for (EngramScalesMode m : {EngramScalesMode::Auto, EngramScalesMode::Memory, EngramScalesMode::Disk})
        if (s == engram_scales_name(m)) return m;
    return std::nullopt;
}

const char* engram_next_pass_name(EngramNextPassMode m) {
    switch (m) {
        case EngramNextPassMode::Auto:
            return "auto";
        case EngramNextPassMode::On:
            return "on";
        case EngramNextPassMode::Off:
            return "off";
    }
    return "?";
}

std::optional<EngramNextPassMode> engram_next_pass_from_name(std::string_view s) {
    for (EngramNextPassMode m : {EngramNextPassMode::Auto, EngramNextPassMode::On, EngramNextPassMode::Off})
        if (s == engram_next_pass_name(m)) return m;
    return std::nullopt;
}

void validate_io_settings(const IoSettings& io) {
    if (io.read_threads < 1 || io.read_threads > 32)
        DS4R_THROW(InputError, "--read-threads %d: expected 1..32", io.read_threads);
    if (io.read_request_mb < 1 || io.read_request_mb > 1024)
        DS4R_THROW(InputError, "--read-request-mb %d: expected 1..1024", io.read_request_mb);
    if (io.engram_queue_depth < 1 || io.engram_queue_depth > 1024)
        DS4R_THROW(InputError, "--engram-queue-depth %d: expected 1..1024", io.engram_queue_depth);
}

PrefetchOptions prefetch_options(const IoSettings& io) {
    validate_io_settings(io);
    PrefetchOptions po;
    po.direct_io = io.direct_weights;
    po.read_threads = io.read_threads;
    po.read_request_bytes = static_cast<size_t>(io.read_request_mb) << 20;
    return po;
}

}  // namespace ds4r
