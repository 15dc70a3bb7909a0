// -v/--verbose and -q/--quiet: accepted before or after the subcommand, as in git / cargo
// (main.cpp puts them on the root and on every subcommand, bound to the same values).
#pragma once

#include <CLI/CLI.hpp>

namespace ds4r::cli {

struct GlobalFlags {
    bool verbose = false;
    bool quiet = false;  // only errors on stderr: no info lines, no progress
};
GlobalFlags& global_flags();
void add_global_flags(CLI::App& app);

}  // namespace ds4r::cli
