// A pass saved mid-way (Ctrl-C / SIGTERM at a layer boundary, README "Resume, overwrite and
// interrupts"): <output>.pass holds the pass's identity (the run sidecar, the output records before
// it, its input positions and tokens, the hidden rows it already captured) and its cross-layer host
// state (PassRunner::write_state), so that --resume continues from the next layer with the same
// bytes as an uninterrupted run. Written atomically: a kill while saving leaves no file, never a
// partial one.
//
// File: "DS4RPASS" | u64 LE header length | header JSON | the runner's state blobs, in header order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ds4r/output.h"

namespace ds4r {

class PassRunner;

struct SavedPass {
    std::string manifest_json;   // the run's sidecar when it was saved (identity)
    int64_t records_before = 0;  // output records when the pass started
    int next_layer = 0;          // the first layer still to run
    int n_layers = 0;
    struct Item {
        int64_t pos = 0;  // input record position (0-based among non-blank lines)
        std::string id_json;
        bool bad = false;       // an error record (--skip-bad)
        int64_t replaces = -1;  // output record this item's record replaces (a retried error), or -1
        bool operator==(const Item&) const = default;
    };
    std::vector<Item> items;                              // in pass order
    std::vector<std::vector<int32_t>> tokens;             // the scored sequences, in pass order
    std::map<int, int64_t> hidden_committed;              // layer -> committed rows when the pass started
    std::map<int, std::vector<HiddenRef>> hidden_refs;    // seq -> rows it captured before the save
    std::vector<std::pair<std::string, uint64_t>> blobs;  // state blobs: name, bytes
    uint64_t data_offset = 0;                             // where the first blob starts

    int64_t total_tokens() const;
    std::map<int, int64_t> hidden_pending() const;  // layer -> rows captured before the save
};

std::string pass_state_path(const std::string& output);  // "<output>.pass"

// Writes header + runner.write_state() atomically (temp file, fsync, rename, fsync of the dir).
void save_pass_state(const std::string& path, SavedPass header, PassRunner& runner);
// Reads and checks the header (sizes against the file); InputError naming the file when malformed.
SavedPass read_pass_header(const std::string& path);
// Loads the blobs into a runner that has begun the pass's sequences.
void load_pass_state(const std::string& path, const SavedPass& header, PassRunner& runner);

}  // namespace ds4r
