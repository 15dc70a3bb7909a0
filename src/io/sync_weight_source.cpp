// The synchronous weight source: reads a layer's byte runs when it is acquired, then (for device
// backends) uploads each run with one copy. No overlap; the CPU backend and tests use it, and it is
// the fallback of the prefetching source.
#include <fcntl.h>

#include <chrono>
#include <cstring>
#include <map>
#include <unordered_map>

#include "ds4r/checkpoint.h"
#include "ds4r/clock.h"
#include "ds4r/file_util.h"
#include "ds4r/weights.h"
#include "io/prefetch_plan.h"

namespace ds4r {

namespace {

class MapLayer : public ResidentLayer {
public:
    Tensor get(const std::string& name) const override {
        auto it = map_.find(name);
        if (it == map_.end())
            throw CheckpointError(
                strfmt("tensor '%s' is not part of the resident layer (binding bug?)", name.c_str()));
        return it->second;
    }
    std::unordered_map<std::string, Tensor> map_;
    std::vector<std::shared_ptr<void>> host_holds_;
    std::vector<Tensor> dev_holds_;
};

class SyncWeightSource : public WeightSource {
public:
    SyncWeightSource(Backend& be, const Checkpoint& ckpt) : be_(be), ckpt_(ckpt) {}

    void set_schedule(const std::vector<int>&) override {}

    std::shared_ptr<ResidentLayer> acquire(int layer) override {
        const double t0 = now_s();
        auto out = std::make_shared<MapLayer>();
        for (const ByteRun& run : runs_for(layer)) load_run(run, *out);
        stats_.wait_seconds += now_s() - t0;
        return out;
    }

    WeightSourceStats stats() const override { return stats_; }

private:
    std::vector<ByteRun> runs_for(int layer) const {
        if (layer != kHeadLayer) return ckpt_.layer_runs(layer);
        std::vector<ByteRun> runs;
        for (const char* n : {kFinalNormTensorName, kHeadTensorName}) {
            const TensorLocation& t = ckpt_.at(n);
            ByteRun r;
            r.shard = t.shard;
            r.begin = t.offset;
            r.end = t.offset + t.nbytes;
            r.tensors.push_back(&t);
            runs.push_back(r);
        }
        return runs;
    }

    const FileHandle& shard_file(int shard) {
        auto it = files_.find(shard);
        if (it == files_.end())
            it = files_
                     .emplace(shard, FileHandle(ckpt_.shards().at(static_cast<size_t>(shard)).path, O_RDONLY,
                                                0, true))
                     .first;
        return it->second;
    }

    void load_run(const ByteRun& run, MapLayer& out) {
        const size_t bytes = static_cast<size_t>(run.end - run.begin);
        const size_t shift = static_cast<size_t>(run.begin % 256);  // keep the file's alignment mod 256
        auto host = be_.alloc_host(bytes + 256 + shift);
        uint8_t* base = static_cast<uint8_t*>(host.get());
        base += (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256 + shift;
        double t0 = now_s();
        shard_file(run.shard).pread_exact(base, bytes, run.begin);
        stats_.read_seconds += now_s() - t0;
        stats_.bytes_read += bytes;
        out.host_holds_.push_back(host);
        if (be_.host_memory()) {
            for (const TensorLocation* t : run.tensors) {
                uint8_t* p = base + (t->offset - run.begin);
                const size_t align = dtype_size(t->dtype);
                if (reinterpret_cast<uintptr_t>(p) % align != 0) {  // misaligned in the file: private copy
                    auto h = be_.alloc_host(t->nbytes);
                    std::memcpy(h.get(), p, t->nbytes);
                    out.host_holds_.push_back(h);
                    p = static_cast<uint8_t*>(h.get());
                }
                out.map_[t->name] = tensor_view(p, t->dtype, t->shape);
            }
            return;
        }
        t0 = now_s();
        // the device copy: most tensor bytes on 256-byte boundaries, as the prefetcher's slots place them
        // (from the allocation's first 256-byte boundary: backends align to less)
        Tensor dev = be_.alloc(DType::U8, {static_cast<int64_t>(bytes + 2 * kSlotAlign)});
        const size_t dshift =
            (kSlotAlign - reinterpret_cast<uintptr_t>(dev.data) % kSlotAlign) % kSlotAlign +
            static_cast<size_t>(run.begin % kSlotAlign + kSlotAlign - slot_shift(run)) % kSlotAlign;
        be_.upload(dev, dshift, base, bytes);
        stats_.bytes_uploaded += bytes;
        out.dev_holds_.push_back(dev);
        for (const TensorLocation* t : run.tensors) {
            const size_t off = dshift + static_cast<size_t>(t->offset - run.begin);
            Tensor v = tensor_view(static_cast<uint8_t*>(dev.data) + off, t->dtype, t->shape);
            if (off % 16 != 0) {  // kernels load weights 16 bytes at a time: give it its own buffer
                v = be_.alloc(t->dtype, t->shape);
                be_.upload(v, 0, base + (t->offset - run.begin), t->nbytes);
                out.dev_holds_.push_back(v);
            }
            out.map_[t->name] = v;
        }
        be_.synchronize();
        stats_.upload_seconds += now_s() - t0;
    }

    Backend& be_;
    const Checkpoint& ckpt_;
    std::map<int, FileHandle> files_;
    WeightSourceStats stats_;
};

}  // namespace

std::unique_ptr<WeightSource> make_sync_weight_source(Backend& be, const Checkpoint& ckpt) {
    return std::make_unique<SyncWeightSource>(be, ckpt);
}

}  // namespace ds4r
