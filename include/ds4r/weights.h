// Layer weights made resident on a backend, one layer at a time (docs/DESIGN.md section 3, io/).
// The replay loop asks for layers in schedule order; a prefetching source reads layer L+1 from the
// shards while layer L computes. Tensors are views into the layer's slot and stay valid while the
// handle returned by acquire() is alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/backend.h"

namespace ds4r {

class Checkpoint;

// Pseudo-layer id of the globals read at the end of a pass (final norm + head).
constexpr int kHeadLayer = -1;

// "head" for kHeadLayer, else "layer L": how the weight sources name a layer in their messages.
inline std::string layer_label(int layer) {
    return layer == kHeadLayer ? std::string("head") : "layer " + std::to_string(layer);
}

class ResidentLayer {
public:
    virtual ~ResidentLayer() = default;
    // The tensor called `name` (a checkpoint name) as a backend view; throws CheckpointError if this
    // layer does not hold it.
    virtual Tensor get(const std::string& name) const = 0;
};

// One acquire() of the prefetching source: how its layer was loaded (for the bench's per-layer table).
// Times *_at_s are seconds since the source was created.
struct LayerLoadRecord {
    int layer = 0;            // layer id or kHeadLayer
    uint64_t position = 0;    // index of this acquire in the (repeating) schedule: 0, 1, 2, ...
    uint64_t bytes = 0;       // tensor bytes of the layer (what the forward uses)
    uint64_t bytes_read = 0;  // bytes read from the shards (aligned supersets of the byte runs)
    uint64_t bytes_uploaded = 0;
    // Wall time of the layer's reads: from the start of its first read request to the end of its last.
    // Several requests run at once on the reader threads, so this is NOT the sum of their durations;
    // bytes_read / read_s is the layer's read bandwidth. (It includes time the readers waited for a
    // free staging buffer in the middle of the layer: an upload that keeps up costs nothing.)
    double read_s = 0;
    double upload_s = 0;         // copy-queue busy time (copies serialized on the queue)
    double wait_s = 0;           // time acquire() blocked: the stall the compute thread saw
    double load_begin_at_s = 0;  // the first read of the layer started
    double ready_at_s = 0;       // the last byte was resident
    double acquired_at_s = 0;    // acquire() returned
};

struct WeightSourceStats {
    uint64_t bytes_read = 0;      // from the shards
    uint64_t bytes_uploaded = 0;  // host -> backend
    // Time during which at least one read was in flight (prefetching source: the union of the read
    // requests' intervals over all reader threads; synchronous source: the sum of its reads), so
    // bytes_read / read_seconds is the read bandwidth whatever the number of reader threads.
    double read_seconds = 0;
    double upload_seconds = 0;
    double wait_seconds = 0;  // time acquire() blocked the caller (the stall)
    // Prefetching source only (the synchronous source leaves these empty / zero):
    uint64_t device_bytes = 0;   // backend (GPU) memory held for layer slots; 0 when slots are host memory
    uint64_t host_bytes = 0;     // host memory held: pinned staging ring, or the two host slots
    uint64_t read_requests = 0;  // read calls issued (each at most PrefetchOptions::read_request_bytes)
    uint64_t bytes_read_direct = 0;  // of bytes_read, read with O_DIRECT (the rest through the page cache)
    std::vector<LayerLoadRecord> layers;  // one record per acquire(), in acquire order
};

class WeightSource {
public:
    virtual ~WeightSource() = default;
    // The order in which layers will be acquired (repeats allowed: one entry per pass and layer).
    virtual void set_schedule(const std::vector<int>& order) = 0;
    // Blocks until `layer` (or kHeadLayer) is resident. Must follow the schedule.
    virtual std::shared_ptr<ResidentLayer> acquire(int layer) = 0;
    virtual WeightSourceStats stats() const = 0;
};

// Reads each layer when asked (no overlap). Works for every backend; the CPU backend uses the host
// buffer directly, others get one upload per contiguous run.
std::unique_ptr<WeightSource> make_sync_weight_source(Backend& be, const Checkpoint& ckpt);

// ---------------------------------------------------------------------------------------------
// The prefetching source (docs/DESIGN.md sections 3, 5 and 8): a pool of `read_threads` reader threads reads
// the byte runs of the next layer of the schedule with large O_DIRECT reads (buffered pread where the
// file system refuses O_DIRECT, logged once) while the caller computes the current one. The layer's
// reads are cut into requests of at most `read_request_bytes` (4 KiB aligned) that the readers take
// in file order, so up to `read_threads` requests are in flight at once (one synchronous request per
// thread: an NVMe drive reaches its bandwidth only with several in flight).
//  - Upload mode (device backends): reads go to a ring of `staging_count` pinned host buffers
//    (Backend::alloc_host). A staging buffer is handed to the single CopyQueue only when all its
//    requests are in: its copies into the layer's backend slot, in order, then one fence (buffers are
//    handed over in the order they fill up). A staging buffer is refilled only after its fence completed.
//  - Direct mode (host-memory backends): the reads land in the slot itself; no copies, no ring.
// Memory is bounded whatever the number of layers or passes: two slots, each the size of the largest
// layer (or the head) of the checkpoint, allocated once at construction, plus the ring (upload mode).
// The reader threads add no buffers: they fill the ring or the slot.
//
// I/O mode: PrefetchOptions::direct_io (the `--io direct|buffered` flag of score and bench, through
// prefetch_options(IoSettings) in ds4r/io_settings.h): O_DIRECT (buffered where refused) or page-cache pread.
// WeightSourceStats::bytes_read_direct says which reads actually bypassed the page cache.
//
// Alignment in upload mode: every tensor's address is a multiple of 16 (the kernels load weights 16
// bytes at a time). Each byte run is placed at an address congruent to (its file offset - r) mod 256,
// r < 256 chosen per run so that most of its tensor bytes land on 16-byte boundaries and, of those, most
// on 256-byte ones (whole 128-byte lines for the Hopper GEMMs' TMA loads; the synchronous source's device
// copies the same); a tensor still off a 16-byte boundary gets its own 256-byte aligned copy inside the
// slot (counted and logged at construction). Direct mode: address = file offset mod 4096 (O_DIRECT reads land in the
// slot); a tensor whose offset is not a multiple of its dtype size gets its own copy (as the sync source).
//
// Contract (threads, order, lifetime):
//  - The constructor, set_schedule(), acquire(), stats() and the destructor are called from ONE
//    thread: the compute thread, the one that issues backend work. The backend outlives the source
//    and every handle it returned (the Checkpoint need not: the source keeps what it needs).
//  - set_schedule() must precede the first acquire(). The order repeats (PrefetchOptions::
//    repeat_schedule): after its last entry the source goes on with its first, so one pass's order
//    (0..n_layers-1, kHeadLayer) serves every pass; a list of several passes works too. Calling it
//    again replaces the order: layers prefetched and not yet acquired are dropped.
//  - acquire(L) blocks until the layer of the next schedule position is resident, then makes backend
//    work issued afterwards wait for its upload (CopyQueue::compute_wait) and returns views into its
//    slot. If L is not the next entry, the source resynchronizes to the next occurrence of L in the
//    order (what was prefetched is dropped; logged as a warning: slower, never wrong); an L that does
//    not occur is a RuntimeError.
//  - Slot recycling: the slot of layer L is reused for a later layer only after (1) every copy of
//    L's handle has been destroyed and (2) the next acquire() call has run Backend::synchronize()
//    (acquire() does it when a released slot is waiting), so work still queued on the compute stream
//    that reads L's weights has finished before new bytes land in its slot. PassRunner::run releases
//    L's handle after run_block (which synchronizes) and before acquire(L+1), so layer L+2 loads
//    while L+1 computes. Holding the handles of both slots while acquiring a third layer would never
//    finish: acquire() throws RuntimeError instead.
//  - Errors of the reader / copy threads (I/O error, truncated shard, copy-queue error) are rethrown
//    by the first acquire() that needs the failed layer, with the kind of the original error (a
//    truncated shard is a CheckpointError naming the file and the layer); layers loaded before the
//    failure are still delivered. The first failed request stops every reader at its next request
//    boundary (requests already in flight complete; no new one starts). From then on every acquire()
//    of that layer or a later one, and set_schedule(), throw; a copy-queue error fails every further
//    acquire(). When requests of several layers fail, acquire() reports the earliest layer's error.
//  - A slot is never written by two loads at once: a slot dropped by set_schedule() or a resync
//    starts a new load only after the read requests into it and the hand-overs of its copies to the
//    CopyQueue are done (copies already queued run before the new layer's: the queue is in order).
//  - A dropped load's failed request is logged and ignored (the layer is read again when needed).
//  - The destructor stops the readers at the next request boundary (requests in flight complete, each
//    at most read_request_bytes), waits for the copies already issued and joins the threads. Handles
//    may outlive the source: their views stay valid until they are destroyed.
//  - Engram tables are never streamed (they are not class Layer, see Checkpoint::layer_runs).
struct PrefetchOptions {
    enum class Mode { Auto, Upload, Direct };
    // Auto: Direct when Backend::host_memory() is true, Upload otherwise. Upload on a host-memory
    // backend exercises the asynchronous path (tests).
    Mode mode = Mode::Auto;
    size_t staging_bytes = size_t{128} << 20;      // one staging buffer (rounded up to 4 KiB); direct
                                                   // mode: the largest read into a slot
    int staging_count = 4;                         // ring length, 2..32
    size_t read_request_bytes = size_t{64} << 20;  // largest single read call, rounded up to 4 KiB
                                                   // (the unit of parallelism and of stop latency)
    int read_threads = 4;                          // reader threads = read requests in flight, 1..32
    bool direct_io = true;                         // false: buffered pread only (--io buffered)
    bool repeat_schedule = true;                   // see the contract above
};

std::unique_ptr<WeightSource> make_prefetch_weight_source(Backend& be, const Checkpoint& ckpt,
                                                          const PrefetchOptions& opt = {});

}  // namespace ds4r
