// The monotonic clock the timings are read from (progress, bench, the weight sources, the Engram gather).
#pragma once

#include <chrono>

namespace ds4r {

// Seconds on std::chrono::steady_clock (differences only: its epoch is unspecified).
inline double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace ds4r
