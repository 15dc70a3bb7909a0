// The score job: input -> passes -> durable results (DESIGN.md sections 2, 5, 6).
#include "ds4r/score.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "ds4r/checkpoint.h"
#include "ds4r/engram.h"
#include "ds4r/input.h"
#include "ds4r/log.h"
#include "ds4r/output.h"
#include "ds4r/progress.h"
#include "ds4r/zero_weights.h"

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
    int64_t records = 0;                           // complete lines (records and error records)
    std::unordered_map<std::string, int64_t> ids;  // id JSON text -> how many records carry it
    std::map<int, int64_t> hidden_rows;            // layer -> rows referenced by complete records

    // True (and one use consumed) when the output already holds a record for this id. Records are
    // written in input order, one per input line, so the k-th input line with an id matches the k-th
    // record with that id (ids repeat only in error records of --skip-bad).
    bool take(const std::string& id) {
        auto it = ids.find(id);
        if (it == ids.end() || it->second == 0) return false;
        --it->second;
        return true;
    }
};

void note_record(ResumeState& st, const std::string& line, const std::string& path, int64_t line_no) {
    const std::string where = strfmt("%s:%lld: ", path.c_str(), (long long)line_no);
    nlohmann::json v;
    try {
        v = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
        throw InputError(
            where + "existing results line is not valid JSON; cannot resume (remove the line or the file)");
    }
    if (!v.is_object() || !v.contains("id"))
        throw InputError(where + "existing results line has no \"id\"; cannot resume");
    ++st.records;
    ++st.ids[v.at("id").dump()];
    if (!v.contains("hidden")) return;
    try {
        for (const auto& h : v.at("hidden")) {
            const int L = h.at("layer").get<int>();
            const int64_t end = h.at("rows").at(1).get<int64_t>();
            st.hidden_rows[L] = std::max(st.hidden_rows[L], end);
        }
    } catch (const nlohmann::json::exception& e) {
        throw InputError(where + "existing results line has a malformed \"hidden\" entry; cannot resume (" +
                         e.what() + ")");
    }
}

// Reads the results file line by line. A kill mid-write can leave a partial last line (no newline):
// it was never committed, so it is cut away before anything is appended.
ResumeState scan_existing_output(const std::string& path) {
    ResumeState st;
    FileHandle f(path, O_RDWR);
    const uint64_t size = f.size();
    std::string chunk(size_t{4} << 20, '\0'), line;
    uint64_t off = 0, line_start = 0;
    int64_t line_no = 0;
    while (off < size) {
        const size_t n = f.pread_some(chunk.data(),
                                      static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - off)), off);
        if (n == 0) break;
        size_t p = 0;
        while (p < n) {
            const void* nl = std::memchr(chunk.data() + p, '\n', n - p);
            const size_t take =
                nl ? static_cast<size_t>(static_cast<const char*>(nl) - (chunk.data() + p)) : n - p;
            line.append(chunk.data() + p, take);
            p += take;
            if (!nl) break;
            ++p;
            ++line_no;
            if (line.find_first_not_of(" \t\r") != std::string::npos) note_record(st, line, path, line_no);
            line.clear();
            line_start = off + p;
        }
        off += n;
    }
    if (line_start < size) {
        log_warn(strfmt("%s: dropping an incomplete last line (%llu bytes) before resuming", path.c_str(),
                        (unsigned long long)(size - line_start)));
        if (::ftruncate(f.fd(), static_cast<off_t>(line_start)) != 0)
            throw RuntimeError(strfmt("%s: cannot truncate (%s)", path.c_str(), errno_text(errno).c_str()));
        f.fsync_or_throw();
    }
    return st;
}

bool same_file(const std::string& a, const std::string& b) {
    struct stat sa {
    }, sb{};
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

// Without --skip-bad, a regular input file is checked completely before any compute: a bad line at
// the end must not cost the hours spent before it. (A pipe is checked as it is read.)
void validate_whole_input(const std::string& path, int64_t vocab, int64_t max_len) {
    InputReader r(path, vocab, max_len);
    if (r.size_bytes() < 0) return;
    std::unordered_map<std::string, int64_t> seen;
    InputRecord rec;
    while (r.next(rec)) {
        auto [pos, fresh] = seen.emplace(rec.id_json, rec.line);
        if (!fresh)
            throw InputError(strfmt("%s:%lld: duplicate id %s (first on line %lld)", r.path().c_str(),
                                    (long long)rec.line, rec.id_json.c_str(), (long long)pos->second));
    }
}

}  // namespace

// --seed-check: the Engram multipliers come from numpy.random.default_rng(10007 * layer) (MODEL.md
// 4.2); for the released model they must equal its published values.
static void check_engram_seeds(const ModelConfig& cfg) {
    if (cfg.engram_layer_ids.empty()) {
        log_info("seed check: the model has no Engram layers: nothing to check");
        return;
    }
    for (int L : cfg.engram_layer_ids) {
        const auto got = engram_multipliers(L, cfg.engram_compressed_vocab_size, cfg.engram_max_ngram_size);
        const auto want =
            released_engram_multipliers(L, cfg.engram_compressed_vocab_size, cfg.engram_max_ngram_size);
        std::string vals;
        for (int64_t v : got) vals += (vals.empty() ? "" : ", ") + std::to_string(v);
        if (want.empty()) {
            log_info(strfmt(
                "seed check: layer %d multipliers [%s] (default_rng(%d)); no published values for this "
                "configuration to compare with",
                L, vals.c_str(), 10007 * L));
        } else if (got != want) {
            throw RuntimeError(
                strfmt("seed check: layer %d Engram multipliers [%s] differ from the released model's "
                       "published values (MODEL.md 4.2)",
                       L, vals.c_str()));
        } else {
            log_info(
                strfmt("seed check: layer %d multipliers [%s] equal the released model's", L, vals.c_str()));
        }
    }
}

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
    if (opt.resume && opt.output == "-")
        throw InputError("--resume needs --output FILE (it cannot continue stdout)");
    if (opt.top_k < 0 || opt.top_k > 1024) throw InputError("--top-k must be in [0, 1024]");
    if (!opt.capture_layers.empty() && opt.hidden_dir.empty())
        throw InputError("--capture-layers needs --hidden-dir DIR");
    if (opt.capture_layers.empty() && !opt.hidden_dir.empty())
        throw InputError(
            "--hidden-dir needs --capture-layers L,... (the layers whose hidden states to save)");
    if (opt.input != "-" && opt.output != "-" && same_file(opt.input, opt.output))
        throw InputError(opt.output + ": the output file is the input file");
    Checkpoint ckpt = Checkpoint::open(opt.model_dir);
    const ModelConfig& cfg = ckpt.config();
    for (int L : opt.capture_layers)
        if (L < 0 || L > cfg.n_layers)
            throw InputError(
                strfmt("--capture-layers: layer %d outside [0, %lld]", L, (long long)cfg.n_layers));
    if (opt.top_k > cfg.vocab_size) throw InputError("--top-k is larger than the vocabulary");
    if (checkpoint_has_zero_weights(ckpt)) {
        if (!opt.allow_zero_weights)
            throw CheckpointError(
                opt.model_dir +
                ": the weights are holes that read as zeros (make-tiny --headers-only), not "
                "a model to score; --allow-zero-weights scores it anyway");
        log_warn("scoring a checkpoint whose weights read as zeros (--allow-zero-weights)");
    }
    const int64_t max_len = opt.max_seq_len > 0
                                ? opt.max_seq_len
                                : (cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 65536);
    if (cfg.max_position_embeddings > 0 && max_len > cfg.max_position_embeddings)
        log_warn(
            strfmt("--max-seq-len %lld is beyond the model's max_position_embeddings (%lld): positions "
                   "past it are outside the context the model was built for",
                   (long long)max_len, (long long)cfg.max_position_embeddings));

    // Input and output problems surface before the (slow) backend and table setup.
    InputReader reader(opt.input, cfg.vocab_size, max_len);
    if (!opt.skip_bad && opt.input != "-") validate_whole_input(opt.input, cfg.vocab_size, max_len);
    // Resume: ids already present are skipped; hidden files are cut back to the committed rows.
    ResumeState resume;
    struct stat ost {};
    if (opt.output != "-" && ::stat(opt.output.c_str(), &ost) == 0) {
        if (S_ISDIR(ost.st_mode))
            throw RuntimeError(opt.output + ": is a directory, expected the results file");
        if (S_ISREG(ost.st_mode)) {
            if (ost.st_size > 0 && !opt.resume)
                throw InputError(opt.output +
                                 ": exists and is not empty; use --resume to continue it, or remove it");
            if (opt.resume) resume = scan_existing_output(opt.output);
        } else if (opt.resume) {
            throw InputError(opt.output + ": --resume needs a regular results file");
        }
    }
    if (resume.records)
        log_info(strfmt("resume: %lld records already in %s", (long long)resume.records, opt.output.c_str()));
    ResultWriter out(opt.output);
    std::unique_ptr<HiddenNpyWriter> hidden;
    if (!opt.capture_layers.empty()) {
        hidden = std::make_unique<HiddenNpyWriter>(opt.hidden_dir, static_cast<int>(cfg.n_layers),
                                                   opt.hidden_mode, cfg.dim, cfg.hc_mult);
        for (int L : opt.capture_layers) {
            auto it = resume.hidden_rows.find(L);
            hidden->open_layer(L, it == resume.hidden_rows.end() ? 0 : it->second);
        }
    }

    auto engram = load_engram_resources(ckpt);
    if (opt.seed_check) check_engram_seeds(cfg);
    auto be = select_backend(opt.backend, opt.device);
    log_info("backend: " + be->name());

    ReplayOptions ro;
    ro.top_k = std::max(opt.top_k, 1);  // --top-k 0: computed as 1, not written
    ro.capture_layers = opt.capture_layers;
    ro.hidden_mode = opt.hidden_mode;
    ro.max_batch_tokens =
        opt.max_batch_tokens > 0 ? opt.max_batch_tokens : default_chunk_rows(cfg, be->free_memory());
    // Pass size: host state ~ hc*D*2 + hashes per token (<= 64 KB, DESIGN.md 5), half of MemAvailable.
    const int64_t host_per_token =
        cfg.hc_mult * cfg.dim * 2 + cfg.hc_mult * 4 +
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
    Progress progress(opt.progress, static_cast<int>(cfg.n_layers));
    progress.set_input_size(reader.size_bytes());
    runner.set_on_chunk(
        [&](int layer, int64_t done, int64_t total) { progress.chunk_done(layer, done, total); });

    ScoreSummary sum;
    sum.backend = be->name();
    std::unordered_map<std::string, int64_t> seen;  // id -> line (duplicate detection)
    bool eof = false;
    try {
        while (!eof) {
            throw_if_interrupted();  // between passes: everything so far is committed
            // Collect one pass: records in input order, bad lines (with --skip-bad) keep their place.
            struct Item {
                bool bad = false;
                InputRecord rec;
                std::string error;
            };
            std::vector<Item> items;
            int64_t tokens = 0;
            uint64_t pass_bytes = 0;
            while (tokens < pass_tokens) {
                Item it;
                std::string bad_id;
                const uint64_t b0 = reader.bytes_consumed();
                try {
                    if (!reader.next(it.rec, &bad_id)) {
                        eof = true;
                        break;
                    }
                    auto [pos, fresh] = seen.emplace(it.rec.id_json, it.rec.line);
                    if (!fresh)
                        throw InputError(strfmt("%s:%lld: duplicate id %s (first on line %lld)",
                                                reader.path().c_str(), (long long)it.rec.line,
                                                it.rec.id_json.c_str(), (long long)pos->second));
                } catch (const InputError& e) {
                    if (!opt.skip_bad) throw;
                    it.bad = true;
                    it.error = e.what();
                    it.rec.line = reader.line();
                    it.rec.id_json = bad_id.empty() ? std::to_string(reader.line()) : bad_id;
                }
                const uint64_t line_bytes = reader.bytes_consumed() - b0;
                if (resume.take(it.rec.id_json)) {
                    ++sum.resumed;
                    progress.skip_input(line_bytes);
                    continue;
                }
                if (it.bad) {
                    ++sum.bad_lines;
                    log_warn(std::string("skipping: ") + it.error);
                    progress.skip_input(line_bytes);
                } else {
                    tokens += static_cast<int64_t>(it.rec.tokens.size());
                    pass_bytes += line_bytes;
                }
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
                progress.set_bytes_read(weights->stats().bytes_read);
                progress.begin_pass(static_cast<int64_t>(seqs.size()), tokens, pass_bytes);
                scores = runner.run(seqs, hidden.get(), [&](const LayerTiming& t) {
                    progress.set_bytes_read(weights->stats().bytes_read);
                    progress.layer_done(t);
                    // Stop mid-pass (nothing of this pass is committed); after the head the pass is
                    // complete and is committed first.
                    if (t.layer != kHeadLayer) throw_if_interrupted();
                });
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
                out.append(format_record(items[i].rec.id_json, scores[static_cast<size_t>(s)], opt.top_k,
                                         refs, items[i].rec.extra_json,
                                         opt.echo_tokens ? &items[i].rec.tokens : nullptr));
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
    } catch (const Interrupted&) {
        // Nothing of the interrupted pass reaches the files: its lines are dropped, its hidden rows cut.
        out.discard();
        if (hidden) hidden->rollback();
        throw Interrupted(resume.records + out.lines_committed());
    } catch (...) {
        // Any other failure: the same clean-up, best effort (the original error is what matters).
        out.discard();
        try {
            if (hidden) hidden->rollback();
        } catch (const std::exception& e) {
            log_warn(std::string("after the error below, cleaning up the hidden files failed: ") + e.what());
        }
        throw;
    }
    sum.seconds = now_s() - t_start;
    return sum;
}

}  // namespace ds4r
