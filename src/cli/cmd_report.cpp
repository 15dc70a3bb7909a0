// `ds4replay report`: CLI11 glue for run_report (src/report/).
#include "cli/commands.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/report.h"

namespace ds4r::cli {

void add_report_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<ReportOptions>();
    auto model = std::make_shared<std::string>();
    auto pairs = std::make_shared<std::vector<std::string>>();
    CLI::App* app = root.add_subcommand("report",
                                        "Summary of a results file (per-sequence logprob, perplexity, "
                                        "entropy, top-1); --html: a page to read");
    app->add_option("results", opt->results_path, "Results JSONL written by score")->required();
    app->add_option("--tokenizer", opt->tokenizer_path, "tokenizer.json to show token text");
    app->add_option("--model", *model, "Model directory (its tokenizer.json shows token text)");
    app->add_option("--html", opt->html_path, "Write a self-contained HTML report to this file");
    app->add_option("--pairs", *pairs, "A,B: compare the records with ids A and B (repeatable)");
    app->add_option("--max-text-tokens", opt->max_text_tokens,
                    "HTML: show the text of sequences up to this many tokens in all (the rest: table only)")
        ->check(CLI::Range(int64_t(1), int64_t(1) << 40))
        ->capture_default_str();
    app->add_flag("--overwrite", opt->overwrite,
                  "Replace an existing --html file that is not a ds4replay report");
    Command c;
    c.app = app;
    c.run = [opt, model, pairs]() {
        if (!opt->tokenizer_path.empty() && !model->empty())
            throw InputError("give either --tokenizer or --model, not both");
        if (opt->tokenizer_path.empty() && !model->empty())
            opt->tokenizer_path = path_join(*model, "tokenizer.json");
        // Neither given: the default model directory's tokenizer when there is one (token text is optional).
        const std::string fallback = path_join(default_model_dir(), "tokenizer.json");
        if (opt->tokenizer_path.empty() && model->empty() && file_exists(fallback))
            opt->tokenizer_path = fallback;
        for (const std::string& p : *pairs) {
            const size_t comma = p.find(',');
            if (comma == std::string::npos || comma == 0 || comma + 1 == p.size() ||
                p.find(',', comma + 1) != std::string::npos)
                throw InputError("--pairs '" + p + "': expected two record ids as A,B");
            opt->pairs.emplace_back(p.substr(0, comma), p.substr(comma + 1));
        }
        return run_report(*opt, stdout);
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
