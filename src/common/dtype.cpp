#include "ds4r/dtype.h"

namespace ds4r {

namespace {
struct DTypeInfo {
    DType t;
    const char* name;
    size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::BF16, "BF16", 2},       {DType::F16, "F16", 2},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},         {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
};
}  // namespace

size_t dtype_size(DType t) {
    for (const auto& i : kInfo)
        if (i.t == t) return i.size;
    return 0;
}

const char* dtype_name(DType t) {
    for (const auto& i : kInfo)
        if (i.t == t) return i.name;
    return "?";
}

std::optional<DType> dtype_from_name(std::string_view s) {
    for (const auto& i : kInfo)
        if (s == i.name) return i.t;
    return std::nullopt;
}

int64_t shape_numel(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
}

std::string shape_str(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i) out += ", ";
        out += std::to_string(s[i]);
    }
    return out + "]";
}

}  // namespace ds4r
