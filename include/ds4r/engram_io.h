// Engram I/O (docs/DESIGN.md section 3, io/; docs/MODEL.md 4.8 step 1): the table readers and the gather of a
// pass's rows. A released table is far larger than memory (layer 1: 384,006,168 rows x 256 e4m3 = 98 GB,
// plus a separate e8m0 scale tensor of rows x 8 bytes), and a pass reads only s x 24 rows of it, at
// hashed (random) positions. So the rows are gathered, never streamed:
//  - the hash ids of the whole pass are known when it starts (PassRunner::begin), so every table's
//    gather starts then, on one background thread, in engram_layer_ids order (layer 1's table first,
//    the next behind it, hidden behind the layers before its own);
//  - the hash ids depend on the tokens alone, so the next pass's gather (`--engram-next-pass`) starts
//    during the current pass, as soon as the current pass's own gathers are done (one gather at a time
//    shares the disk with the weight reads): at the next pass's start layer 1's rows are in memory. The
//    first pass of a run has no previous one (its gather starts with it, layer 1's table first);
//    nothing is gathered after the last pass. Each next-pass table is gathered once the current pass has
//    freed the same table (one set of rows in memory: within 64 KB per token), or at once when the memory
//    allows a second full set (`--engram-next-pass auto` decides per pass; `on` always does);
//  - the ids of a table are deduplicated (repeated n-grams) and sorted by file offset; each distinct row
//    costs one 4 KiB-aligned O_DIRECT read (adjacent rows share requests), issued with many requests in
//    flight: io_uring (liburing, tested at run time; containers often refuse it with ENOSYS / EPERM) or a
//    pool of threads issuing preads; `--engram-io mmap` is the earlier engine (page faults);
//  - a table's scale tensor (~3 GB released) is read sequentially once and kept in memory when memory
//    allows (`--engram-scales`), which halves the random reads;
//  - what is kept per pass is the rows as stored (e4m3 + e8m0: 264 bytes per distinct lookup of the
//    released tables, ~6.3 KB per token per table), dequantized to bf16 chunk by chunk when its layer
//    runs: host memory stays within docs/DESIGN.md's 64 KB per token.
// Values are those of the reference: bf16(e4m3(row[d]) * 2^(scale[d / 32] - 127)), the product in fp32.
// Every engine copies the same stored bytes, so results do not depend on it (tested byte for byte).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ds4r/engram.h"
#include "ds4r/io_settings.h"

namespace ds4r {

class Checkpoint;

// Counters of Engram gathers (summed over tables and passes by PassRunner::engram_stats()).
struct EngramGatherStats {
    uint64_t lookups = 0;                // hash ids looked up (pass rows x hash columns, per table)
    uint64_t unique_rows = 0;            // distinct rows after deduplication
    uint64_t read_requests = 0;          // random read calls (a request covers adjacent 4 KiB pages)
    uint64_t bytes_read = 0;             // bytes those requests read (rows, per-row scales, alignment)
    uint64_t scale_bytes_loaded = 0;     // scale tensors read sequentially into memory
    double busy_s = 0;                   // time with at least one row request in flight
    double scale_load_s = 0;             // time of the sequential scale loads
    double wait_s = 0;                   // time the compute thread waited for rows (the stall)
    uint64_t next_pass_gathers = 0;      // passes whose gather started during the previous pass
    uint64_t tables_ready_at_start = 0;  // of those, tables whose rows were all in when their pass began
    std::string engine;                  // e.g. "io_uring, 256 in flight"
    void add(const EngramGatherStats& o);
};

// The stored rows of one table needed by one pass: distinct rows in file order.
struct EngramRowSet {
    int64_t head_dim = 0;
    std::vector<int64_t> ids;     // [u] sorted distinct row ids
    std::vector<uint8_t> rows;    // [u, head_dim] e4m3 codes
    std::vector<uint8_t> scales;  // [u, head_dim / 32] e8m0 codes
    std::vector<uint32_t> index;  // [lookups] lookup k -> its position in ids
    // out[k * head_dim + d], k in [0, n): bf16 bits of lookup first + k.
    void dequant_bf16(size_t first, size_t n, uint16_t* out) const;
};

// Deduplicates and sorts lookups[k * stride] for k < n into set.ids / set.index (rows and scales left
// empty). RuntimeError naming `path` for an id outside [0, table_rows).
EngramRowSet plan_engram_rows(const int64_t* lookups, size_t n, size_t stride, int64_t table_rows,
                              int64_t head_dim, const std::string& path);

struct EngramTableOptions {
    EngramIoMode io = EngramIoMode::Auto;
    int queue_depth = 256;          // requests in flight (io_uring entries; pread threads, at most 64)
    bool scales_in_memory = false;  // read the scale tensor once, sequentially, at the first gather
    // Tests: replaces ::pread in the pread engine and in io_uring's retry path (short reads, EINTR).
    std::function<ssize_t(int fd, void* buf, size_t n, off_t off)> pread_for_test;
    bool refuse_uring_for_test = false;  // behave as if io_uring_queue_init failed with EPERM
};

// One Engram table in its shard: e4m3 rows [rows, head_dim] with one e8m0 scale per 32 (docs/MODEL.md 3.4,
// 4.8). Constructor errors (missing file, extents past its end, bad shape) are CheckpointErrors naming
// the shard. Thread safety: read_rows / gather_bf16 may run on several threads at once.
class EngramTable {
public:
    // weight_offset / scale_offset: absolute file offsets of `engram.embed.weight` / `.scale`.
    EngramTable(const std::string& shard_path, uint64_t weight_offset, uint64_t scale_offset, int64_t rows,
                int64_t head_dim, EngramTableOptions opt = {});
    ~EngramTable();
    EngramTable(const EngramTable&) = delete;
    EngramTable& operator=(const EngramTable&) = delete;
    int64_t rows() const { return rows_; }
    int64_t head_dim() const { return head_dim_; }
    const std::string& path() const;
    uint64_t scale_bytes() const;  // of the whole scale tensor
    // Fills set.rows and set.scales for set.ids (from plan_engram_rows), adding to `st`. Stops early
    // (RuntimeError "cancelled") when *stop turns true. A file shorter than a row's end (truncated after
    // it was opened) is a CheckpointError naming the shard; other read errors are RuntimeErrors.
    void read_rows(EngramRowSet& set, EngramGatherStats& st, const std::atomic<bool>* stop = nullptr) const;
    // Convenience: out[i * head_dim + d] = bf16 bits of row ids[i] (any order, repeats allowed).
    void gather_bf16(const int64_t* ids, size_t n, uint16_t* out) const;
    // The engine the next read_rows will use ("io_uring, 256 in flight", "pread, 64 threads", ...).
    std::string engine() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int64_t rows_, head_dim_;
};

// Engram hashing state and table readers for the whole run (docs/MODEL.md 4.2, 4.8).
struct EngramResources {
    EngramTokenMap map;
    EngramLayout layout;
    std::vector<std::unique_ptr<EngramTable>> tables;  // one per Engram layer, in engram_layer_ids order
    bool scales_in_memory = false;                     // as decided from IoSettings::engram_scales
    EngramNextPassMode next_pass = EngramNextPassMode::Auto;  // IoSettings::engram_next_pass
};
// Host bytes of one pass's gathered rows per token, at most (every lookup distinct): per table, per hash
// column, a stored row (head_dim e4m3 + head_dim / 32 e8m0), its id (8) and the lookup's index (4).
// Released model: 2 tables x 24 x (256 + 8 + 8 + 4) = 13,248 bytes.
uint64_t engram_rows_bytes_per_token(const ModelConfig& cfg);
// Builds the token map from tokenizer.json (checked against engram_compressed_vocab_size), the
// layout, and opens the table shards with the Engram settings of `io`. nullptr when the model has no
// Engram layers. `--engram-scales auto` keeps the scales in memory when all tables' scale tensors take at
// most a quarter of MemAvailable (logged with the memory it costs).
std::unique_ptr<EngramResources> load_engram_resources(const Checkpoint& ckpt, const IoSettings& io = {});

// What the next pass's gather waits for (EngramPassGather::done_gate of the current pass's): the current
// gather's thread done (every table read, failed or stopped: one gather at a time competes with the
// weight reads for the disk), and, unless the memory allows a second full set of rows, the current pass's
// release of the same table (so that a table's rows are held for one pass at a time).
class EngramGatherGate {
public:
    explicit EngramGatherGate(size_t tables) : released_(tables, 0) {}
    void open();             // the gather's thread is done
    void release(size_t e);  // the pass freed table e's rows (or never needed them)
    void release_all();
    // Block until open / table e freed, or until `stop` (polled every few ms); return whether the
    // condition was met.
    bool wait_open(const std::atomic<bool>& stop) const;
    bool wait_released(size_t e, const std::atomic<bool>& stop) const;

private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    bool open_ = false;
    std::vector<char> released_;  // [tables]
};

// The gathers of one pass: a background thread gathers table 0, then 1, ... as soon as it is created.
class EngramPassGather {
public:
    // hashes: I64 [rows, n_tables, cols] (PassRunner's hash ids of the pass). Tables before
    // first_table are not gathered (a pass continued from a saved layer has run their layers).
    EngramPassGather(const EngramResources& res, std::vector<int64_t> hashes, int64_t rows, int64_t cols,
                     int first_table = 0);
    // The next pass's gather: its thread computes the hash ids with make_hashes (I64 [rows, n_tables,
    // cols]; an exception there is every table's error), waits until `after` opens (the current pass's
    // gather is done), then gathers every table, each once the current pass released it unless
    // `second_full_set` (memory allows both passes' rows at once).
    EngramPassGather(const EngramResources& res, std::function<std::vector<int64_t>()> make_hashes,
                     int64_t rows, int64_t cols, std::shared_ptr<const EngramGatherGate> after,
                     bool second_full_set);
    // Stops the thread at its next request boundary (or its wait on `after`) and joins it.
    ~EngramPassGather();
    EngramPassGather(const EngramPassGather&) = delete;
    EngramPassGather& operator=(const EngramPassGather&) = delete;
    // Blocks until table ei's rows are in (the wait counts as stall); rethrows the gather's error.
    // Valid until release(ei) or destruction.
    const EngramRowSet& wait(int ei);
    // Table ei's rows when its gather has ended without error and they are not released yet, else
    // nullptr; never blocks (nor counts as stall). Valid as wait()'s.
    const EngramRowSet* ready(int ei) const;
    void release(int ei);  // frees table ei's rows
    EngramGatherStats stats() const;
    int tables_done() const;  // tables whose gather has ended (rows in, or failed)
    int tables() const { return static_cast<int>(done_.size()); }
    // Opens when this gather's thread is done (the next pass's gather starts behind it).
    std::shared_ptr<const EngramGatherGate> done_gate() const { return gate_; }

private:
    void run();
    void gather_tables();
    const EngramResources& res_;
    std::function<std::vector<int64_t>()> make_hashes_;  // the next pass's: run on the thread
    std::shared_ptr<const EngramGatherGate> after_;      // the next pass's: start once it opens
    bool second_full_set_ = false;                       // the next pass's: do not wait for releases
    std::shared_ptr<EngramGatherGate> gate_;
    std::vector<int64_t> hashes_;
    int64_t rows_, cols_;
    int first_table_ = 0;
    std::atomic<bool> stop_{false};
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<EngramRowSet> sets_;          // [tables], under mu_ once done_[ei]
    std::vector<char> done_;                  // [tables]
    std::vector<char> released_;              // [tables]: release(ei) called
    std::vector<std::exception_ptr> errors_;  // [tables]
    EngramGatherStats stats_;                 // under mu_
    std::thread thread_;
};

// Embedding rows (docs/MODEL.md 4.3) read from the shard on the host: a gather, never streamed.
class TokenEmbeddingReader {
public:
    explicit TokenEmbeddingReader(const Checkpoint& ckpt);  // opens the shard of `embed.weight`
    ~TokenEmbeddingReader();
    int64_t dim() const { return dim_; }
    // out[0..dim): bf16 bits of the embedding of `token` (0 <= token < vocab rows).
    void read(int32_t token, uint16_t* out) const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int64_t dim_ = 0;
};

}  // namespace ds4r
