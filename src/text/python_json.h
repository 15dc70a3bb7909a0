// Python's json.dumps(value, ensure_ascii=False) for values parsed with nlohmann::ordered_json:
// DeepSeek's chat encoder writes tool schemas and non-string tool arguments that way, so the prompt
// must reproduce its spacing (", " and ": "), key order, escapes and float formatting (repr).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ds4r/json_util.h"  // json_nesting_depth

namespace ds4r::text {

std::string python_json_dumps(const nlohmann::ordered_json& v);
// Python's repr(float) (shortest round-trip digits; exponent form below 1e-4 and from 1e16).
std::string python_float_repr(double d);

constexpr int kMaxJsonNesting = 256;

}  // namespace ds4r::text
