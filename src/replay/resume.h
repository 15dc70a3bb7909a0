// Output safety and --resume (README "Resume, overwrite and interrupts"): what the files of an
// earlier run hold, checked against the run about to start before any file is changed.
//  - Without --resume, an existing non-empty output, an existing hidden file this run would write or
//    a saved pass is an error (exit 2) unless --overwrite is given.
//  - With --resume, the sidecar <output>.run.json (input sha256, the options that change bytes, the
//    model, the hidden layout), the records (top-k width, captured layers, ids in input order) and
//    the hidden files' .npy headers must all agree with this run; any mismatch is an exit-2 error
//    naming it. An output without a sidecar (an older ds4replay) is checked from its records only.
//  - --skip-bad error records whose input line is now good are scored again (ResumeCursor::Retry).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ds4r/config.h"
#include "ds4r/run_manifest.h"
#include "ds4r/score.h"
#include "replay/pass_state.h"

namespace ds4r {

// The input's identity for the sidecar: sha256 and record count of a regular file (read once);
// unknown for stdin or a pipe.
RunManifest::Input fingerprint_input(const std::string& path);

// The sidecar of this run (backend filled in later).
RunManifest make_run_manifest(const ScoreOptions& opt, const ModelConfig& cfg, const std::string& model_dir,
                              int64_t max_seq_len, RunManifest::Input input);

// One complete record of an existing results file.
struct ExistingRecord {
    std::string id_json;
    bool error = false;    // an error record of --skip-bad
    int64_t line = 0;      // error records: the input line they stand for
    int64_t n_tokens = 0;  // scored records
};

// What the output files hold, established by check_outputs() without changing any of them.
struct OutputCheck {
    bool files = false;                   // a regular output file (sidecar, resume, pass state)
    bool overwrite = false;               // --overwrite: start every file of this run empty
    std::vector<ExistingRecord> records;  // complete records, in file (= input) order
    uint64_t committed_bytes = 0;         // output bytes up to its last newline
    uint64_t file_bytes = 0;              // output size (more: a partial last line, cut on open)
    std::map<int, int64_t> hidden_rows;   // layer -> rows the records reference
    std::optional<SavedPass> saved_pass;  // a pass saved mid-way (Ctrl-C) that continues this run
    bool stale_pass_file = false;         // <output>.pass of a pass since committed: removed on open
};

OutputCheck check_outputs(const ScoreOptions& opt, const RunManifest& now, const ModelConfig& cfg,
                          int64_t max_seq_len);

// Walks the input in step with the records of a resumed output: record k of the output stands for
// the k-th (non-blank) input record.
class ResumeCursor {
public:
    enum class Action {
        Score,  // past the output's records: score it
        Skip,   // already in the output
        Retry,  // an error record whose line is now good: score it and replace the error record
    };
    explicit ResumeCursor(const std::vector<ExistingRecord>* records) : records_(records) {}
    // The input record at position `pos`: `bad` when it cannot be scored (--skip-bad), `line` its line,
    // `id_json` its id, `n_tokens` its length. InputError when it is not the record the output holds.
    Action classify(int64_t pos, bool bad, int64_t line, const std::string& id_json, int64_t n_tokens,
                    const std::string& input_path, const std::string& output_path) const;
    int64_t records() const { return records_ ? static_cast<int64_t>(records_->size()) : 0; }

private:
    const std::vector<ExistingRecord>* records_;
};

}  // namespace ds4r
