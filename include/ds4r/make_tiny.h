// make-tiny (docs/DESIGN.md section 2): a random checkpoint in exactly the released layout
// (docs/MODEL.md 2.1, 3.1-3.4) — config.json in the Hugging Face form, model.safetensors.index.json, shards
// model-000NN-of-000MM.safetensors (tiny: shard 1 embed, one shard per layer, head + norm, one shard
// per Engram table; full-width: the release's grouping, docs/MODEL.md 3.1: vision, embed, one per
// layer, head + norm, 3 MTP, the Engram tables; 48 shards at 40 layers), a byte-level BPE tokenizer.json —
// with tensor names, dtypes and shapes taken from the binding (all_tensor_specs), fp8 / fp4 weights quantized
// as DeepSeek's are.
//
// Presets:
//   tiny        the dimensions and layer roles of the golden tiny-a (vocab 512, dim 256, 6 layers).
//   full-width  the real dimensions (vocab 129280, dim 5120, 384 experts of 2304, ...) with N layers
//               (default 4: window, window + Engram, KV + index source of ratio 2, consumer). The
//               Engram tables (~98 GB each) are written as sparse files: their rows read as zero.
// --layers N truncates either preset (layer lists keep the ids < N). Same seed => same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ds4r/binding.h"
#include "ds4r/config.h"

namespace ds4r {

// tiny: the golden tiny-a; tiny-roles: tiny-a's dimensions, 8 layers with another role pattern
// (ratios 0,0,2,2,2,1,1,1, KV sources 2,5, index sources 2,4,5,7, candidate source 5); full-width.
enum class TinyPreset { Tiny, FullWidth, TinyRoles };

// "tiny" / "full-width" / "tiny-roles"; nullopt for anything else.
std::optional<TinyPreset> tiny_preset_from_name(std::string_view name);
const char* tiny_preset_name(TinyPreset p);
// Default layer count of a preset (tiny 6, tiny-roles 8, full-width 4).
int tiny_preset_default_layers(TinyPreset p);

// The preset's configuration with `layers` layers (<= 0: the preset default), before the fields that
// depend on the tokenizer and the Engram prime layout (engram_compressed_vocab_size = 0,
// engram_num_embeddings empty). Throws InputError for an unusable layer count.
ModelConfig make_tiny_base_config(TinyPreset preset, int layers);

// A synthetic byte-level BPE tokenizer.json (Hugging Face `tokenizers` format) of exactly
// `vocab_size` ids: <｜begin▁of▁sentence｜> 0, <｜end▁of▁sentence｜> 1, <｜▁pad▁｜> 2 (added special
// tokens that are also in the vocab), the 256 byte tokens at 3..258 in GPT-2 bytes_to_unicode order,
// merged tokens (BPE trained on a small built-in multilingual text, then, past what that text
// supports, pairs of earlier tokens chosen by a fixed-seed generator; every merge's result is a vocab
// token) and five chat special tokens at the top ids (added tokens only). Independent of --seed.
// Throws InputError when vocab_size < 264.
std::string make_tiny_tokenizer_json(int64_t vocab_size);

// config.json text in the released Hugging Face form (docs/MODEL.md 2.1): top-level architectures /
// model_type / dtype / transformers_version / bos / eos / pad ids, quantization_config, and a
// text_config with every key of docs/MODEL.md 2.1 (num_nextn_predict_layers 0: no MTP tensors are written).
std::string make_tiny_config_json(const ModelConfig& cfg);

struct TinyShard {
    std::string file;             // "model-000NN-of-000MM.safetensors"
    std::vector<size_t> tensors;  // indices into MakeTinyPlan::specs
    bool sparse = false;          // every tensor left as a hole (full-width Engram tables)
    bool random_table = false;    // an Engram table of random bytes (--engram-rows)
    uint64_t tensor_bytes = 0;    // sum of the tensors' sizes
};

// Everything make-tiny will write, computed without touching the disk.
struct MakeTinyPlan {
    TinyPreset preset = TinyPreset::Tiny;
    ModelConfig cfg;                // as config.json parses back (parse_model_config)
    std::vector<LayerRole> roles;   // derive_layer_roles(cfg)
    std::vector<TensorSpec> specs;  // all_tensor_specs(cfg, roles), optional ones included
    std::vector<TinyShard> shards;  // in file-number order
    std::string config_json;
    std::string tokenizer_json;
    uint64_t total_tensor_bytes = 0;        // index metadata.total_size
    uint64_t sparse_bytes = 0;              // of which left as holes
    uint64_t layer_bytes(int layer) const;  // tensor bytes of layer's shard (Engram tables excluded)
};

// Builds the plan: base config, tokenizer, engram_compressed_vocab_size = distinct keys of the
// generated tokenizer (build_engram_token_map, unchecked), engram_num_embeddings from
// build_engram_layout, config.json rendered and parsed back, roles, specs and shard assignment.
// engram_rows > 0: each Engram table gets about that many rows (engram_vocab_size is set so that the
// layer's primes sum near it) and is written DENSE with random bytes (see MakeTinyOptions::engram_rows).
MakeTinyPlan plan_make_tiny(TinyPreset preset, int layers, int64_t engram_rows = 0);

// model.safetensors.index.json text (metadata.total_size + weight_map, names sorted).
std::string make_tiny_index_json(const MakeTinyPlan& plan);

struct MakeTinyProgress {
    uint64_t bytes_done = 0;   // tensor bytes generated and written
    uint64_t bytes_total = 0;  // total_tensor_bytes - sparse_bytes (holes are not written)
    std::string file;          // the file being written
};

struct MakeTinyOptions {
    TinyPreset preset = TinyPreset::Tiny;
    int layers = 0;  // <= 0: the preset default
    uint64_t seed = 0;
    bool force = false;  // allow a non-empty OUT_DIR (stale model-*.safetensors are removed)
    int threads = 0;     // generator threads; <= 0: hardware concurrency (output does not depend on it)
    // Every shard is written as headers plus holes (all weights read as zero bytes): a checkpoint of the
    // released size and layout for checking inspect / validation at scale, not for scoring.
    bool headers_only = false;
    // > 0: Engram tables of about this many rows at the preset's row width, written dense: random
    // non-zero, finite e4m3 codes and e8m0 scales 2^-8..2^-1 (a fast PRNG over 64-bit words, large
    // sequential writes), so that gathers read real data from the disk. --engram-rows 40000000 at full width
    // is a ~10.6 GB table (264 bytes per row). Changes the hashing's primes, so not for golden data.
    int64_t engram_rows = 0;
    // Called after each written chunk (at most every ~64 MiB) and at the end of every file.
    std::function<void(const MakeTinyProgress&)> progress;
};

struct MakeTinyResult {
    MakeTinyPlan plan;
    std::vector<std::string> files;  // every file written, in order (paths under OUT_DIR)
    uint64_t bytes_on_disk = 0;      // apparent size of all files written
    double seconds = 0;
    std::string readme;  // the README.txt text written into OUT_DIR (also for printing)
};

// Writes the checkpoint into out_dir (created if missing). Refuses (InputError) a non-empty out_dir
// without force. Files are written one at a time through temporary names and renamed when complete;
// the index is written last. Tensor generation streams in bounded chunks (about 64 MiB per thread
// pool round), never holding a whole tensor of the full-width model in memory.
MakeTinyResult make_tiny(const std::string& out_dir, const MakeTinyOptions& opts);

}  // namespace ds4r
