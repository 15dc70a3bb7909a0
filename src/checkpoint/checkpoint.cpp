// Checkpoint directory: open + validate (docs/DESIGN.md 6), tensor lookup, per-layer read plans.
#include "ds4r/checkpoint.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <new>
#include <set>
#include <unordered_set>

#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/safetensors.h"

namespace ds4r {

std::vector<ByteRun> merge_byte_runs(std::vector<const TensorLocation*> tensors, uint64_t max_gap) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorLocation* a, const TensorLocation* b) {
        if (a->shard != b->shard) return a->shard < b->shard;
        if (a->offset != b->offset) return a->offset < b->offset;
        return a->nbytes < b->nbytes;
    });
    std::vector<ByteRun> runs;
    for (const TensorLocation* t : tensors) {
        const uint64_t end = t->offset + t->nbytes;
        // Sorted by offset, so t starts at or after the current run's begin; it joins the run when it
        // starts inside it or at most max_gap bytes after its end.
        if (!runs.empty() && runs.back().shard == t->shard &&
            (t->offset <= runs.back().end || t->offset - runs.back().end <= max_gap)) {
            runs.back().end = std::max(runs.back().end, end);
            runs.back().tensors.push_back(t);
            continue;
        }
        ByteRun r;
        r.shard = t->shard;
        r.begin = t->offset;
        r.end = end;
        r.tensors.push_back(t);
        runs.push_back(std::move(r));
    }
    return runs;
}

namespace {

// Problems found while validating; reported together (up to kShown of them) in one CheckpointError.
class Problems {
public:
    explicit Problems(std::string dir) : dir_(std::move(dir)) {}
    void add(std::string msg) {
        ++count_;
        if (msgs_.size() < kShown) msgs_.push_back(std::move(msg));
    }
    bool any() const { return count_ > 0; }
    void throw_if_any() const {
        if (count_ == 0) return;
        if (count_ == 1) throw CheckpointError(msgs_[0]);
        std::string m = strfmt("%s: checkpoint is invalid (%zu problems):", dir_.c_str(), count_);
        for (const auto& s : msgs_) m += "\n  - " + s;
        if (count_ > msgs_.size()) m += strfmt("\n  ... and %zu more", count_ - msgs_.size());
        throw CheckpointError(m);
    }

private:
    static constexpr size_t kShown = 12;
    std::string dir_;
    std::vector<std::string> msgs_;
    size_t count_ = 0;
};

// "layers.<L>.<rest>" -> L; -1 for anything else.
int layer_of_name(const std::string& n) {
    if (n.rfind("layers.", 0) != 0) return -1;
    size_t i = 7;
    int64_t v = 0;
    size_t digits = 0;
    while (i < n.size() && n[i] >= '0' && n[i] <= '9' && digits < 9) {
        v = v * 10 + (n[i] - '0');
        ++i;
        ++digits;
    }
    if (digits == 0 || i >= n.size() || n[i] != '.') return -1;
    return static_cast<int>(v);
}

// "model-00003-of-00048.safetensors" -> "00048"; empty when the name is not of that form.
std::string shard_set_total(const std::string& f) {
    const std::string pre = "model-", mid = "-of-", suf = ".safetensors";
    if (f.size() <= pre.size() + mid.size() + suf.size() || f.rfind(pre, 0) != 0 ||
        f.compare(f.size() - suf.size(), suf.size(), suf) != 0)
        return {};
    std::string core = f.substr(pre.size(), f.size() - pre.size() - suf.size());  // "00003-of-00048"
    size_t p = core.find(mid);
    if (p == std::string::npos || p == 0 || p + mid.size() >= core.size()) return {};
    std::string a = core.substr(0, p), b = core.substr(p + mid.size());
    auto digits = [](const std::string& s) {
        return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return digits(a) && digits(b) ? b : std::string();
}

bool is_regular_file(const std::string& p) {
    std::error_code ec;
    return std::filesystem::is_regular_file(p, ec);
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& model_dir) {
    Checkpoint ck;
    ck.dir_ = model_dir;
    if (!is_directory(model_dir))
        throw CheckpointError(
            strfmt("%s: model directory not found (give --model DIR or set $DSV41_PATH)", model_dir.c_str()));

    // --- config, roles, tokenizer ---
    const std::string config_path = path_join(model_dir, "config.json");
    if (!is_regular_file(config_path))
        throw CheckpointError(strfmt("%s: missing (the model configuration)", config_path.c_str()));
    try {
        ck.config_ = load_model_config(config_path);
        ck.roles_ = derive_layer_roles(ck.config_, config_path);
    } catch (const Error&) {
        throw;
    } catch (const std::bad_alloc&) {
        throw;
    } catch (const std::exception& e) {
        // Whatever the JSON library raises on a hostile config is still a checkpoint problem (exit 3).
        throw CheckpointError(
            strfmt("%s: malformed config (%s)", config_path.c_str(), printable_name(e.what()).c_str()));
    }
    if (!is_regular_file(ck.tokenizer_path()))
        throw CheckpointError(strfmt("%s: missing (the tokenizer; the Engram token map is built from it)",
                                     ck.tokenizer_path().c_str()));

    // --- index (or a single model.safetensors) ---
    const std::string index_path = path_join(model_dir, "model.safetensors.index.json");
    const std::string single_path = path_join(model_dir, "model.safetensors");
    std::vector<std::pair<std::string, std::string>> weight_map;  // name -> shard file, sorted by name
    if (is_regular_file(index_path)) {
        SafetensorsIndex idx = read_safetensors_index(index_path);
        weight_map = std::move(idx.weight_map);
        ck.index_total_size_ = idx.total_size;
        ck.index_file_ = "model.safetensors.index.json";
    } else if (is_regular_file(single_path)) {
        SafetensorsHeader h = read_safetensors_header(single_path);
        for (const auto& t : h.tensors) weight_map.emplace_back(t.name, "model.safetensors");
        std::sort(weight_map.begin(), weight_map.end());
        ck.index_file_ = "model.safetensors";
    } else {
        throw CheckpointError(
            strfmt("%s: no model.safetensors.index.json and no model.safetensors", model_dir.c_str()));
    }
    const std::string index_display = path_join(model_dir, ck.index_file_);

    // --- shards: present, sane headers, long enough ---
    std::map<std::string, std::vector<const std::string*>> names_by_file;  // file -> tensor names (sorted)
    for (const auto& [name, file] : weight_map) names_by_file[file].push_back(&name);
    Problems probs(model_dir);
    std::vector<SafetensorsHeader> headers;
    std::map<std::string, int> shard_of_file;
    for (const auto& [file, names] : names_by_file) {
        const std::string path = path_join(model_dir, file);
        if (!is_regular_file(path)) {
            std::string more =
                names.size() > 1 ? strfmt(" and %zu more tensors", names.size() - 1) : std::string();
            probs.add(strfmt("%s: missing (listed in %s for '%s'%s)", path.c_str(), ck.index_file_.c_str(),
                             printable_name(*names[0]).c_str(), more.c_str()));
            continue;
        }
        try {
            FileHandle fh(path, O_RDONLY, 0644, /*checkpoint=*/true);
            SafetensorsHeader h = read_safetensors_header(fh);
            ShardInfo si;
            si.file_name = file;
            si.path = path;
            si.file_size = h.file_size;
            si.data_begin = h.data_begin;
            si.data_end = h.data_end;
            si.n_tensors = h.tensors.size();
            shard_of_file[file] = static_cast<int>(ck.shards_.size());
            ck.shards_.push_back(std::move(si));
            ck.files_.push_back(std::move(fh));
            headers.push_back(std::move(h));
        } catch (const CheckpointError& e) {
            probs.add(e.what());
        }
    }
    // Every shard of the set "model-*-of-<M>" that lies in the directory must be referenced.
    {
        std::set<std::string> totals;
        for (const auto& [file, names] : names_by_file) {
            std::string t = shard_set_total(file);
            if (!t.empty()) totals.insert(t);
        }
        std::error_code ec;
        std::vector<std::string> unreferenced;
        for (auto it = std::filesystem::directory_iterator(model_dir, ec);
             !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
            const std::string f = it->path().filename().string();
            const std::string t = shard_set_total(f);
            if (!t.empty() && totals.count(t) && !names_by_file.count(f)) unreferenced.push_back(f);
        }
        std::sort(unreferenced.begin(), unreferenced.end());
        for (const auto& f : unreferenced)
            probs.add(strfmt("%s: shard present in the model directory but not referenced by %s",
                             path_join(model_dir, f).c_str(), ck.index_file_.c_str()));
    }
    probs.throw_if_any();

    // --- index <-> headers, both ways ---
    std::unordered_map<std::string, const std::string*> file_of_name;
    file_of_name.reserve(weight_map.size());
    for (const auto& [name, file] : weight_map) file_of_name.emplace(name, &file);
    for (size_t s = 0; s < headers.size(); ++s) {
        const ShardInfo& si = ck.shards_[s];
        std::unordered_set<std::string> in_header;
        in_header.reserve(headers[s].tensors.size());
        for (auto& t : headers[s].tensors) {
            in_header.insert(t.name);
            auto it = file_of_name.find(t.name);
            if (it == file_of_name.end()) {
                probs.add(strfmt("%s: tensor '%s' is in this shard's header but not in %s", si.path.c_str(),
                                 printable_name(t.name).c_str(), ck.index_file_.c_str()));
                continue;
            }
            if (*it->second != si.file_name) {
                probs.add(strfmt("%s: tensor '%s' is in this shard's header but %s places it in %s",
                                 si.path.c_str(), printable_name(t.name).c_str(), ck.index_file_.c_str(),
                                 printable_name(*it->second).c_str()));
                continue;
            }
            TensorLocation loc;
            loc.name = t.name;
            loc.dtype = t.dtype;
            loc.shard = static_cast<int>(s);
            loc.offset = t.offset;
            loc.nbytes = t.nbytes;
            loc.shape = std::move(t.shape);
            loc.layer = layer_of_name(t.name);
            ck.tensors_.push_back(std::move(loc));
        }
        for (const std::string* name : names_by_file[si.file_name])
            if (!in_header.count(*name))
                probs.add(strfmt("%s: tensor '%s' listed in %s is not in this shard's header",
                                 si.path.c_str(), printable_name(*name).c_str(), ck.index_file_.c_str()));
    }
    headers.clear();
    probs.throw_if_any();
    std::sort(ck.tensors_.begin(), ck.tensors_.end(), [](const TensorLocation& a, const TensorLocation& b) {
        if (a.shard != b.shard) return a.shard < b.shard;
        if (a.offset != b.offset) return a.offset < b.offset;
        return a.name < b.name;
    });
    ck.by_name_.reserve(ck.tensors_.size());
    for (size_t i = 0; i < ck.tensors_.size(); ++i) ck.by_name_.emplace(ck.tensors_[i].name, i);

    // --- the binding: every required tensor with exactly its dtype and shape ---
    std::vector<bool> bound(ck.tensors_.size(), false);
    for (const TensorSpec& spec : all_tensor_specs(ck.config_, ck.roles_)) {
        auto it = ck.by_name_.find(spec.name);
        if (it == ck.by_name_.end()) {
            if (spec.optional) continue;
            std::string who = spec.layer >= 0
                                  ? strfmt("layer %d: %s", spec.layer,
                                           ck.roles_[static_cast<size_t>(spec.layer)].describe().c_str())
                                  : std::string("global");
            probs.add(strfmt("%s: required tensor '%s' (%s) is missing; expected %s %s",
                             index_display.c_str(), spec.name.c_str(), who.c_str(), dtype_name(spec.dtype),
                             shape_str(spec.shape).c_str()));
            continue;
        }
        TensorLocation& loc = ck.tensors_[it->second];
        bound[it->second] = true;
        if (loc.dtype != spec.dtype || loc.shape != spec.shape) {
            probs.add(strfmt("%s: tensor '%s' expected %s %s, found %s %s",
                             ck.shards_[static_cast<size_t>(loc.shard)].path.c_str(), spec.name.c_str(),
                             dtype_name(spec.dtype), shape_str(spec.shape).c_str(), dtype_name(loc.dtype),
                             shape_str(loc.shape).c_str()));
            continue;
        }
        loc.layer = spec.layer;
        // Optional specs are the ones the release ships but the prefill never reads (bias_vl).
        if (spec.optional)
            loc.cls = TensorClass::Unused;
        else if (spec.use == TensorUse::Global)
            loc.cls = TensorClass::Global;
        else if (spec.use == TensorUse::EngramTable)
            loc.cls = TensorClass::EngramTable;
        else
            loc.cls = TensorClass::Layer;
    }
    probs.throw_if_any();
    for (size_t i = 0; i < ck.tensors_.size(); ++i)
        if (!bound[i])
            ck.tensors_[i].cls =
                is_unused_in_prefill(ck.tensors_[i].name) ? TensorClass::Unused : TensorClass::Unknown;

    // --- warnings: unknown tensors, index total_size ---
    std::vector<std::string> unknown = ck.unknown_tensor_names();
    if (!unknown.empty()) {
        std::string list;
        for (size_t i = 0; i < unknown.size() && i < 5; ++i)
            list += (i ? ", " : "") + printable_name(unknown[i]);
        if (unknown.size() > 5) list += strfmt(", ... (%zu more)", unknown.size() - 5);
        log_warn(strfmt(
            "%s: %zu tensor(s) are not used by the V4.1 prefill and not known to be unused (ignored): %s",
            model_dir.c_str(), unknown.size(), list.c_str()));
    }
    if (ck.index_total_size_ && *ck.index_total_size_ != ck.total_bytes())
        log_warn(strfmt("%s: metadata.total_size says %llu bytes, the shards' tensors hold %llu",
                        index_display.c_str(), (unsigned long long)*ck.index_total_size_,
                        (unsigned long long)ck.total_bytes()));

    // --- per-layer streamed tensors ---
    ck.layer_tensors_.assign(static_cast<size_t>(ck.config_.n_layers), {});
    for (size_t i = 0; i < ck.tensors_.size(); ++i) {
        const TensorLocation& t = ck.tensors_[i];
        if (t.cls == TensorClass::Layer && t.layer >= 0 && t.layer < ck.config_.n_layers)
            ck.layer_tensors_[static_cast<size_t>(t.layer)].push_back(i);
    }
    return ck;
}

std::vector<std::string> Checkpoint::unknown_tensor_names() const {
    std::vector<std::string> out;
    for (const auto& t : tensors_)
        if (t.cls == TensorClass::Unknown) out.push_back(t.name);
    std::sort(out.begin(), out.end());
    return out;
}

const TensorLocation* Checkpoint::find(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorLocation& Checkpoint::at(const std::string& name) const {
    const TensorLocation* t = find(name);
    if (!t)
        throw CheckpointError(strfmt("%s: tensor '%s' is not in the checkpoint (%s)", dir_.c_str(),
                                     printable_name(name).c_str(), index_file_.c_str()));
    return *t;
}

std::vector<const TensorLocation*> Checkpoint::tensors_of(TensorClass c) const {
    std::vector<const TensorLocation*> out;
    for (const auto& t : tensors_)
        if (t.cls == c) out.push_back(&t);
    return out;
}

uint64_t Checkpoint::bytes_of(TensorClass c) const {
    uint64_t n = 0;
    for (const auto& t : tensors_)
        if (t.cls == c) n += t.nbytes;
    return n;
}

uint64_t Checkpoint::total_bytes() const {
    uint64_t n = 0;
    for (const auto& t : tensors_) n += t.nbytes;
    return n;
}

void Checkpoint::read(const TensorLocation& t, void* dst) const {
    DS4R_CHECK(t.shard >= 0 && static_cast<size_t>(t.shard) < files_.size(), "tensor '%s' has no shard",
               t.name.c_str());
    if (t.nbytes) files_[static_cast<size_t>(t.shard)].pread_exact(dst, t.nbytes, t.offset);
}

void Checkpoint::read_run(const ByteRun& run, void* dst) const {
    DS4R_CHECK(run.shard >= 0 && static_cast<size_t>(run.shard) < files_.size() && run.end >= run.begin,
               "invalid byte run (shard %d)", run.shard);
    if (run.size()) files_[static_cast<size_t>(run.shard)].pread_exact(dst, run.size(), run.begin);
}

std::vector<ByteRun> Checkpoint::layer_runs(int layer) const {
    DS4R_CHECK(layer >= 0 && static_cast<size_t>(layer) < layer_tensors_.size(), "layer %d outside [0, %zu)",
               layer, layer_tensors_.size());
    std::vector<const TensorLocation*> ts;
    for (size_t i : layer_tensors_[static_cast<size_t>(layer)]) ts.push_back(&tensors_[i]);
    return merge_byte_runs(std::move(ts));
}

uint64_t Checkpoint::layer_stream_bytes(int layer) const {
    DS4R_CHECK(layer >= 0 && static_cast<size_t>(layer) < layer_tensors_.size(), "layer %d outside [0, %zu)",
               layer, layer_tensors_.size());
    uint64_t n = 0;
    for (size_t i : layer_tensors_[static_cast<size_t>(layer)]) n += tensors_[i].nbytes;
    return n;
}

uint64_t Checkpoint::layer_read_bytes(int layer) const {
    uint64_t n = 0;
    for (const auto& r : layer_runs(layer)) n += r.size();
    return n;
}

size_t Checkpoint::layer_tensor_count(int layer) const {
    DS4R_CHECK(layer >= 0 && static_cast<size_t>(layer) < layer_tensors_.size(), "layer %d outside [0, %zu)",
               layer, layer_tensors_.size());
    return layer_tensors_[static_cast<size_t>(layer)].size();
}

std::string Checkpoint::tokenizer_path() const {
    return path_join(dir_, "tokenizer.json");
}

}  // namespace ds4r
