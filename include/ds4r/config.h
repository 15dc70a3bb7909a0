// The model configuration (docs/MODEL.md section 2) and the per-layer roles derived from it.
// config.json comes in two forms: the released Hugging Face one (`text_config` +
// `quantization_config`, docs/MODEL.md 2.1) and the flat `inference/config.json` one using ModelArgs
// field names (docs/MODEL.md 2.2). Both parse into the same ModelConfig (flat names).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r {

struct ModelConfig {
    // --- sizes ---
    int64_t vocab_size = 0;     // embedding / head rows (129280)
    int64_t dim = 0;            // D, residual width (5120)
    int64_t moe_inter_dim = 0;  // expert FFN width, routed and shared (2304)
    int64_t n_layers = 0;       // backbone blocks (40)
    int64_t n_mtp_layers = 0;   // MTP / DSpark blocks: never used in prefill
    int64_t n_heads = 0;        // query heads (64)
    int64_t head_dim = 0;       // q head dim == shared KV latent dim (512)
    int64_t rope_head_dim = 0;  // RoPE on the LAST rope_head_dim dims (64)
    int64_t q_lora_rank = 0;    // (1280)
    int64_t o_groups = 0;       // output projection groups (8)
    int64_t o_lora_rank = 0;    // per-group rank of the output LoRA (1024)
    int64_t window_size = 0;    // raw-KV sliding window (128)
    // --- MoE ---
    int64_t n_routed_experts = 0;     // 384
    int64_t n_shared_experts = 0;     // 1
    int64_t n_activated_experts = 0;  // top-k experts per token (6)
    std::string score_func;           // "sqrtsoftplus"
    double route_scale = 1.0;         // 1.5
    double swiglu_limit = 0.0;        // 10.0
    double gate_temp = 1.0;           // ModelArgs default, not in the file (docs/MODEL.md 2.2)
    bool norm_topk_prob = true;
    // --- norms / rope ---
    double norm_eps = 1e-20;         // eps of EVERY RMSNorm (docs/MODEL.md 4.0)
    double rope_theta = 10000.0;     // base of ratio-0 layers
    double compress_rope_theta = 0;  // base of ratio>0 layers (YaRN on)
    int64_t original_seq_len = 0;    // YaRN original_max_position_embeddings
    double rope_factor = 1;          // YaRN factor (16)
    double beta_fast = 32, beta_slow = 1;
    int64_t max_position_embeddings = 0;
    // --- compressed attention / indexer ---
    std::vector<int> compress_ratios;      // per layer (may list MTP layers too): 0, 1 or 2
    std::vector<int> kv_source_layers;     // layers that compute and publish compressed KV + index keys
    std::vector<int> index_source_layers;  // layers that run the indexer and publish top-k
    int64_t index_n_heads = 0;             // 32
    int64_t index_head_dim = 0;            // 128
    int64_t index_topk = 0;                // 512
    int candidate_source_layer = -1;       // builds the candidate block pool (20); -1 = none
    int64_t candidate_topk_blocks = 0;     // 2048
    int64_t candidate_block_size = 0;      // 8
    // --- hyper-connections ---
    int64_t hc_mult = 0;            // 4
    int64_t hc_sinkhorn_iters = 0;  // 20
    double hc_eps = 1e-6;
    // --- Engram ---
    std::vector<int> engram_layer_ids;           // [1, 14]
    std::vector<int64_t> engram_num_embeddings;  // rows per table (= sum of its 24 primes)
    int64_t engram_max_ngram_size = 0;           // 4 -> n-grams of size 2..4
    int64_t engram_vocab_size = 0;               // prime search starts above this
    int64_t engram_n_heads = 0;                  // hash heads per n-gram size (8)
    int64_t engram_head_dim = 0;                 // row width (256)
    int64_t engram_pad_id = 2;                   // token id used for missing history
    int64_t engram_compressed_vocab_size = 0;    // 99092
    // --- quantization ---
    int64_t weight_block_size = 32;  // fp8 32x32 weight blocks, activation blocks of 32
    std::string dtype = "fp8";       // dense linears
    std::string expert_dtype = "fp4";
    // --- special tokens (informational) ---
    int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;

    std::string form;  // "hf" (text_config) or "flat" (inference/config.json)

    // Derived helpers.
    int64_t nope_dim() const { return head_dim - rope_head_dim; }
    int64_t hc_dim() const { return hc_mult * dim; }                                     // 20480
    int64_t mix_hc() const { return (2 + hc_mult) * hc_mult; }                           // 24
    int64_t engram_ngram_groups() const { return engram_max_ngram_size - 1; }            // 3
    int64_t engram_hash_cols() const { return engram_ngram_groups() * engram_n_heads; }  // 24
    int compress_ratio(int layer) const;  // 0 for layers outside the list
    int engram_index(int layer) const;    // position in engram_layer_ids, -1 if none
};

// Parse config.json text (either form). `path` is used in error messages. Throws CheckpointError
// naming the file and the key for missing / mistyped / inconsistent values.
ModelConfig parse_model_config(std::string_view json_text, const std::string& path);
ModelConfig load_model_config(const std::string& path);

// What one backbone layer does (docs/MODEL.md 2.4 table, 5.6).
struct LayerRole {
    int layer = 0;
    int ratio = 0;                  // compress ratio: 0 window only, 1, or 2
    bool kv_source = false;         // runs the compressor, publishes compressed KV (+ index keys)
    bool index_source = false;      // runs the indexer, publishes top-k
    bool owns_index_keys = false;   // index source that computes its own keys (kv_source too)
    bool candidate_source = false;  // builds the candidate block pool (layer 20)
    bool reindex = false;           // index source without keys: reads the latest key owner's keys
    bool uses_candidates = false;   // index source after the candidate source: scores masked to its pool
    bool engram = false;            // Engram applied to the stream before this block
    int kv_from = -1;               // layer whose compressed KV this layer reads (-1: none)
    int topk_from = -1;             // layer whose top-k this layer uses (-1: none)
    int index_keys_from = -1;       // layer whose index keys this layer's indexer reads (-1: none)
    // "window", "kv+index source", "consumer", "reindex", ... (for inspect)
    std::string describe() const;
};

// One role per backbone layer 0..n_layers-1, for every pattern DeepSeek's reference runs (docs/MODEL.md
// 5.6: each shared slot a layer reads was written earlier by a layer of the same ratio). Throws
// CheckpointError (naming `path`) otherwise (a ratio>0 layer before any KV source, a key-less index
// source before any key owner, a slot of another ratio, ...).
std::vector<LayerRole> derive_layer_roles(const ModelConfig& cfg, const std::string& path);

}  // namespace ds4r
