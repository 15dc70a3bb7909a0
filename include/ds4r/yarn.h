// The YaRN correction band of the RoPE tables (docs/MODEL.md 4.0), shared by both backends' rope_table:
// model.py's find_correction_range, evaluated in Python double arithmetic on the host.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ds4r {

// low = max(floor(corrected_dim(beta_fast)), 0), high = min(ceil(corrected_dim(beta_slow)), rd - 1)
// with corrected_dim(r) = rd * log(orig / (r * 2 pi)) / (2 log(base)).
inline void yarn_band(double base, int64_t orig, double beta_fast, double beta_slow, int64_t rd, int64_t* low,
                      int64_t* high) {
    const double pi = 3.141592653589793;
    auto corrected_dim = [&](double rotations) {
        return static_cast<double>(rd) * std::log(static_cast<double>(orig) / (rotations * 2 * pi)) /
               (2 * std::log(base));
    };
    *low = std::max<int64_t>(static_cast<int64_t>(std::floor(corrected_dim(beta_fast))), 0);
    *high = std::min<int64_t>(static_cast<int64_t>(std::ceil(corrected_dim(beta_slow))), rd - 1);
}

}  // namespace ds4r
