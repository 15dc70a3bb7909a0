// Safetensors headers and the Hugging Face shard index (model.safetensors.index.json).
//
// A safetensors file is: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {..}},
// then the data section; offsets are relative to the data section (byte 8 + N of the file).
// Both parsers validate everything a reader relies on and throw CheckpointError naming the file
// (and the tensor) on any problem; they never crash, abort or hang on any input (fuzzed:
// tests/fuzz/fuzz_safetensors_header.cpp, tests/fuzz/fuzz_index_json.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds4r/dtype.h"
#include "ds4r/file_util.h"

namespace ds4r {

// Largest header accepted. Real V4.1 shards have headers of ~250 KB (2,342 tensors).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;  // 100 MiB
// Largest rank accepted for a tensor shape (sanity bound; the model uses at most 2).
constexpr size_t kSafetensorsMaxRank = 64;

struct SafetensorsTensor {
    std::string name;
    DType dtype = DType::U8;
    Shape shape;          // non-negative dims
    uint64_t offset = 0;  // absolute file offset of the first byte (8 + header_len + begin)
    uint64_t nbytes = 0;  // numel(shape) * dtype_size(dtype) == end - begin
};

struct SafetensorsHeader {
    std::string path;  // as given; used in messages
    uint64_t file_size = 0;
    uint64_t header_len = 0;                 // N, the JSON length
    uint64_t data_begin = 0;                 // 8 + N
    uint64_t data_end = 0;                   // largest absolute end offset of any tensor (data_begin if none)
    std::vector<SafetensorsTensor> tensors;  // sorted by offset (then name)
    std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", if present

    // Linear search is fine for tests; Checkpoint builds its own name map.
    const SafetensorsTensor* find(std::string_view name) const;
};

// Validates the 8-byte length prefix of a file of `file_size` bytes (`n` bytes available at
// `bytes`) and returns the header length N: at least 8 bytes in the file, N <= 100 MiB and
// 8 + N <= file_size.
uint64_t safetensors_header_length(const uint8_t* bytes, size_t n, uint64_t file_size,
                                   const std::string& path);

// Parses and validates a header. `bytes` holds the file's first 8 + N bytes (fewer: truncation is
// reported), `file_size` is the size of the whole file. Checks: N bounded and inside the file,
// valid JSON object, known dtype, non-negative shape without overflow, data_offsets
// [begin <= end], end inside the data section, end - begin == numel * dtype size, no duplicate
// names, no overlapping tensors. Throws CheckpointError naming `path`, the tensor, and what was
// expected versus found.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t n, uint64_t file_size,
                                           const std::string& path);

// Opens `path`, preads the 8-byte length then the header (never the tensor data), and parses it.
SafetensorsHeader read_safetensors_header(const std::string& path);
// The same on an already open file (messages name f.path()).
SafetensorsHeader read_safetensors_header(const FileHandle& f);

// model.safetensors.index.json.
struct SafetensorsIndex {
    std::string path;
    // tensor name -> shard file name (a plain file name inside the model directory), sorted by name.
    std::vector<std::pair<std::string, std::string>> weight_map;
    std::optional<uint64_t> total_size;  // metadata.total_size, when present
};

// Parses an index from memory (so the fuzzer needs no files). Requires a JSON object with a
// "weight_map" object whose values are strings naming plain files (no '/', not "." or ".."),
// no duplicate names; "metadata" is optional (total_size, if present, a non-negative integer);
// other top-level keys are ignored. Throws CheckpointError naming `path`.
SafetensorsIndex parse_safetensors_index(std::string_view json_text, const std::string& path);
SafetensorsIndex read_safetensors_index(const std::string& path);

// Printable, bounded rendering of a name taken from a file (for error messages): control and
// non-ASCII bytes become \xNN, long names are cut at 200 characters.
std::string printable_name(std::string_view s);

}  // namespace ds4r
