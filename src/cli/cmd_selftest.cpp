// `ds4replay selftest`: CLI11 glue for run_selftest (src/replay/selftest.cpp).
#include "cli/commands.h"
#include "cli/io_flags.h"
#include "ds4r/selftest.h"

namespace ds4r::cli {

void add_selftest_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<SelftestOptions>();
    CLI::App* app =
        root.add_subcommand("selftest", "Build a tiny model in a temp dir, score it, check the numbers");
    app->add_option("--backend", opt->backend, "auto, cuda or cpu")
        ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
        ->capture_default_str();
    app->add_option("--device", opt->device, "CUDA device index")->capture_default_str();
    add_kernels_flag(app, &opt->kernels);
    app->add_option("--keep", opt->keep_dir, "Write the tiny model here and keep it");
    Command c;
    c.app = app;
    c.run = [opt]() { return run_selftest(*opt, stdout); };
    out.push_back(c);
}

}  // namespace ds4r::cli
