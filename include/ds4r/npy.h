// NumPy .npy files (format v1.0 written; v1/v2/v3 read), little endian, C order.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ds4r/dtype.h"

namespace ds4r {

struct NpyArray {
    std::string descr;  // numpy dtype string, e.g. "<f4", "<u2", "|u1", "<i8"
    Shape shape;
    std::vector<uint8_t> data;  // raw little-endian element bytes, C order

    size_t item_size() const;  // from descr
    int64_t numel() const { return shape_numel(shape); }
    template <class T>
    const T* as() const {
        return reinterpret_cast<const T*>(data.data());
    }
    template <class T>
    std::vector<T> to_vector() const {
        std::vector<T> v(static_cast<size_t>(numel()));
        if (!v.empty()) std::memcpy(v.data(), data.data(), v.size() * sizeof(T));
        return v;
    }
};

// The header of a .npy file: dtype, shape, where the data starts.
struct NpyHeader {
    std::string descr;
    Shape shape;
    size_t data_offset = 0;
};
// Parses the header at the start of `bytes` (the data need not follow); RuntimeError naming `path`.
NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& path);
// Reads only the header of a .npy file (its first 64 KiB at most).
NpyHeader read_npy_header(const std::string& path);

// Reads a .npy file; throws RuntimeError naming the file on any malformation (bad magic, header,
// fortran order, big-endian dtype, truncated data).
NpyArray load_npy(const std::string& path);
// Parses an in-memory .npy image (`path` only for messages).
NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& path);

// The v1.0 header (magic .. newline) for `descr` and `shape`, padded to a multiple of 64 bytes.
// `min_header_bytes` reserves room so a later rewrite with a larger shape keeps the same length.
std::string npy_header(const std::string& descr, const Shape& shape, size_t min_header_bytes = 0);

// Writes a whole array atomically (temp file + fsync + rename).
void save_npy(const std::string& path, const std::string& descr, const Shape& shape, const void* data,
              size_t bytes);

}  // namespace ds4r
