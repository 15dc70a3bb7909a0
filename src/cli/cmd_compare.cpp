// `ds4replay compare`: CLI11 glue for run_compare (src/output/compare.cpp).
#include "cli/commands.h"
#include "ds4r/compare.h"
#include "ds4r/file_util.h"

namespace ds4r::cli {

void add_compare_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<CompareOptions>();
    auto model = std::make_shared<std::string>();
    auto quiet_seq = std::make_shared<bool>(false);
    CLI::App* app = root.add_subcommand(
        "compare",
        "Fidelity statistics between two result files (ds4replay records or served-API top-k logprobs)");
    app->add_option("a", opt->file_a, "First results file (JSONL)")->required();
    app->add_option("b", opt->file_b, "Second results file (JSONL)")->required();
    app->add_option("--tokenizer", opt->tokenizer_path, "tokenizer.json to map API token text to ids");
    app->add_option("--model", *model, "Model directory (its tokenizer.json maps API token text to ids)");
    app->add_flag("--json", opt->json, "Print one JSON object");
    app->add_flag("--no-per-sequence", *quiet_seq, "Overall statistics only");
    Command c;
    c.app = app;
    c.run = [opt, model, quiet_seq]() {
        if (opt->tokenizer_path.empty() && !model->empty())
            opt->tokenizer_path = path_join(*model, "tokenizer.json");
        opt->per_sequence = !*quiet_seq;
        return run_compare(*opt, stdout);
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
