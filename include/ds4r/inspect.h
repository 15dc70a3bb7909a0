// `ds4replay inspect` (DESIGN.md section 2): validates a checkpoint and reports its configuration,
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

// Opens and validates `model_dir`, writes the report to `out`, returns 0. A validation failure
// propagates (CheckpointError: exit code 3); in JSON mode it is first written to `out` as the
// error object, so scripts always get one JSON object.
int run_inspect(const std::string& model_dir, bool json, std::FILE* out);

}  // namespace ds4r
