// ds4replay entry point: parses the command line, runs one subcommand, maps errors to exit codes
// (0 ok, 1 runtime failure, 2 usage or bad input, 3 checkpoint problem; docs/DESIGN.md section 2).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "cli/global_flags.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/settings.h"

namespace ds4r::cli {

std::string default_model_dir() {
    return ds4r::default_model_dir();  // $DSV41_PATH, else ~/models/... (src/common/settings.cpp)
}

GlobalFlags& global_flags() {
    static GlobalFlags g;
    return g;
}

void add_global_flags(CLI::App& app) {
    app.add_flag("-v,--verbose", global_flags().verbose, "Debug logging on stderr");
    app.add_flag("-q,--quiet", global_flags().quiet, "Only errors on stderr (no progress)");
}

// Results printed to stdout must have reached it: a full disk or a closed pipe is an error
// (exit 1), with the reason.
int check_stdout(int rc) {
    const int earlier = errno;  // the failed write's reason when stdout's buffer is already empty
    errno = 0;
    const bool flush_failed = std::fflush(stdout) != 0;
    const int err = flush_failed && errno ? errno : earlier;
    if (!flush_failed && !std::ferror(stdout)) return rc;
    std::fprintf(stderr, "ds4replay: error: writing to stdout failed: %s\n",
                 err ? ds4r::errno_text(err).c_str() : "an earlier write failed");
    return rc == 0 ? 1 : rc;
}

}  // namespace ds4r::cli

int main(int argc, char** argv) {
    using namespace ds4r;
    CLI::App app{"ds4replay: teacher-forced DeepSeek V4.1-Flash prefill replay on one GPU"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("ds4replay ") + DS4R_VERSION);
    cli::add_global_flags(app);

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
        for (auto& c : cmds) cli::add_global_flags(*c.app);  // -q / -v after the subcommand too
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        int rc = app.exit(e);  // prints help / the parse error
        return rc == 0 ? 0 : 2;
    }
    const bool verbose = cli::global_flags().verbose;
    if (verbose) log_set_level(LogLevel::Debug);
    if (cli::global_flags().quiet) log_set_level(LogLevel::Error);
    try {
        for (auto& c : cmds)
            if (c.app && c.app->parsed()) return cli::check_stdout(c.run());
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
