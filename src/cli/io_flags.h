// The I/O flags shared by `score` and `bench` (include/ds4r/io_settings.h).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>

#include "ds4r/io_settings.h"

namespace ds4r::cli {

// Adds --io, --read-threads, --read-request-mb, --engram-io, --engram-queue-depth and --engram-scales
// to `app`, writing into *io. The returned function, called before the command runs, applies the
// enumerated ones (and validates the settings: InputError naming the flag).
std::function<void()> add_io_flags(CLI::App* app, IoSettings* io);

}  // namespace ds4r::cli
