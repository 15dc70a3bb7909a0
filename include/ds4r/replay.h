// The layer-major pass runner (DESIGN.md section 3, replay/): a pass is a set of sequences whose
// state fits in host memory; every layer is applied to every sequence of the pass before the next
// layer is acquired from the WeightSource. Per-sequence state (4-copy residual stream, next
// pre-mix) lives in host memory between layers and streams through the backend in chunks of at
// most max_batch_tokens rows.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/engram.h"
#include "ds4r/model.h"
#include "ds4r/weights.h"

namespace ds4r {

class Checkpoint;
class Tokenizer;

enum class HiddenMode { Mean, Copies };

struct ReplayOptions {
    int64_t max_batch_tokens = 4096;  // rows per chunk (bounds activation memory, never results)
    int top_k = 8;                    // alternatives per position
    std::vector<int> capture_layers;  // 0..n_layers (n_layers = collapsed final hidden state)
    HiddenMode hidden_mode = HiddenMode::Mean;
};

// Rows per chunk that keep a chunk's activations (~ (14 + hc) * D * 4 bytes per row plus attention
// scores, plus the state ring's 2 extra buffers of hc * (D * 2 + 4) bytes) within a quarter of the
// backend's free memory; 64 .. 8192.
int64_t default_chunk_rows(const ModelConfig& cfg, size_t free_bytes);

// Engram hashing state and table readers for the whole run (MODEL.md 4.2, 4.8).
struct EngramResources {
    EngramTokenMap map;
    EngramLayout layout;
    std::vector<std::unique_ptr<EngramTable>> tables;  // one per Engram layer, in engram_layer_ids order
};
// Builds the token map from tokenizer.json (checked against engram_compressed_vocab_size), the
// layout, and opens the table shards. nullptr when the model has no Engram layers.
std::unique_ptr<EngramResources> load_engram_resources(const Checkpoint& ckpt);

// Scores of one sequence of n tokens. Row t < n-1 scores tokens[t+1]; row n-1 is the distribution
// after the last token ("final").
struct SequenceScores {
    int64_t n = 0;
    std::vector<double> logprob;        // [n-1]
    std::vector<int32_t> rank;          // [n-1]
    std::vector<double> entropy;        // [n]
    std::vector<int32_t> topk_ids;      // [n, k]
    std::vector<double> topk_logprobs;  // [n, k]
};

// Receives captured hidden states (DESIGN.md "Hidden states"), per layer and sequence, in
// sequence order. Mean mode: fp16 bits [rows, D]; copies mode: bf16 bits [rows, hc, D];
// layer n_layers: fp16 bits [rows, D].
class HiddenSink {
public:
    virtual ~HiddenSink() = default;
    virtual void add_rows(int layer, int seq, const uint16_t* data, int64_t rows, int64_t row_elems) = 0;
    // The pass is run again from its start (PassRunner's out-of-memory retry): forget the rows added
    // during it. Default: nothing (for sinks that overwrite the rows of a (layer, seq) when re-added).
    virtual void restart_pass() {}
};

struct LayerTiming {
    int layer = 0;         // kHeadLayer for the head
    double wait_s = 0;     // blocked on the weight source
    double compute_s = 0;  // sweeps (backend synchronized)
    int64_t rows = 0;
};

class PassRunner {
public:
    PassRunner(Backend& be, const Checkpoint& ckpt, WeightSource& weights, const EngramResources* engram,
               ReplayOptions opt);
    ~PassRunner();

    // One whole pass: begin, every layer in order, finish. When the backend runs out of memory
    // (OutOfMemoryError), the chunks are halved (down to kMinChunkRows) and the pass runs again from
    // its start: results do not depend on the chunk size (batch invariance), so nothing changes but
    // the time. Later passes keep the smaller chunks.
    std::vector<SequenceScores> run(const std::vector<std::vector<int32_t>>& seqs, HiddenSink* sink,
                                    const std::function<void(const LayerTiming&)>& on_layer = {});
    static constexpr int64_t kMinChunkRows = 8;
    // Progress within a layer: called after each chunk of a block (layer) or of the head (kHeadLayer)
    // with the pass rows done so far and the pass's total. On an asynchronous backend "done" means
    // issued; the host runs at most the state ring's depth of chunks ahead.
    using ChunkCallback = std::function<void(int layer, int64_t rows_done, int64_t rows_total)>;
    void set_on_chunk(ChunkCallback f) { on_chunk_ = std::move(f); }
    int64_t chunk_rows() const { return opt_.max_batch_tokens; }  // the current chunk size
    int out_of_memory_retries() const { return oom_retries_; }

    // --- step API (used by run() and by the teacher-forced tests) ---
    // Embeds the tokens, expands to hc copies, pre-mix = one-hot copy 0, computes Engram hashes.
    void begin(const std::vector<std::vector<int32_t>>& seqs);
    // Engram of layer L on the host stream (no-op for non-Engram layers).
    void run_engram(const LayerWeights& w);
    // Block L (kv sweep, then main sweep). If host_taps is non-null, per-row taps are downloaded
    // into it (each vector sized total_rows * width, pass row order).
    struct HostTaps {
        std::vector<uint16_t> attn_out, moe_out;  // [rows, D] bf16
        std::vector<int32_t> route_idx;           // [rows, k]
        std::vector<float> route_w;               // [rows, k]
    };
    void run_block(const LayerWeights& w, HostTaps* host_taps = nullptr);
    // Final collapse, norm, head statistics.
    std::vector<SequenceScores> finish(const GlobalWeights& g, HiddenSink* sink);
    // Captures layer L (< n_layers) from the host stream (call after run_engram, before run_block).
    void capture(int layer, HiddenSink* sink);

    // Host state of sequence i.
    uint16_t* stream(int seq);  // BF16 [len, hc, D]
    float* premix(int seq);     // F32 [len, hc]
    int64_t seq_len(int seq) const;
    PassContext& context() { return ctx_; }
    const std::vector<std::vector<int32_t>>& tokens() const { return tokens_; }

private:
    std::vector<SequenceScores> run_pass(const std::vector<std::vector<int32_t>>& seqs, HiddenSink* sink,
                                         const std::function<void(const LayerTiming&)>& on_layer);
    struct Chunk {
        int64_t r0 = 0, r1 = 0;  // pass rows
        ChunkRows rows;
    };
    void plan_chunks();
    // Gathers Engram rows of Engram layer #ei for every row of the pass, in the background (MODEL.md
    // 4.8 step 1): BF16 [total_rows, cols * ehd]. Started one Engram layer ahead.
    void start_engram_gather(int ei);
    void upload_chunk(const Chunk& ch, const Tensor& X, const Tensor& P);  // synchronous (Engram)
    // The chunk state ring (run_block, finish): chunk c's residual stream and pre-mix live in device
    // buffer c % ring while chunk c computes; chunk c + 1 is uploaded (up_q_) and chunk c - 1
    // downloaded (down_q_) meanwhile. Buffer b is refilled only after its previous chunk's download
    // completed. Copies never change values: results are those of synchronous copies.
    struct StateRing {
        std::vector<Tensor> X, P;        // ring x BF16 [max_rows, hc, D] / F32 [max_rows, hc]
        std::vector<uint64_t> up, down;  // per chunk: fences of its upload / download (0: none)
        CopyQueue* up_q = nullptr;
        CopyQueue* down_q = nullptr;
        StateRing() = default;
        StateRing(const StateRing&) = delete;
        StateRing& operator=(const StateRing&) = delete;
        // Copies still in flight when the ring goes away (an exception in the middle of a layer)
        // complete before its buffers are freed.
        ~StateRing();
    };
    void init_ring(StateRing& ring);
    void ring_upload(StateRing& ring, size_t c);    // issues chunk c's upload into its buffer
    void ring_download(StateRing& ring, size_t c);  // after chunk c's compute: its download
    void ring_drain(StateRing& ring);               // host waits for every download

    Backend& be_;
    const Checkpoint& ckpt_;
    WeightSource& weights_;
    const EngramResources* engram_;
    ReplayOptions opt_;
    const ModelConfig& cfg_;
    std::vector<LayerRole> roles_;
    PassContext ctx_;
    std::vector<std::vector<int32_t>> tokens_;
    std::vector<int64_t> row0_;
    int64_t total_rows_ = 0;
    std::shared_ptr<void> stream_;  // BF16 [total_rows, hc, D]
    std::shared_ptr<void> premix_;  // F32 [total_rows, hc]
    std::vector<int64_t> hashes_;   // I64 [total_rows, n_engram_layers, cols]
    std::vector<Chunk> chunks_;
    int oom_retries_ = 0;
    ChunkCallback on_chunk_;
    std::unique_ptr<CopyQueue> up_q_, down_q_;  // the state ring's host -> backend / backend -> host copies
    std::future<std::vector<uint16_t>> engram_rows_;  // the gather in flight
    int engram_rows_layer_ = -1;                      // its Engram layer index (-1: none)
};

}  // namespace ds4r
