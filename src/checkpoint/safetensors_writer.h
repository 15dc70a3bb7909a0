// Streaming safetensors writer (used by make-tiny). The header is planned up front from the tensor
// list, so tensor bytes can be written one bounded chunk at a time, at their final offsets, without
// ever holding a tensor (let alone a model) in memory. The file is written under a temporary name
// and renamed on commit(), so an interrupted run never leaves a file that looks complete. Tensors
// that are all zero may be left as holes of a sparse file (the Engram tables at full width).
//
// Layout, as Hugging Face's `safetensors` writes it (and as the golden tiny-a shards are laid out):
//   u64 little-endian header length N | N bytes of JSON, space-padded to a multiple of 8 |
//   tensor data, contiguous, in header order (tensor names sorted by byte value).
// The JSON starts with "__metadata__": {"format": "pt"} and gives dtype / shape / data_offsets
// (relative to the start of the data) for every tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ds4r/dtype.h"
#include "ds4r/file_util.h"

namespace ds4r {

struct SafetensorsEntry {
    std::string name;
    DType dtype;
    Shape shape;
};

struct SafetensorsLayout {
    std::vector<SafetensorsEntry> entries;  // in file order (sorted by name)
    std::vector<uint64_t> offsets;          // [entries] data offset relative to data_start
    std::vector<uint64_t> sizes;            // [entries] bytes
    std::string header;                     // JSON text including the space padding
    uint64_t data_start = 0;                // 8 + header.size()
    uint64_t file_size = 0;                 // data_start + sum(sizes)

    // Index of `name` in entries, or -1.
    int64_t find(const std::string& name) const;
};

// Sorts the entries by name, assigns contiguous offsets and renders the header. Throws RuntimeError
// for duplicate names or negative dims. `metadata` goes into "__metadata__" (string values).
SafetensorsLayout plan_safetensors(std::vector<SafetensorsEntry> entries,
                                   const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

class SafetensorsWriter {
public:
    // Creates "<path>.tmp.<pid>", writes the header and sizes the file to its final length (the
    // data area starts as a hole).
    SafetensorsWriter(std::string path, SafetensorsLayout layout);
    ~SafetensorsWriter();  // removes the temporary file unless commit() succeeded
    SafetensorsWriter(const SafetensorsWriter&) = delete;
    SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

    const SafetensorsLayout& layout() const { return layout_; }
    const std::string& path() const { return path_; }

    // Writes bytes [offset, offset + n) of entry `i`. Each tensor's bytes must arrive in order
    // (offset == bytes already written to it); throws RuntimeError otherwise or past its end.
    void write(size_t i, uint64_t offset, const void* data, size_t n);
    // Declares entry `i` all-zero and leaves it as a hole (reads as zero bytes).
    void leave_zero(size_t i);
    // Every tensor must be complete (written or left zero). fsync, rename, fsync of the directory.
    void commit();

private:
    std::string path_, tmp_;
    SafetensorsLayout layout_;
    FileHandle fh_;
    std::vector<uint64_t> written_;  // [entries] bytes written so far
    std::vector<uint8_t> zero_;      // [entries] 1 = left as a hole
    bool done_ = false;
};

}  // namespace ds4r
