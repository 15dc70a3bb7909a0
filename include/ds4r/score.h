// `ds4replay score`: reads tokens.jsonl, plans passes, runs them layer-major, writes results.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/io_settings.h"
#include "ds4r/replay.h"
#include "ds4r/shard.h"

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
    // --devices: one worker per entry (a device index; repeats allowed: 0,0 = two workers on device 0;
    // the CPU backend takes any index). Empty: the one device `device`. src/replay/multi_device_runner.h.
    std::vector<int> devices;
    double gpu_memory_gb = 0;      // CUDA memory budget (--gpu-memory-gb); 0: the default 22 GB
    std::string kernels = "auto";  // CUDA GEMM kernels (--kernels auto|portable|hopper, ds4r/backend.h)
    // --prepared-experts auto (kAutoExpertLayout) | fp16 | e5m2 | off (None): the widest layout allowed
    // (ds4r/replay.h plan_prepared_experts)
    ExpertLayout prepared_experts = kAutoExpertLayout;
    // --fp16-weights auto (true) | off (Backend::set_fp16_weights)
    bool fp16_weights = true;
    int64_t chunk_rows = 0;        // 0 = sized from free backend memory
    int64_t pass_tokens = 0;       // 0 = sized from available host / backend memory
    int64_t max_seq_len = 0;       // 0 = max_position_embeddings of the config
    bool resume = false;
    bool overwrite = false;  // replace an existing output / hidden files / saved pass of an earlier run
    bool skip_bad = false;
    // Before scoring, check that the Engram hash multipliers derived from numpy's
    // default_rng(10007 * layer) equal the released model's published values (docs/MODEL.md 4.2).
    bool seed_check = false;
    std::string progress = "auto";  // auto | bar | plain | none
    IoSettings io;                  // --io, --read-threads, --read-request-mb, --engram-io, ...
    // Tests only: called after every layer of every pass (e.g. to request an interrupt at layer 3).
    std::function<void(const LayerTiming&)> on_layer_for_tests;
    // Tests only: the backend memory a pass's attention arenas may take (0: pass_arena_room of the
    // backend, measured once the weight slots are allocated).
    uint64_t arena_room_for_tests = 0;
    // Tests only (--devices): called on worker w's thread after each of its layers; a throw there acts
    // as a failing device.
    std::function<void(int worker, const LayerTiming&)> on_worker_layer_for_tests;
    ShardSpec shard;  // --shard K/N | auto: only this shard's records (include/ds4r/shard.h)
};

struct ScoreSummary {
    std::string backend;
    int64_t sequences = 0, tokens = 0, resumed = 0, bad_lines = 0, passes = 0;
    double seconds = 0;
};

ScoreSummary run_score(const ScoreOptions& opt);

// --devices: "all" (every one of `visible` CUDA devices; InputError when none) or a comma-separated
// list of device indices in [0, 1024) (repeats allowed). InputError on anything else; never aborts.
std::vector<int> parse_device_list(const std::string& text, int visible);
constexpr int kMaxDeviceIndex = 1024;
constexpr int kMaxDeviceWorkers = 64;

}  // namespace ds4r
