// `ds4replay merge` from the shards' run sidecars (include/ds4r/merge.h, include/ds4r/run_manifest.h).
#include <algorithm>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/merge.h"
#include "ds4r/run_manifest.h"

namespace ds4r {

MergeSummary run_merge(const MergeRunOptions& opt) {
    if (opt.output.empty() || opt.output == "-")
        throw InputError("merge writes a results file: give OUT as a file path, not '-'");
    if (opt.shard_outputs.empty()) throw InputError("merge: give the shard outputs to merge");
    std::vector<std::string> problems;
    std::vector<RunManifest> runs;
    std::vector<MergeShard> shards;
    for (const std::string& path : opt.shard_outputs) {
        const std::string side = run_manifest_path(path);
        std::optional<RunManifest> m;
        try {
            m = read_run_manifest(side);
        } catch (const Error& e) {
            problems.push_back(e.what());
            continue;
        }
        if (!m) {
            problems.push_back(path + ": no run sidecar " + side +
                               " (merge takes the outputs of `score --shard`)");
            continue;
        }
        if (!m->shard) {
            problems.push_back(path + ": not a shard output (its sidecar has \"shard\": null)");
            continue;
        }
        if (m->shard->records < 0) {
            problems.push_back(path + ": its sidecar does not record the shard's planned records");
            continue;
        }
        MergeShard s;
        s.results = path;
        s.hidden_dir = m->hidden.dir;
        s.index = m->shard->index;
        s.count = m->shard->count;
        s.first_record = m->shard->first_record;
        s.records = m->shard->records;
        shards.push_back(s);
        runs.push_back(std::move(*m));
    }
    // Same input (bytes), options, model and hidden layout; they differ only in the shard.
    for (size_t i = 1; i < runs.size(); ++i) {
        const std::string label = strfmt("shard %d/%d (%s) was written with", runs[0].shard->index,
                                         runs[0].shard->count, shards[0].results.c_str());
        for (const std::string& d : compare_run_manifests_ignoring_shard(runs[i], runs[0], label))
            problems.push_back(strfmt("shard %d/%d (%s): ", runs[i].shard->index, runs[i].shard->count,
                                      shards[i].results.c_str()) +
                               d);
        if (runs[i].input.sha256 != runs[0].input.sha256 || runs[i].input.records != runs[0].input.records)
            if (runs[i].input.sha256.empty() || runs[0].input.sha256.empty())
                problems.push_back(
                    shards[i].results +
                    ": the input's hash is not recorded: cannot check the shards belong together");
    }
    const std::string merged_side = run_manifest_path(opt.output);
    if (file_exists(opt.output) && !opt.overwrite)
        problems.push_back(opt.output +
                           " exists: merge never replaces a file (use --overwrite to replace it)");
    else if (file_exists(merged_side) && !opt.overwrite)
        problems.push_back(merged_side +
                           " exists: merge never replaces a file (use --overwrite to replace it)");
    if (!runs.empty() && runs[0].input.records < 0)
        problems.push_back(shards[0].results + ": its sidecar does not record the input's record count");
    if (!problems.empty()) {
        std::string msg = "merge: refused, nothing was written:";
        for (const auto& p : problems) msg += "\n  - " + p;
        throw InputError(msg);
    }

    MergeTarget t;
    t.output = opt.output;
    t.hidden_dir = opt.hidden_dir;
    for (const auto& [L, layout] : runs[0].hidden.layers) t.capture_layers.push_back(L);
    t.total_records = runs[0].input.records;
    t.overwrite = opt.overwrite;
    const MergeSummary sum = merge_shard_outputs(shards, t);

    // The merged output's sidecar: the shards' run, unsharded, with the merged hidden dir. It is written
    // last: an output without it is not one `--resume` or another merge would trust.
    RunManifest merged = runs[0];
    merged.shard.reset();
    merged.hidden.dir = t.capture_layers.empty() ? std::string() : opt.hidden_dir;
    write_run_manifest(merged_side, merged);
    return sum;
}

}  // namespace ds4r
