// The layer-major pass runner (docs/DESIGN.md section 3, replay/): a pass is a set of sequences whose
// state fits in host memory; every layer is applied to every sequence of the pass before the next
// layer is acquired from the WeightSource. Per-sequence state (4-copy residual stream, next
// pre-mix) lives in host memory between layers and streams through the backend in chunks of at
// most chunk_rows rows.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/engram_io.h"
#include "ds4r/model.h"
#include "ds4r/weights.h"

namespace ds4r {

class AtomicFileWriter;
class Checkpoint;
class FileHandle;
class Tokenizer;

enum class HiddenMode { Mean, Copies };

struct ReplayOptions {
    int64_t chunk_rows = 4096;        // rows per chunk (bounds activation memory, never results)
    int top_k = 8;                    // alternatives per position
    std::vector<int> capture_layers;  // 0..n_layers (n_layers = collapsed final hidden state)
    HiddenMode hidden_mode = HiddenMode::Mean;
    // PassRunner::run shrinks the chunks and runs the pass again on OutOfMemoryError; false: it throws
    // (the multi-device runner restarts the pass of every worker instead, src/replay/multi_device_runner.h).
    bool retry_out_of_memory = true;
};

// Rows per chunk that keep a chunk's activations (~ (14 + hc) * D * 4 bytes per row plus attention
// scores, plus the state ring's 2 extra buffers of hc * (D * 2 + 4) bytes) within half of the
// backend's free memory (as a run starts, before its weight slots are allocated): kLargeChunkRows where
// half the free memory holds twice that many rows, else 64 .. kChunkRowsCap.
inline constexpr int64_t kChunkRowsCap = 8192;
inline constexpr int64_t kLargeChunkRows = 16384;  // the MoE's own chunk (CudaBackend::moe) is as large
int64_t default_chunk_rows(const ModelConfig& cfg, size_t free_bytes);
// The chunk size of a run (--max-batch-tokens of score / bench): `requested` rows when > 0, else
// default_chunk_rows(cfg, free_bytes).
int64_t resolve_chunk_rows(int64_t requested, const ModelConfig& cfg, size_t free_bytes);
// As resolve_chunk_rows, for a run that then plans its prepared experts (plan_prepared_experts up to
// `widest`): a default of kLargeChunkRows drops to kChunkRowsCap where the larger chunks' working set
// would leave the experts' copy a narrower layout than the smaller chunks' would (the layout gains more
// than the chunk: docs/PERFORMANCE.md, sixteenth session). free_bytes: `be`'s free memory as the run
// starts; reserved: what the run allocates before it plans the pass (the weight slots; a multi-GPU
// worker's layer copies).
int64_t plan_chunk_rows(int64_t requested, const Backend& be, const ModelConfig& cfg, size_t free_bytes,
                        uint64_t reserved, ExpertLayout widest);
// The two weight slots of a run's weight source, about: twice the largest layer's stream bytes.
uint64_t weight_slots_bytes(const Checkpoint& ck);

// Backend bytes one chunk row's working set is budgeted at when a pass is planned (pass_arena_room):
// default_chunk_rows' estimate x 0.65. At full width that is 463 KB against the measured marginal cost
// of a row, 404 KB (19.03 GB GPU high-water at 8,192-row chunks vs 16.70 GB at 2,420, docs/PERFORMANCE.md).
int64_t chunk_row_budget_bytes(const ModelConfig& cfg);
// Backend memory a pass's arenas may take (PassContext::setup: window / compressed KV, index keys, top-k,
// candidate mask; seq_arena_bytes per sequence + pass_rope_bytes): `be`'s free memory less the working
// set of chunks of `chunk_rows` rows. Call once the weight slots are allocated (the weight source is
// built). score and bench d end a pass before its arenas would pass it; 0 when nothing is left.
uint64_t pass_arena_room(const Backend& be, const ModelConfig& cfg, int64_t chunk_rows);
// Sets the backend's prepared experts (Backend::prepare_experts: CudaBackend's e5m2 or fp16 copy of a
// layer's routed experts for the Hopper kernels) to the widest layout, up to `widest` (--prepared-experts:
// fp16 F16, e5m2 E5m2, auto kAutoExpertLayout, off None), that the backend has and whose copy takes at most half of `arena_room`
// (the pass's arena room without it), else off. Returns the bytes the copy takes (0 when off): the
// caller's arena room shrinks by them. Results never depend on it.
uint64_t plan_prepared_experts(Backend& be, const ModelConfig& cfg, uint64_t arena_room, ExpertLayout widest);
// The layout plan_prepared_experts would set for that room (nothing set).
ExpertLayout pick_prepared_experts(const Backend& be, const ModelConfig& cfg, uint64_t arena_room,
                                   ExpertLayout widest);

// Host bytes per pass token at most (docs/DESIGN.md 5: <= 64 KB): the residual stream (hc x dim bf16), the
// pre-mix, the Engram hash ids, the gathered Engram rows as stored (engram_rows_bytes_per_token) and the
// next pass's (--engram-next-pass): auto its hash ids (its rows replace the current pass's table by table,
// or take memory found free at run time), on a second full set. Released model: 54,672 bytes (off),
// 55,056 (auto), 68,304 (on: over the budget).
int64_t pass_host_bytes_per_token(const ModelConfig& cfg, EngramNextPassMode next_pass);

// EngramResources / load_engram_resources (the Engram tables of a run) and the pass gather: ds4r/engram_io.h.

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

// Receives captured hidden states (docs/DESIGN.md "Hidden states"), per layer and sequence, in
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
    int layer = 0;             // kHeadLayer for the head
    double wait_s = 0;         // blocked on the weight source
    double engram_wait_s = 0;  // blocked on the Engram gather's rows (Engram layers; not in compute_s)
    double compute_s = 0;      // sweeps (backend synchronized)
    // of compute_s: the chunk loop blocked on the host's dequantization of a chunk's Engram rows (Engram
    // layers in the block's sweep; the first chunk's, then each one not done while the chunks before ran)
    double engram_dequant_wait_s = 0;
    // Engram layers in the block's sweep: the first two chunks' rows were dequantized ahead of the chunk
    // loop, during the layer before or the wait for the layer's weights (the gather had them by then;
    // PassRunner::prefetch_engram_rows)
    bool engram_rows_prefetched = false;
    int64_t rows = 0;
    double stall_s() const { return wait_s + engram_wait_s; }  // blocked on I/O of either kind
    double wall_s() const { return stall_s() + compute_s; }
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
    // `from`: continue a pass saved mid-way (Ctrl-C): after begin(), `from->load` restores the state
    // written by write_state and the layers from `from->next_layer` run (an out-of-memory retry runs
    // the whole pass again instead).
    struct Continuation {
        int next_layer = 0;
        std::function<void(PassRunner&)> load;
    };
    std::vector<SequenceScores> run(const std::vector<std::vector<int32_t>>& seqs, HiddenSink* sink,
                                    const std::function<void(const LayerTiming&)>& on_layer = {},
                                    const Continuation* from = nullptr);
    static constexpr int64_t kMinChunkRows = 8;
    // Progress within a layer: called after each chunk of a block (layer) or of the head (kHeadLayer)
    // with the pass rows done so far and the pass's total. On an asynchronous backend "done" means
    // issued; the host runs at most the state ring's depth of chunks ahead.
    using ChunkCallback = std::function<void(int layer, int64_t rows_done, int64_t rows_total)>;
    void set_on_chunk(ChunkCallback f) { on_chunk_ = std::move(f); }
    int64_t chunk_rows() const { return opt_.chunk_rows; }  // the current chunk size
    int out_of_memory_retries() const { return oom_retries_; }
    // After an OutOfMemoryError: halves the chunks (logged with `why`); false when they are at
    // kMinChunkRows already (nothing left to shrink).
    bool shrink_chunks(const std::string& why);
    // The Engram gathers of every pass so far (rows, requests, busy time, the stall at Engram layers).
    EngramGatherStats engram_stats() const;
    // The pass after the next run()'s (score reads the input one pass ahead; empty: none, e.g. the last
    // pass). During that run, once its own Engram gathers are done, this pass's rows are gathered
    // (EngramResources::next_pass: on, off, or auto = when they take <= 1/4 of MemAvailable); the run()
    // that follows with exactly these sequences finds them in memory. Anything else drops them.
    void set_next_pass(std::vector<std::vector<int32_t>> seqs);
    // Tables of the next pass's gather that have ended (rows in or failed); -1 when none is running.
    int next_pass_tables_done() const;

    // --- mid-pass save (src/replay/pass_state.cpp) ---
    // The first layer not yet applied to the host state of the current pass.
    int next_layer() const { return next_layer_; }
    // Everything that carries from one layer to the next: the residual stream and pre-mix (host), the
    // per-sequence shared-slot sizes and the shared-slot arenas (compressed KV, index keys, top-k,
    // candidate mask; docs/MODEL.md 5.6). Names and byte sizes, in write_state's order.
    std::vector<std::pair<std::string, uint64_t>> state_blobs() const;
    void write_state(AtomicFileWriter& out);
    // Reads the blobs at `offset` of `in` into a pass begun with the same sequences.
    void read_state(const FileHandle& in, uint64_t offset);

    // --- step API (used by run() and by the teacher-forced tests) ---
    // Embeds the tokens, expands to hc copies, pre-mix = one-hot copy 0, computes Engram hashes.
    // `first_layer`: the layer the pass starts at (a continued pass: its Engram gather starts there).
    void begin(const std::vector<std::vector<int32_t>>& seqs, int first_layer = 0);
    // Engram of layer L on the host stream (no-op for non-Engram layers).
    // Returns the seconds spent blocked on the gather's rows (LayerTiming::engram_wait_s).
    double run_engram(const LayerWeights& w);
    // Block L (kv sweep, then main sweep). If host_taps is non-null, per-row taps are downloaded
    // into it (each vector sized total_rows * width, pass row order).
    struct HostTaps {
        std::vector<uint16_t> attn_out, moe_out;  // [rows, D] bf16
        std::vector<int32_t> route_idx;           // [rows, k]
        std::vector<float> route_w;               // [rows, k]
    };
    // engram: layer w's gathered rows (engram_rows); then the block applies Engram to each chunk first,
    // instead of run_engram's own sweep (the same bytes; run_pass takes it unless the layer is captured).
    // timing (optional): the block's LayerTiming::engram_dequant_wait_s and engram_rows_prefetched.
    void run_block(const LayerWeights& w, HostTaps* host_taps = nullptr, const EngramRowSet* engram = nullptr,
                   LayerTiming* timing = nullptr);
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
                                         const std::function<void(const LayerTiming&)>& on_layer,
                                         const Continuation* from);
    struct Chunk {
        int64_t r0 = 0, r1 = 0;  // pass rows
        ChunkRows rows;
    };
    void plan_chunks();
    void upload_chunk(const Chunk& ch, const Tensor& X, const Tensor& P);  // synchronous (Engram)
    // Engram layer w's gathered rows, blocking until the gather has them (*waited: seconds blocked).
    const EngramRowSet& engram_rows(const LayerWeights& w, double* waited);
    // Chunk ch's lookups dequantized to bf16 into e_host (BF16 [rows, cols * ehd]).
    void engram_dequant(const EngramRowSet& rows, const Chunk& ch, uint16_t* e_host) const;
    // The chunk state ring (run_block, finish): chunk c's residual stream and pre-mix live in device
    // buffer c % ring while chunk c computes; chunk c + 1 is uploaded (up_q_) and chunk c - 1
    // downloaded (down_q_) meanwhile. Buffer b is refilled only after its previous chunk's download
    // completed. Copies never change values: results are those of synchronous copies.
    struct StateRing {
        std::vector<Tensor> X, P;        // ring x BF16 [max_rows, hc, D] / F32 [max_rows, hc]
        std::vector<uint64_t> up, down;  // per chunk: fences of its upload / download (0: none)
        CopyQueue* up_q = nullptr;
        CopyQueue* down_q = nullptr;
        // Engram layers in run_block (else empty): chunk c's dequantized rows in E[c % 2], BF16
        // [max_rows, cols * ehd], uploaded by ring_upload from e_host[c % 2] (host, pinned, same shape);
        // e_pending[c % 2] dequantizes chunk c into it (started one chunk ahead; chunks 0 and 1 during
        // the layer before where the rows were in by then, prefetch_engram_rows); joined before e_host is
        // freed: declared after it.
        const EngramRowSet* engram = nullptr;
        std::vector<Tensor> E;
        std::shared_ptr<void> e_host[2];
        std::future<void> e_pending[2];
        double dequant_wait_s = 0;  // the host blocked on the rows' dequant (LayerTiming)
        bool prefetched = false;    // e_pending[0 / 1] came from engram_prefetch_ (LayerTiming)
        StateRing() = default;
        StateRing(const StateRing&) = delete;
        StateRing& operator=(const StateRing&) = delete;
        // Copies still in flight when the ring goes away (an exception in the middle of a layer)
        // complete before its buffers are freed.
        ~StateRing();
    };
    void init_ring(StateRing& ring, const EngramRowSet* engram = nullptr);
    // Chunk c's Engram rows dequantized into e_host (BF16 [rows, cols * ehd]) on a helper thread.
    std::future<void> dequant_async(const EngramRowSet* rows, size_t c, void* e_host) const;
    // ring_upload: chunk c's Engram rows into ring.e_host[c % 2] (ring.e_pending[c % 2])
    void start_dequant(StateRing& ring, size_t c);
    int64_t max_chunk_rows() const;  // rows of the largest chunk (the ring's buffers)
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
    std::vector<Chunk> chunks_;
    int oom_retries_ = 0;
    int next_layer_ = 0;  // first layer not yet applied to the host state
    ChunkCallback on_chunk_;
    std::unique_ptr<CopyQueue> up_q_, down_q_;  // the state ring's host -> backend / backend -> host copies
    // the state ring's Engram row buffers (StateRing::e_host), kept from one Engram layer to the next
    std::shared_ptr<void> engram_pinned_[2];
    size_t engram_pinned_bytes_ = 0;
    // The pass's Engram gathers (io/): every table's rows, started by begin() (docs/MODEL.md 4.8 step 1).
    std::unique_ptr<EngramPassGather> engram_gather_;
    EngramGatherStats engram_stats_;  // of the passes before the current one
    void start_next_pass_gather();    // run_pass, after begin(): the gather of next_seqs_
    std::vector<int64_t> engram_hashes(
        const std::vector<std::vector<int32_t>>& seqs) const;  // [rows, ne, cols]
    std::vector<std::vector<int32_t>> next_seqs_;              // set_next_pass's sequences
    std::vector<std::vector<int32_t>> next_gather_seqs_;       // the sequences next_gather_ gathers for
    std::unique_ptr<EngramPassGather> next_gather_;            // the next pass's gather, started by run_pass
    bool next_pass_memory_note_ = false;                       // auto refused once (logged once)

    // The first two chunks' Engram rows of the next Engram layer, dequantized into engram_pinned_ when
    // the gather already has them: during the layer before it (unless that one is an Engram layer, whose
    // ring holds the buffers), else while its weights are awaited; the block's chunk loop then starts
    // without waiting for them (docs/PERFORMANCE.md, eleventh session). init_ring hands the futures to
    // the layer's ring. Declared last: joined before the rows and buffers they use are freed.
    struct EngramPrefetch {
        int layer = -1;                      // the Engram layer (-1: none pending)
        const EngramRowSet* rows = nullptr;  // engram_gather_'s rows of that layer
        std::future<void> chunk[2];          // chunk i's rows into engram_pinned_[i]
    };
    EngramPrefetch engram_prefetch_;
    void ensure_engram_pinned();           // engram_pinned_ sized for chunks_ (max rows x cols x ehd)
    void prefetch_engram_rows(int layer);  // starts engram_prefetch_ for `layer` if its rows are in
    void drop_engram_prefetch();           // joins and forgets a pending prefetch (errors dropped)
};

}  // namespace ds4r
