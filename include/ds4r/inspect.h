// `ds4replay inspect` (docs/DESIGN.md section 2): validates a checkpoint and reports its configuration,
// its layer roles and its bytes (streamed per layer, globals, Engram tables, unused), as text for
// people or as one JSON object for scripts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "ds4r/checkpoint.h"
#include "ds4r/error.h"

namespace ds4r {

// Human-readable size in decimal and binary units: "9.07 MB (8.65 MiB)"; below 1000 bytes "512 B".
std::string format_bytes(uint64_t n);

// The report of a checkpoint that passed validation, ending with the line "checkpoint OK".
std::string inspect_text(const Checkpoint& ck);
// The same facts as one JSON object on one line (with "ok": true), newline-terminated.
std::string inspect_json(const Checkpoint& ck);
// {"ok": false, "model_dir": ..., "error": ..., "exit_code": N} for a checkpoint that failed.
std::string inspect_error_json(const std::string& model_dir, const Error& e);

// Disk traffic and time of one pass of `pass_tokens` tokens (issue 14: what users plan with): the layers'
// streamed bytes (read once per pass) and the Engram gathers (per table, pass_tokens x hash columns
// lookups spread uniformly over each head's rows: expected distinct rows, 4 KiB pages and random
// requests; scale pages too unless the scales are kept in memory), timed at the given disk rates.
struct PassIoPrediction {
    int64_t pass_tokens = 0;
    double seq_mb_s = 0, iops = 0;  // the disk rates used (MB = 1e6 bytes)
    bool scales_in_memory = true;
    uint64_t layer_bytes = 0;     // layers + head, read sequentially
    uint64_t engram_lookups = 0;  // all tables
    double engram_rows = 0;       // expected distinct rows, all tables
    double engram_requests = 0;   // expected random 4 KiB reads (rows' pages, + scales' pages)
    uint64_t scale_bytes = 0;     // all tables' scale tensors (read once per run when in memory)
    double layer_s = 0, engram_s = 0, scales_s = 0;
    double pass_s = 0;  // layer_s + engram_s: both share the disk (compute hides under it)
};
PassIoPrediction predict_pass_io(const Checkpoint& ck, int64_t pass_tokens, double seq_mb_s, double iops,
                                 bool scales_in_memory);
std::string pass_io_text(const PassIoPrediction& p);

// Opens and validates `model_dir`, writes the report to `out`, returns 0. A validation failure
// propagates (CheckpointError: exit code 3); in JSON mode it is first written to `out` as the
// error object, so scripts always get one JSON object.
int run_inspect(const std::string& model_dir, bool json, std::FILE* out);
// The same, followed (text) or extended (JSON: "pass_prediction") by predict_pass_io when pass_tokens > 0.
int run_inspect(const std::string& model_dir, bool json, std::FILE* out, int64_t pass_tokens, double seq_mb_s,
                double iops, bool scales_in_memory);

}  // namespace ds4r
