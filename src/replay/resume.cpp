// Output safety and --resume checks (src/replay/resume.h). Nothing here changes a file.
#include "replay/resume.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "ds4r/file_util.h"
#include "ds4r/input.h"
#include "ds4r/log.h"
#include "ds4r/npy.h"
#include "ds4r/output.h"
#include "ds4r/sha256.h"

namespace ds4r {

using json = nlohmann::json;

RunManifest::Input fingerprint_input(const std::string& path) {
    RunManifest::Input in;
    in.path = path;
    struct stat st {};
    if (path == "-" || ::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return in;
    // One read: the hash of the bytes and the non-blank lines (the records, as InputReader counts).
    FileHandle f(path, O_RDONLY);
    Sha256 h;
    std::vector<char> buf(size_t{4} << 20);
    int64_t records = 0;
    bool line_has_text = false;
    for (uint64_t off = 0;;) {
        const size_t n = f.pread_some(buf.data(), buf.size(), off);
        if (n == 0) break;
        h.update(buf.data(), n);
        for (size_t i = 0; i < n; ++i) {
            const char c = buf[i];
            if (c == '\n') {
                records += line_has_text;
                line_has_text = false;
            } else if (c != ' ' && c != '\t' && c != '\r') {
                line_has_text = true;
            }
        }
        off += n;
    }
    in.sha256 = h.hex_digest();
    in.records = records + line_has_text;
    return in;
}

RunManifest make_run_manifest(const ScoreOptions& opt, const ModelConfig& cfg, const std::string& model_dir,
                              int64_t max_seq_len, RunManifest::Input input) {
    RunManifest m;
    m.input = std::move(input);
    m.set_option("top_k", int64_t{opt.top_k});
    std::vector<int> layers = opt.capture_layers;
    std::sort(layers.begin(), layers.end());
    m.set_option("capture_layers", layers);
    m.set_option("hidden_mode", std::string(opt.hidden_mode == HiddenMode::Copies ? "copies" : "mean"));
    m.set_option("max_seq_len", max_seq_len);
    m.set_option("skip_bad", opt.skip_bad);
    m.set_option("echo_tokens", opt.echo_tokens);  // records carry "tokens" unless --no-tokens
    const std::string index = path_join(model_dir, "model.safetensors.index.json");
    m.model.fingerprint =
        model_fingerprint(path_join(model_dir, "config.json"), file_exists(index) ? index : "");
    m.model.n_layers = cfg.n_layers;
    m.model.vocab = cfg.vocab_size;
    if (!opt.capture_layers.empty()) {
        m.hidden.dir = opt.hidden_dir;
        for (int L : layers) {
            const HiddenLayout l =
                hidden_layout(opt.hidden_mode, L, static_cast<int>(cfg.n_layers), cfg.dim, cfg.hc_mult);
            m.hidden.layers[L] = {l.descr, l.row_shape};
        }
    }
    return m;
}

namespace {

// The records of an existing results file, and what they show of the run that wrote them.
struct ScannedOutput {
    std::vector<ExistingRecord> records;
    uint64_t committed_bytes = 0, file_bytes = 0;
    std::map<int, int64_t> hidden_rows;
    // From the scored records: top-k width and captured layers (checked against this run).
    std::set<int64_t> topk_widths;
    std::set<std::vector<int>> layer_sets;
    int64_t first_scored = -1;  // record index of the first scored record (for messages)
};

void note_record(ScannedOutput& st, const std::string& line, const std::string& path, int64_t line_no) {
    const std::string where = strfmt("%s:%lld: ", path.c_str(), (long long)line_no);
    json v;
    try {
        v = json::parse(line);
    } catch (const json::exception&) {
        throw InputError(
            where + "existing results line is not valid JSON; cannot resume (remove the line or the file)");
    }
    if (!v.is_object() || !v.contains("id"))
        throw InputError(where + "existing results line has no \"id\"; cannot resume");
    ExistingRecord r;
    r.id_json = v.at("id").dump();
    try {
        if (v.contains("error")) {
            r.error = true;
            r.line = v.contains("line") ? v.at("line").get<int64_t>() : 0;
        } else {
            r.n_tokens = v.contains("n_tokens") ? v.at("n_tokens").get<int64_t>() : 0;
            if (v.contains("final") && v.at("final").contains("topk_ids"))
                st.topk_widths.insert(static_cast<int64_t>(v.at("final").at("topk_ids").size()));
            std::vector<int> layers;
            if (v.contains("hidden"))
                for (const auto& h : v.at("hidden")) {
                    const int L = h.at("layer").get<int>();
                    const int64_t end = h.at("rows").at(1).get<int64_t>();
                    st.hidden_rows[L] = std::max(st.hidden_rows[L], end);
                    layers.push_back(L);
                }
            std::sort(layers.begin(), layers.end());
            st.layer_sets.insert(layers);
            if (st.first_scored < 0) st.first_scored = static_cast<int64_t>(st.records.size());
        }
    } catch (const json::exception& e) {
        throw InputError(where + "existing results line has a malformed field; cannot resume (" + e.what() +
                         ")");
    }
    st.records.push_back(std::move(r));
}

// Reads the results file line by line (read-only). A kill mid-write can leave a partial last line (no
// newline): it was never committed; open_outputs cuts it away.
ScannedOutput scan_output(const std::string& path) {
    ScannedOutput st;
    FileHandle f(path, O_RDONLY);
    st.committed_bytes = for_each_line(f, [&](const std::string& line, int64_t line_no) {
        if (line.find_first_not_of(" \t\r") != std::string::npos) note_record(st, line, path, line_no);
    });
    st.file_bytes = f.size();
    return st;
}

std::string layers_text(const std::vector<int>& v) {
    if (v.empty()) return "no --capture-layers";
    std::string s;
    for (int L : v) s += (s.empty() ? "" : ",") + std::to_string(L);
    return "--capture-layers " + s;
}

// What the records show must agree with this run (the only check of an output without a sidecar).
void check_records(const ScannedOutput& st, const ScoreOptions& opt, const std::string& out,
                   std::vector<std::string>& diffs) {
    for (int64_t k : st.topk_widths)
        if (k != opt.top_k)
            diffs.push_back(strfmt("--top-k %d but the output was written with --top-k %lld (%s)", opt.top_k,
                                   (long long)k, out.c_str()));
    std::vector<int> now = opt.capture_layers;
    std::sort(now.begin(), now.end());
    for (const auto& s : st.layer_sets)
        if (s != now)
            diffs.push_back(layers_text(now) + " but the output was written with " + layers_text(s) + " (" +
                            out + ")");
}

// Each hidden file this run writes: its header must have this run's layout and announce at least
// the rows the records reference, and the file must hold them (plus a saved pass's rows).
void check_hidden_files(const ScoreOptions& opt, const ModelConfig& cfg,
                        const std::map<int, int64_t>& referenced, const std::map<int, int64_t>& pending,
                        std::vector<std::string>& diffs) {
    for (int L : opt.capture_layers) {
        const std::string path = path_join(opt.hidden_dir, "hidden_L" + std::to_string(L) + ".npy");
        const int64_t rows = referenced.count(L) ? referenced.at(L) : 0;
        const int64_t extra = pending.count(L) ? pending.at(L) : 0;
        if (!file_exists(path)) {
            if (rows + extra > 0)
                throw RuntimeError(
                    strfmt("%s: missing, but the results file references %lld of its rows; cannot "
                           "resume",
                           path.c_str(), (long long)(rows + extra)));
            continue;
        }
        // No row referenced and none held (a run stopped while creating it): open_layer rewrites it.
        if (rows + extra == 0 && FileHandle(path, O_RDONLY).size() <= kHiddenHeaderBytes) continue;
        NpyHeader h;
        try {
            h = read_npy_header(path);
        } catch (const Error& e) {
            diffs.push_back(std::string(e.what()) + " (a hidden file of this run)");
            continue;
        }
        const HiddenLayout want =
            hidden_layout(opt.hidden_mode, L, static_cast<int>(cfg.n_layers), cfg.dim, cfg.hc_mult);
        const Shape have_row(h.shape.begin() + (h.shape.empty() ? 0 : 1), h.shape.end());
        if (h.descr != want.descr || have_row != want.row_shape || h.shape.empty()) {
            diffs.push_back(strfmt("%s: --hidden-mode %s writes %s %s rows but the file holds %s %s",
                                   path.c_str(), opt.hidden_mode == HiddenMode::Copies ? "copies" : "mean",
                                   want.descr.c_str(), shape_str(want.row_shape).c_str(), h.descr.c_str(),
                                   shape_str(h.shape).c_str()));
            continue;
        }
        const uint64_t need = h.data_offset + static_cast<uint64_t>((rows + extra) * want.row_elems) * 2;
        if (h.data_offset != kHiddenHeaderBytes || h.shape[0] < rows ||
            FileHandle(path, O_RDONLY).size() < need)
            throw RuntimeError(
                strfmt("%s: holds fewer rows than the results file references (%lld); cannot resume",
                       path.c_str(), (long long)(rows + extra)));
    }
}

// The hidden files hold the referenced rows and a saved pass's rows after them.
bool hidden_rows_present(const ScoreOptions& opt, const ModelConfig& cfg,
                         const std::map<int, int64_t>& referenced, const std::map<int, int64_t>& pending) {
    for (const auto& [L, extra] : pending) {
        const std::string path = path_join(opt.hidden_dir, "hidden_L" + std::to_string(L) + ".npy");
        const int64_t rows = referenced.count(L) ? referenced.at(L) : 0;
        const HiddenLayout l =
            hidden_layout(opt.hidden_mode, L, static_cast<int>(cfg.n_layers), cfg.dim, cfg.hc_mult);
        if (opt.hidden_dir.empty() || !file_exists(path) ||
            FileHandle(path, O_RDONLY).size() <
                kHiddenHeaderBytes + static_cast<uint64_t>((rows + extra) * l.row_elems) * 2)
            return false;
    }
    return true;
}

[[noreturn]] void refuse(const std::vector<std::string>& diffs, const std::string& out) {
    std::string msg = "--resume: this is not the run that wrote " + out + ":";
    for (const auto& d : diffs) msg += "\n  " + d;
    msg += "\nrun with the options it was written with, or write a new output (or --overwrite it)";
    throw InputError(msg);
}

}  // namespace

ResumeCursor::Action ResumeCursor::classify(int64_t pos, bool bad, int64_t line, const std::string& id_json,
                                            int64_t n_tokens, const std::string& input_path,
                                            const std::string& output_path) const {
    if (!records_ || pos >= static_cast<int64_t>(records_->size())) return Action::Score;
    const ExistingRecord& r = (*records_)[static_cast<size_t>(pos)];
    const std::string where = strfmt("%s:%lld: ", input_path.c_str(), (long long)line);
    if (r.error) {
        // The same line (or id): the error record stands for it. Now good: score it again.
        if (r.line != line && r.id_json != id_json)
            throw InputError(
                strfmt("%sid %s, but record %lld of %s is the error record of line %lld (id %s): not "
                       "the input the output was written from",
                       where.c_str(), id_json.c_str(), (long long)pos + 1, output_path.c_str(),
                       (long long)r.line, r.id_json.c_str()));
        return bad ? Action::Skip : Action::Retry;
    }
    if (bad || r.id_json != id_json || r.n_tokens != n_tokens)
        throw InputError(strfmt(
            "%s%s, but record %lld of %s is id %s (%lld tokens): not the input the output was "
            "written from",
            where.c_str(),
            bad ? "a bad line" : strfmt("id %s (%lld tokens)", id_json.c_str(), (long long)n_tokens).c_str(),
            (long long)pos + 1, output_path.c_str(), r.id_json.c_str(), (long long)r.n_tokens));
    return Action::Skip;
}

OutputCheck check_outputs(const ScoreOptions& opt, const RunManifest& now, const ModelConfig& cfg,
                          int64_t max_seq_len) {
    OutputCheck oc;
    oc.overwrite = opt.overwrite;
    if (opt.resume && opt.overwrite) throw InputError("--resume and --overwrite exclude each other");
    if (opt.output == "-") return oc;
    struct stat ost {};
    const bool exists = ::stat(opt.output.c_str(), &ost) == 0;
    if (exists && S_ISDIR(ost.st_mode))
        throw RuntimeError(opt.output + ": is a directory, expected the results file");
    if (exists && !S_ISREG(ost.st_mode)) {
        if (opt.resume) throw InputError(opt.output + ": --resume needs a regular results file");
        return oc;  // a FIFO or a device: written, nothing else
    }
    oc.files = true;
    const std::string sidecar = run_manifest_path(opt.output), pass_file = pass_state_path(opt.output);
    std::vector<std::string> hidden_existing;
    for (int L : opt.capture_layers) {
        const std::string p = path_join(opt.hidden_dir, "hidden_L" + std::to_string(L) + ".npy");
        if (file_exists(p)) hidden_existing.push_back(p);
    }

    if (!opt.resume) {
        if (opt.overwrite) return oc;
        if (exists && ost.st_size > 0)
            throw InputError(
                opt.output +
                ": exists and is not empty; use --resume to continue it, --overwrite to replace it, or "
                "remove it");
        for (const auto& p : hidden_existing)
            throw InputError(
                p +
                ": exists (a hidden file this run would write); use --resume to continue the run "
                "that wrote it, --overwrite to replace it, or another --hidden-dir");
        if (file_exists(pass_file))
            throw InputError(pass_file +
                             ": holds a pass saved by an interrupted run; use --resume to continue it, "
                             "or --overwrite to start again");
        return oc;
    }

    // --resume: everything is checked before anything is changed.
    const std::optional<RunManifest> then = read_run_manifest(sidecar);
    ScannedOutput st;
    if (exists) st = scan_output(opt.output);
    std::vector<std::string> diffs;
    if (then) {
        diffs = compare_run_manifests(now, *then);
        if (now.input.sha256.empty() && !then->input.sha256.empty())
            log_warn(
                "resume: the input is not a regular file: its hash cannot be checked; its records are "
                "matched "
                "with the output's by id and length");
        if (now.backend != then->backend && !then->backend.empty() && !now.backend.empty())
            log_warn("resume: the output was written on the " + then->backend + " backend, this run uses " +
                     now.backend + ": its records will come from both (they differ in the last bits)");
        // An input that changed only where --skip-bad wrote error records (the user fixed those lines) is
        // the same run: its other records are matched line by line (ids and lengths) below.
        const bool has_errors = std::any_of(st.records.begin(), st.records.end(),
                                            [](const ExistingRecord& r) { return r.error; });
        if (has_errors && !diffs.empty() && diffs.front().rfind("input ", 0) == 0) {
            log_warn("resume: the input changed since the output was written (" + diffs.front() +
                     "); the error records are retried and the other records must match the input's ids and "
                     "lengths");
            diffs.erase(diffs.begin());
        }
    } else if (!st.records.empty() || !hidden_existing.empty()) {
        log_warn("resume: " + sidecar +
                 " is missing (an output of an older ds4replay, or the sidecar was removed): checking what "
                 "the records "
                 "show (ids in input order, --top-k, --capture-layers, the hidden files' headers); the "
                 "input's hash, "
                 "--max-seq-len and --skip-bad cannot be checked");
        if (st.records.empty())
            for (const auto& p : hidden_existing) {
                // A run killed at its very start (the hidden files are created before the output and
                // its sidecar) leaves them empty or header-only: no row of data to lose; resuming
                // rewrites them. Anything else may be somebody's file.
                const uint64_t size = FileHandle(p, O_RDONLY).size();
                std::string magic(6, '\0');
                if (size > 0) {
                    FileHandle f(p, O_RDONLY);
                    const ssize_t n = ::pread(f.fd(), magic.data(), magic.size(), 0);
                    if (n != static_cast<ssize_t>(magic.size())) magic.clear();
                }
                if (size <= kHiddenHeaderBytes && (size == 0 || magic == std::string("\x93NUMPY", 6))) {
                    log_warn("resume: " + p +
                             " holds no rows (a run stopped before its first output): rewritten");
                    continue;
                }
                throw InputError(
                    p +
                    ": exists, and no results file or sidecar says which run wrote it; remove it, use "
                    "another --hidden-dir, or --overwrite without --resume");
            }
    }
    // The records tell the same where the sidecar agrees (and all there is without one).
    if (!then || diffs.empty()) check_records(st, opt, opt.output, diffs);

    // A pass saved mid-way continues if it starts where the output ends.
    if (file_exists(pass_file)) {
        SavedPass sp = read_pass_header(pass_file);
        std::vector<std::string> pass_diffs;
        try {
            pass_diffs = compare_run_manifests(now, parse_run_manifest(sp.manifest_json, pass_file),
                                               "the pass was saved with");
        } catch (const InputError& e) {
            pass_diffs.push_back(e.what());
        }
        if (sp.records_before != static_cast<int64_t>(st.records.size())) {
            // Saved, then resumed and committed, before a crash removed the file: it is spent.
            log_warn(strfmt(
                "resume: %s was saved after %lld records, the output holds %lld: it is out of date and "
                "is removed",
                pass_file.c_str(), (long long)sp.records_before, (long long)st.records.size()));
            oc.stale_pass_file = true;
        } else if (!pass_diffs.empty() && diffs.empty()) {
            for (auto& d : pass_diffs) diffs.push_back(pass_file + ": " + d);
        } else if (!hidden_rows_present(opt, cfg, st.hidden_rows, sp.hidden_pending())) {
            // The pass ran again from its start (out of memory) and dropped its rows before a crash.
            log_warn("resume: " + pass_file +
                     ": the hidden files no longer hold the saved pass's rows: it is removed "
                     "and the pass runs again from its start");
            oc.stale_pass_file = true;
        } else {
            for (const auto& [L, rows] : sp.hidden_committed)
                if ((st.hidden_rows.count(L) ? st.hidden_rows.at(L) : 0) != rows)
                    diffs.push_back(
                        strfmt("%s: hidden_L%d.npy had %lld rows when the pass was saved, the records "
                               "reference %lld",
                               pass_file.c_str(), L, (long long)rows,
                               (long long)(st.hidden_rows.count(L) ? st.hidden_rows.at(L) : 0)));
            oc.saved_pass = std::move(sp);
        }
    }
    if (!diffs.empty()) refuse(diffs, opt.output);
    check_hidden_files(opt, cfg, st.hidden_rows,
                       oc.saved_pass ? oc.saved_pass->hidden_pending() : std::map<int, int64_t>{}, diffs);
    if (!diffs.empty()) refuse(diffs, opt.output);

    // A regular input is matched with the records now (a pipe as it is read).
    if (!st.records.empty() && !now.input.sha256.empty()) {
        InputReader r(opt.input, cfg.vocab_size, max_seq_len);
        ResumeCursor cursor(&st.records);
        InputRecord rec;
        std::set<std::string> seen;  // a repeated id is a bad line (as in the score loop)
        // --shard: the output's records start at the shard's first input record (earlier records are
        // read for their ids only, as in the score loop).
        for (int64_t i = 0; now.shard && i < now.shard->first_record; ++i) {
            try {
                if (r.next(rec)) seen.insert(rec.id_json);
            } catch (const InputError&) {
            }
        }
        for (int64_t pos = 0; pos < static_cast<int64_t>(st.records.size()); ++pos) {
            std::string bad_id;
            bool bad = false, got = true;
            try {
                got = r.next(rec, &bad_id);
                if (got && !seen.insert(rec.id_json).second) {
                    bad_id = rec.id_json;
                    throw InputError("duplicate id");
                }
            } catch (const InputError&) {
                bad = true;
                rec.line = r.line();
                rec.id_json = bad_id.empty() ? std::to_string(r.line()) : bad_id;
                rec.tokens.clear();
            }
            if (!got)
                throw InputError(strfmt(
                    "%s holds %lld records, the input %s only %lld: not the input the output "
                    "was written from",
                    opt.output.c_str(), (long long)st.records.size(), opt.input.c_str(), (long long)pos));
            cursor.classify(pos, bad, rec.line, rec.id_json, static_cast<int64_t>(rec.tokens.size()),
                            opt.input, opt.output);
        }
    }
    oc.records = std::move(st.records);
    oc.committed_bytes = st.committed_bytes;
    oc.file_bytes = st.file_bytes;
    oc.hidden_rows = std::move(st.hidden_rows);
    return oc;
}

}  // namespace ds4r
