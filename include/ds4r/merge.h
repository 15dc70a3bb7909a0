// `ds4replay merge`: the outputs of `score --shard K/N` for K = 1..N -> the output of the unsharded run,
// byte for byte (issue 16). Results JSONL lines are concatenated in shard order with the hidden-state
// row ranges of each record moved by the rows of the earlier shards; the hidden-state .npy files of
// every captured layer are concatenated under one header.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ds4r {

// One shard's run as merge sees it (filled from the shard's run sidecar, `<results>.run.json`).
struct MergeShard {
    std::string results;                    // the shard's results JSONL
    std::string hidden_dir;                 // its --hidden-dir ("" without --capture-layers)
    int64_t index = 0, count = 0;           // shard index (1-based) of count
    int64_t first_record = 0, records = 0;  // the input records it was planned to score
};

struct MergeTarget {
    std::string output;      // the merged results file (never "-")
    std::string hidden_dir;  // the merged hidden dir (needed when capture_layers is not empty)
    std::vector<int> capture_layers;
    int64_t total_records = 0;  // records of the whole input
    bool overwrite = false;     // replace an existing output / hidden files (else: refuse)
};

struct MergeSummary {
    int64_t records = 0;                 // lines written
    std::map<int, int64_t> hidden_rows;  // per captured layer: rows written
};

// Checks, then writes. Refuses with InputError (exit 2), before writing anything, naming each problem:
// shard counts that differ, shards missing or given twice, planned record ranges that do not tile the
// input, a shard whose results hold fewer or more complete records than planned (or a partial last
// line: a shard still running or killed; rerun it with --resume), hidden entries that are malformed or
// reference rows a shard's .npy does not hold, .npy files of different dtypes / row shapes, an output or
// merged hidden file that exists (without `overwrite`), an output that is one of the shards' files.
// Everything is written to temporary files and renamed into place at the end (hidden files first,
// then the results), so an interrupted merge leaves no partial output.
MergeSummary merge_shard_outputs(const std::vector<MergeShard>& shards, const MergeTarget& target);

struct MergeRunOptions {
    std::string output;                      // OUT
    std::vector<std::string> shard_outputs;  // the shards' results files, any order
    std::string hidden_dir;                  // --hidden-dir for the merged .npy files
    bool overwrite = false;                  // --overwrite
};
// `ds4replay merge`: reads each shard's run sidecar (`<results>.run.json`), checks that the shards are
// one run (same input bytes, options, model and hidden layout; they differ only in "shard"), merges
// (merge_shard_outputs) and writes the merged output's sidecar (the run, "shard": null) last.
// InputError (exit 2) naming every problem found, before anything is written.
MergeSummary run_merge(const MergeRunOptions& opt);

// Called for each entry of a record's "hidden" array: layer and the rows [begin, end) it references;
// returns where those rows start in the file being written.
using RowMap = std::function<int64_t(int layer, int64_t begin, int64_t end)>;

// The text of a results line with the row range of each entry of its top-level "hidden" array
// replaced by [map(...), map(...) + end - begin); every other byte is kept. A line without "hidden"
// (an error record) is returned unchanged. Throws InputError ("<where>: ...") on a malformed entry, one
// naming another file than hidden_L<layer>.npy, or one not in the exact layout format_record writes
// (so a change of that layout cannot go unnoticed). Exposed for tests.
std::string remap_hidden_rows(const std::string& line, const RowMap& map, const std::string& where);

}  // namespace ds4r
