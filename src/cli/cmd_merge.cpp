// `ds4replay merge`: CLI11 glue for run_merge (src/output/merge_runs.cpp).
#include <cstdio>

#include "cli/commands.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/merge.h"

namespace ds4r::cli {

void add_merge_command(CLI::App& root, std::vector<Command>& out) {
    auto opt = std::make_shared<MergeRunOptions>();
    CLI::App* app = root.add_subcommand(
        "merge", "Merge the outputs of `score --shard K/N` (K = 1..N) into the output of the unsharded run");
    app->add_option("output", opt->output, "Merged results file (JSONL); never replaced without --overwrite")
        ->required();
    app->add_option("shards", opt->shard_outputs, "The shards' results files, in any order")->required();
    app->add_option("--hidden-dir", opt->hidden_dir,
                    "Directory for the merged hidden-state .npy files (when the shards captured layers)");
    app->add_flag("--overwrite", opt->overwrite, "Replace an existing merged output and its hidden files");
    Command c;
    c.app = app;
    c.run = [opt]() -> int {
        const MergeSummary s = run_merge(*opt);
        std::string rows;
        for (const auto& [L, n] : s.hidden_rows)
            rows += strfmt(", layer %d: %lld hidden rows", L, (long long)n);
        log_info(strfmt("merged %zu shards: %lld records into %s%s", opt->shard_outputs.size(),
                        (long long)s.records, opt->output.c_str(), rows.c_str()));
        return 0;
    };
    out.push_back(c);
}

}  // namespace ds4r::cli
