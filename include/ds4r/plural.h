// Counts in messages: "1 sequence", "2 sequences", "1 pass", "3 passes".
#pragma once

#include <cstdint>
#include <string>

namespace ds4r {

// The count and its noun; `many` defaults to `one` + "s".
std::string plural(int64_t n, const std::string& one, const std::string& many = "");

}  // namespace ds4r
