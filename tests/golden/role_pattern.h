// The tiny-roles checkpoint (make-tiny --preset tiny-roles: 8 layers, ratios 0,0,2,2,2,1,1,1, KV
// sources 2,5, index sources 2,4,5,7, candidate source 5; issue 10) written once per process, and
// scoring helpers for the CPU role-pattern test and the CUDA one (CPU vs CUDA). Header-only: both
// suites include it.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/make_tiny.h"
#include "ds4r/output.h"
#include "ds4r/replay.h"
#include "ds4r/score.h"
#include "golden_util.h"
#include "test_util.h"

namespace ds4r::test {

inline const std::string& tiny_roles_model_dir() {
    static const std::string dir = [] {
        const std::string d = temp_dir("tiny-roles") + "/model";
        MakeTinyOptions o;
        o.preset = TinyPreset::TinyRoles;
        o.seed = 10;
        make_tiny(d, o);
        return d;
    }();
    return dir;
}

struct RolesModel {
    std::unique_ptr<Checkpoint> ckpt;
    std::unique_ptr<Backend> be;
    std::unique_ptr<WeightSource> weights;
    std::unique_ptr<EngramResources> engram;
};

// The model in `dir` (default: tiny-roles) on `backend`, opened once per process.
inline RolesModel& tiny_roles_model(const std::string& backend, const std::string& dir = "") {
    static std::map<std::string, std::unique_ptr<RolesModel>> models;
    const std::string path = dir.empty() ? tiny_roles_model_dir() : dir;
    auto& m = models[backend + "\n" + path];
    if (!m) {
        m = std::make_unique<RolesModel>();
        m->ckpt = std::make_unique<Checkpoint>(Checkpoint::open(path));
        m->be = select_backend(backend, 0);
        m->weights = make_sync_weight_source(*m->be, *m->ckpt);
        m->engram = load_engram_resources(*m->ckpt);
    }
    return *m;
}

// Deterministic sequences: lengths that give layer 7 (ratio 1) more positions than the candidate
// pool holds (3 blocks of 4), odd lengths (a ratio-2 tail token), and sequences too short to compress.
inline std::vector<std::vector<int32_t>> tiny_roles_sequences(int64_t vocab) {
    std::mt19937 rng(2024);
    std::vector<std::vector<int32_t>> out;
    for (int len : {40, 17, 33, 1, 2, 25, 9, 48}) {
        std::vector<int32_t> s(static_cast<size_t>(len));
        for (auto& t : s) t = static_cast<int32_t>(3 + rng() % static_cast<uint32_t>(vocab - 3));
        out.push_back(s);
    }
    return out;
}

// Scores the sequences of each group in one PassRunner pass (chunks of chunk_rows rows);
// returns the formatted record (top-8) of every sequence index. With a sink, the stream entering
// every layer (copies mode: the exact bf16 bits) and the final hidden state are captured.
inline std::map<int, std::string> score_tiny_roles(const std::string& backend,
                                                   const std::vector<std::vector<int>>& groups,
                                                   int64_t chunk_rows, const std::string& dir = "",
                                                   MemSink* sink = nullptr) {
    RolesModel& m = tiny_roles_model(backend, dir);
    const auto seqs = tiny_roles_sequences(m.ckpt->config().vocab_size);
    ReplayOptions ro;
    ro.chunk_rows = chunk_rows;
    ro.top_k = 8;
    if (sink) {
        ro.hidden_mode = HiddenMode::Copies;
        for (int L = 0; L <= m.ckpt->config().n_layers; ++L) ro.capture_layers.push_back(L);
    }
    PassRunner runner(*m.be, *m.ckpt, *m.weights, m.engram.get(), ro);
    std::map<int, std::string> out;
    for (const auto& g : groups) {
        std::vector<std::vector<int32_t>> toks;
        for (int i : g) toks.push_back(seqs[static_cast<size_t>(i)]);
        MemSink local;
        auto scores = runner.run(toks, sink ? &local : nullptr);
        for (size_t j = 0; j < g.size(); ++j) {
            out[g[j]] = format_record("\"s" + std::to_string(g[j]) + "\"", scores[j], 8, {}, "{}");
            if (sink)
                for (auto& [key, v] : local.rows)
                    if (key.second == static_cast<int>(j)) sink->rows[{key.first, g[j]}] = v;
        }
    }
    return out;
}

}  // namespace ds4r::test
