// Progress on stderr (issue: "the user must see that work is happening"): one update per layer of
// each pass with pass and layer counters, tokens/s, weight-read rate and an ETA. `bar` redraws one
// line (terminals), `plain` prints a line per layer (logs, pipes), `none` is silent; `auto` picks
// bar when stderr is a terminal.
#pragma once

#include <cstdint>
#include <string>

#include "ds4r/replay.h"

namespace ds4r {

class Progress {
public:
    Progress(const std::string& mode, int n_layers);
    void begin_pass(int pass_index, int64_t tokens);
    void layer_done(const LayerTiming& t);
    void end_pass();
    // Bytes read by the weight source so far (for the GB/s figure); optional.
    void set_bytes_read(uint64_t bytes) { bytes_read_ = bytes; }

private:
    void emit(const std::string& line, bool final_line);
    enum class Mode { Bar, Plain, None } mode_;
    int n_layers_;
    int pass_ = 0;
    int64_t tokens_ = 0;
    int64_t tokens_done_total_ = 0;
    double pass_t0_ = 0, run_t0_ = 0;
    int layers_done_ = 0;
    uint64_t bytes_read_ = 0, bytes_at_pass_start_ = 0;
    size_t last_len_ = 0;
};

}  // namespace ds4r
