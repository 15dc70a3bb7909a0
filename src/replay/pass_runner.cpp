// Layer-major pass runner: host state, chunking and the sweeps of include/ds4r/model.h.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>

#include "ds4r/checkpoint.h"
#include "ds4r/clock.h"
#include "ds4r/file_util.h"
#include "ds4r/log.h"
#include "ds4r/numeric.h"
#include "ds4r/replay.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

namespace {

// Backend bytes per chunk row, estimated: activations ~ (14 + hc) * D * 4 plus attention scores, plus the
// state ring's 2 extra buffers of hc * (D * 2 + 4), plus (Engram models) two chunks' dequantized Engram
// rows, which run_block's ring holds beside the block's own buffers (2 x cols * ehd bf16: 24 KB at full
// width).
// ~1.76x the measured marginal cost of a row at full width (404 KB; docs/PERFORMANCE.md).
int64_t chunk_row_estimate_bytes(const ModelConfig& cfg) {
    const int64_t activations = (14 + cfg.hc_mult) * cfg.dim * 4 + cfg.n_heads * cfg.head_dim * 8;
    const int64_t ring = 2 * cfg.hc_mult * (cfg.dim * 2 + 4);
    const int64_t engram =
        cfg.engram_layer_ids.empty() ? 0 : 2 * cfg.engram_hash_cols() * cfg.engram_head_dim * 2;
    return activations + ring + engram;
}

}  // namespace

int64_t default_chunk_rows(const ModelConfig& cfg, size_t free_bytes) {
    // Half the free memory (score and bench ask before the two weight slots are allocated) over the
    // per-row estimate (16.70 GB high-water at 2,420 rows, 19.03 GB at 8,192, 15.10 GB of them the weight
    // slots; docs/PERFORMANCE.md): the released model on the 22 GB budget gets the 8,192 cap. A budget
    // whose half holds twice 16,384 rows (~48 GB free at full width) gets 16,384: larger chunks give the
    // MoE more rows per expert per launch (fewer short last tiles in the grouped GEMMs: the routed experts
    // 1.2x at 16,384 rows, docs/PERFORMANCE.md sixteenth session), and only there does their larger
    // working set (~4 GB more) leave the pass's arenas ample room (closer to the cap it would shorten the
    // passes, i.e. more weight reads). An overestimate costs a pass rerun with halved chunks (the
    // out-of-memory retry), not a wrong number.
    const int64_t fit = static_cast<int64_t>(free_bytes / 2) / chunk_row_estimate_bytes(cfg);
    if (fit >= 2 * kLargeChunkRows) return kLargeChunkRows;
    return std::clamp<int64_t>(fit, 64, kChunkRowsCap);
}

int64_t pass_host_bytes_per_token(const ModelConfig& cfg, EngramNextPassMode next_pass) {
    const int64_t hashes = static_cast<int64_t>(cfg.engram_layer_ids.size()) * cfg.engram_hash_cols() * 8;
    const int64_t rows = static_cast<int64_t>(engram_rows_bytes_per_token(cfg));
    // auto: the next pass's hash ids; its rows replace the current pass's table by table unless memory
    // allows more (checked per pass). on: a second full set.
    const int64_t next = next_pass == EngramNextPassMode::Off  ? 0
                         : next_pass == EngramNextPassMode::On ? hashes + rows
                                                               : hashes;
    return cfg.hc_mult * cfg.dim * 2 + cfg.hc_mult * 4 + hashes + 64 + rows + next;
}

int64_t chunk_row_budget_bytes(const ModelConfig& cfg) {
    return chunk_row_estimate_bytes(cfg) * 65 / 100;
}

namespace {
// free_b less the working set of chunks of `chunk_rows` rows (0 when nothing is left)
uint64_t arena_room_of(uint64_t free_b, const ModelConfig& cfg, int64_t chunk_rows) {
    const uint64_t chunks =
        static_cast<uint64_t>(std::max<int64_t>(chunk_rows, 0) * chunk_row_budget_bytes(cfg));
    return free_b > chunks ? free_b - chunks : 0;
}
}  // namespace

uint64_t pass_arena_room(const Backend& be, const ModelConfig& cfg, int64_t chunk_rows) {
    return arena_room_of(be.free_memory(), cfg, chunk_rows);
}

ExpertLayout pick_prepared_experts(const Backend& be, const ModelConfig& cfg, uint64_t arena_room,
                                   ExpertLayout widest) {
    // the widest layout up to `widest` that the backend has and whose copy fits in half of the room
    for (ExpertLayout l : {ExpertLayout::F16, ExpertLayout::E5m2}) {
        const uint64_t b = be.prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, l);
        if (l <= widest && b > 0 && arena_room / 2 >= b) return l;
    }
    return ExpertLayout::None;
}

uint64_t plan_prepared_experts(Backend& be, const ModelConfig& cfg, uint64_t arena_room, ExpertLayout widest) {
    auto bytes_of = [&](ExpertLayout l) {
        return be.prepared_experts_bytes(cfg.n_routed_experts, cfg.dim, cfg.moe_inter_dim, l);
    };
    const ExpertLayout pick = pick_prepared_experts(be, cfg, arena_room, widest);
    be.set_prepared_experts(pick);
    const uint64_t bytes = bytes_of(pick);
    if (pick != ExpertLayout::None)
        log_info(strfmt("prepared experts: each layer's routed experts as %s on %s (%.2f GB)",
                        expert_layout_name(pick), be.name().c_str(), static_cast<double>(bytes) / 1e9));
    else if (widest != ExpertLayout::None && bytes_of(ExpertLayout::E5m2) > 0)
        log_debug(strfmt("prepared experts off: %.2f GB per layer (e5m2) would take over half of the %.2f GB "
                         "left for the pass's attention state (raise --gpu-memory-gb)",
                         static_cast<double>(bytes_of(ExpertLayout::E5m2)) / 1e9,
                         static_cast<double>(arena_room) / 1e9));
    return bytes;
}

int64_t resolve_chunk_rows(int64_t requested, const ModelConfig& cfg, size_t free_bytes) {
    return requested > 0 ? requested : default_chunk_rows(cfg, free_bytes);
}

uint64_t weight_slots_bytes(const Checkpoint& ck) {
    uint64_t layer = 0;
    for (int L = 0; L < static_cast<int>(ck.config().n_layers); ++L)
        layer = std::max(layer, ck.layer_stream_bytes(L));
    return 2 * layer;
}

int64_t plan_chunk_rows(int64_t requested, const Backend& be, const ModelConfig& cfg, size_t free_bytes,
                        uint64_t reserved, ExpertLayout widest) {
    const int64_t rows = resolve_chunk_rows(requested, cfg, free_bytes);
    if (requested > 0 || rows <= kChunkRowsCap) return rows;
    // the arena room each chunk size would leave (pass_arena_room once `reserved` is allocated)
    const uint64_t after = free_bytes > reserved ? free_bytes - reserved : 0;
    const ExpertLayout large = pick_prepared_experts(be, cfg, arena_room_of(after, cfg, rows), widest);
    const ExpertLayout small =
        pick_prepared_experts(be, cfg, arena_room_of(after, cfg, kChunkRowsCap), widest);
    return small > large ? kChunkRowsCap : rows;
}

PassRunner::PassRunner(Backend& be, const Checkpoint& ckpt, WeightSource& weights,
                       const EngramResources* engram, ReplayOptions opt)
    : be_(be),
      ckpt_(ckpt),
      weights_(weights),
      engram_(engram),
      opt_(std::move(opt)),
      cfg_(ckpt.config()),
      roles_(ckpt.roles()),
      ctx_(be, ckpt.config()) {
    DS4R_CHECK(opt_.chunk_rows >= 2, "chunk_rows must be >= 2");
    up_q_ = be_.make_copy_queue();
    down_q_ = be_.make_copy_queue();
    if (!cfg_.engram_layer_ids.empty())
        DS4R_CHECK(engram_ != nullptr, "the model has Engram layers but no Engram resources were loaded");
    // One pass acquires layers 0..n-1, then the head; a prefetching source repeats this order.
    std::vector<int> order;
    for (int L = 0; L < cfg_.n_layers; ++L) order.push_back(L);
    order.push_back(kHeadLayer);
    weights_.set_schedule(order);
}

PassRunner::~PassRunner() = default;  // next_gather_ and engram_gather_ stop and join their threads

EngramGatherStats PassRunner::engram_stats() const {
    EngramGatherStats st = engram_stats_;
    if (engram_gather_) st.add(engram_gather_->stats());
    return st;
}

void PassRunner::set_next_pass(std::vector<std::vector<int32_t>> seqs) {
    next_seqs_ = std::move(seqs);
}

int PassRunner::next_pass_tables_done() const {
    return next_gather_ ? next_gather_->tables_done() : -1;
}

std::vector<int64_t> PassRunner::engram_hashes(const std::vector<std::vector<int32_t>>& seqs) const {
    const int64_t ne = static_cast<int64_t>(cfg_.engram_layer_ids.size()), cols = cfg_.engram_hash_cols();
    int64_t rows = 0;
    for (const auto& s : seqs) rows += static_cast<int64_t>(s.size());
    std::vector<int64_t> hashes(static_cast<size_t>(rows * ne * cols));  // [rows, ne, cols]
    int64_t r0 = 0;
    for (const auto& s : seqs) {
        std::vector<int64_t> h = engram_hash_ids(s, engram_->map, engram_->layout, cfg_);
        std::copy(h.begin(), h.end(), hashes.begin() + r0 * ne * cols);
        r0 += static_cast<int64_t>(s.size());
    }
    return hashes;
}

void PassRunner::start_next_pass_gather() {
    next_gather_.reset();
    next_gather_seqs_.clear();
    if (!engram_ || !engram_gather_ || next_seqs_.empty() || engram_->next_pass == EngramNextPassMode::Off)
        return;
    int64_t rows = 0;
    for (const auto& s : next_seqs_) {
        for (int32_t t : s)
            if (t < 0 || t >= cfg_.vocab_size) return;  // the next pass's begin() reports it
        rows += static_cast<int64_t>(s.size());
    }
    // A second full set of rows next to the current pass's (`on`, or `auto` when it takes at most a
    // quarter of MemAvailable); otherwise each table is gathered once the current pass freed its rows.
    bool full_set = engram_->next_pass == EngramNextPassMode::On;
    if (engram_->next_pass == EngramNextPassMode::Auto) {
        const uint64_t need = static_cast<uint64_t>(rows) * engram_rows_bytes_per_token(cfg_);
        const uint64_t avail = mem_available_bytes();
        full_set = avail > 0 && need <= avail / 4;
        if (!full_set && !next_pass_memory_note_)
            log_info(
                strfmt("Engram: the next pass's rows (%.2f GB) are gathered table by table as this pass "
                       "frees its own (a second full set would take more than a quarter of the "
                       "available %.2f GB)",
                       need / 1e9, avail / 1e9));
        next_pass_memory_note_ = next_pass_memory_note_ || !full_set;
    }
    next_gather_seqs_ = next_seqs_;
    // The hash ids are computed on the gather's thread (the tokens are copied: the runner may change).
    next_gather_ = std::make_unique<EngramPassGather>(
        *engram_, [this, seqs = next_seqs_] { return engram_hashes(seqs); }, rows, cfg_.engram_hash_cols(),
        engram_gather_->done_gate(), full_set);
}

uint16_t* PassRunner::stream(int seq) {
    return static_cast<uint16_t*>(stream_.get()) +
           row0_.at(static_cast<size_t>(seq)) * cfg_.hc_mult * cfg_.dim;
}
float* PassRunner::premix(int seq) {
    return static_cast<float*>(premix_.get()) + row0_.at(static_cast<size_t>(seq)) * cfg_.hc_mult;
}
int64_t PassRunner::seq_len(int seq) const {
    return static_cast<int64_t>(tokens_.at(static_cast<size_t>(seq)).size());
}

void PassRunner::begin(const std::vector<std::vector<int32_t>>& seqs, int first_layer) {
    // A prefetch of the previous pass (or of this pass before an out-of-memory retry) reads rows and
    // chunks that go now.
    drop_engram_prefetch();
    // The previous pass's gather (finished, or stopped at its next request) goes with its rows.
    if (engram_gather_) engram_stats_.add(engram_gather_->stats());
    engram_gather_.reset();
    // The gather started during the previous pass is this pass's when it gathered exactly these tokens
    // from the first layer; otherwise it is dropped (stopped at its next request).
    std::unique_ptr<EngramPassGather> prepared = std::move(next_gather_);
    if (prepared && !(first_layer == 0 && next_gather_seqs_ == seqs)) prepared.reset();
    next_gather_seqs_.clear();
    tokens_ = seqs;
    next_layer_ = 0;
    row0_.clear();
    total_rows_ = 0;
    std::vector<int64_t> lens;
    for (const auto& s : seqs) {
        DS4R_CHECK(!s.empty(), "empty sequence");
        for (int32_t t : s)
            DS4R_CHECK(t >= 0 && t < cfg_.vocab_size, "token id %d outside [0, %lld)", t,
                       (long long)cfg_.vocab_size);
        row0_.push_back(total_rows_);
        total_rows_ += static_cast<int64_t>(s.size());
        lens.push_back(static_cast<int64_t>(s.size()));
    }
    try {
        ctx_.setup(lens);
    } catch (const OutOfMemoryError& e) {
        // Smaller chunks leave more room for these (the runner's retry); say what ran out.
        int64_t bytes = pass_rope_bytes(cfg_, ctx_.max_len);
        for (int64_t len : lens) bytes += seq_arena_bytes(cfg_, len);
        throw OutOfMemoryError(
            strfmt("the attention arenas of a pass of %zu sequences / %lld tokens (%.2f GB; "
                   "a smaller --pass-tokens needs less): %s",
                   seqs.size(), (long long)total_rows_, static_cast<double>(bytes) / 1e9, e.what()));
    }
    const int64_t D = cfg_.dim, hc = cfg_.hc_mult;
    stream_ = be_.alloc_host(static_cast<size_t>(total_rows_ * hc * D) * 2);
    premix_ = be_.alloc_host(static_cast<size_t>(total_rows_ * hc) * 4);

    // Embedding rows (docs/MODEL.md 4.3), read by io/ from the shard on the host: a gather, never streamed.
    const TokenEmbeddingReader emb(ckpt_);
    DS4R_CHECK(emb.dim() == D, "embed.weight has %lld columns, the model dim is %lld", (long long)emb.dim(),
               (long long)D);
    std::vector<uint16_t> row(static_cast<size_t>(D));
    uint16_t* X = static_cast<uint16_t*>(stream_.get());
    float* P = static_cast<float*>(premix_.get());
    int64_t r = 0;
    for (const auto& s : seqs)
        for (int32_t t : s) {
            emb.read(t, row.data());
            for (int64_t k = 0; k < hc; ++k)
                std::memcpy(X + (r * hc + k) * D, row.data(), static_cast<size_t>(D) * 2);
            for (int64_t k = 0; k < hc; ++k) P[r * hc + k] = k == 0 ? 1.0f : 0.0f;  // one-hot on copy 0
            ++r;
        }

    // Engram hash ids of every row (docs/MODEL.md 4.2), computed once per pass; every table's gather starts
    // now, in the background (io/), layer 1's table first.
    if (engram_ && prepared) {
        // Gathered (or being gathered) during the previous pass: the first pass of a run never is.
        EngramGatherStats st;
        st.next_pass_gathers = 1;
        st.tables_ready_at_start = static_cast<uint64_t>(prepared->tables_done());
        engram_stats_.add(st);
        engram_gather_ = std::move(prepared);
    } else if (engram_) {
        const int64_t ne = static_cast<int64_t>(cfg_.engram_layer_ids.size()), cols = cfg_.engram_hash_cols();
        // A pass continued from a saved layer (first_layer > 0) skips the tables of the layers it ran.
        int first_table = 0;
        while (first_table < ne && cfg_.engram_layer_ids[static_cast<size_t>(first_table)] < first_layer)
            ++first_table;
        engram_gather_ =
            std::make_unique<EngramPassGather>(*engram_, engram_hashes(seqs), total_rows_, cols, first_table);
    }
    plan_chunks();
}

void PassRunner::plan_chunks() {
    // Chunks are contiguous pass rows; a boundary inside a sequence always falls on an even
    // position so that ratio-2 compressor pairs never straddle two chunks.
    drop_engram_prefetch();  // it dequantizes the old chunks' rows
    chunks_.clear();
    const int64_t cap = opt_.chunk_rows;
    int64_t r = 0;
    while (r < total_rows_) {
        int64_t end = std::min(total_rows_, r + cap);
        // find the sequence containing row end-1 and check the split position
        auto it = std::upper_bound(row0_.begin(), row0_.end(), end - 1);
        const size_t si = static_cast<size_t>(it - row0_.begin()) - 1;
        const int64_t seq_end = row0_[si] + static_cast<int64_t>(tokens_[si].size());
        if (end < seq_end && (end - row0_[si]) % 2 == 1) --end;
        DS4R_CHECK(end > r, "chunk planning made no progress");
        Chunk ch;
        ch.r0 = r;
        ch.r1 = end;
        ch.rows.rows = end - r;
        for (int64_t q = r; q < end;) {
            auto jt = std::upper_bound(row0_.begin(), row0_.end(), q);
            const size_t sj = static_cast<size_t>(jt - row0_.begin()) - 1;
            const int64_t s_end = row0_[sj] + static_cast<int64_t>(tokens_[sj].size());
            const int64_t stop = std::min(end, s_end);
            Segment sg;
            sg.seq = static_cast<int>(sj);
            sg.t0 = q - row0_[sj];
            sg.t1 = stop - row0_[sj];
            sg.row = q - r;
            ch.rows.segs.push_back(sg);
            for (int64_t t = sg.t0; t < sg.t1; ++t) ch.rows.host_pos.push_back(static_cast<int32_t>(t));
            q = stop;
        }
        chunks_.push_back(std::move(ch));
        r = end;
    }
}

void PassRunner::upload_chunk(const Chunk& ch, const Tensor& X, const Tensor& P) {
    ProfileRange pr(be_, "io.chunk_upload");
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim, M = ch.r1 - ch.r0;
    be_.upload(X, 0, static_cast<uint16_t*>(stream_.get()) + ch.r0 * hc * D,
               static_cast<size_t>(M * hc * D) * 2);
    be_.upload(P, 0, static_cast<float*>(premix_.get()) + ch.r0 * hc, static_cast<size_t>(M * hc) * 4);
}

PassRunner::StateRing::~StateRing() {
    try {
        if (up_q) up_q->host_wait(up_q->fence());
        if (down_q) down_q->host_wait(down_q->fence());
    } catch (...) {
        // a failing device: the error that unwinds this ring is the one reported
    }
}

void PassRunner::init_ring(StateRing& ring, const EngramRowSet* engram) {
    // Synchronous queues (the CPU backend's) need two buffers. Asynchronous ones get three, so that
    // the upload of chunk c + 1 and the download of chunk c - 1 both overlap chunk c.
    const bool async = up_q_->asynchronous() || down_q_->asynchronous();
    const size_t n = std::min<size_t>(async ? 3 : 2, chunks_.size());
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim;
    const int64_t max_rows = max_chunk_rows();
    ring.up_q = up_q_.get();
    ring.down_q = down_q_.get();
    for (size_t b = 0; b < n; ++b) {
        ring.X.push_back(be_.alloc(DType::BF16, {max_rows, hc, D}));
        ring.P.push_back(be_.alloc(DType::F32, {max_rows, hc}));
    }
    ring.up.assign(chunks_.size(), 0);
    ring.down.assign(chunks_.size(), 0);
    if (engram) {
        const int64_t width = cfg_.engram_hash_cols() * cfg_.engram_head_dim;
        // the first chunks' rows dequantized during the layer before (prefetch_engram_rows) go on here;
        // any other prefetch is joined before its buffers are written again
        const bool prefetched = engram_prefetch_.rows == engram;
        if (!prefetched) drop_engram_prefetch();
        ensure_engram_pinned();
        ring.engram = engram;
        for (int i = 0; i < 2; ++i) {
            ring.E.push_back(be_.alloc(DType::BF16, {max_rows, width}));
            ring.e_host[i] = engram_pinned_[i];
        }
        if (prefetched) {
            for (int i = 0; i < 2; ++i) ring.e_pending[i] = std::move(engram_prefetch_.chunk[i]);
            ring.prefetched = true;
            engram_prefetch_ = EngramPrefetch{};
        }
    }
    // The queues touch the buffers only once their (stream-ordered) allocation took effect.
    up_q_->wait_compute();
    down_q_->wait_compute();
}

void PassRunner::ring_upload(StateRing& ring, size_t c) {
    if (c >= chunks_.size()) return;
    const size_t n = ring.X.size(), b = c % n;
    // Buffer b last held chunk c - n: its state must have left it (run_block downloads it; finish
    // downloads nothing, and its synchronous result downloads order the reuse instead).
    if (c >= n && ring.down[c - n] != 0) down_q_->host_wait(ring.down[c - n]);
    const Chunk& ch = chunks_[c];
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim, M = ch.r1 - ch.r0;
    up_q_->copy(ring.X[b], 0, static_cast<uint16_t*>(stream_.get()) + ch.r0 * hc * D,
                static_cast<size_t>(M * hc * D) * 2);
    up_q_->copy(ring.P[b], 0, static_cast<float*>(premix_.get()) + ch.r0 * hc,
                static_cast<size_t>(M * hc) * 4);
    if (ring.engram) {
        // chunk c's rows, dequantized into e_host[c % 2] while chunk c - 1 computed (e_pending); chunks 0
        // and 1 during the layer before (prefetched), else side by side now
        if (!ring.e_pending[c % 2].valid()) start_dequant(ring, c);
        if (c == 0 && chunks_.size() > 1 && !ring.e_pending[1].valid()) start_dequant(ring, 1);
        const double t0 = now_s();
        ring.e_pending[c % 2].get();  // rethrows the dequant's error
        ring.dequant_wait_s += now_s() - t0;
        up_q_->wait_compute();  // E[c % 2] last held chunk c - 2, read by the compute issued so far
        up_q_->copy(ring.E[c % 2], 0, ring.e_host[c % 2].get(),
                    static_cast<size_t>(M * ring.E[0].dim(1)) * 2);
    }
    ring.up[c] = up_q_->fence();
    if (ring.engram && c + 1 < chunks_.size() && !ring.e_pending[(c + 1) % 2].valid()) {
        // e_host[(c + 1) % 2] last held chunk c - 1: its upload (fence up[c - 1]) must have read it
        if (c >= 1) up_q_->host_wait(ring.up[c - 1]);
        start_dequant(ring, c + 1);
    }
}

std::future<void> PassRunner::dequant_async(const EngramRowSet* rows, size_t c, void* e_host) const {
    uint16_t* e = static_cast<uint16_t*>(e_host);
    const Chunk* ch = &chunks_[c];
    return std::async(std::launch::async, [this, rows, ch, e] { engram_dequant(*rows, *ch, e); });
}

void PassRunner::start_dequant(StateRing& ring, size_t c) {
    ring.e_pending[c % 2] = dequant_async(ring.engram, c, ring.e_host[c % 2].get());
}

int64_t PassRunner::max_chunk_rows() const {
    int64_t max_rows = 0;
    for (const Chunk& ch : chunks_) max_rows = std::max(max_rows, ch.r1 - ch.r0);
    return max_rows;
}

void PassRunner::ensure_engram_pinned() {
    const size_t bytes =
        static_cast<size_t>(max_chunk_rows() * cfg_.engram_hash_cols() * cfg_.engram_head_dim) * 2;
    // pinned once for the runner (page-locking 2 x ~100 MB took a visible part of an Engram layer's time
    // when done per layer); the ring before has finished with them (its destructor waited for its
    // uploads), a pending prefetch is joined first
    if (engram_pinned_bytes_ < bytes) {
        drop_engram_prefetch();
        for (auto& b : engram_pinned_) b.reset();
        for (auto& b : engram_pinned_) b = be_.alloc_host(bytes);
        engram_pinned_bytes_ = bytes;
    }
}

void PassRunner::prefetch_engram_rows(int layer) {
    if (!engram_gather_ || chunks_.empty()) return;
    if (engram_prefetch_.layer == layer) return;
    // still being gathered (or failed: the layer's own wait reports it): the ring dequantizes them itself
    const EngramRowSet* rows = engram_gather_->ready(cfg_.engram_index(layer));
    if (!rows) return;
    drop_engram_prefetch();
    ensure_engram_pinned();
    engram_prefetch_.layer = layer;
    engram_prefetch_.rows = rows;
    for (size_t i = 0; i < std::min<size_t>(2, chunks_.size()); ++i)
        engram_prefetch_.chunk[i] = dequant_async(rows, i, engram_pinned_[i].get());
}

void PassRunner::drop_engram_prefetch() {
    for (auto& f : engram_prefetch_.chunk)
        if (f.valid()) f.wait();  // an error there is the layer's to report, if it ever runs
    engram_prefetch_ = EngramPrefetch{};
}

void PassRunner::ring_download(StateRing& ring, size_t c) {
    const size_t b = c % ring.X.size();
    const Chunk& ch = chunks_[c];
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim, M = ch.r1 - ch.r0;
    down_q_->wait_compute();  // the chunk's compute, issued before this call
    down_q_->download(static_cast<uint16_t*>(stream_.get()) + ch.r0 * hc * D, ring.X[b], 0,
                      static_cast<size_t>(M * hc * D) * 2);
    down_q_->download(static_cast<float*>(premix_.get()) + ch.r0 * hc, ring.P[b], 0,
                      static_cast<size_t>(M * hc) * 4);
    ring.down[c] = down_q_->fence();
}

void PassRunner::ring_drain(StateRing& ring) {
    // The queue completes in order: its last fence covers every download.
    for (auto it = ring.down.rbegin(); it != ring.down.rend(); ++it)
        if (*it != 0) {
            down_q_->host_wait(*it);
            break;
        }
}

const EngramRowSet& PassRunner::engram_rows(const LayerWeights& w, double* waited) {
    DS4R_CHECK(engram_gather_ != nullptr, "Engram rows before begin()");
    const double t_wait = now_s();
    const EngramRowSet* rows;
    {
        ProfileRange pr(be_, "engram.gather_wait");
        rows =
            &engram_gather_->wait(cfg_.engram_index(w.layer));  // rethrows a gather error (a truncated table)
    }
    *waited = now_s() - t_wait;
    return *rows;
}

void PassRunner::engram_dequant(const EngramRowSet& rows, const Chunk& ch, uint16_t* e_host) const {
    const int64_t cols = cfg_.engram_hash_cols(), M = ch.r1 - ch.r0;
    rows.dequant_bf16(static_cast<size_t>(ch.r0 * cols), static_cast<size_t>(M * cols), e_host);
}

double PassRunner::run_engram(const LayerWeights& w) {
    if (!w.role.engram) return 0;
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim;
    double waited = 0;
    const EngramRowSet& rows = engram_rows(w, &waited);
    const int64_t width = cfg_.engram_hash_cols() * cfg_.engram_head_dim;
    std::vector<uint16_t> e_host;
    for (Chunk& ch : chunks_) {
        const int64_t M = ch.r1 - ch.r0;
        e_host.resize(static_cast<size_t>(M * width));
        engram_dequant(rows, ch, e_host.data());
        Tensor X = be_.alloc(DType::BF16, {M, hc, D});
        Tensor P = be_.alloc(DType::F32, {M, hc});
        upload_chunk(ch, X, P);
        // the chunk's rows dequantized to bf16 (docs/MODEL.md 4.8 step 1): BF16 [M, cols * ehd]
        Tensor e = be_.alloc(DType::BF16, {M, width});
        be_.upload(e, 0, e_host.data(), e.nbytes());
        engram_chunk(ctx_, w, X, e);
        be_.download(static_cast<uint16_t*>(stream_.get()) + ch.r0 * hc * D, X, 0,
                     static_cast<size_t>(M * hc * D) * 2);
    }
    be_.synchronize();
    engram_gather_->release(cfg_.engram_index(w.layer));
    return waited;
}

void PassRunner::run_block(const LayerWeights& w, HostTaps* host_taps, const EngramRowSet* engram,
                           LayerTiming* timing) {
    const int64_t D = cfg_.dim, k = cfg_.n_activated_experts;
    begin_layer(ctx_, w.role);
    // the layer's prepared experts (Backend::prepare_experts; no-op unless plan_prepared_experts turned
    // them on), dropped when the block ends, on an exception too: a later layer's weights may reuse the
    // addresses of this one's
    struct PreparedExpertsScope {
        Backend& be;
        ~PreparedExpertsScope() { be.release_experts(); }
    } prepared{be_};
    be_.prepare_experts(w.moe);
    if (host_taps) {
        host_taps->attn_out.assign(static_cast<size_t>(total_rows_ * D), 0);
        host_taps->moe_out.assign(static_cast<size_t>(total_rows_ * D), 0);
        host_taps->route_idx.assign(static_cast<size_t>(total_rows_ * k), 0);
        host_taps->route_w.assign(static_cast<size_t>(total_rows_ * k), 0);
    }
    // One sweep over the chunks in pass order. Everything a query at position t reads was produced
    // from positions <= t of its own sequence: window KV of t-127..t, compressed groups j < (t+1)/ratio
    // (a group's tokens end at or before t, and chunk boundaries inside a sequence are even), index
    // keys and candidate blocks of those groups. Rows of later positions in the arenas are never read
    // (masked / not indexed). So each chunk's KV part can run right before its attention part.
    // Engram in the sweep (engram: the layer's gathered rows): each chunk's rows are dequantized on the
    // host into pinned memory ahead of the chunk and uploaded with its state (ring_upload), and the
    // chunk's residual stream takes the Engram output on the device before its attention. Engram reads
    // and writes each row alone, so this is run_engram's arithmetic without its round trip of the whole
    // stream through host memory.
    StateRing ring;
    init_ring(ring, engram);
    ring_upload(ring, 0);
    for (size_t c = 0; c < chunks_.size(); ++c) {
        Chunk& ch = chunks_[c];
        ring_upload(ring, c + 1);  // runs while this chunk computes
        if (ch.rows.pos.data == nullptr && ch.rows.rows > 0) {
            ch.rows.pos = be_.alloc(DType::I32, {ch.rows.rows});
            be_.upload(ch.rows.pos, 0, ch.rows.host_pos.data(), ch.rows.host_pos.size() * 4);
        }
        const int64_t M = ch.r1 - ch.r0;
        const size_t b = c % ring.X.size();
        const Tensor X = ring.X[b].rows(0, M), P = ring.P[b].rows(0, M);
        up_q_->compute_wait(ring.up[c]);
        if (engram) engram_chunk(ctx_, w, X, ring.E[c % 2].rows(0, M));
        const Tensor x = attn_input(ctx_, w, X, P);  // read by both sweeps of the chunk
        kv_chunk(ctx_, w, ch.rows, x);
        LayerTaps taps;
        if (host_taps) {
            taps.attn_out = be_.alloc(DType::BF16, {M, D});
            taps.moe_out = be_.alloc(DType::BF16, {M, D});
            taps.route_idx = be_.alloc(DType::I32, {M, k});
            taps.route_w = be_.alloc(DType::F32, {M, k});
        }
        main_chunk(ctx_, w, ch.rows, X, P, x, host_taps ? &taps : nullptr);
        ring_download(ring, c);
        if (host_taps) {
            be_.download(host_taps->attn_out.data() + ch.r0 * D, taps.attn_out, 0,
                         static_cast<size_t>(M * D) * 2);
            be_.download(host_taps->moe_out.data() + ch.r0 * D, taps.moe_out, 0,
                         static_cast<size_t>(M * D) * 2);
            be_.download(host_taps->route_idx.data() + ch.r0 * k, taps.route_idx, 0,
                         static_cast<size_t>(M * k) * 4);
            be_.download(host_taps->route_w.data() + ch.r0 * k, taps.route_w, 0,
                         static_cast<size_t>(M * k) * 4);
        }
        if (on_chunk_) on_chunk_(w.layer, ch.r1, total_rows_);
    }
    ring_drain(ring);  // the host state is complete before anything reads it
    be_.synchronize();
    if (timing) {
        timing->engram_dequant_wait_s = ring.dequant_wait_s;
        timing->engram_rows_prefetched = ring.prefetched;
    }
}

void PassRunner::capture(int layer, HiddenSink* sink) {
    if (!sink) return;
    const int64_t hc = cfg_.hc_mult, D = cfg_.dim;
    const uint16_t* X = static_cast<const uint16_t*>(stream_.get());
    std::vector<uint16_t> out;
    for (size_t i = 0; i < tokens_.size(); ++i) {
        const int64_t n = static_cast<int64_t>(tokens_[i].size());
        const uint16_t* base = X + row0_[i] * hc * D;
        if (opt_.hidden_mode == HiddenMode::Copies) {
            sink->add_rows(layer, static_cast<int>(i), base, n, hc * D);
            continue;
        }
        // Mean of the hc copies in fp32 (summed in copy order, then / hc), stored fp16.
        out.resize(static_cast<size_t>(n * D));
        for (int64_t r = 0; r < n; ++r)
            for (int64_t d = 0; d < D; ++d) {
                float acc = 0.0f;
                for (int64_t k = 0; k < hc; ++k) acc += bf16_to_f32(base[(r * hc + k) * D + d]);
                out[static_cast<size_t>(r * D + d)] = f32_to_f16(acc / static_cast<float>(hc));
            }
        sink->add_rows(layer, static_cast<int>(i), out.data(), n, D);
    }
}

std::vector<SequenceScores> PassRunner::finish(const GlobalWeights& g, HiddenSink* sink) {
    const int64_t D = cfg_.dim, K = opt_.top_k;
    std::vector<SequenceScores> out(tokens_.size());
    for (size_t i = 0; i < tokens_.size(); ++i) {
        const int64_t n = static_cast<int64_t>(tokens_[i].size());
        auto& s = out[i];
        s.n = n;
        s.logprob.resize(static_cast<size_t>(n - 1));
        s.rank.resize(static_cast<size_t>(n - 1));
        s.entropy.resize(static_cast<size_t>(n));
        s.topk_ids.resize(static_cast<size_t>(n * K));
        s.topk_logprobs.resize(static_cast<size_t>(n * K));
    }
    const bool cap_final = sink && std::find(opt_.capture_layers.begin(), opt_.capture_layers.end(),
                                             cfg_.n_layers) != opt_.capture_layers.end();
    std::vector<uint16_t> collapsed_host(static_cast<size_t>(cap_final ? total_rows_ * D : 0));
    StateRing ring;
    init_ring(ring);
    ring_upload(ring, 0);
    for (size_t c = 0; c < chunks_.size(); ++c) {
        const Chunk& ch = chunks_[c];
        ring_upload(ring, c + 1);  // runs while this chunk computes
        const int64_t M = ch.r1 - ch.r0;
        const size_t b = c % ring.X.size();
        const Tensor X = ring.X[b].rows(0, M), P = ring.P[b].rows(0, M);
        std::vector<int32_t> targets(static_cast<size_t>(M));
        for (const Segment& sg : ch.rows.segs) {
            const auto& toks = tokens_[static_cast<size_t>(sg.seq)];
            for (int64_t t = sg.t0; t < sg.t1; ++t)
                targets[static_cast<size_t>(sg.row + t - sg.t0)] =
                    t + 1 < static_cast<int64_t>(toks.size()) ? toks[static_cast<size_t>(t + 1)] : -1;
        }
        Tensor tg = be_.alloc(DType::I32, {M});
        be_.upload(tg, 0, targets.data(), targets.size() * 4);
        HeadStatsOut hs;
        hs.lse = be_.alloc(DType::F64, {M});
        hs.entropy = be_.alloc(DType::F64, {M});
        hs.target_logit = be_.alloc(DType::F32, {M});
        hs.rank = be_.alloc(DType::I32, {M});
        hs.topk_ids = be_.alloc(DType::I32, {M, K});
        hs.topk_logit = be_.alloc(DType::F32, {M, K});
        Tensor collapsed = be_.alloc(DType::BF16, {M, D});
        up_q_->compute_wait(ring.up[c]);
        head_chunk(ctx_, g, X, P, tg, static_cast<int>(K), collapsed, hs);
        std::vector<double> lse(static_cast<size_t>(M)), ent(static_cast<size_t>(M));
        std::vector<float> tl(static_cast<size_t>(M)), kl(static_cast<size_t>(M * K));
        std::vector<int32_t> rk(static_cast<size_t>(M)), ki(static_cast<size_t>(M * K));
        be_.download(lse.data(), hs.lse, 0, lse.size() * 8);
        be_.download(ent.data(), hs.entropy, 0, ent.size() * 8);
        be_.download(tl.data(), hs.target_logit, 0, tl.size() * 4);
        be_.download(rk.data(), hs.rank, 0, rk.size() * 4);
        be_.download(ki.data(), hs.topk_ids, 0, ki.size() * 4);
        be_.download(kl.data(), hs.topk_logit, 0, kl.size() * 4);
        if (cap_final)
            be_.download(collapsed_host.data() + ch.r0 * D, collapsed, 0, static_cast<size_t>(M * D) * 2);
        for (const Segment& sg : ch.rows.segs) {
            auto& s = out[static_cast<size_t>(sg.seq)];
            for (int64_t t = sg.t0; t < sg.t1; ++t) {
                const size_t r = static_cast<size_t>(sg.row + t - sg.t0);
                // log-probabilities in double from the fp32 logits (docs/DESIGN.md section 2)
                if (t + 1 < s.n) {
                    s.logprob[static_cast<size_t>(t)] = static_cast<double>(tl[r]) - lse[r];
                    s.rank[static_cast<size_t>(t)] = rk[r];
                }
                s.entropy[static_cast<size_t>(t)] = ent[r];
                for (int64_t j = 0; j < K; ++j) {
                    s.topk_ids[static_cast<size_t>(t * K + j)] = ki[r * K + static_cast<size_t>(j)];
                    s.topk_logprobs[static_cast<size_t>(t * K + j)] =
                        static_cast<double>(kl[r * K + static_cast<size_t>(j)]) - lse[r];
                }
            }
        }
        if (on_chunk_) on_chunk_(kHeadLayer, ch.r1, total_rows_);
    }
    if (cap_final) {
        // L = n_layers: the collapsed final hidden state before the final norm, stored fp16.
        for (size_t i = 0; i < tokens_.size(); ++i) {
            const int64_t n = static_cast<int64_t>(tokens_[i].size());
            std::vector<uint16_t> h(static_cast<size_t>(n * D));
            for (int64_t j = 0; j < n * D; ++j)
                h[static_cast<size_t>(j)] =
                    f32_to_f16(bf16_to_f32(collapsed_host[static_cast<size_t>(row0_[i] * D + j)]));
            sink->add_rows(static_cast<int>(cfg_.n_layers), static_cast<int>(i), h.data(), n, D);
        }
    }
    return out;
}

bool PassRunner::shrink_chunks(const std::string& why) {
    if (opt_.chunk_rows <= kMinChunkRows) return false;
    const int64_t rows = std::max<int64_t>(kMinChunkRows, opt_.chunk_rows / 2);
    log_warn(
        strfmt("out of backend memory with chunks of %lld rows (%s); running the pass again with chunks "
               "of %lld rows",
               (long long)opt_.chunk_rows, why.c_str(), (long long)rows));
    opt_.chunk_rows = rows;
    ++oom_retries_;
    return true;
}

std::vector<SequenceScores> PassRunner::run(const std::vector<std::vector<int32_t>>& seqs, HiddenSink* sink,
                                            const std::function<void(const LayerTiming&)>& on_layer,
                                            const Continuation* from) {
    // set_next_pass applies to this run only; a run that fails or is interrupted stops the next pass's
    // gather (its thread ends at its next request; the error of this pass is what is reported).
    struct NextPassScope {
        PassRunner& r;
        bool ok = false;
        ~NextPassScope() {
            r.next_seqs_.clear();
            if (!ok) {
                r.next_gather_.reset();
                r.next_gather_seqs_.clear();
            }
        }
    } next_scope{*this};
    for (;;) {
        try {
            auto out = run_pass(seqs, sink, on_layer, from);
            next_scope.ok = true;
            return out;
        } catch (const OutOfMemoryError& e) {
            // docs/DESIGN.md section 6: shrink the chunks and go on, never return wrong data. Nothing of
            // the pass has left the runner (its captured rows are dropped by the sink).
            if (!opt_.retry_out_of_memory || !shrink_chunks(e.what())) throw;
            from = nullptr;  // the whole pass again: the rows it captured before a save are dropped too
            if (sink) sink->restart_pass();
            be_.synchronize();
        }
    }
}

std::vector<SequenceScores> PassRunner::run_pass(const std::vector<std::vector<int32_t>>& seqs,
                                                 HiddenSink* sink,
                                                 const std::function<void(const LayerTiming&)>& on_layer,
                                                 const Continuation* from) {
    begin(seqs, from ? from->next_layer : 0);
    start_next_pass_gather();  // behind this pass's own gathers (docs/PERFORMANCE.md, Engram)
    if (from) {
        from->load(*this);
        next_layer_ = from->next_layer;
    }
    auto captured = [&](int L) {
        return std::find(opt_.capture_layers.begin(), opt_.capture_layers.end(), L) !=
               opt_.capture_layers.end();
    };
    for (int L = next_layer_; L < cfg_.n_layers; ++L) {
        LayerTiming tm;
        tm.layer = L;
        tm.rows = total_rows_;
        // an Engram layer's first chunks' rows: dequantized while its weights are awaited, unless the
        // layer before started them already
        if (roles_[static_cast<size_t>(L)].engram && !captured(L)) prefetch_engram_rows(L);
        double t0 = now_s();
        auto res = weights_.acquire(L);
        tm.wait_s = now_s() - t0;
        t0 = now_s();
        const LayerWeights w = bind_layer_weights(cfg_, roles_[static_cast<size_t>(L)],
                                                  [&](const std::string& n) { return res->get(n); });
        // Engram in the block's sweep (run_block), or as a sweep of its own where the layer's input is
        // captured (the capture reads the host stream after Engram)
        const EngramRowSet* engram = nullptr;
        if (w.role.engram && !captured(L))
            engram = &engram_rows(w, &tm.engram_wait_s);
        else
            tm.engram_wait_s = run_engram(w);
        if (captured(L)) capture(L, sink);
        // the next layer's first Engram rows dequantized while this one computes (not while an Engram
        // layer's own ring holds the buffers)
        if (!engram && L + 1 < cfg_.n_layers && roles_[static_cast<size_t>(L + 1)].engram && !captured(L + 1))
            prefetch_engram_rows(L + 1);
        run_block(w, nullptr, engram, &tm);
        if (engram) engram_gather_->release(cfg_.engram_index(L));
        next_layer_ = L + 1;  // the host state now holds layer L's output (a save point)
        tm.compute_s = now_s() - t0 - tm.engram_wait_s;
        if (on_layer) on_layer(tm);
    }
    LayerTiming tm;
    tm.layer = kHeadLayer;
    tm.rows = total_rows_;
    double t0 = now_s();
    auto head = weights_.acquire(kHeadLayer);
    tm.wait_s = now_s() - t0;
    t0 = now_s();
    const GlobalWeights g = bind_global_weights([&](const std::string& n) { return head->get(n); });
    auto out = finish(g, sink);
    tm.compute_s = now_s() - t0;
    if (on_layer) on_layer(tm);
    return out;
}

}  // namespace ds4r
