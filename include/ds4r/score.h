// `ds4replay score`: reads tokens.jsonl, plans passes, runs them layer-major, writes results.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/replay.h"

namespace ds4r {

struct ScoreOptions {
    std::string model_dir;
    std::string input = "-";
    std::string output = "-";
    int top_k = 8;            // 0: no alternatives (no topk_ids / topk_logprobs fields)
    bool echo_tokens = true;  // records carry the input token ids ("tokens"); --no-tokens drops them
    // A checkpoint whose shards are marked as holes (make-tiny --headers-only) reads as all-zero
    // weights: refused unless this is set.
    bool allow_zero_weights = false;
    std::vector<int> capture_layers;
    std::string hidden_dir;
    HiddenMode hidden_mode = HiddenMode::Mean;
    std::string backend = "auto";  // auto | cuda | cpu
    int device = 0;
    int64_t max_batch_tokens = 0;  // 0 = sized from free backend memory
    int64_t pass_tokens = 0;       // 0 = sized from available host / backend memory
    int64_t max_seq_len = 0;       // 0 = max_position_embeddings of the config
    bool resume = false;
    bool skip_bad = false;
    // Before scoring, check that the Engram hash multipliers derived from numpy's
    // default_rng(10007 * layer) equal the released model's published values (MODEL.md 4.2).
    bool seed_check = false;
    std::string progress = "auto";  // auto | bar | plain | none
};

struct ScoreSummary {
    std::string backend;
    int64_t sequences = 0, tokens = 0, resumed = 0, bad_lines = 0, passes = 0;
    double seconds = 0;
};

// "auto": CUDA when a usable GPU is present, else the CPU backend. Throws RuntimeError for
// "cuda" without a GPU (the message says why).
std::unique_ptr<Backend> select_backend(const std::string& kind, int device);

ScoreSummary run_score(const ScoreOptions& opt);

}  // namespace ds4r
