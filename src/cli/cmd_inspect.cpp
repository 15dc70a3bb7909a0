// `ds4replay inspect --model DIR [--json]`: CLI glue; the report lives in src/checkpoint/inspect.cpp.
#include <cstdio>

#include "cli/commands.h"
#include "ds4r/inspect.h"

namespace ds4r::cli {

void add_inspect_command(CLI::App& root, std::vector<Command>& out) {
    struct Opts {
        std::string model;
        bool json = false;
        int64_t pass_tokens = 0;
        double seq_mb_s = 1700, iops = 70000;  // the H200 machine's disk (issue 14), unless measured
        std::string scales = "memory";
    };
    auto opts = std::make_shared<Opts>();
    opts->model = default_model_dir();
    Command c;
    c.app =
        root.add_subcommand("inspect", "Validate a checkpoint and print its layout, layer roles and bytes");
    c.app->add_option("--model", opts->model, "Model directory (original HF checkpoint)")
        ->capture_default_str();
    c.app->add_flag("--json", opts->json, "Print the report as one JSON object");
    c.app
        ->add_option("--pass-tokens", opts->pass_tokens,
                     "Also print the bytes read from disk for a pass of N tokens (layers, Engram rows) and "
                     "the predicted pass time")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
    c.app
        ->add_option("--disk-seq-mbps", opts->seq_mb_s, "Disk sequential read rate, MB/s (bench measures it)")
        ->capture_default_str();
    c.app->add_option("--disk-iops", opts->iops, "Disk random 4 KiB reads per second (bench measures it)")
        ->capture_default_str();
    c.app->add_option("--engram-scales", opts->scales, "memory or disk: as score's --engram-scales")
        ->check(CLI::IsMember({"memory", "disk"}))
        ->capture_default_str();
    c.run = [opts]() -> int {
        return run_inspect(opts->model, opts->json, stdout, opts->pass_tokens, opts->seq_mb_s, opts->iops,
                           opts->scales == "memory");
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
