// Small JSON helpers shared by the input reader and the encoder.
#pragma once

#include <string_view>

namespace ds4r {

// Deepest [ / { nesting outside strings: a cheap bound before parsing (a parsed value's destructor
// and dump() recurse once per level).
int json_nesting_depth(std::string_view s);

}  // namespace ds4r
