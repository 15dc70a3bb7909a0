// `ds4replay score`: CLI11 glue for run_score (src/replay/score.cpp).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cli/commands.h"
#include "cli/global_flags.h"
#include "cli/io_flags.h"
#include "ds4r/log.h"
#include "ds4r/plural.h"
#include "ds4r/progress.h"
#include "ds4r/score.h"
#include "ds4r/settings.h"

namespace ds4r::cli {

namespace {
std::vector<int> parse_layers(const std::string& s) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        if (tok.empty()) continue;
        try {
            size_t used = 0;
            int v = std::stoi(tok, &used);
            if (used != tok.size()) throw std::invalid_argument(tok);
            out.push_back(v);
        } catch (const std::exception&) {
            throw InputError("--capture-layers: '" + tok + "' is not a layer number");
        }
    }
    return out;
}
}  // namespace

void add_score_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<ScoreOptions>();
    auto layers = std::make_shared<std::string>();
    auto mode = std::make_shared<std::string>("mean");
    auto positional = std::make_shared<std::string>();
    auto shard = std::make_shared<std::string>();
    auto shard_count = std::make_shared<int64_t>(0);
    CLI::App* app =
        root.add_subcommand("score", "Score token sequences: logprob, rank, entropy and top-k per position");
    opt->model_dir = default_model_dir();
    app->add_option("input_file", *positional, "Input tokens.jsonl (same as --input)");
    app->add_option("--model", opt->model_dir, "Model directory (HF checkpoint)")->capture_default_str();
    app->add_option("--input", opt->input, "Input JSONL, '-' for stdin")->capture_default_str();
    app->add_option("--output", opt->output, "Output JSONL, '-' for stdout")->capture_default_str();
    app->add_option("--top-k", opt->top_k, "Alternatives per position (0: none, no topk_* fields)")
        ->capture_default_str();
    auto no_tokens = std::make_shared<bool>(false);
    app->add_flag("--no-tokens", *no_tokens, "Leave the input token ids (\"tokens\") out of the records");
    app->add_flag("--allow-zero-weights", opt->allow_zero_weights,
                  "Score a checkpoint whose weights read as zeros (make-tiny --headers-only)");
    app->add_option("--capture-layers", *layers,
                    "Comma-separated layers whose input residual stream is saved (N = final)");
    app->add_option("--hidden-dir", opt->hidden_dir, "Directory for hidden-state .npy files");
    app->add_option("--hidden-mode", *mode, "mean (fp16 mean of the 4 copies) or copies (all 4, bf16 bits)")
        ->check(CLI::IsMember({"mean", "copies"}))
        ->capture_default_str();
    app->add_option("--backend", opt->backend, "auto, cuda or cpu")
        ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
        ->capture_default_str();
    auto* device_opt = app->add_option("--device", opt->device, "CUDA device index")->capture_default_str();
    auto devices = std::make_shared<std::string>();
    app->add_option("--devices", *devices,
                    "Score each pass on several devices: all, or indices such as 0,1,2,3 (0,0 = two workers "
                    "on one device); one weight reader, the same bytes as one device")
        ->excludes(device_opt);
    add_kernels_flag(app, &opt->kernels);
    add_prepared_experts_flag(app, &opt->prepared_experts);
    add_fp16_weights_flag(app, &opt->fp16_weights);
    app->add_option("--gpu-memory-gb", opt->gpu_memory_gb,
                    "GPU memory budget in GB (0 = 22, sized for a 24 GB card); never changes results")
        ->check(CLI::NonNegativeNumber);
    app->add_option("--max-batch-tokens", opt->chunk_rows,
                    "Rows per chunk (0 = from free memory); never changes results")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 24));
    app->add_option("--pass-tokens", opt->pass_tokens, "Tokens per pass (0 = from available memory)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
    app->add_option("--max-seq-len", opt->max_seq_len, "Longest accepted sequence (0 = the model's maximum)")
        ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
    app->add_flag("--resume", opt->resume,
                  "Continue the run that wrote --output (checked against its sidecar <output>.run.json)");
    app->add_flag("--overwrite", opt->overwrite,
                  "Replace an existing output, the hidden files this run writes and a saved pass");
    app->add_flag("--seed-check", opt->seed_check,
                  "Verify the Engram hash multipliers (numpy default_rng(10007*L)) against the released "
                  "model's values first");
    app->add_flag("--skip-bad", opt->skip_bad, "Write an error record for a bad input line and go on");
    app->add_option("--progress", opt->progress, "auto, bar, plain or none")
        ->check(CLI::IsMember({"auto", "bar", "plain", "none"}))
        ->capture_default_str();
    app->add_option("--shard", *shard,
                    "Score only shard K of N of the input (K/N, 1-based, balanced by tokens), or auto: the "
                    "index of a Slurm job array task / Kubernetes indexed Job; merge shards with `merge`");
    app->add_option("--shard-count", *shard_count,
                    "With --shard auto: the number of shards (required for a Kubernetes indexed Job)")
        ->check(CLI::Range(int64_t(1), kMaxShards));
    auto apply_io = add_io_flags(app, &opt->io);
    Command c;
    c.app = app;
    c.run = [opt, layers, mode, positional, shard, shard_count, apply_io, no_tokens, devices]() -> int {
        apply_io();
        opt->echo_tokens = !*no_tokens;
        if (!positional->empty()) {
            if (opt->input != "-" && opt->input != *positional)
                throw InputError("give the input either as a positional argument or with --input, not both");
            opt->input = *positional;
        }
        if (global_flags().quiet) opt->progress = "none";
        // Typed at a terminal: say what the silence is waiting for.
        if (opt->input == "-" && ::isatty(STDIN_FILENO))
            std::fprintf(stderr, "ds4replay: reading token sequences from stdin (Ctrl-D to end)\n");
        opt->capture_layers = parse_layers(*layers);
        opt->shard = parse_shard_spec(*shard, *shard_count, scheduler_env);
        opt->hidden_mode = *mode == "copies" ? HiddenMode::Copies : HiddenMode::Mean;
        if (!devices->empty()) {
            if (*devices == "all" && opt->backend == "cpu")
                throw InputError(
                    "--devices all needs the CUDA backend (with --backend cpu give indices: 0,0)");
            opt->devices = parse_device_list(*devices, *devices == "all" ? cuda_device_count() : 0);
        }
        if (opt->chunk_rows == 1) throw InputError("--max-batch-tokens must be 0 (auto) or >= 2");
        // Ctrl-C / SIGTERM: stop at the next layer boundary with nothing half-written (exit 130).
        install_interrupt_handlers();
        ScoreSummary s;
        try {
            s = run_score(*opt);
        } catch (const Interrupted& e) {
            if (e.pass_saved.empty())
                std::fprintf(stderr, "ds4replay: interrupted: %s saved; rerun with --resume\n",
                             plural(e.sequences_saved, "sequence").c_str());
            else
                std::fprintf(stderr,
                             "ds4replay: interrupted: %s saved, and the %s; --resume continues from there\n",
                             plural(e.sequences_saved, "sequence").c_str(), e.pass_saved.c_str());
            return 130;
        }
        log_info(strfmt("scored %s (%s) in %s on %s in %.2fs (%.0f tokens/s)%s%s",
                        plural(s.sequences, "sequence").c_str(), plural(s.tokens, "token").c_str(),
                        plural(s.passes, "pass", "passes").c_str(), s.backend.c_str(), s.seconds,
                        s.seconds > 0 ? s.tokens / s.seconds : 0.0,
                        s.resumed ? strfmt(", %lld already done", (long long)s.resumed).c_str() : "",
                        s.bad_lines ? (", " + plural(s.bad_lines, "bad line")).c_str() : ""));
        return 0;
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
