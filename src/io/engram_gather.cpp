// The Engram resources of a run, the gathers of a pass, and the token embedding reads
// (include/ds4r/engram_io.h).
#include <fcntl.h>

#include <algorithm>
#include <chrono>

#include "ds4r/clock.h"
#include "ds4r/binding.h"
#include "ds4r/checkpoint.h"
#include "ds4r/engram_io.h"
#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/log.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

std::unique_ptr<EngramResources> load_engram_resources(const Checkpoint& ckpt, const IoSettings& io) {
    const ModelConfig& cfg = ckpt.config();
    if (cfg.engram_layer_ids.empty()) return nullptr;
    validate_io_settings(io);
    auto res = std::make_unique<EngramResources>();
    const std::string tok_path = ckpt.tokenizer_path();
    Tokenizer tok = Tokenizer::load(tok_path);
    res->map = build_engram_token_map(tok, cfg, tok_path, /*check=*/true);
    res->layout = build_engram_layout(cfg);
    // Scales in memory: rows x head_dim / 32 bytes per table (released: 384M x 8 = 3.1 GB for layer 1).
    uint64_t scale_bytes = 0;
    for (int L : cfg.engram_layer_ids) scale_bytes += ckpt.at(engram_table_scale_tensor_name(L)).nbytes;
    const uint64_t avail = mem_available_bytes();
    res->scales_in_memory =
        io.engram_scales == EngramScalesMode::Memory ||
        (io.engram_scales == EngramScalesMode::Auto && avail > 0 && scale_bytes <= avail / 4);
    EngramTableOptions to;
    to.io = io.engram_io;
    to.queue_depth = io.engram_queue_depth;
    to.scales_in_memory = res->scales_in_memory;
    res->next_pass = io.engram_next_pass;
    for (int L : cfg.engram_layer_ids) {
        const TensorLocation& w = ckpt.at(engram_table_tensor_name(L));
        const TensorLocation& s = ckpt.at(engram_table_scale_tensor_name(L));
        if (w.shard != s.shard)
            throw CheckpointError(
                strfmt("layer %d: engram.embed.weight and .scale are in different shards", L));
        res->tables.push_back(
            std::make_unique<EngramTable>(ckpt.shards().at(static_cast<size_t>(w.shard)).path, w.offset,
                                          s.offset, w.shape[0], w.shape[1], to));
    }
    log_info(strfmt("Engram: %zu tables, rows read by %s; scales %s (%.2f GB%s)", res->tables.size(),
                    res->tables.front()->engine().c_str(),
                    res->scales_in_memory ? "kept in host memory" : "read per row", scale_bytes / 1e9,
                    res->scales_in_memory ? " of host memory" : ""));
    return res;
}

uint64_t engram_rows_bytes_per_token(const ModelConfig& cfg) {
    const auto hd = static_cast<uint64_t>(cfg.engram_head_dim);
    return static_cast<uint64_t>(cfg.engram_layer_ids.size()) *
           static_cast<uint64_t>(cfg.engram_hash_cols()) * (hd + hd / 32 + 8 + 4);
}

void EngramGatherGate::open() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        open_ = true;
    }
    cv_.notify_all();
}

void EngramGatherGate::release(size_t e) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (e < released_.size()) released_[e] = 1;
    }
    cv_.notify_all();
}

void EngramGatherGate::release_all() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        std::fill(released_.begin(), released_.end(), 1);
    }
    cv_.notify_all();
}

bool EngramGatherGate::wait_open(const std::atomic<bool>& stop) const {
    std::unique_lock<std::mutex> lk(mu_);
    while (!open_ && !stop) cv_.wait_for(lk, std::chrono::milliseconds(5));
    return open_;
}

bool EngramGatherGate::wait_released(size_t e, const std::atomic<bool>& stop) const {
    std::unique_lock<std::mutex> lk(mu_);
    const auto freed = [&] { return e >= released_.size() || released_[e] != 0; };
    while (!freed() && !stop) cv_.wait_for(lk, std::chrono::milliseconds(5));
    return freed();
}

EngramPassGather::EngramPassGather(const EngramResources& res, std::vector<int64_t> hashes, int64_t rows,
                                   int64_t cols, int first_table)
    : res_(res),
      gate_(std::make_shared<EngramGatherGate>(res.tables.size())),
      hashes_(std::move(hashes)),
      rows_(rows),
      cols_(cols),
      first_table_(first_table) {
    const size_t n = res_.tables.size();
    // A continued pass never holds the tables of the layers it skipped.
    for (int e = 0; e < first_table_; ++e) gate_->release(static_cast<size_t>(e));
    DS4R_CHECK(hashes_.size() == static_cast<size_t>(rows_ * cols_) * n,
               "Engram gather: %zu hash ids for %lld rows x %zu tables x %lld columns", hashes_.size(),
               (long long)rows_, n, (long long)cols_);
    sets_.resize(n);
    done_.assign(n, 0);
    released_.assign(n, 0);
    errors_.resize(n);
    thread_ = std::thread([this] { run(); });
}

EngramPassGather::EngramPassGather(const EngramResources& res,
                                   std::function<std::vector<int64_t>()> make_hashes, int64_t rows,
                                   int64_t cols, std::shared_ptr<const EngramGatherGate> after,
                                   bool second_full_set)
    : res_(res),
      make_hashes_(std::move(make_hashes)),
      after_(std::move(after)),
      second_full_set_(second_full_set),
      gate_(std::make_shared<EngramGatherGate>(res.tables.size())),
      rows_(rows),
      cols_(cols) {
    const size_t n = res_.tables.size();
    sets_.resize(n);
    done_.assign(n, 0);
    released_.assign(n, 0);
    errors_.resize(n);
    thread_ = std::thread([this] { run(); });
}

EngramPassGather::~EngramPassGather() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    gate_->release_all();  // its rows go with it
}

void EngramPassGather::run() {
    gather_tables();
    gate_->open();  // finished, failed or stopped: the next pass's gather may use the disk now
}

void EngramPassGather::gather_tables() {
    const size_t n = res_.tables.size();
    if (make_hashes_) {
        // The next pass's gather: its hash ids first (CPU only), then wait for the current pass's gather.
        std::exception_ptr err;
        try {
            hashes_ = make_hashes_();
            DS4R_CHECK(hashes_.size() == static_cast<size_t>(rows_ * cols_) * n,
                       "Engram gather: %zu hash ids for %lld rows x %zu tables x %lld columns",
                       hashes_.size(), (long long)rows_, n, (long long)cols_);
        } catch (...) {
            err = std::current_exception();
        }
        if (!err && after_ && !after_->wait_open(stop_))
            return;  // stopped while waiting: nobody waits for it
        if (err) {
            std::lock_guard<std::mutex> lk(mu_);
            for (size_t j = 0; j < n; ++j) {
                errors_[j] = err;
                done_[j] = 1;
            }
            cv_.notify_all();
            return;
        }
    }
    // Table 0 (layer 1's) first: it has the fewest layers to hide behind; each next one behind it.
    for (size_t ei = static_cast<size_t>(std::max(first_table_, 0)); ei < n; ++ei) {
        // The next pass's table: once the current pass freed its rows (one set in memory at a time).
        if (after_ && !second_full_set_ && !after_->wait_released(ei, stop_)) return;
        EngramRowSet set;
        EngramGatherStats st;
        std::exception_ptr err;
        try {
            const EngramTable& t = *res_.tables[ei];
            const size_t lookups = static_cast<size_t>(rows_ * cols_);
            // hashes_ [rows, n_tables, cols]: table ei's ids of row r are at (r * n + ei) * cols.
            std::vector<int64_t> ids(lookups);
            for (int64_t r = 0; r < rows_; ++r)
                std::copy_n(hashes_.begin() + static_cast<int64_t>((static_cast<size_t>(r) * n + ei) * cols_),
                            cols_, ids.begin() + r * cols_);
            set = plan_engram_rows(ids.data(), lookups, 1, t.rows(), t.head_dim(), t.path());
            st.lookups = lookups;
            t.read_rows(set, st, &stop_);
        } catch (...) {
            err = std::current_exception();
        }
        std::lock_guard<std::mutex> lk(mu_);
        if (err) {
            // The tables after a failed one are not gathered: the pass stops at the first.
            for (size_t j = ei; j < n; ++j) {
                errors_[j] = err;
                done_[j] = 1;
            }
            cv_.notify_all();
            return;
        }
        sets_[ei] = std::move(set);
        stats_.add(st);
        done_[ei] = 1;
        cv_.notify_all();
        if (stop_) return;
    }
}

const EngramRowSet& EngramPassGather::wait(int ei) {
    const auto i = static_cast<size_t>(ei);
    DS4R_CHECK(i < sets_.size() && ei >= first_table_, "Engram gather: table %d of %zu (first gathered: %d)",
               ei, sets_.size(), first_table_);
    const double t0 = now_s();
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_[i] != 0; });
    stats_.wait_s += now_s() - t0;
    if (errors_[i]) std::rethrow_exception(errors_[i]);
    return sets_[i];
}

const EngramRowSet* EngramPassGather::ready(int ei) const {
    const auto i = static_cast<size_t>(ei);
    if (i >= sets_.size() || ei < first_table_) return nullptr;
    std::lock_guard<std::mutex> lk(mu_);
    return done_[i] != 0 && !errors_[i] && !released_[i] ? &sets_[i] : nullptr;
}

void EngramPassGather::release(int ei) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        sets_.at(static_cast<size_t>(ei)) = EngramRowSet{};
        released_.at(static_cast<size_t>(ei)) = 1;
    }
    gate_->release(static_cast<size_t>(ei));
}

EngramGatherStats EngramPassGather::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
}

int EngramPassGather::tables_done() const {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<int>(std::count(done_.begin(), done_.end(), 1));
}

struct TokenEmbeddingReader::Impl {
    FileHandle file;
    uint64_t offset = 0;  // of embed.weight
    int64_t rows = 0;
};

TokenEmbeddingReader::TokenEmbeddingReader(const Checkpoint& ckpt) : impl_(std::make_unique<Impl>()) {
    const TensorLocation& emb = ckpt.at(kEmbedTensorName);
    impl_->file = FileHandle(ckpt.shards().at(static_cast<size_t>(emb.shard)).path, O_RDONLY, 0, true);
    impl_->offset = emb.offset;
    impl_->rows = emb.shape.at(0);
    dim_ = emb.shape.at(1);
}

TokenEmbeddingReader::~TokenEmbeddingReader() = default;

void TokenEmbeddingReader::read(int32_t token, uint16_t* out) const {
    DS4R_CHECK(token >= 0 && token < impl_->rows, "token id %d outside the embedding's %lld rows", token,
               (long long)impl_->rows);
    impl_->file.pread_exact(out, static_cast<size_t>(dim_) * 2,
                            impl_->offset + static_cast<uint64_t>(token) * static_cast<uint64_t>(dim_) * 2);
}

}  // namespace ds4r
