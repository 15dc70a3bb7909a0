// ds4replay entry point: parses the command line, runs one subcommand, maps errors to exit codes
// (0 ok, 1 runtime failure, 2 usage or bad input, 3 checkpoint problem; DESIGN.md section 2).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/settings.h"

namespace ds4r::cli {

std::string default_model_dir() {
    return ds4r::default_model_dir();  // $DSV41_PATH, else ~/models/... (src/common/settings.cpp)
}

}  // namespace ds4r::cli

int main(int argc, char** argv) {
    using namespace ds4r;
    CLI::App app{"ds4replay: teacher-forced DeepSeek V4.1-Flash prefill replay on one GPU"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("ds4replay ") + DS4R_VERSION);
    bool verbose = false, quiet = false;
    app.add_flag("-v,--verbose", verbose, "Debug logging on stderr");
    app.add_flag("-q,--quiet", quiet, "Only errors on stderr");

    std::vector<cli::Command> cmds;
    cli::add_score_command(app, cmds);
    cli::add_selftest_command(app, cmds);
    cli::add_inspect_command(app, cmds);
    cli::add_make_tiny_command(app, cmds);
    cli::add_compare_command(app, cmds);
    cli::add_bench_command(app, cmds);
    cli::add_report_command(app, cmds);
    cli::add_encode_command(app, cmds);
    cli::add_decode_command(app, cmds);
    cli::add_merge_command(app, cmds);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        int rc = app.exit(e);  // prints help / the parse error
        return rc == 0 ? 0 : 2;
    }
    if (verbose) log_set_level(LogLevel::Debug);
    if (quiet) log_set_level(LogLevel::Error);
    try {
        for (auto& c : cmds)
            if (c.app && c.app->parsed()) return c.run();
        std::fprintf(stderr, "ds4replay: no command given (try --help)\n");
        return 2;
    } catch (const Error& e) {
        std::fprintf(stderr, "ds4replay: error: %s\n", e.what());
        if (verbose && !e.where().empty()) std::fprintf(stderr, "  (raised at %s)\n", e.where().c_str());
        return e.exit_code();
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "ds4replay: error: out of host memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "ds4replay: error: %s\n", e.what());
        return 1;
    }
}
