// Subcommand registration. Each cmd_*.cpp adds its CLI11 subcommand and the action to run when it
// is selected; the work itself lives in the library modules, never here.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace ds4r::cli {

struct Command {
    CLI::App* app = nullptr;
    std::function<int()> run;  // returns the exit code
};

// Defined one per cmd_*.cpp.
void add_inspect_command(CLI::App& root, std::vector<Command>& out);
void add_make_tiny_command(CLI::App& root, std::vector<Command>& out);
void add_score_command(CLI::App& root, std::vector<Command>& out);
void add_selftest_command(CLI::App& root, std::vector<Command>& out);
void add_compare_command(CLI::App& root, std::vector<Command>& out);
void add_bench_command(CLI::App& root, std::vector<Command>& out);
void add_report_command(CLI::App& root, std::vector<Command>& out);
void add_encode_command(CLI::App& root, std::vector<Command>& out);  // cmd_encode.cpp
void add_decode_command(CLI::App& root, std::vector<Command>& out);  // cmd_encode.cpp
void add_merge_command(CLI::App& root, std::vector<Command>& out);

// $DSV41_PATH, else ~/models/DeepSeek-V4.1-Flash (docs/DESIGN.md section 2).
std::string default_model_dir();

}  // namespace ds4r::cli
