// libFuzzer target: parse_safetensors_header on arbitrary bytes (docs/DESIGN.md 6). Expected rejections
// are ds4r::Error; anything else (a crash, a sanitizer report, another exception) is a finding, and
// so is an accepted header that breaks the guarantees the parser documents.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ds4r/error.h"
#include "ds4r/safetensors.h"

namespace {

void check_invariants(const ds4r::SafetensorsHeader& h, uint64_t file_size) {
    if (h.data_begin != 8 + h.header_len || h.data_begin > file_size) __builtin_trap();
    if (h.data_end < h.data_begin || h.data_end > file_size) __builtin_trap();
    uint64_t reach = h.data_begin, prev = 0;
    for (const auto& t : h.tensors) {
        if (t.offset < prev) __builtin_trap();  // sorted by offset
        prev = t.offset;
        if (t.offset < h.data_begin || t.offset > h.data_end || t.nbytes > h.data_end - t.offset)
            __builtin_trap();
        unsigned __int128 n = ds4r::dtype_size(t.dtype);
        for (int64_t d : t.shape) {
            if (d < 0) __builtin_trap();
            n *= static_cast<uint64_t>(d);
            if (n > UINT64_MAX) n = static_cast<unsigned __int128>(UINT64_MAX) + 1;  // saturate
        }
        if (n != t.nbytes) __builtin_trap();
        if (t.nbytes && t.offset < reach) __builtin_trap();  // no overlaps
        if (t.nbytes) reach = std::max(reach, t.offset + t.nbytes);
    }
}

void one(const uint8_t* data, size_t size, uint64_t file_size) {
    try {
        check_invariants(ds4r::parse_safetensors_header(data, size, file_size, "fuzz.safetensors"),
                         file_size);
    } catch (const ds4r::Error&) {
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    one(data, size, size);                        // the input is the whole file
    one(data, size, size + (uint64_t{1} << 40));  // the input is the head of a 1 TiB file
    return 0;
}
