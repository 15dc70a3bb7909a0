// The flags shared by `score`, `bench` (and `selftest`): I/O (include/ds4r/io_settings.h) and the GPU
// kernels.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

#include "ds4r/expert_layout.h"
#include "ds4r/io_settings.h"

namespace ds4r::cli {

// Adds --io, --read-threads, --read-request-mb, --engram-io, --engram-queue-depth and --engram-scales
// to `app`, writing into *io. The returned function, called before the command runs, applies the
// enumerated ones (and validates the settings: InputError naming the flag).
std::function<void()> add_io_flags(CLI::App* app, IoSettings* io);

// --kernels auto|portable|hopper|hopper-fp8 (ds4r/backend.h GpuKernels) into *kernels.
void add_kernels_flag(CLI::App* app, std::string* kernels);
// --prepared-experts auto|fp16|e5m2|off into *widest (ds4r/replay.h plan_prepared_experts).
void add_prepared_experts_flag(CLI::App* app, ExpertLayout* widest);
// --fp16-weights auto|off into *allow (Backend::set_fp16_weights).
void add_fp16_weights_flag(CLI::App* app, bool* allow);

}  // namespace ds4r::cli
