// `score` / `bench` I/O flags (src/cli/io_flags.h).
#include "cli/io_flags.h"

#include <string>

#include "ds4r/error.h"

namespace ds4r::cli {

void add_kernels_flag(CLI::App* app, std::string* kernels) {
    app->add_option(
           "--kernels", *kernels,
           "CUDA GEMM kernels: auto (Hopper wgmma on H100/H200, portable elsewhere), portable "
           "(mma.sync, every GPU), hopper, or hopper-fp8 (fp8 wgmma partials: faster, not bit-identical)")
        ->check(CLI::IsMember({"auto", "portable", "hopper", "hopper-fp8"}))
        ->capture_default_str();
}

void add_prepared_experts_flag(CLI::App* app, ExpertLayout* widest) {
    app->add_option_function<std::string>(
           "--prepared-experts",
           [widest](const std::string& v) {
               *widest = v == "auto"   ? kAutoExpertLayout
                         : v == "fp16" ? ExpertLayout::F16
                         : v == "e5m2" ? ExpertLayout::E5m2
                                       : ExpertLayout::None;
           },
           "Hopper kernels: each layer's routed experts copied on the GPU in a layout the grouped GEMMs read "
           "faster (the same results): fp16 with the scales folded in (2 bytes per weight, 27.2 GB at full "
           "width) or e5m2 (1 byte, 13.6 GB); the widest copy allowed that takes at most half of the memory "
           "left for a pass's attention state (raise --gpu-memory-gb). fp16: either; e5m2: e5m2 only; auto: " +
               std::string(kAutoExpertLayout == ExpertLayout::F16 ? "fp16" : "e5m2") + "'s choice; off")
        ->check(CLI::IsMember({"auto", "fp16", "e5m2", "off"}))
        ->default_str("auto");
}

void add_fp16_weights_flag(CLI::App* app, bool* allow) {
    app->add_option_function<std::string>(
           "--fp16-weights", [allow](const std::string& v) { *allow = v == "auto"; },
           "Hopper kernels: the fp8 weights of GEMMs of 1,024 rows or more widened to fp16 first (a "
           "transient copy of up to 84 MB, made where the memory budget has room; faster GEMMs, the same "
           "results): auto or off")
        ->check(CLI::IsMember({"auto", "off"}))
        ->default_str("auto");
}

std::function<void()> add_io_flags(CLI::App* app, IoSettings* io) {
    auto weight_io = std::make_shared<std::string>(io->direct_weights ? "direct" : "buffered");
    auto engram_io = std::make_shared<std::string>(engram_io_name(io->engram_io));
    auto scales = std::make_shared<std::string>(engram_scales_name(io->engram_scales));
    auto next_pass = std::make_shared<std::string>(engram_next_pass_name(io->engram_next_pass));
    app->add_option("--io", *weight_io,
                    "Weight reads: direct (O_DIRECT, page cache bypassed; buffered where the file system "
                    "refuses it) or buffered (through the page cache)")
        ->check(CLI::IsMember({"direct", "buffered"}))
        ->capture_default_str();
    app->add_option("--read-threads", io->read_threads, "Weight reader threads (reads in flight), 1..32")
        ->check(CLI::Range(1, 32))
        ->capture_default_str();
    app->add_option("--read-request-mb", io->read_request_mb, "Largest single weight read in MiB, 1..1024")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    app->add_option("--engram-io", *engram_io,
                    "Engram row reads: auto (io_uring where the kernel allows it, else pread), uring, pread "
                    "(a pool of O_DIRECT pread threads) or mmap (page faults; the earlier engine). Results "
                    "do not depend on it")
        ->check(CLI::IsMember({"auto", "uring", "pread", "mmap"}))
        ->capture_default_str();
    app->add_option("--engram-queue-depth", io->engram_queue_depth,
                    "Engram read requests in flight (io_uring entries; pread threads, at most 64), 1..1024")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    app->add_option("--engram-scales", *scales,
                    "Engram scale tensors: auto (in host memory when they take <= 1/4 of available memory; "
                    "~3 GB per released table), memory, or disk (read next to each row)")
        ->check(CLI::IsMember({"auto", "memory", "disk"}))
        ->capture_default_str();
    app->add_option("--engram-next-pass", *next_pass,
                    "Gather the next pass's Engram rows while the current pass runs (hides layer 1's "
                    "gather): auto (each table once this pass freed its own, or at once when a second full "
                    "set takes <= 1/4 of available memory), on (at once: ~13 KB per token more), or off. "
                    "Results do not depend on it")
        ->check(CLI::IsMember({"auto", "on", "off"}))
        ->capture_default_str();
    return [io, weight_io, engram_io, scales, next_pass]() {
        io->direct_weights = *weight_io == "direct";
        io->engram_io = engram_io_from_name(*engram_io).value_or(EngramIoMode::Auto);
        io->engram_scales = engram_scales_from_name(*scales).value_or(EngramScalesMode::Auto);
        io->engram_next_pass = engram_next_pass_from_name(*next_pass).value_or(EngramNextPassMode::Auto);
        validate_io_settings(*io);
    };
}

}  // namespace ds4r::cli
