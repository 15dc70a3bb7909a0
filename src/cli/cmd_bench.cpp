// `ds4replay bench`: CLI11 glue for run_bench (src/replay/bench.cpp).
#include "cli/commands.h"
#include "cli/io_flags.h"
#include "ds4r/bench.h"

namespace ds4r::cli {

void add_bench_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<BenchOptions>();
    auto no_prefetch = std::make_shared<bool>(false);
    CLI::App* app = root.add_subcommand(
        "bench", "Streaming and kernel benchmarks on a full-width checkpoint (prints a table, writes CSV)");
    opt->model_dir = default_model_dir();
    app->add_option("--model", opt->model_dir,
                    "Model directory (make-tiny --preset full-width for real shapes)")
        ->capture_default_str();
    app->add_option("--workloads", opt->workloads,
                    "Comma-separated: kernels, a (4x512), b (80x1800), c (1x32768), d (the largest pass host "
                    "memory allows)")
        ->capture_default_str();
    app->add_option("--csv", opt->csv, "Write every measurement as CSV here");
    app->add_option("--backend", opt->backend, "auto, cuda or cpu")
        ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
        ->capture_default_str();
    app->add_option("--device", opt->device, "CUDA device index")->capture_default_str();
    add_kernels_flag(app, &opt->kernels);
    add_prepared_experts_flag(app, &opt->prepared_experts);
    add_fp16_weights_flag(app, &opt->fp16_weights);
    app->add_option("--gpu-memory-gb", opt->gpu_memory_gb,
                    "GPU memory budget in GB (0 = 22, sized for a 24 GB card); never changes results")
        ->check(CLI::NonNegativeNumber);
    app->add_option("--max-batch-tokens", opt->chunk_rows, "Rows per chunk (0 = from free memory)");
    app->add_flag("--no-prefetch", *no_prefetch, "Read layers synchronously (no overlap) for comparison");
    app->add_option("--b-sequences", opt->b_sequences, "Workload b: number of sequences")
        ->capture_default_str();
    app->add_option("--b-tokens", opt->b_tokens, "Workload b: tokens per sequence")->capture_default_str();
    app->add_option("--c-tokens", opt->c_tokens, "Workload c: tokens of the one sequence")
        ->capture_default_str();
    app->add_option("--d-tokens", opt->d_tokens, "Workload d: tokens per sequence")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app->add_option("--d-host-gb", opt->d_host_gb,
                    "Workload d: host memory in GB for the pass's state (0 = half of MemAvailable, as score)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app->add_option(
           "--passes", opt->passes,
           "Passes per workload (fresh tokens each; the last is reported: with --engram-next-pass its "
           "Engram rows were gathered during the one before)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    app->add_option("--kernel-rows", opt->kernel_rows, "M of the kernel benchmarks")->capture_default_str();
    app->add_option("--kernel-filter", opt->kernel_filter,
                    "Kernel table: only the rows whose name contains this text (e.g. \"wq_a\", \"grouped\", "
                    "\"head\"); the cuBLAS 8192^3 reference always runs");
    app->add_option("--iters", opt->iters, "Timed iterations per kernel")->capture_default_str();
    app->add_option("--disk-seconds", opt->disk_seconds,
                    "Seconds per disk measurement (sequential O_DIRECT rate, random 4 KiB reads at queue "
                    "depths 1, 32, 256) run before the workloads; 0 skips them")
        ->check(CLI::Range(0.0, 60.0))
        ->capture_default_str();
    auto apply_io = add_io_flags(app, &opt->io);
    Command c;
    c.app = app;
    c.run = [opt, no_prefetch, apply_io]() {
        apply_io();
        opt->prefetch = !*no_prefetch;
        return run_bench(*opt, stdout);
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
