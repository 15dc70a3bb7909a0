#include "golden_util.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "ds4r/backend.h"
#include "ds4r/file_util.h"
#include "ds4r/numeric.h"
#include "ds4r/output.h"
#include "test_util.h"

namespace ds4r::test {

std::string golden_dir() {
    return data_dir() + "/tiny-a";
}

std::vector<GoldenSeq> golden_sequences() {
    std::vector<GoldenSeq> out;
    std::ifstream f(golden_dir() + "/tokens.jsonl");
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line);
        GoldenSeq s;
        s.id = j.at("id").get<std::string>();
        for (const auto& t : j.at("tokens")) s.tokens.push_back(t.get<int32_t>());
        out.push_back(s);
    }
    return out;
}

std::vector<Record> read_records(const std::string& path) {
    std::vector<Record> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line);
        Record r;
        r.id = j.at("id").is_string() ? j.at("id").get<std::string>() : j.at("id").dump();
        r.n_tokens = j.at("n_tokens").get<int64_t>();
        r.logprob = j.at("logprob").get<std::vector<double>>();
        r.entropy = j.at("entropy").get<std::vector<double>>();
        r.rank = j.at("rank").get<std::vector<int64_t>>();
        for (const auto& row : j.at("topk_ids"))
            for (const auto& v : row) r.topk_ids_flat.push_back(v.get<int64_t>());
        for (const auto& row : j.at("topk_logprobs"))
            for (const auto& v : row) r.topk_logprobs_flat.push_back(v.get<double>());
        r.final_entropy = j.at("final").at("entropy").get<double>();
        r.final_topk_ids = j.at("final").at("topk_ids").get<std::vector<int64_t>>();
        r.final_topk_logprobs = j.at("final").at("topk_logprobs").get<std::vector<double>>();
        out.push_back(std::move(r));
    }
    return out;
}

NpyArray dump(const std::string& name) {
    return load_npy(golden_dir() + "/dumps/" + name);
}
bool dump_exists(const std::string& name) {
    return file_exists(golden_dir() + "/dumps/" + name);
}

Bf16Stats compare_bf16(const uint16_t* a, const uint16_t* b, size_t n) {
    Bf16Stats st;
    double num = 0, den = 0;
    size_t eq = 0;
    for (size_t i = 0; i < n; ++i) {
        if (a[i] == b[i]) ++eq;
        const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        num += (x - y) * (x - y);
        den += y * y;
        st.max_abs = std::max(st.max_abs, std::fabs(x - y));
    }
    st.equal_frac = n ? static_cast<double>(eq) / n : 1.0;
    st.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    return st;
}

double rel_l2_f32(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        den += static_cast<double>(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

GoldenModel& golden_model(const std::string& backend) {
    static std::map<std::string, std::unique_ptr<GoldenModel>> models;
    auto& m = models[backend];
    if (!m) {
        m = std::make_unique<GoldenModel>();
        m->ckpt = std::make_unique<Checkpoint>(Checkpoint::open(golden_model_dir()));
        m->be = select_backend(backend, 0);
        m->weights = make_sync_weight_source(*m->be, *m->ckpt);
        m->engram = load_engram_resources(*m->ckpt);
    }
    return *m;
}

std::map<int, std::string> score_golden(const std::vector<std::vector<int>>& groups, int64_t chunk_rows,
                                        MemSink* sink, const std::string& backend) {
    GoldenModel& gm = golden_model(backend);
    auto seqs = golden_sequences();
    ReplayOptions ro;
    ro.chunk_rows = chunk_rows;
    ro.top_k = 8;
    if (sink) ro.capture_layers = {2, 6};
    PassRunner runner(*gm.be, *gm.ckpt, *gm.weights, gm.engram.get(), ro);
    std::map<int, std::string> out;
    for (const auto& g : groups) {
        std::vector<std::vector<int32_t>> toks;
        for (int i : g) toks.push_back(seqs[static_cast<size_t>(i)].tokens);
        MemSink local;
        auto scores = runner.run(toks, sink ? &local : nullptr);
        for (size_t j = 0; j < g.size(); ++j) {
            out[g[j]] =
                format_record("\"" + seqs[static_cast<size_t>(g[j])].id + "\"", scores[j], 8, {}, "{}");
            if (sink)
                for (auto& [key, v] : local.rows)
                    if (key.second == static_cast<int>(j)) sink->rows[{key.first, g[j]}] = v;
        }
    }
    return out;
}

std::vector<int> all_golden_indices() {
    std::vector<int> v(golden_sequences().size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
    return v;
}

double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    for (auto& x : v) x = std::fabs(x);
    std::sort(v.begin(), v.end());
    // numpy's default (linear interpolation)
    const double pos = q * (v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

}  // namespace ds4r::test
