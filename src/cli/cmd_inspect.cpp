// `ds4replay inspect --model DIR [--json]`: CLI glue; the report lives in src/checkpoint/inspect.cpp.
#include <cstdio>

#include "cli/commands.h"
#include "ds4r/inspect.h"

namespace ds4r::cli {

void add_inspect_command(CLI::App& root, std::vector<Command>& out) {
    struct Opts {
        std::string model;
        bool json = false;
    };
    auto opts = std::make_shared<Opts>();
    opts->model = default_model_dir();
    Command c;
    c.app =
        root.add_subcommand("inspect", "Validate a checkpoint and print its layout, layer roles and bytes");
    c.app->add_option("--model", opts->model, "Model directory (original HF checkpoint)")
        ->capture_default_str();
    c.app->add_flag("--json", opts->json, "Print the report as one JSON object");
    c.run = [opts]() -> int { return run_inspect(opts->model, opts->json, stdout); };
    out.push_back(c);
}

}  // namespace ds4r::cli
