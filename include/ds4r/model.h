// The V4.1 block, written once against the Backend interface (docs/MODEL.md section 4).
//
// A pass pushes many sequences through one layer at a time. Rows of the pass are (sequence,
// position) pairs; they are processed in chunks of at most --max-batch-tokens rows, in pass order:
//   engram_chunk  (Engram layers only, a sweep of its own) X is updated in place before the block (4.4 step
//   1); kv_chunk      window KV of the chunk's rows, and at KV sources the compressed KV + index keys (4.6 b,
//   c); main_chunk    queries, indexer, sparse attention, output, mHC and MoE: X <- block(X), P <- f_pre.
// kv_chunk then main_chunk run for one chunk before the next: attention at position t reads only
// data of positions <= t of its own sequence (causal), all produced by this or an earlier chunk.
// Per-sequence data that attention reads (window KV of this layer, the cross-layer shared slots of
// docs/MODEL.md 5.6) lives in backend "arenas" for the whole pass.
// Every row's result depends only on that row's sequence: never on the chunking or on the other
// sequences of the pass (batch invariance, docs/DESIGN.md section 4).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/config.h"

namespace ds4r {

// Tensors of one block as backend views (bound by checkpoint name from include/ds4r/binding.h).
struct LayerWeights {
    int layer = 0;
    LayerRole role;
    Tensor attn_norm, ffn_norm;          // BF16 [D]
    Tensor hc_attn_fn, hc_ffn_fn;        // F32 [mix, hc*D]
    Tensor hc_attn_base, hc_ffn_base;    // F32 [mix]
    Tensor hc_attn_scale, hc_ffn_scale;  // F32 [3]
    Tensor attn_sink;                    // F32 [H]
    Fp8Linear wq_a;                      // [q_lora, D]
    Tensor q_norm;                       // BF16 [q_lora]
    Fp8Linear wq_b;                      // [H*hd, q_lora]
    Fp8Linear wkv;                       // [hd, D]
    Tensor kv_norm;                      // BF16 [hd]
    Fp8Linear wo_a;                      // [G*o_lora, H*hd/G], used as exact bf16 (docs/MODEL.md 3.6)
    Fp8Linear wo_b;                      // [D, G*o_lora]
    // Compressor (KV sources only).
    Tensor cmp_wkv;    // BF16 [hd, D] (fp32 math at ratio 2, bf16 at ratio 1)
    Tensor cmp_wgate;  // BF16 [hd, D] (ratio 2 only)
    Tensor cmp_norm;   // BF16 [hd]
    // Indexer.
    Tensor idx_wk;            // BF16 [ihd, hd] (key-owning sources only)
    Tensor idx_k_norm;        // BF16 [ihd]
    Fp8Linear idx_wq_b;       // [nIH*ihd, q_lora] (index sources)
    Tensor idx_weights_proj;  // BF16 [nIH, D]
    MoeWeights moe;
    // Engram projections (Engram layers only; the table itself is gathered on the host).
    Fp8Linear eng_wkv;    // [(hc+1)*D, cols*ehd]
    Tensor eng_q, eng_k;  // BF16 [hc, D]
};

// name -> backend tensor of the checkpoint tensor with that name (throws if absent).
using TensorLookup = std::function<Tensor(const std::string& name)>;
LayerWeights bind_layer_weights(const ModelConfig& cfg, const LayerRole& role, const TensorLookup& get);

struct GlobalWeights {
    Tensor norm;  // BF16 [D]
    Tensor head;  // BF16 [V, D] (used as fp32)
};
GlobalWeights bind_global_weights(const TensorLookup& get);

// One sequence of a pass, as the layer sees it.
struct SeqInfo {
    int64_t len = 0;                     // s
    int64_t row0 = 0;                    // its first row in the pass-wide arenas win_kv, cmp_kv, index_k
    int64_t topk_off = 0;                // its first element in `topk` (room for [len, topk_cap])
    int64_t cand_off = 0;                // its first element in `cand` (room for [len, cand_cap])
    int64_t topk_cap = 0, cand_cap = 0;  // seq_arena_caps(len)
    // Shared slots (docs/MODEL.md 5.6), set by the latest source layers:
    int64_t cmp_rows = 0;    // T: rows of compressed KV / index keys (s / ratio of the latest KV source)
    int64_t topk_width = 0;  // K_c of the latest index source (0: window only)
    int64_t cand_words = 0;  // 32-bit words per row of the candidate block mask (0: none yet)
};

// A contiguous piece of one sequence inside a chunk.
struct Segment {
    int seq = 0;             // index into the pass's sequences
    int64_t t0 = 0, t1 = 0;  // positions [t0, t1)
    int64_t row = 0;         // first row of the segment in the chunk tensors
};

struct ChunkRows {
    std::vector<Segment> segs;      // in row order, covering rows [0, rows)
    int64_t rows = 0;               // M
    Tensor pos;                     // I32 [M] positions (backend memory)
    std::vector<int32_t> host_pos;  // the same on the host
};

// Pass-wide backend state shared by the chunk functions.
struct PassContext {
    PassContext(Backend& b, const ModelConfig& c) : be(b), cfg(c) {}
    Backend& be;
    const ModelConfig& cfg;
    std::vector<SeqInfo> seqs;
    int64_t total_rows = 0;
    int64_t max_len = 0;
    Tensor win_kv;      // BF16 [total_rows, hd]: window KV of the current layer (4.6 b)
    Tensor cmp_kv;      // BF16 [total_rows, hd]: compressed KV of the latest KV source (seq at row0)
    Tensor index_k;     // BF16 [total_rows, ihd]: index keys of the latest key-owning source
    Tensor topk;        // I32 flat, sum of len * topk_cap: sequence i holds [len, topk_width] at its topk_off
    Tensor cand;        // I32 flat (32-bit mask words, see Backend::candidate_blocks), sum of len * cand_cap:
                        // sequence i holds [len, cand_words] at its cand_off
    Tensor rope_plain;  // F32 [max_len, rd/2, 2]: ratio-0 layers (base rope_theta, no YaRN)
    Tensor rope_yarn;   // F32 [max_len, rd/2, 2]: ratio>0 layers and indexers (compress_rope_theta, YaRN)

    // Allocates the arenas and RoPE tables for sequences of these lengths (the previous pass's are
    // released first: a pass run again with smaller chunks after running out of memory needs the room).
    // Device bytes: the sum of seq_arena_bytes over the sequences + pass_rope_bytes(longest).
    void setup(const std::vector<int64_t>& lens);
    // Views of one sequence's slots.
    Tensor seq_topk(int i) const;  // I32 [len, topk_width]
    Tensor seq_cand(int i) const;  // I32 [len, cand_words] (mask words)
};

// The most one sequence of `len` tokens can publish in the shared slots (begin_layer), which its
// arenas reserve: compressed rows T <= len / (the smallest compression ratio), so top-k width
// min(index_topk, T) and candidate mask words ceil(ceil(T / block) / 32) (0 without a candidate source).
struct SeqArenaCaps {
    int64_t cmp_rows = 0, topk_width = 0, cand_words = 0;
};
SeqArenaCaps seq_arena_caps(const ModelConfig& cfg, int64_t len);
// Backend bytes of one sequence's arenas: window KV, compressed KV and index keys (len rows each), its
// top-k [len, topk_width] and candidate mask [len, cand_words] at the caps above. Additive over the
// sequences of a pass, so a pass's size can be planned sequence by sequence (score, bench d).
int64_t seq_arena_bytes(const ModelConfig& cfg, int64_t len);
// Bytes of a pass's two RoPE tables when its longest sequence has max_len tokens.
int64_t pass_rope_bytes(const ModelConfig& cfg, int64_t max_len);

// Optional per-chunk outputs for tests (teacher-forced golden comparisons). Empty tensors = off.
struct LayerTaps {
    Tensor attn_out;   // BF16 [M, D]: attention output after wo_b
    Tensor moe_out;    // BF16 [M, D]
    Tensor route_idx;  // I32 [M, k]
    Tensor route_w;    // F32 [M, k]
};

// Engram (docs/MODEL.md 4.8): X BF16 [M, hc, D] updated in place; e BF16 [M, cols*ehd] = gathered rows.
void engram_chunk(PassContext& ctx, const LayerWeights& w, const Tensor& X, const Tensor& e);
// The attention input of a chunk (4.5 steps 3-4): x BF16 [M, D] = attn_norm(hc_pre(X, P)) with
// X BF16 [M, hc, D], P F32 [M, hc]; computed once, read by kv_chunk and main_chunk.
Tensor attn_input(PassContext& ctx, const LayerWeights& w, const Tensor& X, const Tensor& P);
// Sweep 1 (4.6 b, c, 4.6.1, 4.6.2 step 1) from x = attn_input(...). Chunk segments must start at even
// positions.
void kv_chunk(PassContext& ctx, const LayerWeights& w, const ChunkRows& rows, const Tensor& x);
// Sweep 2: the rest of block L from x = attn_input(X, P). X BF16 [M, hc, D] <- block output; P F32
// [M, hc] <- f_pre.
void main_chunk(PassContext& ctx, const LayerWeights& w, const ChunkRows& rows, const Tensor& X,
                const Tensor& P, const Tensor& x, const LayerTaps* taps);
// After the last block (4.9): x = hc_pre(X, P) -> `collapsed` (BF16 [M, D], the capture point of
// layer n_layers) -> final norm -> head statistics against targets I32 [M].
void head_chunk(PassContext& ctx, const GlobalWeights& g, const Tensor& X, const Tensor& P,
                const Tensor& targets, int k, const Tensor& collapsed, const HeadStatsOut& out);

// Called once per layer before its kv sweep: publishes the per-sequence slot metadata the layer
// will produce (cmp_rows at KV sources, topk_width at index sources, cand_words at the candidate
// source), so arenas views are known before any chunk runs.
void begin_layer(PassContext& ctx, const LayerRole& role);

}  // namespace ds4r
