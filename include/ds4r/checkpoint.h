// The original Hugging Face checkpoint directory (docs/DESIGN.md sections 2 and 6, docs/MODEL.md section 3):
// config.json, model.safetensors.index.json, the shards it names, tokenizer.json. Checkpoint::open
// reads only the config, the index and the shard headers (a few MB for the real ~510 GB model),
// validates everything the prefill relies on, and answers where every tensor's bytes are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ds4r/binding.h"
#include "ds4r/config.h"
#include "ds4r/dtype.h"
#include "ds4r/file_util.h"

namespace ds4r {

// What the prefill does with a tensor of the checkpoint.
enum class TensorClass : uint8_t {
    Global,       // embed / final norm / head (TensorUse::Global)
    Layer,        // streamed with its layer (required TensorUse::Layer specs)
    EngramTable,  // Engram rows + row scales: gathered by hash id, never streamed
    Unused,       // shipped but not read by the prefill: mtp.*, vision.*, aligner.*, image_*, *.bias_vl
    Unknown,      // not in the binding and not known to be unused (a warning at open)
};

struct TensorLocation {
    std::string name;
    DType dtype = DType::U8;
    Shape shape;
    int shard = -1;       // index into Checkpoint::shards()
    uint64_t offset = 0;  // absolute file offset of the first byte
    uint64_t nbytes = 0;
    int layer = -1;  // backbone layer ("layers.<L>."), -1 otherwise
    TensorClass cls = TensorClass::Unknown;
};

struct ShardInfo {
    std::string file_name;  // as named in the index, e.g. "model-00003-of-00048.safetensors"
    std::string path;       // <dir>/<file_name>
    uint64_t file_size = 0;
    uint64_t data_begin = 0;  // 8 + header_len
    uint64_t data_end = 0;    // largest end offset of any tensor
    size_t n_tensors = 0;
};

// A contiguous byte range of one shard to read in one request; `tensors` lie inside it, sorted by
// offset. Bytes between them (gaps, unused tensors) are read and ignored.
struct ByteRun {
    int shard = -1;
    uint64_t begin = 0, end = 0;  // absolute, half-open
    std::vector<const TensorLocation*> tensors;
    uint64_t size() const { return end - begin; }
};

// Largest gap between two tensors that a read run bridges (reading it is cheaper than a new request).
constexpr uint64_t kByteRunMaxGap = 64u << 10;

// Groups tensors into maximal runs per shard (sorted by shard, then offset), merging neighbours whose
// gap is <= max_gap bytes. Input order does not matter; empty tensors are kept in the run they touch.
std::vector<ByteRun> merge_byte_runs(std::vector<const TensorLocation*> tensors,
                                     uint64_t max_gap = kByteRunMaxGap);

class Checkpoint {
public:
    // Parses and validates everything before any compute (docs/DESIGN.md 6): config + layer roles,
    // tokenizer.json present, the index (or a single model.safetensors), every shard present with a
    // sane header and long enough, index and headers agreeing both ways, no unreferenced shard of the
    // set, every required tensor of the binding present with exactly its dtype and shape. Throws
    // CheckpointError (exit code 3) naming the file and tensor; several problems are reported together.
    static Checkpoint open(const std::string& model_dir);

    const std::string& dir() const { return dir_; }
    const ModelConfig& config() const { return config_; }
    const std::vector<LayerRole>& roles() const { return roles_; }
    const std::vector<ShardInfo>& shards() const { return shards_; }
    // Every tensor of the checkpoint, sorted by (shard, offset).
    const std::vector<TensorLocation>& tensors() const { return tensors_; }
    // "model.safetensors.index.json" or "model.safetensors" (no index).
    const std::string& index_file() const { return index_file_; }
    std::optional<uint64_t> index_total_size() const { return index_total_size_; }
    // Names of tensors of class Unknown (also logged as a warning at open).
    std::vector<std::string> unknown_tensor_names() const;

    const TensorLocation* find(const std::string& name) const;
    // CheckpointError naming the tensor if missing.
    const TensorLocation& at(const std::string& name) const;
    // All tensors of one class, sorted by (shard, offset).
    std::vector<const TensorLocation*> tensors_of(TensorClass c) const;
    uint64_t bytes_of(TensorClass c) const;
    uint64_t total_bytes() const;

    // pread the tensor's bytes into host memory (dst must hold t.nbytes bytes).
    void read(const TensorLocation& t, void* dst) const;
    // pread a run (dst must hold run.size() bytes); tensor i sits at dst + (t->offset - run.begin).
    void read_run(const ByteRun& run, void* dst) const;

    // The layer's streamed tensors (class Layer) merged into a few large reads: the prefetcher's plan.
    std::vector<ByteRun> layer_runs(int layer) const;
    // Sum of nbytes of the layer's class-Layer tensors (what must be uploaded).
    uint64_t layer_stream_bytes(int layer) const;
    // Sum of the run sizes of layer_runs(layer) (what is read, gaps included).
    uint64_t layer_read_bytes(int layer) const;
    // Number of class-Layer tensors of the layer.
    size_t layer_tensor_count(int layer) const;

    std::string tokenizer_path() const;  // <dir>/tokenizer.json

private:
    std::string dir_;
    ModelConfig config_;
    std::vector<LayerRole> roles_;
    std::vector<ShardInfo> shards_;
    std::vector<FileHandle> files_;  // one open descriptor per shard (for read / read_run)
    std::vector<TensorLocation> tensors_;
    std::unordered_map<std::string, size_t> by_name_;
    std::vector<std::vector<size_t>> layer_tensors_;  // per layer: indices of class-Layer tensors
    std::string index_file_;
    std::optional<uint64_t> index_total_size_;
};

}  // namespace ds4r
