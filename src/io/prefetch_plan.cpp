// Layer plans of the prefetching weight source (see prefetch_plan.h).
#include "io/prefetch_plan.h"

#include <algorithm>

#include "ds4r/error.h"
#include "ds4r/weights.h"
#include "io/direct_reader.h"

namespace ds4r {

namespace {

// A file range of one shard that must land at slot_off (a run, or a private copy of a tensor).
struct Dest {
    int shard = -1;
    uint64_t begin = 0, end = 0;
    size_t slot_off = 0;
};

// The smallest offset >= cursor that is congruent to `file_offset` modulo `align`.
size_t congruent_at_or_after(size_t cursor, uint64_t file_offset, size_t align) {
    const size_t want = static_cast<size_t>(file_offset % align);
    const size_t have = cursor % align;
    return cursor + (want + align - have) % align;
}

}  // namespace

// Upload mode: the residue r (mod kSlotAlign) of the file offsets of most of the run's tensor bytes among
// those of its best residue modulo kTensorAlign. Placing the run at slot offsets congruent to
// (file offset - r) mod kSlotAlign lines those tensors up on 16 bytes even when the shard's data section
// starts at 8 mod 16 (safetensors pads its header to 8 only), and puts the bulk of them on kSlotAlign
// boundaries: the Hopper GEMMs' TMA boxes then start on whole 128-byte lines (a head 80 bytes off them
// ran at 69% of the aligned rate: 379.5 vs 548.1 TFLOP/s, docs/PERFORMANCE.md). Ties prefer the smaller
// residue (r = 0: the file's own alignment).
size_t slot_shift(const ByteRun& run) {
    uint64_t bytes[kSlotAlign] = {}, bytes16[kTensorAlign] = {};
    for (const TensorLocation* t : run.tensors) {
        bytes[t->offset % kSlotAlign] += t->nbytes;
        bytes16[t->offset % kTensorAlign] += t->nbytes;
    }
    size_t best16 = 0;
    for (size_t r = 1; r < kTensorAlign; ++r)
        if (bytes16[r] > bytes16[best16]) best16 = r;
    size_t best = best16;
    for (size_t r = best16 + kTensorAlign; r < kSlotAlign; r += kTensorAlign)
        if (bytes[r] > bytes[best]) best = r;
    return best;
}

namespace {

// Tensors of the run placed at run_off + (offset - run.begin) unless `misplaced` says they need their
// own aligned copy (then they go to `misaligned`, placed later).
template <class Misplaced>
void place_tensors(const ByteRun& run, size_t run_off, LayerPlan& plan,
                   std::vector<const TensorLocation*>& misaligned, Misplaced misplaced) {
    for (const TensorLocation* t : run.tensors) {
        plan.tensor_bytes += t->nbytes;
        const size_t off = run_off + static_cast<size_t>(t->offset - run.begin);
        if (t->nbytes > 0 && misplaced(*t, off)) {
            misaligned.push_back(t);
            continue;
        }
        plan.tensors[t->name] = TensorPlacement{t->dtype, t->shape, off};
    }
}

// The aligned read pieces of one run: its aligned superset cut into pieces of at most `max_len`.
std::vector<ReadPiece> run_pieces(const ByteRun& run, size_t max_len) {
    std::vector<ReadPiece> out;
    const uint64_t fb = align_down(run.begin, DirectReader::kAlign);
    const uint64_t fe = align_up(run.end, DirectReader::kAlign);
    for (uint64_t x = fb; x < fe; x += max_len) {
        ReadPiece p;
        p.shard = run.shard;
        p.file_begin = x;
        p.file_end = std::min<uint64_t>(x + max_len, fe);
        p.need_end = std::min(p.file_end, run.end);
        out.push_back(p);
    }
    return out;
}

void plan_upload(const std::vector<ByteRun>& runs, size_t staging, LayerPlan& plan) {
    std::vector<Dest> dests;
    std::vector<const TensorLocation*> misaligned;
    size_t cursor = 0;
    for (const ByteRun& run : runs) {
        const size_t shift = slot_shift(run);
        const size_t off = congruent_at_or_after(cursor, run.begin + kSlotAlign - shift, kSlotAlign);
        dests.push_back(Dest{run.shard, run.begin, run.end, off});
        place_tensors(run, off, plan, misaligned,
                      [](const TensorLocation&, size_t slot_off) { return slot_off % kTensorAlign != 0; });
        cursor = off + static_cast<size_t>(run.size());
    }
    for (const TensorLocation* t : misaligned) {
        cursor = static_cast<size_t>(align_up(cursor, kSlotAlign));
        dests.push_back(Dest{t->shard, t->offset, t->offset + t->nbytes, cursor});
        plan.tensors[t->name] = TensorPlacement{t->dtype, t->shape, cursor};
        cursor += static_cast<size_t>(t->nbytes);
    }
    plan.slot_bytes = cursor;
    plan.private_tensors = misaligned.size();

    for (const ByteRun& run : runs) {
        for (ReadPiece p : run_pieces(run, staging)) {
            const size_t len = static_cast<size_t>(p.file_end - p.file_begin);
            if (plan.batches.empty() || plan.batches.back().used + len > staging) plan.batches.emplace_back();
            PlanBatch& b = plan.batches.back();
            p.buf_off = b.used;
            b.used += len;
            b.reads.push_back(p);
            plan.read_bytes += len;
            for (const Dest& d : dests) {
                if (d.shard != p.shard) continue;
                const uint64_t lo = std::max(d.begin, p.file_begin), hi = std::min(d.end, p.file_end);
                if (lo >= hi) continue;
                b.copies.push_back(SlotCopy{p.buf_off + static_cast<size_t>(lo - p.file_begin),
                                            d.slot_off + static_cast<size_t>(lo - d.begin),
                                            static_cast<size_t>(hi - lo)});
                plan.upload_bytes += hi - lo;
            }
        }
    }
}

void plan_direct(const std::vector<ByteRun>& runs, size_t max_read, LayerPlan& plan) {
    std::vector<const TensorLocation*> misaligned;
    std::vector<std::pair<const ByteRun*, size_t>> run_offsets;
    size_t cursor = 0;
    for (const ByteRun& run : runs) {
        const uint64_t fb = align_down(run.begin, DirectReader::kAlign);
        const size_t region = cursor;  // kAlign-aligned: the read buffer of the run's aligned superset
        const size_t off = region + static_cast<size_t>(run.begin - fb);
        run_offsets.emplace_back(&run, off);
        // Host memory: the reads fix the placement (offset = file offset mod kAlign); a tensor needs its
        // own copy only when its file offset breaks its dtype's alignment (as the synchronous source).
        place_tensors(run, off, plan, misaligned, [](const TensorLocation& t, size_t slot_off) {
            return slot_off % dtype_size(t.dtype) != 0;
        });
        for (ReadPiece p : run_pieces(run, max_read)) {
            p.buf_off = region + static_cast<size_t>(p.file_begin - fb);
            plan.read_bytes += p.file_end - p.file_begin;
            plan.batches.emplace_back();
            plan.batches.back().reads.push_back(p);
            plan.batches.back().used = static_cast<size_t>(p.file_end - p.file_begin);
        }
        cursor = region + static_cast<size_t>(align_up(run.end, DirectReader::kAlign) - fb);
    }
    for (const TensorLocation* t : misaligned) {
        size_t src = 0;
        for (const auto& [run, off] : run_offsets)
            if (run->shard == t->shard && run->begin <= t->offset && t->offset + t->nbytes <= run->end)
                src = off + static_cast<size_t>(t->offset - run->begin);
        cursor = static_cast<size_t>(align_up(cursor, kSlotAlign));
        plan.private_copies.push_back(SlotCopy{src, cursor, static_cast<size_t>(t->nbytes)});
        plan.tensors[t->name] = TensorPlacement{t->dtype, t->shape, cursor};
        cursor += static_cast<size_t>(t->nbytes);
    }
    plan.slot_bytes = cursor;
    plan.private_tensors = misaligned.size();
}

}  // namespace

std::vector<ByteRun> plan_runs(const Checkpoint& ckpt, int layer) {
    if (layer != kHeadLayer) return ckpt.layer_runs(layer);
    return merge_byte_runs({&ckpt.at(kFinalNormTensorName), &ckpt.at(kHeadTensorName)});
}

LayerPlan make_layer_plan(const Checkpoint& ckpt, int layer, bool upload, size_t staging_bytes) {
    DS4R_CHECK(staging_bytes >= DirectReader::kAlign && staging_bytes % DirectReader::kAlign == 0,
               "prefetch plan: staging size %zu is not a positive multiple of %zu", staging_bytes,
               DirectReader::kAlign);
    LayerPlan plan;
    plan.layer = layer;
    plan.upload = upload;
    for (const ShardInfo& s : ckpt.shards()) plan.shard_paths.push_back(s.path);
    const std::vector<ByteRun> runs = plan_runs(ckpt, layer);
    if (upload)
        plan_upload(runs, staging_bytes, plan);
    else
        plan_direct(runs, staging_bytes, plan);
    return plan;
}

}  // namespace ds4r
