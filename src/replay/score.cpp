// The score job: input -> passes -> durable results (docs/DESIGN.md sections 2, 5, 6). The steps:
// check the options and the model, check the outputs (read-only, src/replay/resume.cpp), set up the
// backend, open the outputs (the first change to any file), then per pass: collect, run, commit. An
// interrupt mid-pass saves the pass at the layer boundary (src/replay/pass_state.cpp).
#include "ds4r/score.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "ds4r/borrowed_host_memory.h"
#include "ds4r/checkpoint.h"
#include "ds4r/clock.h"
#include "ds4r/engram.h"
#include "ds4r/file_util.h"
#include "ds4r/input.h"
#include "ds4r/log.h"
#include "ds4r/model.h"
#include "ds4r/output.h"
#include "ds4r/progress.h"
#include "ds4r/shard.h"
#include "ds4r/zero_weights.h"
#include "io/fanout_weight_source.h"
#include "replay/multi_device_runner.h"
#include "replay/pass_state.h"
#include "replay/resume.h"

namespace ds4r {

namespace {

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

// --seed-check: the Engram multipliers come from numpy.random.default_rng(10007 * layer) (docs/MODEL.md
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
                       "published values (docs/MODEL.md 4.2)",
                       L, vals.c_str()));
        } else {
            log_info(
                strfmt("seed check: layer %d multipliers [%s] equal the released model's", L, vals.c_str()));
        }
    }
}

// The options that need no model.
void check_options(const ScoreOptions& opt) {
    if (opt.resume && opt.output == "-")
        throw InputError("--resume needs --output FILE (it cannot continue stdout)");
    if (opt.overwrite && opt.resume) throw InputError("--resume and --overwrite exclude each other");
    if (opt.top_k < 0 || opt.top_k > 1024) throw InputError("--top-k must be in [0, 1024]");
    if (!opt.capture_layers.empty() && opt.hidden_dir.empty())
        throw InputError("--capture-layers needs --hidden-dir DIR");
    if (opt.capture_layers.empty() && !opt.hidden_dir.empty())
        throw InputError(
            "--hidden-dir needs --capture-layers L,... (the layers whose hidden states to save)");
    if (opt.input != "-" && opt.output != "-" && same_file(opt.input, opt.output))
        throw InputError(opt.output + ": the output file is the input file");
}

// The options checked against the model; returns the longest accepted sequence.
int64_t check_options_against_model(const ScoreOptions& opt, const Checkpoint& ckpt) {
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
    return max_len;
}

// Pass size: host state ~ hc*D*2 + hashes per token (<= 64 KB, docs/DESIGN.md 5), half of MemAvailable.
int64_t pass_tokens_for(const ScoreOptions& opt, const ModelConfig& cfg) {
    if (opt.pass_tokens > 0) return opt.pass_tokens;
    const int64_t host_per_token = pass_host_bytes_per_token(cfg, opt.io.engram_next_pass);
    const uint64_t avail = mem_available_bytes();
    const int64_t n = avail ? static_cast<int64_t>(avail / 2) / host_per_token : (1 << 20);
    return std::clamp<int64_t>(n, 1024, 1 << 20);
}

std::string thousands(int64_t v) {
    std::string s = std::to_string(v), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

// One input record of a pass, in input order; bad lines (--skip-bad) keep their place.
struct PassItem {
    int64_t pos = 0;  // input record position (0-based among non-blank lines)
    bool bad = false;
    InputRecord rec;
    std::string error;
    int64_t replaces = -1;  // a retried error record: the output record it replaces
};

struct Pass {
    std::vector<PassItem> items;
    std::vector<std::vector<int32_t>> seqs;  // the scored items' tokens
    std::vector<int> seq_of_item;            // item -> index into seqs (-1: bad)
    int64_t tokens = 0;
    uint64_t bytes = 0;       // input bytes of the scored items (progress)
    int64_t max_len = 0;      // its longest sequence
    int64_t arena_bytes = 0;  // backend bytes of its sequences' arenas (seq_arena_bytes; RoPE tables apart)
};

// What runs the passes: one PassRunner (--device) or the multi-device runner (--devices).
struct PassEngine {
    PassRunner* single = nullptr;
    MultiDeviceRunner* multi = nullptr;
    std::function<uint64_t()> bytes_read;  // weight bytes read so far (progress)
    // Backend memory a pass's arenas may take (pass_arena_room; --devices: the workers' together)
    uint64_t arena_room = UINT64_MAX;
    int64_t chunk_rows() const { return single ? single->chunk_rows() : multi->chunk_rows(); }
};

// A score run: its files, its runner and its place in the input.
class ScoreJob {
public:
    ScoreJob(const ScoreOptions& opt, const ModelConfig& cfg, InputReader& reader, const OutputCheck& check,
             RunManifest manifest)
        : opt_(opt),
          cfg_(cfg),
          reader_(reader),
          check_(check),
          manifest_(std::move(manifest)),
          cursor_(&check.records) {}

    // --shard: only the plan's records are scored (earlier ones are read for their ids only).
    void restrict_to(const ShardPlan& plan) { shard_ = plan; }
    // --devices: a pass saved mid-way cannot be continued (its state is one runner's); it runs again
    // from its start. Call before open_outputs.
    void set_multi_device() { multi_device_ = true; }
    // Opens the output, the hidden files and writes the sidecar: the first step that changes a file.
    void open_outputs();
    void run(const PassEngine& engine, Progress& progress, ScoreSummary& sum);

private:
    // Reads input records into a pass: up to `pass_tokens` tokens and as many sequences as their arenas
    // fit in arena_room (at least one) (the one that would not fit waits for the next pass: pending_);
    // or (a saved pass) through position `last_pos`. Records already in the output are skipped.
    Pass collect_pass(int64_t pass_tokens, uint64_t arena_room, int64_t last_pos, Progress& progress,
                      ScoreSummary& sum);
    void add_scored(Pass& pass, PassItem it, uint64_t line_bytes) const;
    // The saved pass must be this pass: same items, same tokens.
    void check_saved_pass(const Pass& pass, const SavedPass& saved) const;
    void commit_pass(const Pass& pass, const std::vector<SequenceScores>& scores, ScoreSummary& sum);
    // Ctrl-C mid-pass: the pass's state after its last completed layer, to <output>.pass. Returns the
    // message part ("pass of ... saved at layer 3 of 6"), or "" when nothing could be saved.
    std::string save_pass_in_flight(const Pass& pass, PassRunner& runner);
    int64_t records_in_output() const {
        return static_cast<int64_t>(check_.records.size()) + out_->lines_committed();
    }

    const ScoreOptions& opt_;
    const ModelConfig& cfg_;
    InputReader& reader_;
    const OutputCheck& check_;
    RunManifest manifest_;
    ResumeCursor cursor_;
    std::unique_ptr<ResultWriter> out_;
    std::unique_ptr<HiddenNpyWriter> hidden_;
    std::unordered_map<std::string, int64_t> seen_;  // id -> line (duplicate detection)
    int64_t next_pos_ = 0;                           // next input record position
    bool eof_ = false;
    // A record read for a pass that its arenas did not fit: the next pass's first (classified already)
    struct Pending {
        PassItem item;
        uint64_t line_bytes = 0;
    };
    std::optional<Pending> pending_;
    std::optional<ShardPlan> shard_;  // --shard: next_pos_ counts from its first record
    int64_t input_record_ = 0;        // records read from the input (all shards')
    bool pass_file_ = false;          // <output>.pass exists (saved by an earlier run, continued by this one)
    bool multi_device_ = false;       // --devices (set_multi_device)
    const SavedPass* saved_pass() const {
        return check_.saved_pass && !multi_device_ ? &*check_.saved_pass : nullptr;
    }
};

void ScoreJob::open_outputs() {
    const std::string pass_file = pass_state_path(opt_.output);
    if (check_.files && (check_.overwrite || check_.stale_pass_file) && file_exists(pass_file)) {
        // Replaced (--overwrite) or spent: a saved pass of an earlier run (ours to remove).
        if (::unlink(pass_file.c_str()) != 0)
            throw RuntimeError(
                strfmt("%s: cannot remove (%s)", pass_file.c_str(), errno_text(errno).c_str()));
        fsync_parent_dir(pass_file);
    }
    if (check_.saved_pass && multi_device_) {
        // Its rows in the hidden files are cut back below (open_layer keeps no pending rows).
        log_warn(strfmt("%s: --devices cannot continue a pass saved mid-way: it runs again from its start",
                        pass_file.c_str()));
        if (::unlink(pass_file.c_str()) != 0 && errno != ENOENT)
            throw RuntimeError(
                strfmt("%s: cannot remove (%s)", pass_file.c_str(), errno_text(errno).c_str()));
        fsync_parent_dir(pass_file);
    }
    pass_file_ = saved_pass() != nullptr;
    // Hidden files first: a hidden dir that cannot be made stops the run before the output exists.
    if (!opt_.capture_layers.empty()) {
        hidden_ = std::make_unique<HiddenNpyWriter>(opt_.hidden_dir, static_cast<int>(cfg_.n_layers),
                                                    opt_.hidden_mode, cfg_.dim, cfg_.hc_mult);
        const std::map<int, int64_t> pending =
            saved_pass() ? saved_pass()->hidden_pending() : std::map<int, int64_t>{};
        for (int L : opt_.capture_layers) {
            auto it = check_.hidden_rows.find(L);
            auto pt = pending.find(L);
            hidden_->open_layer(L, it == check_.hidden_rows.end() ? 0 : it->second,
                                pt == pending.end() ? 0 : pt->second);
        }
        if (saved_pass()) hidden_->restore_refs(saved_pass()->hidden_refs);
    }
    // The output opened (appending) before the sidecar: a path that cannot be written fails here.
    out_ = std::make_unique<ResultWriter>(opt_.output);
    if (check_.files) {
        write_run_manifest(run_manifest_path(opt_.output), manifest_);
        // --overwrite starts it empty; a kill mid-write can leave a partial last line (never committed).
        const uint64_t keep = check_.overwrite ? 0 : check_.committed_bytes;
        if (check_.overwrite || check_.file_bytes > keep) {
            if (!check_.overwrite)
                log_warn(strfmt("%s: dropping an incomplete last line (%llu bytes) before resuming",
                                opt_.output.c_str(), (unsigned long long)(check_.file_bytes - keep)));
            FileHandle f(opt_.output, O_RDWR);
            if (::ftruncate(f.fd(), static_cast<off_t>(keep)) != 0)
                throw RuntimeError(
                    strfmt("%s: cannot truncate (%s)", opt_.output.c_str(), errno_text(errno).c_str()));
            f.fsync_or_throw();
        }
    }
    if (!check_.records.empty())
        log_info(strfmt("resume: %lld records already in %s", (long long)check_.records.size(),
                        opt_.output.c_str()));
}

void ScoreJob::add_scored(Pass& pass, PassItem it, uint64_t line_bytes) const {
    const auto len = static_cast<int64_t>(it.rec.tokens.size());
    pass.tokens += len;
    pass.bytes += line_bytes;
    pass.max_len = std::max(pass.max_len, len);
    pass.arena_bytes += seq_arena_bytes(cfg_, len);
    pass.items.push_back(std::move(it));
}

Pass ScoreJob::collect_pass(int64_t pass_tokens, uint64_t arena_room, int64_t last_pos, Progress& progress,
                            ScoreSummary& sum) {
    Pass pass;
    if (pending_) {
        add_scored(pass, std::move(pending_->item), pending_->line_bytes);
        pending_.reset();
    }
    while (!eof_ && (last_pos >= 0 ? next_pos_ <= last_pos : pass.tokens < pass_tokens)) {
        if (shard_ && input_record_ >= shard_->end_record()) {  // the rest is later shards'
            eof_ = true;
            break;
        }
        PassItem it;
        std::string bad_id;
        const uint64_t b0 = reader_.bytes_consumed();
        try {
            if (!reader_.next(it.rec, &bad_id)) {
                eof_ = true;
                break;
            }
            auto [at, fresh] = seen_.emplace(it.rec.id_json, it.rec.line);
            if (!fresh)
                throw InputError(strfmt("%s:%lld: duplicate id %s (first on line %lld)",
                                        reader_.path().c_str(), (long long)it.rec.line,
                                        it.rec.id_json.c_str(), (long long)at->second));
        } catch (const InputError& e) {
            if (!opt_.skip_bad) throw;
            it.bad = true;
            it.error = e.what();
            it.rec.line = reader_.line();
            it.rec.id_json = bad_id.empty() ? std::to_string(reader_.line()) : bad_id;
            it.rec.tokens.clear();
        }
        if (shard_ && input_record_++ < shard_->first_record) {  // an earlier shard's record
            progress.skip_input(reader_.bytes_consumed() - b0);
            continue;
        }
        it.pos = next_pos_++;
        const uint64_t line_bytes = reader_.bytes_consumed() - b0;
        switch (cursor_.classify(it.pos, it.bad, it.rec.line, it.rec.id_json,
                                 static_cast<int64_t>(it.rec.tokens.size()), reader_.path(), opt_.output)) {
            case ResumeCursor::Action::Skip:
                ++sum.resumed;
                progress.skip_input(line_bytes);
                continue;
            case ResumeCursor::Action::Retry:
                it.replaces = it.pos;
                log_info(
                    strfmt("resume: %s:%lld (id %s) is good now: scoring it in place of its error record",
                           reader_.path().c_str(), (long long)it.rec.line, it.rec.id_json.c_str()));
                break;
            case ResumeCursor::Action::Score:
                break;
        }
        if (it.bad) {
            ++sum.bad_lines;
            log_warn(std::string("skipping: ") + it.error);
            progress.skip_input(line_bytes);
            pass.items.push_back(std::move(it));
            continue;
        }
        // The backend holds every sequence's attention arenas for the whole pass: a sequence they would
        // not fit next to the others starts the next pass (a saved pass is rebuilt as it was).
        const auto len = static_cast<int64_t>(it.rec.tokens.size());
        if (last_pos < 0 && pass.tokens > 0 &&
            static_cast<uint64_t>(pass.arena_bytes + seq_arena_bytes(cfg_, len) +
                                  pass_rope_bytes(cfg_, std::max(pass.max_len, len))) > arena_room) {
            pending_ = Pending{std::move(it), line_bytes};
            break;
        }
        add_scored(pass, std::move(it), line_bytes);
    }
    pass.seq_of_item.assign(pass.items.size(), -1);
    for (size_t i = 0; i < pass.items.size(); ++i)
        if (!pass.items[i].bad) {
            pass.seq_of_item[i] = static_cast<int>(pass.seqs.size());
            pass.seqs.push_back(pass.items[i].rec.tokens);
        }
    return pass;
}

void ScoreJob::check_saved_pass(const Pass& pass, const SavedPass& saved) const {
    std::vector<SavedPass::Item> items;
    for (const PassItem& it : pass.items) items.push_back({it.pos, it.rec.id_json, it.bad, it.replaces});
    if (items != saved.items || pass.seqs != saved.tokens)
        throw InputError(
            pass_state_path(opt_.output) +
            ": the saved pass is not the input's next pass (its ids or tokens differ); remove the file to "
            "run that pass again from its start");
}

void ScoreJob::commit_pass(const Pass& pass, const std::vector<SequenceScores>& scores, ScoreSummary& sum) {
    std::map<int64_t, std::string> replaced;  // retried error records
    for (size_t i = 0; i < pass.items.size(); ++i) {
        const PassItem& it = pass.items[i];
        if (it.bad) {
            out_->append(format_error_record(it.rec.id_json, it.rec.line, it.error));
            continue;
        }
        const int s = pass.seq_of_item[i];
        std::vector<HiddenRef> refs = hidden_ ? hidden_->refs_for(s) : std::vector<HiddenRef>{};
        std::string record = format_record(it.rec.id_json, scores[static_cast<size_t>(s)], opt_.top_k, refs,
                                           it.rec.extra_json, opt_.echo_tokens ? &it.rec.tokens : nullptr);
        if (it.replaces >= 0)
            replaced[it.replaces] = std::move(record);
        else
            out_->append(record);
        ++sum.sequences;
        sum.tokens += static_cast<int64_t>(it.rec.tokens.size());
    }
    // Hidden rows first, then the records that reference them: a crash in between leaves
    // unreferenced rows that --resume cuts away, never a record pointing at missing rows.
    if (hidden_) {
        hidden_->commit();
        hidden_->clear_refs();
    }
    out_->commit_replacing(replaced);
    // The saved pass is now in the output: its file is spent (a crash before this unlink leaves a
    // stale file that --resume recognizes by its record count and removes).
    if (pass_file_) {
        const std::string pass_file = pass_state_path(opt_.output);
        if (::unlink(pass_file.c_str()) != 0 && errno != ENOENT)
            throw RuntimeError(
                strfmt("%s: cannot remove (%s)", pass_file.c_str(), errno_text(errno).c_str()));
        fsync_parent_dir(pass_file);
        pass_file_ = false;
    }
}

std::string ScoreJob::save_pass_in_flight(const Pass& pass, PassRunner& runner) {
    const int layer = runner.next_layer();
    if (!check_.files || pass.seqs.empty() || layer < 1 || layer > cfg_.n_layers) return "";
    SavedPass sp;
    sp.manifest_json = run_manifest_to_json(manifest_);
    sp.records_before = records_in_output();
    sp.next_layer = layer;
    sp.n_layers = static_cast<int>(cfg_.n_layers);
    for (const PassItem& it : pass.items) sp.items.push_back({it.pos, it.rec.id_json, it.bad, it.replaces});
    sp.tokens = pass.seqs;
    if (hidden_) {
        hidden_->sync_data();  // the rows captured so far stay in the files, after the committed ones
        sp.hidden_committed = hidden_->committed_rows();
        sp.hidden_refs = hidden_->pending_refs();
    }
    const std::string path = pass_state_path(opt_.output);
    try {
        save_pass_state(path, sp, runner);
    } catch (const std::exception& e) {
        log_warn(std::string("saving the pass in flight failed (it is dropped): ") + e.what());
        return "";
    }
    pass_file_ = true;
    return strfmt("pass of %s sequences / %s tokens saved at layer %d of %lld",
                  thousands((int64_t)pass.seqs.size()).c_str(), thousands(pass.tokens).c_str(), layer,
                  (long long)cfg_.n_layers);
}

void ScoreJob::run(const PassEngine& engine, Progress& progress, ScoreSummary& sum) {
    const int64_t pass_tokens = pass_tokens_for(opt_, cfg_);
    // A pass ends before --pass-tokens (or the host memory's share) where its sequences' attention arenas
    // would not fit the backend memory left beside the weight slots and the chunks.
    const uint64_t arena_room = opt_.arena_room_for_tests > 0 ? opt_.arena_room_for_tests : engine.arena_room;
    log_info(strfmt("chunks of <= %lld rows, passes of <= %lld tokens%s", (long long)engine.chunk_rows(),
                    (long long)pass_tokens,
                    arena_room < UINT64_MAX
                        ? strfmt(" and <= %.2f GB of attention arenas (%.1f KB per token of a 4,096-token "
                                 "sequence)",
                                 static_cast<double>(arena_room) / 1e9,
                                 static_cast<double>(seq_arena_bytes(cfg_, 4096)) / 4096 / 1024)
                              .c_str()
                        : ""));
    const SavedPass* saved = saved_pass();
    // The input is read one pass ahead when the next pass's Engram rows are gathered during the current
    // pass (--engram-next-pass; include/ds4r/engram_io.h). Reading ahead changes no output: a pass is
    // committed only after it ran, and an input error of the pass read ahead surfaces when that pass
    // would have been read (after the current one is committed).
    // (--devices: each worker gathers its own share of a pass; no next-pass gather there yet.)
    const bool read_ahead = engine.single && !cfg_.engram_layer_ids.empty() &&
                            opt_.io.engram_next_pass != EngramNextPassMode::Off;
    Pass pass, ahead;
    bool have_ahead = false;
    std::exception_ptr ahead_error;
    try {
        while (!eof_ || have_ahead || pending_) {
            throw_if_interrupted();  // between passes: everything so far is committed
            if (have_ahead) {
                have_ahead = false;
                if (ahead_error) std::rethrow_exception(ahead_error);
                pass = std::move(ahead);
                ahead = Pass{};
            } else {
                pass = collect_pass(pass_tokens, arena_room, saved ? saved->items.back().pos : -1, progress,
                                    sum);
            }
            if (pass.items.empty()) break;
            if (read_ahead && (!eof_ || pending_) && !pass.seqs.empty()) {
                try {
                    ahead = collect_pass(pass_tokens, arena_room, -1, progress, sum);
                } catch (...) {
                    ahead_error = std::current_exception();
                }
                have_ahead = true;
            }
            if (engine.single)
                engine.single->set_next_pass(
                    have_ahead && !ahead_error ? ahead.seqs : std::vector<std::vector<int32_t>>{});
            PassRunner::Continuation cont;
            if (saved) {
                check_saved_pass(pass, *saved);
                cont.next_layer = saved->next_layer;
                cont.load = [&](PassRunner& r) { load_pass_state(pass_state_path(opt_.output), *saved, r); };
                log_info(strfmt("resume: continuing the saved pass of %zu sequences at layer %d",
                                pass.seqs.size(), saved->next_layer));
            }
            std::vector<SequenceScores> scores;
            if (!pass.seqs.empty()) {
                progress.set_bytes_read(engine.bytes_read());
                progress.begin_pass(static_cast<int64_t>(pass.seqs.size()), pass.tokens, pass.bytes);
                auto on_layer = [&](const LayerTiming& t) {
                    progress.set_bytes_read(engine.bytes_read());
                    progress.layer_done(t);
                    if (opt_.on_layer_for_tests) opt_.on_layer_for_tests(t);
                    // Stop at the layer boundary (the pass is saved, see below); after the head
                    // the pass is complete and is committed first.
                    if (t.layer != kHeadLayer) throw_if_interrupted();
                };
                scores = engine.single
                             ? engine.single->run(pass.seqs, hidden_.get(), on_layer, saved ? &cont : nullptr)
                             : engine.multi->run(pass.seqs, hidden_.get(), on_layer);
                progress.end_pass();
                ++sum.passes;
            }
            saved = nullptr;
            commit_pass(pass, scores, sum);
            pass = Pass{};
        }
    } catch (const Interrupted&) {
        // The pass in flight is saved at the layer boundary; its lines never reach the output. If it
        // cannot be saved, its hidden rows are cut back too.
        out_->discard();
        std::string saved_text;
        if (engine.single)
            saved_text = save_pass_in_flight(pass, *engine.single);
        else if (!pass.seqs.empty())
            log_warn("--devices: the pass in flight is dropped (its sequences run again with --resume)");
        // A saved pass (this one, or an earlier run's not yet continued) keeps its rows in the files.
        if (hidden_) {
            if (pass_file_) {
                hidden_->sync_data();
                hidden_->clear_refs();
            } else {
                hidden_->rollback();
            }
        }
        throw Interrupted(records_in_output(), saved_text);
    } catch (...) {
        // Any other failure: the same clean-up, best effort (the original error is what matters).
        out_->discard();
        try {
            if (hidden_ && !pass_file_) hidden_->rollback();  // a saved pass's rows stay with it
        } catch (const std::exception& e) {
            log_warn(std::string("after the error below, cleaning up the hidden files failed: ") + e.what());
        }
        throw;
    }
}

}  // namespace

ScoreSummary run_score(const ScoreOptions& opt) {
    const double t_start = now_s();
    check_options(opt);
    Checkpoint ckpt = Checkpoint::open(opt.model_dir);
    const ModelConfig& cfg = ckpt.config();
    const int64_t max_len = check_options_against_model(opt, ckpt);

    // Input and output problems surface before the (slow) backend and table setup, and before any
    // file is changed.
    InputReader reader(opt.input, cfg.vocab_size, max_len);
    if (!opt.skip_bad && opt.input != "-") validate_whole_input(opt.input, cfg.vocab_size, max_len);
    RunManifest manifest = make_run_manifest(opt, cfg, ckpt.dir(), max_len, fingerprint_input(opt.input));
    std::optional<ShardPlan> shard;  // --shard: this run scores records [first, end) of the input
    if (opt.shard.enabled()) {
        shard = plan_shard(opt.input, cfg.vocab_size, max_len, opt.shard);
        log_info(describe_shard_plan(*shard));
        manifest.shard = shard_manifest_entry(*shard);
    }
    const OutputCheck check = check_outputs(opt, manifest, cfg, max_len);

    auto engram = load_engram_resources(ckpt, opt.io);
    if (opt.seed_check) check_engram_seeds(cfg);
    // One backend per worker: --device (one), or --devices (each entry; an index may repeat).
    const bool multi = !opt.devices.empty();
    std::vector<std::unique_ptr<Backend>> bes;
    const auto kernels = parse_gpu_kernels(opt.kernels);
    if (!multi) bes.push_back(select_backend(opt.backend, opt.device, opt.gpu_memory_gb, kernels));
    for (int d : opt.devices) {
        bes.push_back(select_backend(opt.backend, d, opt.gpu_memory_gb, kernels));
        bes.back()->set_fp16_weights(opt.fp16_weights);
        // Every worker on the same kind of backend: the bytes must equal a one-device run's.
        if (bes.back()->host_memory() != bes.front()->host_memory())
            throw InputError(strfmt("--devices: device %d gives the %s backend, device %d the %s backend", d,
                                    bes.back()->name().c_str(), opt.devices.front(),
                                    bes.front()->name().c_str()));
    }
    Backend& be = *bes.front();
    be.set_fp16_weights(opt.fp16_weights);
    std::string names;
    for (const auto& b : bes) names += (names.empty() ? "" : ", ") + b->name();
    log_info((multi ? strfmt("backends (%zu workers): ", bes.size()) : std::string("backend: ")) + names);
    manifest.backend = be.name();

    ScoreJob job(opt, cfg, reader, check, manifest);
    if (shard) job.restrict_to(*shard);
    if (multi) job.set_multi_device();
    job.open_outputs();

    ReplayOptions ro;
    ro.top_k = std::max(opt.top_k, 1);  // --top-k 0: computed as 1, not written
    ro.capture_layers = opt.capture_layers;
    ro.hidden_mode = opt.hidden_mode;
    Progress progress(opt.progress, static_cast<int>(cfg.n_layers));
    progress.set_input_size(reader.size_bytes());
    auto on_chunk = [&](int layer, int64_t done, int64_t total) { progress.chunk_done(layer, done, total); };
    ScoreSummary sum;
    sum.backend = multi ? names : be.name();
    if (!multi) {
        ro.chunk_rows = plan_chunk_rows(opt.chunk_rows, be, cfg, be.free_memory(), weight_slots_bytes(ckpt),
                                        opt.prepared_experts);
        // Layer L+1 is read (and uploaded) while layer L computes.
        auto weights = make_prefetch_weight_source(be, ckpt, prefetch_options(opt.io));
        PassRunner runner(be, ckpt, *weights, engram.get(), ro);
        runner.set_on_chunk(on_chunk);
        uint64_t room = pass_arena_room(be, cfg, ro.chunk_rows);
        room -= plan_prepared_experts(be, cfg, room, opt.prepared_experts);
        job.run(PassEngine{&runner, nullptr, [&] { return weights->stats().bytes_read; }, room}, progress,
                sum);
    } else {
        // One reader for every worker: each layer is read once into host memory (the prefetching
        // source in direct mode, layer L+1 while L computes; pinned memory of the first GPU when the
        // workers are GPUs) and handed to every worker's backend.
        auto host_be = be.host_memory() ? make_cpu_backend() : make_cpu_backend_with_host_memory_of(be);
        PrefetchOptions po = prefetch_options(opt.io);
        po.mode = PrefetchOptions::Mode::Direct;
        std::vector<Backend*> targets;
        std::vector<ReplayOptions> ros;
        const uint64_t copies = weight_slots_bytes(ckpt);  // a worker's copies of the current and next layer
        for (const auto& b : bes) {
            targets.push_back(b.get());
            b->use_on_this_thread();  // free_memory asks the current device
            ros.push_back(ro);
            ros.back().chunk_rows =
                plan_chunk_rows(opt.chunk_rows, *b, cfg, b->free_memory(), copies, opt.prepared_experts);
        }
        FanoutWeightSource weights(make_prefetch_weight_source(*host_be, ckpt, po), ckpt, targets);
        MultiDeviceRunner runner(targets, opt.devices, ckpt, weights, engram.get(), ros);
        runner.set_on_chunk(on_chunk);
        if (opt.on_worker_layer_for_tests) runner.set_worker_hook_for_tests(opt.on_worker_layer_for_tests);
        // The workers split a pass by tokens (balanced): each holds about its share of the arenas, beside
        // its copies of the current and the next layer (made as the pass reaches them, so not yet in use).
        uint64_t room = UINT64_MAX;
        for (size_t w = 0; w < bes.size(); ++w) {
            bes[w]->use_on_this_thread();
            uint64_t r = pass_arena_room(*bes[w], cfg, ros[w].chunk_rows);
            r = r > copies ? r - copies : 0;
            r -= plan_prepared_experts(*bes[w], cfg, r, opt.prepared_experts);
            room = std::min(room, r);
        }
        bes.front()->use_on_this_thread();
        job.run(PassEngine{nullptr, &runner, [&] { return weights.stats().bytes_read; },
                           room * static_cast<uint64_t>(bes.size())},
                progress, sum);
    }
    sum.seconds = now_s() - t_start;
    return sum;
}

}  // namespace ds4r
