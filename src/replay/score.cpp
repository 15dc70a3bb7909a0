// The score job: input -> passes -> durable results (DESIGN.md sections 2, 5, 6).
#include "ds4r/score.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ds4r/checkpoint.h"
#include "ds4r/input.h"
#include "ds4r/log.h"
#include "ds4r/output.h"
#include "ds4r/progress.h"

namespace ds4r {

namespace {

double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// MemAvailable from /proc/meminfo, in bytes (0 if unknown).
uint64_t host_available_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    uint64_t val;
    std::string unit;
    while (f >> key >> val >> unit)
        if (key == "MemAvailable:") return val * 1024;
    return 0;
}

// What an existing results file already holds (for --resume).
struct ResumeState {
    std::set<std::string> ids;          // id JSON texts of complete records
    std::map<int, int64_t> hidden_rows; // layer -> rows referenced by complete records
};

ResumeState scan_existing_output(const std::string& path) {
    ResumeState st;
    if (!file_exists(path)) return st;
    std::string text = read_text_file(path, size_t(1) << 40);
    size_t keep = text.rfind('\n');
    keep = keep == std::string::npos ? 0 : keep + 1;
    if (keep < text.size()) {
        // A kill mid-write can leave a partial last line: drop it (it was never committed).
        log_warn(strfmt("%s: dropping an incomplete last line (%zu bytes) before resuming", path.c_str(),
                        text.size() - keep));
        if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0)
            throw RuntimeError(strfmt("%s: cannot truncate (%s)", path.c_str(), errno_text(errno).c_str()));
        text.resize(keep);
    }
    size_t pos = 0;
    int64_t line = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        std::string l = text.substr(pos, nl - pos);
        pos = nl + 1;
        ++line;
        if (l.empty()) continue;
        nlohmann::json v;
        try {
            v = nlohmann::json::parse(l);
        } catch (const nlohmann::json::parse_error&) {
            throw InputError(strfmt("%s:%lld: existing results line is not valid JSON; cannot resume", path.c_str(),
                                    (long long)line));
        }
        if (!v.is_object() || !v.contains("id"))
            throw InputError(strfmt("%s:%lld: existing results line has no id; cannot resume", path.c_str(), (long long)line));
        st.ids.insert(v.at("id").dump());
        if (v.contains("hidden") && v.at("hidden").is_array())
            for (const auto& h : v.at("hidden")) {
                int L = h.value("layer", -1);
                const auto& rows = h.at("rows");
                st.hidden_rows[L] = std::max(st.hidden_rows[L], rows.at(1).get<int64_t>());
            }
    }
    return st;
}

}  // namespace

std::unique_ptr<Backend> select_backend(const std::string& kind, int device) {
    if (kind == "cpu") return make_cpu_backend();
    std::string why;
    if (kind == "cuda" || kind == "auto") {
        auto be = make_cuda_backend(device, &why);
        if (be) return be;
        if (kind == "cuda") throw RuntimeError("--backend cuda: " + why);
        log_info("no usable GPU (" + why + "); using the CPU reference backend");
        return make_cpu_backend();
    }
    throw InputError("--backend must be auto, cuda or cpu, not '" + kind + "'");
}

ScoreSummary run_score(const ScoreOptions& opt) {
    const double t_start = now_s();
    Checkpoint ckpt = Checkpoint::open(opt.model_dir);
    const ModelConfig& cfg = ckpt.config();
    for (int L : opt.capture_layers)
        if (L < 0 || L > cfg.n_layers)
            throw InputError(strfmt("--capture-layers: layer %d outside [0, %lld]", L, (long long)cfg.n_layers));
    if (!opt.capture_layers.empty() && opt.hidden_dir.empty())
        throw InputError("--capture-layers needs --hidden-dir DIR");
    if (opt.top_k < 1 || opt.top_k > 1024) throw InputError("--top-k must be in [1, 1024]");
    if (opt.top_k > cfg.vocab_size) throw InputError("--top-k is larger than the vocabulary");
    const int64_t max_len = opt.max_seq_len > 0 ? opt.max_seq_len
                                                : (cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 65536);

    auto engram = load_engram_resources(ckpt);
    auto be = select_backend(opt.backend, opt.device);
    log_info("backend: " + be->name());

    // Resume: ids already present are skipped; hidden files are cut back to the committed rows.
    ResumeState resume;
    if (opt.output != "-" && file_exists(opt.output)) {
        FileHandle f(opt.output, O_RDONLY);
        if (f.size() > 0 && !opt.resume)
            throw InputError(opt.output + ": exists and is not empty; use --resume to continue it, or remove it");
        if (opt.resume) resume = scan_existing_output(opt.output);
    }
    if (!resume.ids.empty()) log_info(strfmt("resume: %zu sequences already done", resume.ids.size()));

    ReplayOptions ro;
    ro.top_k = opt.top_k;
    ro.capture_layers = opt.capture_layers;
    ro.hidden_mode = opt.hidden_mode;
    // Per-row activation footprint of a chunk is ~ (14 + hc) * D * 4 bytes plus attention scores;
    // keep chunks to a quarter of the free backend memory.
    const int64_t per_row = (14 + cfg.hc_mult) * cfg.dim * 4 + cfg.n_heads * cfg.head_dim * 8;
    ro.max_batch_tokens = opt.max_batch_tokens > 0
                              ? opt.max_batch_tokens
                              : std::clamp<int64_t>(static_cast<int64_t>(be->free_memory() / 4) / per_row, 64, 8192);
    // Pass size: host state ~ hc*D*2 + hashes per token (<= 64 KB, DESIGN.md 5), half of MemAvailable.
    const int64_t host_per_token = cfg.hc_mult * cfg.dim * 2 + cfg.hc_mult * 4 +
                                   static_cast<int64_t>(cfg.engram_layer_ids.size()) * cfg.engram_hash_cols() * 8 + 64;
    int64_t pass_tokens = opt.pass_tokens;
    if (pass_tokens <= 0) {
        const uint64_t avail = host_available_bytes();
        pass_tokens = avail ? static_cast<int64_t>(avail / 2) / host_per_token : (1 << 20);
        pass_tokens = std::clamp<int64_t>(pass_tokens, 1024, 1 << 20);
    }
    log_info(strfmt("chunks of <= %lld rows, passes of <= %lld tokens", (long long)ro.max_batch_tokens,
                    (long long)pass_tokens));

    // Layer L+1 is read (and uploaded) while layer L computes.
    auto weights = make_prefetch_weight_source(*be, ckpt);
    PassRunner runner(*be, ckpt, *weights, engram.get(), ro);
    ResultWriter out(opt.output);
    std::unique_ptr<HiddenNpyWriter> hidden;
    if (!opt.capture_layers.empty()) {
        hidden = std::make_unique<HiddenNpyWriter>(opt.hidden_dir, static_cast<int>(cfg.n_layers), opt.hidden_mode,
                                                   cfg.dim, cfg.hc_mult);
        for (int L : opt.capture_layers) {
            auto it = resume.hidden_rows.find(L);
            hidden->open_layer(L, it == resume.hidden_rows.end() ? 0 : it->second);
        }
    }
    Progress progress(opt.progress, static_cast<int>(cfg.n_layers));

    ScoreSummary sum;
    sum.backend = be->name();
    InputReader reader(opt.input, cfg.vocab_size, max_len);
    std::map<std::string, int64_t> seen;  // id -> line (duplicate detection)
    bool eof = false;
    while (!eof) {
        // Collect one pass: records in input order, bad lines (with --skip-bad) keep their place.
        struct Item {
            bool bad = false;
            InputRecord rec;
            std::string error;
        };
        std::vector<Item> items;
        int64_t tokens = 0;
        while (tokens < pass_tokens) {
            Item it;
            std::string bad_id;
            try {
                if (!reader.next(it.rec, &bad_id)) {
                    eof = true;
                    break;
                }
                auto [pos, fresh] = seen.emplace(it.rec.id_json, it.rec.line);
                if (!fresh)
                    throw InputError(strfmt("%s:%lld: duplicate id %s (first on line %lld)", reader.path().c_str(),
                                            (long long)it.rec.line, it.rec.id_json.c_str(), (long long)pos->second));
            } catch (const InputError& e) {
                if (!opt.skip_bad) throw;
                ++sum.bad_lines;
                log_warn(std::string("skipping: ") + e.what());
                it.bad = true;
                it.error = e.what();
                it.rec.line = reader.line();
                it.rec.id_json = bad_id.empty() ? std::to_string(reader.line()) : bad_id;
            }
            if (resume.ids.count(it.rec.id_json)) {
                ++sum.resumed;
                continue;
            }
            if (!it.bad) tokens += static_cast<int64_t>(it.rec.tokens.size());
            items.push_back(std::move(it));
        }
        if (items.empty()) break;
        std::vector<std::vector<int32_t>> seqs;
        std::vector<int> seq_of_item(items.size(), -1);
        for (size_t i = 0; i < items.size(); ++i)
            if (!items[i].bad) {
                seq_of_item[i] = static_cast<int>(seqs.size());
                seqs.push_back(items[i].rec.tokens);
            }
        std::vector<SequenceScores> scores;
        if (!seqs.empty()) {
            progress.begin_pass(static_cast<int>(sum.passes), tokens);
            scores = runner.run(seqs, hidden.get(), [&](const LayerTiming& t) { progress.layer_done(t); });
            progress.end_pass();
            ++sum.passes;
        }
        for (size_t i = 0; i < items.size(); ++i) {
            if (items[i].bad) {
                out.append(format_error_record(items[i].rec.id_json, items[i].rec.line, items[i].error));
                continue;
            }
            const int s = seq_of_item[i];
            std::vector<HiddenRef> refs = hidden ? hidden->refs_for(s) : std::vector<HiddenRef>{};
            out.append(format_record(items[i].rec.id_json, scores[static_cast<size_t>(s)], opt.top_k, refs,
                                     items[i].rec.extra_json));
            ++sum.sequences;
            sum.tokens += static_cast<int64_t>(items[i].rec.tokens.size());
        }
        // Hidden rows first, then the records that reference them: a crash in between leaves
        // unreferenced rows that --resume cuts away, never a record pointing at missing rows.
        if (hidden) {
            hidden->commit();
            hidden->clear_refs();
        }
        out.commit();
    }
    sum.seconds = now_s() - t_start;
    return sum;
}

}  // namespace ds4r
