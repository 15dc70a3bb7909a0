// The prefetcher's per-layer plan: where each byte run of a layer goes in its slot, which aligned reads
// fetch it, and which copies move it from a staging buffer into the slot. Built once per layer at
// construction of the prefetching source (immutable afterwards, shared with the handles).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ds4r/checkpoint.h"
#include "ds4r/dtype.h"

namespace ds4r {

// Upload mode: a run's slot offset is congruent to (its file offset - shift) modulo kSlotAlign, where
// the shift (< kSlotAlign) puts most of the run's tensor bytes on kTensorAlign boundaries and, of those,
// most on kSlotAlign boundaries (whole 128-byte lines for the GEMMs' TMA loads); a tensor
// left off such a boundary gets a private copy at a kSlotAlign boundary (the kernels load weights 16
// bytes at a time). Direct mode: slot offset = file offset mod DirectReader::kAlign (O_DIRECT).
constexpr size_t kSlotAlign = 256;
constexpr size_t kTensorAlign = 16;

// The shift above for one run: the residue (< kSlotAlign) of its file offsets that most of its tensor
// bytes share, among those of its best residue modulo kTensorAlign (ties: the smaller).
size_t slot_shift(const ByteRun& run);

// One aligned range: [file_begin, file_end) of `shard` (DirectReader::kAlign multiples) into the
// staging buffer (upload mode) or the slot (direct mode) at buf_off. The prefetcher's reader threads
// read it in requests of at most PrefetchOptions::read_request_bytes, several at once. Bytes past
// `need_end` may be missing (past the end of the file); bytes before it must be read or the shard is
// truncated.
struct ReadPiece {
    int shard = -1;
    uint64_t file_begin = 0, file_end = 0;
    uint64_t need_end = 0;
    size_t buf_off = 0;
};

// `bytes` bytes from offset src_off of the staging buffer (upload) or slot (direct) to slot offset dst_off.
struct SlotCopy {
    size_t src_off = 0, dst_off = 0, bytes = 0;
};

// What one staging buffer carries (upload mode), or a group of reads into the slot (direct mode).
struct PlanBatch {
    std::vector<ReadPiece> reads;
    std::vector<SlotCopy> copies;  // upload mode: staging -> slot, after the reads, then one fence
    size_t used = 0;               // staging bytes used (upload mode)
};

struct TensorPlacement {
    DType dtype = DType::U8;
    Shape shape;
    size_t slot_off = 0;  // offset from the slot's aligned base
};

struct LayerPlan {
    int layer = 0;       // layer id or kHeadLayer
    bool upload = true;  // upload mode (staging + copies) or direct mode (reads into the slot)
    std::vector<PlanBatch> batches;
    std::vector<SlotCopy> private_copies;  // direct mode: slot -> slot, after every read of the layer
    std::unordered_map<std::string, TensorPlacement> tensors;
    std::vector<std::string> shard_paths;  // indexed like Checkpoint::shards() (for messages)
    size_t slot_bytes = 0;                 // bytes from the aligned base the layer needs
    uint64_t tensor_bytes = 0;             // sum of the tensors' nbytes
    uint64_t read_bytes = 0;               // sum of the reads' lengths (aligned)
    uint64_t upload_bytes = 0;             // sum of the copies' lengths (upload mode)
    size_t private_tensors = 0;            // tensors given their own aligned copy
};

// The byte runs of a layer (Checkpoint::layer_runs) or of the head (norm.weight + head.weight).
std::vector<ByteRun> plan_runs(const Checkpoint& ckpt, int layer);

// Upload mode: runs placed one after another in the slot (alignment: see kSlotAlign), reads
// split into pieces of at most `staging_bytes` and packed greedily into staging buffers of that size.
// Direct mode: each run's aligned superset is read straight into the slot (slot offset = file offset
// mod DirectReader::kAlign) in reads of at most `staging_bytes`; a tensor whose file offset is not a
// multiple of its dtype size gets a private copy (kSlotAlign aligned) after the reads.
LayerPlan make_layer_plan(const Checkpoint& ckpt, int layer, bool upload, size_t staging_bytes);

}  // namespace ds4r
