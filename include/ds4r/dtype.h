// Element types of safetensors files and of backend tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r {

enum class DType : uint8_t {
    BF16,
    F16,
    F32,
    F64,
    I8,
    U8,
    I16,
    I32,
    I64,
    BOOL,
    F8_E4M3,  // OCP float8 e4m3fn: bias 7, max 448, no inf, NaN = S.1111.111 (docs/MODEL.md 3.2)
    F8_E5M2,
    F8_E8M0,  // unsigned power-of-two scale 2^(e-127); 0xFF = NaN
};

// Bytes per element. I8 holds two packed fp4 (e2m1) codes for routed experts, still 1 byte.
size_t dtype_size(DType t);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
const char* dtype_name(DType t);
// Parse a safetensors dtype string; nullopt for unknown spellings.
std::optional<DType> dtype_from_name(std::string_view s);

using Shape = std::vector<int64_t>;
// Product of the dims (1 for a scalar / empty shape). Caller validates non-negativity.
int64_t shape_numel(const Shape& s);
// "[1280, 5120]"
std::string shape_str(const Shape& s);

}  // namespace ds4r
