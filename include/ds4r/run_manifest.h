// The run sidecar `<output>.run.json` (README "Resume, overwrite and interrupts"): what a results
// file was written from (the input's bytes, the options that change output bytes, the model, the
// hidden-file layout, the shard), so that --resume can refuse to continue a different run and
// `merge` can check that shards belong together. Written atomically (temp file, fsync, rename).
//
//   {"format": "ds4replay-run", "version": 1,
//    "input": {"path": "...", "sha256": "hex" | null, "records": N | null},
//    "options": {"top_k": 8, "capture_layers": [2, 6], "hidden_mode": "mean", "max_seq_len": 65536,
//                "skip_bad": false, ...},
//    "model": {"fingerprint": "hex", "n_layers": 40, "vocab": 129280},
//    "hidden": {"dir": "..." | null, "layers": {"2": {"dtype": "<f2", "row_shape": [5120]}, ...}},
//    "backend": "cuda",            (informational: never compared)
//    "shard": null | {"index": K, "count": N, "first_record": F, "records": R}}
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ds4r/dtype.h"

namespace ds4r {

struct RunManifest {
    static constexpr const char* kFormat = "ds4replay-run";
    static constexpr int kVersion = 1;

    struct Input {
        std::string path;      // as given on the command line ("-" = stdin)
        std::string sha256;    // hex of the input bytes; "" = unknown (stdin: resume cannot check it)
        int64_t records = -1;  // non-blank input lines (records + error records); -1 = unknown
    };
    struct Model {
        std::string fingerprint;  // model_fingerprint(): sha256 over config.json and the index json
        int64_t n_layers = 0, vocab = 0;
    };
    struct HiddenLayer {
        std::string dtype;  // numpy descr of the .npy file, "<f2" or "<u2"
        Shape row_shape;    // one row's shape: the file is [rows, row_shape...]
        bool operator==(const HiddenLayer&) const = default;
    };
    struct Hidden {
        std::string dir;                    // "" = no hidden capture
        std::map<int, HiddenLayer> layers;  // captured layer -> layout of hidden_L<layer>.npy
    };
    struct Shard {
        int index = 0, count = 1;  // this output holds shard `index` of `count`, as given to --shard K/N
        // The input records (0-based, non-blank lines) the shard's plan gave it: [first_record,
        // first_record + records) (include/ds4r/shard.h); records = -1: not recorded. `merge` checks
        // that the shards tile the input and that each holds exactly its records.
        int64_t first_record = 0, records = -1;
        bool operator==(const Shard&) const = default;
    };

    Input input;
    // The options that change output bytes: key (a flag's name with '_' for '-', e.g. "top_k" for
    // --top-k) -> value as compact JSON text ("8", "[2,6]", "\"mean\"", "true"). A later flag that
    // shapes the output (e.g. echo_tokens) is one more entry.
    std::map<std::string, std::string> options;
    Model model;
    Hidden hidden;
    std::string backend;  // informational: resuming on another backend is allowed (with a warning)
    std::optional<Shard> shard;

    // Typed setters for `options`.
    void set_option(const std::string& key, int64_t v);
    void set_option(const std::string& key, bool v);
    void set_option(const std::string& key, const std::string& v);
    void set_option(const std::string& key, const std::vector<int>& v);
};

// "<output>.run.json".
std::string run_manifest_path(const std::string& output);

// sha256 over the bytes of config.json, then the index json (or "" when there is none), each
// prefixed by its file name: a model moved to another directory keeps its fingerprint.
std::string model_fingerprint(const std::string& config_path, const std::string& index_path);

std::string run_manifest_to_json(const RunManifest& m);  // pretty-printed, ends with a newline
// Parses a sidecar; throws InputError naming `path` when it is not one (never aborts: fuzzed by
// tests/fuzz/fuzz_run_manifest.cpp). A newer version than kVersion is refused.
RunManifest parse_run_manifest(const std::string& text, const std::string& path);

// Atomic write (temp file + fsync + rename + fsync of the directory).
void write_run_manifest(const std::string& path, const RunManifest& m);
// nullopt when the file does not exist; throws InputError when it exists and is not a sidecar.
std::optional<RunManifest> read_run_manifest(const std::string& path);

// Human-readable differences between the run about to start (`now`) and a recorded one (`then`),
// e.g. "--top-k 3 but the output was written with --top-k 8". Empty = the same run. `then_label`
// names the recorded side ("the output was written with"). An input hash that either side does not
// know (stdin) is not a difference: the caller decides how to report it. The backend never is.
std::vector<std::string> compare_run_manifests(const RunManifest& now, const RunManifest& then,
                                               const std::string& then_label = "the output was written with");
// The same, without the "shard" field (`merge`: shards of one run differ only there).
std::vector<std::string> compare_run_manifests_ignoring_shard(
    const RunManifest& a, const RunManifest& b,
    const std::string& then_label = "the output was written with");

}  // namespace ds4r
