// The run sidecar (include/ds4r/run_manifest.h).
#include "ds4r/run_manifest.h"

#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/sha256.h"

namespace ds4r {

using json = nlohmann::json;

void RunManifest::set_option(const std::string& key, int64_t v) {
    options[key] = json(v).dump();
}
void RunManifest::set_option(const std::string& key, bool v) {
    options[key] = json(v).dump();
}
void RunManifest::set_option(const std::string& key, const std::string& v) {
    options[key] = json(v).dump();
}
void RunManifest::set_option(const std::string& key, const std::vector<int>& v) {
    options[key] = json(v).dump();
}

std::string run_manifest_path(const std::string& output) {
    return output + ".run.json";
}

std::string model_fingerprint(const std::string& config_path, const std::string& index_path) {
    Sha256 h;
    for (const std::string& p : {config_path, index_path}) {
        if (p.empty()) continue;
        const size_t slash = p.find_last_of('/');
        h.update(slash == std::string::npos ? p : p.substr(slash + 1));
        h.update("\n", 1);
        h.update(read_text_file(p, size_t{64} << 20));
    }
    return h.hex_digest();
}

std::string run_manifest_to_json(const RunManifest& m) {
    nlohmann::ordered_json j;  // in the documented order
    j["format"] = RunManifest::kFormat;
    j["version"] = RunManifest::kVersion;
    j["input"] = {{"path", m.input.path},
                  {"sha256", m.input.sha256.empty() ? json(nullptr) : json(m.input.sha256)},
                  {"records", m.input.records < 0 ? json(nullptr) : json(m.input.records)}};
    nlohmann::ordered_json opts = nlohmann::ordered_json::object();
    for (const auto& [k, v] : m.options) opts[k] = nlohmann::ordered_json::parse(v);
    j["options"] = opts;
    j["model"] = {
        {"fingerprint", m.model.fingerprint}, {"n_layers", m.model.n_layers}, {"vocab", m.model.vocab}};
    nlohmann::ordered_json layers = nlohmann::ordered_json::object();
    for (const auto& [L, hl] : m.hidden.layers)
        layers[std::to_string(L)] = {{"dtype", hl.dtype}, {"row_shape", hl.row_shape}};
    j["hidden"] = {{"dir", m.hidden.dir.empty() ? json(nullptr) : json(m.hidden.dir)}, {"layers", layers}};
    j["backend"] = m.backend;
    j["shard"] = m.shard ? json{{"index", m.shard->index},
                                {"count", m.shard->count},
                                {"first_record", m.shard->first_record},
                                {"records", m.shard->records < 0 ? json(nullptr) : json(m.shard->records)}}
                         : json(nullptr);
    return j.dump(1) + "\n";
}

namespace {

// A string member that may be null (-> "").
std::string string_or_empty(const json& j, const char* key) {
    const json& v = j.at(key);
    return v.is_null() ? std::string() : v.get<std::string>();
}

}  // namespace

RunManifest parse_run_manifest(const std::string& text, const std::string& path) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw InputError(path + ": not a run sidecar (invalid JSON: " + e.what() + ")");
    }
    RunManifest m;
    try {
        if (!j.is_object() || !j.contains("format") || j.at("format") != RunManifest::kFormat)
            throw InputError(path + ": not a run sidecar (no \"format\": \"ds4replay-run\")");
        const int version = j.at("version").get<int>();
        if (version < 1 || version > RunManifest::kVersion)
            throw InputError(
                strfmt("%s: run sidecar version %d; this ds4replay reads version %d (a newer "
                       "ds4replay wrote it?)",
                       path.c_str(), version, RunManifest::kVersion));
        const json& in = j.at("input");
        m.input.path = in.at("path").get<std::string>();
        m.input.sha256 = string_or_empty(in, "sha256");
        m.input.records = in.at("records").is_null() ? -1 : in.at("records").get<int64_t>();
        for (const auto& [k, v] : j.at("options").items()) m.options[k] = v.dump();
        const json& mo = j.at("model");
        m.model.fingerprint = mo.at("fingerprint").get<std::string>();
        m.model.n_layers = mo.at("n_layers").get<int64_t>();
        m.model.vocab = mo.at("vocab").get<int64_t>();
        const json& hi = j.at("hidden");
        m.hidden.dir = string_or_empty(hi, "dir");
        for (const auto& [k, v] : hi.at("layers").items()) {
            size_t used = 0;
            int L = -1;
            try {
                L = std::stoi(k, &used);
            } catch (const std::exception&) {
            }
            if (L < 0 || used != k.size())
                throw InputError(path + ": hidden layer key '" + k + "' is not a layer number");
            RunManifest::HiddenLayer hl;
            hl.dtype = v.at("dtype").get<std::string>();
            hl.row_shape = v.at("row_shape").get<Shape>();
            m.hidden.layers[L] = hl;
        }
        if (j.contains("backend") && j.at("backend").is_string())
            m.backend = j.at("backend").get<std::string>();
        if (j.contains("shard") && !j.at("shard").is_null()) {
            RunManifest::Shard s;
            s.index = j.at("shard").at("index").get<int>();
            s.count = j.at("shard").at("count").get<int>();
            const json& sh = j.at("shard");
            if (sh.contains("first_record")) s.first_record = sh.at("first_record").get<int64_t>();
            if (sh.contains("records") && !sh.at("records").is_null()) s.records = sh.at("records").get<int64_t>();
            if (s.first_record < 0 || s.records < -1)
                throw InputError(strfmt("%s: shard records %lld + %lld are not a valid range", path.c_str(),
                                        (long long)s.first_record, (long long)s.records));
            if (s.count < 1 || s.index < 0 || s.index > s.count)
                throw InputError(
                    strfmt("%s: shard %d of %d is not a valid shard", path.c_str(), s.index, s.count));
            m.shard = s;
        }
    } catch (const json::exception& e) {
        throw InputError(path + ": malformed run sidecar (" + e.what() + ")");
    }
    return m;
}

void write_run_manifest(const std::string& path, const RunManifest& m) {
    AtomicFileWriter w(path);
    w.write(run_manifest_to_json(m));
    w.commit();
}

std::optional<RunManifest> read_run_manifest(const std::string& path) {
    if (!file_exists(path)) return std::nullopt;
    return parse_run_manifest(read_text_file(path, size_t{16} << 20), path);
}

namespace {

// How an option reads on a command line: "--top-k 8", "--skip-bad" / "no --skip-bad",
// "--capture-layers 2,6" / "no --capture-layers".
std::string option_text(const std::string& key, const std::string* value_json) {
    std::string flag = "--" + key;
    for (char& c : flag)
        if (c == '_') c = '-';
    if (!value_json) return flag + " (not recorded)";
    json v;
    try {
        v = json::parse(*value_json);
    } catch (const json::exception&) {
        return flag + " " + *value_json;
    }
    if (v.is_boolean()) return v.get<bool>() ? flag : "no " + flag;
    if (v.is_string()) return flag + " " + v.get<std::string>();
    if (v.is_array()) {
        if (v.empty()) return "no " + flag;
        std::string s;
        for (const auto& x : v)
            s += (s.empty() ? "" : ",") + (x.is_string() ? x.get<std::string>() : x.dump());
        return flag + " " + s;
    }
    return flag + " " + v.dump();
}

std::string layout_text(const RunManifest::HiddenLayer* hl) {
    if (!hl) return "no file";
    return hl->dtype + " " + shape_str(hl->row_shape) + " rows";
}

std::string short_hash(const std::string& h) {
    return h.size() > 12 ? h.substr(0, 12) + "..." : h;
}

std::vector<std::string> compare_impl(const RunManifest& now, const RunManifest& then,
                                      const std::string& label, bool with_shard) {
    std::vector<std::string> d;
    if (!now.input.sha256.empty() && !then.input.sha256.empty() && now.input.sha256 != then.input.sha256)
        d.push_back(strfmt("input %s (sha256 %s, %lld records) but %s input %s (sha256 %s, %lld records)",
                           now.input.path.c_str(), short_hash(now.input.sha256).c_str(),
                           (long long)now.input.records, label.c_str(), then.input.path.c_str(),
                           short_hash(then.input.sha256).c_str(), (long long)then.input.records));
    std::map<std::string, int> keys;
    for (const auto& kv : now.options) keys[kv.first] |= 1;
    for (const auto& kv : then.options) keys[kv.first] |= 2;
    for (const auto& [k, where] : keys) {
        const std::string* a = where & 1 ? &now.options.at(k) : nullptr;
        const std::string* b = where & 2 ? &then.options.at(k) : nullptr;
        if (a && b) {
            // Compare as JSON values ("8" and "8.0" aside, the texts come from the same writer).
            bool same = *a == *b;
            try {
                same = same || json::parse(*a) == json::parse(*b);
            } catch (const json::exception&) {
            }
            if (same) continue;
        }
        d.push_back(option_text(k, a) + " but " + label + " " + option_text(k, b));
    }
    if (now.model.fingerprint != then.model.fingerprint || now.model.n_layers != then.model.n_layers ||
        now.model.vocab != then.model.vocab)
        d.push_back(
            strfmt("model %s (%lld layers, vocabulary %lld) but %s model %s (%lld layers, vocabulary %lld)",
                   short_hash(now.model.fingerprint).c_str(), (long long)now.model.n_layers,
                   (long long)now.model.vocab, label.c_str(), short_hash(then.model.fingerprint).c_str(),
                   (long long)then.model.n_layers, (long long)then.model.vocab));
    std::map<int, int> layers;
    for (const auto& kv : now.hidden.layers) layers[kv.first] |= 1;
    for (const auto& kv : then.hidden.layers) layers[kv.first] |= 2;
    for (const auto& [L, where] : layers) {
        const auto* a = where & 1 ? &now.hidden.layers.at(L) : nullptr;
        const auto* b = where & 2 ? &then.hidden.layers.at(L) : nullptr;
        if (a && b && *a == *b) continue;
        d.push_back(strfmt("hidden_L%d.npy: %s but %s %s", L, layout_text(a).c_str(), label.c_str(),
                           layout_text(b).c_str()));
    }
    if (with_shard && now.shard != then.shard) {
        auto text = [](const std::optional<RunManifest::Shard>& s) {
            return s ? strfmt("--shard %d/%d", s->index, s->count) : std::string("no --shard");
        };
        d.push_back(text(now.shard) + " but " + label + " " + text(then.shard));
    }
    return d;
}

}  // namespace

std::vector<std::string> compare_run_manifests(const RunManifest& now, const RunManifest& then,
                                               const std::string& then_label) {
    return compare_impl(now, then, then_label, true);
}

std::vector<std::string> compare_run_manifests_ignoring_shard(const RunManifest& a, const RunManifest& b,
                                                              const std::string& then_label) {
    return compare_impl(a, b, then_label, false);
}

}  // namespace ds4r
