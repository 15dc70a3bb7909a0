// config.json parsing, both forms (docs/MODEL.md 2.1 and 2.2), and layer-role derivation (docs/MODEL.md 2.4).
#include "ds4r/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ds4r/error.h"

namespace ds4r {

using json = nlohmann::json;

int ModelConfig::compress_ratio(int layer) const {
    if (layer < 0 || static_cast<size_t>(layer) >= compress_ratios.size()) return 0;
    return compress_ratios[static_cast<size_t>(layer)];
}

int ModelConfig::engram_index(int layer) const {
    for (size_t i = 0; i < engram_layer_ids.size(); ++i)
        if (engram_layer_ids[i] == layer) return static_cast<int>(i);
    return -1;
}

namespace {

// Typed access with errors that name the file and the key.
class Reader {
public:
    Reader(const json& obj, std::string path, std::string prefix)
        : obj_(obj), path_(std::move(path)), prefix_(std::move(prefix)) {}

    bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

    const json& at(const char* key) const {
        if (!has(key))
            throw CheckpointError(
                strfmt("%s: missing key '%s%s' in config", path_.c_str(), prefix_.c_str(), key));
        return obj_.at(key);
    }

    int64_t i64(const char* key) const {
        const json& v = at(key);
        if (v.is_number_integer()) return v.get<int64_t>();
        if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
            throw CheckpointError(strfmt("%s: key '%s%s' is too large", path_.c_str(), prefix_.c_str(), key));
        if (v.is_number_float()) {
            const double d = v.get<double>();
            // Range check before the cast: converting an out-of-range double is undefined behaviour.
            if (d >= -9.2e18 && d <= 9.2e18 && d == std::floor(d)) return static_cast<int64_t>(d);
        }
        throw CheckpointError(strfmt("%s: key '%s%s' must be an integer (within int64), found %s",
                                     path_.c_str(), prefix_.c_str(), key, describe(v).c_str()));
    }
    int64_t i64(const char* key, int64_t dflt) const { return has(key) ? i64(key) : dflt; }

    double f64(const char* key) const {
        const json& v = at(key);
        if (!v.is_number())
            throw CheckpointError(strfmt("%s: key '%s%s' must be a number, found %s", path_.c_str(),
                                         prefix_.c_str(), key, describe(v).c_str()));
        return v.get<double>();
    }
    double f64(const char* key, double dflt) const { return has(key) ? f64(key) : dflt; }

    bool boolean(const char* key, bool dflt) const {
        if (!has(key)) return dflt;
        const json& v = at(key);
        if (!v.is_boolean())
            throw CheckpointError(
                strfmt("%s: key '%s%s' must be true/false", path_.c_str(), prefix_.c_str(), key));
        return v.get<bool>();
    }

    std::string str(const char* key) const {
        const json& v = at(key);
        if (!v.is_string())
            throw CheckpointError(
                strfmt("%s: key '%s%s' must be a string", path_.c_str(), prefix_.c_str(), key));
        return v.get<std::string>();
    }
    std::string str(const char* key, const std::string& dflt) const { return has(key) ? str(key) : dflt; }

    template <class T>
    std::vector<T> ints(const char* key) const {
        const json& v = at(key);
        if (!v.is_array())
            throw CheckpointError(
                strfmt("%s: key '%s%s' must be an array of integers", path_.c_str(), prefix_.c_str(), key));
        std::vector<T> out;
        for (const auto& e : v) {
            if (!e.is_number_integer())
                throw CheckpointError(strfmt("%s: key '%s%s' must hold integers, found %s", path_.c_str(),
                                             prefix_.c_str(), key, describe(e).c_str()));
            if (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX))
                throw CheckpointError(
                    strfmt("%s: key '%s%s' holds a value too large", path_.c_str(), prefix_.c_str(), key));
            out.push_back(static_cast<T>(e.get<int64_t>()));
        }
        return out;
    }

    const json& obj() const { return obj_; }

    // A short, bounded description of an untrusted value (no recursive dump()).
    static std::string describe(const json& v) {
        if (v.is_number() || v.is_boolean()) return v.dump();
        if (v.is_string()) return "a string";
        return std::string("a JSON ") + v.type_name();
    }

private:
    const json& obj_;
    std::string path_;
    std::string prefix_;
};

void parse_hf(const json& root, const std::string& path, ModelConfig& c) {
    const json& tc = root.at("text_config");
    if (!tc.is_object()) throw CheckpointError(strfmt("%s: 'text_config' must be an object", path.c_str()));
    Reader r(tc, path, "text_config.");
    Reader top(root, path, "");
    c.form = "hf";
    c.vocab_size = r.i64("vocab_size");
    c.dim = r.i64("hidden_size");
    c.moe_inter_dim = r.i64("moe_intermediate_size");
    c.n_layers = r.i64("num_hidden_layers");
    c.n_mtp_layers = r.i64("num_nextn_predict_layers", 0);
    c.n_heads = r.i64("num_attention_heads");
    if (r.has("num_key_value_heads") && r.i64("num_key_value_heads") != 1)
        throw CheckpointError(
            strfmt("%s: text_config.num_key_value_heads must be 1 (one shared "
                   "KV latent), found %lld",
                   path.c_str(), (long long)r.i64("num_key_value_heads")));
    c.head_dim = r.i64("head_dim");
    c.rope_head_dim = r.i64("qk_rope_head_dim");
    c.q_lora_rank = r.i64("q_lora_rank");
    c.o_lora_rank = r.i64("o_lora_rank");
    c.o_groups = r.i64("o_groups");
    c.window_size = r.i64("sliding_window");
    c.n_routed_experts = r.i64("n_routed_experts");
    c.n_shared_experts = r.i64("n_shared_experts");
    c.n_activated_experts = r.i64("num_experts_per_tok");
    c.score_func = r.str("scoring_func");
    c.route_scale = r.f64("routed_scaling_factor");
    c.swiglu_limit = r.f64("swiglu_limit");
    c.norm_topk_prob = r.boolean("norm_topk_prob", true);
    c.norm_eps = r.f64("rms_norm_eps");
    c.rope_theta = r.f64("rope_theta");
    c.compress_rope_theta = r.f64("compress_rope_theta");
    c.max_position_embeddings = r.i64("max_position_embeddings", 0);
    if (r.has("rope_scaling")) {
        const json& rs = r.at("rope_scaling");
        if (!rs.is_object())
            throw CheckpointError(strfmt("%s: text_config.rope_scaling must be an object", path.c_str()));
        Reader s(rs, path, "text_config.rope_scaling.");
        c.rope_factor = s.f64("factor");
        c.beta_fast = s.f64("beta_fast", 32);
        c.beta_slow = s.f64("beta_slow", 1);
        c.original_seq_len = s.i64("original_max_position_embeddings");
    }
    c.compress_ratios = r.ints<int>("compress_ratios");
    c.kv_source_layers = r.ints<int>("kv_source_layer_ids");
    c.index_source_layers = r.ints<int>("index_source_layer_ids");
    c.index_n_heads = r.i64("index_n_heads");
    c.index_head_dim = r.i64("index_head_dim");
    c.index_topk = r.i64("index_topk");
    c.candidate_source_layer = static_cast<int>(r.i64("candidate_source_layer_id", -1));
    c.candidate_topk_blocks = r.i64("candidate_topk_blocks", 0);
    c.candidate_block_size = r.i64("candidate_block_size", 1);
    c.hc_mult = r.i64("hc_mult");
    c.hc_sinkhorn_iters = r.i64("hc_sinkhorn_iters");
    c.hc_eps = r.f64("hc_eps");
    c.engram_layer_ids = r.ints<int>("engram_layer_ids");
    c.engram_num_embeddings = r.ints<int64_t>("engram_num_embeddings");
    c.engram_max_ngram_size = r.i64("engram_max_ngram_size");
    c.engram_vocab_size = r.i64("engram_vocab_size");
    c.engram_n_heads = r.i64("engram_n_heads");
    c.engram_head_dim = r.i64("engram_head_dim");
    c.engram_pad_id = r.i64("engram_pad_token_id", 2);
    c.engram_compressed_vocab_size = r.i64("engram_compressed_vocab_size");
    c.bos_token_id = top.i64("bos_token_id", 0);
    c.eos_token_id = top.i64("eos_token_id", 1);
    c.pad_token_id = top.i64("pad_token_id", 2);
    if (root.contains("quantization_config")) {
        const json& q = root.at("quantization_config");
        if (!q.is_object())
            throw CheckpointError(strfmt("%s: 'quantization_config' must be an object", path.c_str()));
        Reader qr(q, path, "quantization_config.");
        std::string method = qr.str("quant_method", "fp8");
        if (method != "fp8")
            throw CheckpointError(
                strfmt("%s: quantization_config.quant_method must be \"fp8\", "
                       "found \"%s\"",
                       path.c_str(), method.c_str()));
        if (qr.has("weight_block_size")) {
            auto wb = qr.ints<int64_t>("weight_block_size");
            if (wb.size() != 2 || wb[0] != wb[1])
                throw CheckpointError(
                    strfmt("%s: quantization_config.weight_block_size must be "
                           "[b, b]",
                           path.c_str()));
            c.weight_block_size = wb[0];
        }
        std::string fmt = qr.str("scale_fmt", "ue8m0");
        if (fmt != "ue8m0")
            throw CheckpointError(
                strfmt("%s: quantization_config.scale_fmt must be \"ue8m0\", "
                       "found \"%s\"",
                       path.c_str(), fmt.c_str()));
        c.expert_dtype = qr.str("expert_dtype", "fp4");
    }
}

void parse_flat(const json& root, const std::string& path, ModelConfig& c) {
    Reader r(root, path, "");
    c.form = "flat";
    c.vocab_size = r.i64("vocab_size");
    c.dim = r.i64("dim");
    c.moe_inter_dim = r.i64("moe_inter_dim");
    c.n_layers = r.i64("n_layers");
    c.n_mtp_layers = r.i64("n_mtp_layers", 0);
    c.n_heads = r.i64("n_heads");
    c.head_dim = r.i64("head_dim");
    c.rope_head_dim = r.i64("rope_head_dim");
    c.q_lora_rank = r.i64("q_lora_rank");
    c.o_lora_rank = r.i64("o_lora_rank");
    c.o_groups = r.i64("o_groups");
    c.window_size = r.i64("window_size");
    c.n_routed_experts = r.i64("n_routed_experts");
    c.n_shared_experts = r.i64("n_shared_experts");
    c.n_activated_experts = r.i64("n_activated_experts");
    c.score_func = r.str("score_func");
    c.route_scale = r.f64("route_scale");
    c.swiglu_limit = r.f64("swiglu_limit");
    c.gate_temp = r.f64("gate_temp", 1.0);
    c.norm_topk_prob = r.boolean("norm_topk_prob", true);
    c.norm_eps = r.f64("norm_eps");
    c.rope_theta = r.f64("rope_theta");
    c.compress_rope_theta = r.f64("compress_rope_theta");
    c.original_seq_len = r.i64("original_seq_len");
    c.rope_factor = r.f64("rope_factor");
    c.beta_fast = r.f64("beta_fast", 32);
    c.beta_slow = r.f64("beta_slow", 1);
    {
        const double mpe = static_cast<double>(c.original_seq_len) * c.rope_factor;  // YaRN-extended context
        if (!(mpe >= 0 && mpe <= 1e12))
            throw CheckpointError(strfmt("%s: original_seq_len * rope_factor out of range", path.c_str()));
        c.max_position_embeddings = static_cast<int64_t>(mpe);
    }
    c.compress_ratios = r.ints<int>("compress_ratios");
    c.kv_source_layers = r.ints<int>("kv_source_layers");
    c.index_source_layers = r.ints<int>("index_source_layers");
    c.index_n_heads = r.i64("index_n_heads");
    c.index_head_dim = r.i64("index_head_dim");
    c.index_topk = r.i64("index_topk");
    c.candidate_source_layer = static_cast<int>(r.i64("candidate_source_layer", -1));
    c.candidate_topk_blocks = r.i64("candidate_topk_blocks", 0);
    c.candidate_block_size = r.i64("candidate_block_size", 1);
    c.hc_mult = r.i64("hc_mult");
    c.hc_sinkhorn_iters = r.i64("hc_sinkhorn_iters");
    c.hc_eps = r.f64("hc_eps");
    c.engram_layer_ids = r.ints<int>("engram_layer_ids");
    c.engram_num_embeddings = r.ints<int64_t>("engram_num_embeddings");
    c.engram_max_ngram_size = r.i64("engram_max_ngram_size");
    c.engram_vocab_size = r.i64("engram_vocab_size");
    c.engram_n_heads = r.i64("engram_n_heads");
    c.engram_head_dim = r.i64("engram_head_dim");
    c.engram_pad_id = r.i64("engram_pad_id", 2);
    c.engram_compressed_vocab_size = r.i64("engram_compressed_vocab_size");
    c.dtype = r.str("dtype", "fp8");
    c.expert_dtype = r.str("expert_dtype", "fp4");
}

void check_config(const ModelConfig& c, const std::string& path) {
    auto need = [&](bool ok, const char* what) {
        if (!ok) throw CheckpointError(strfmt("%s: invalid config: %s", path.c_str(), what));
    };
    need(c.vocab_size > 0 && c.vocab_size < (1LL << 31), "vocab_size must be in [1, 2^31)");
    // Upper bounds keep every size product of the binding far from int64 overflow.
    for (int64_t d : {c.dim, c.moe_inter_dim, c.head_dim, c.q_lora_rank, c.o_lora_rank, c.index_head_dim,
                      c.engram_head_dim, c.window_size, c.index_topk})
        need(d <= (1LL << 20),
             "a dimension (dim, moe_inter_dim, head_dim, q/o_lora_rank, index/engram head dims, "
             "window, index_topk) exceeds 2^20");
    for (int64_t d :
         {c.n_heads, c.n_routed_experts, c.index_n_heads, c.o_groups, c.engram_n_heads, c.n_activated_experts,
          c.hc_sinkhorn_iters, c.candidate_topk_blocks, c.candidate_block_size})
        need(d <= 65536,
             "a count (heads, experts, groups, Sinkhorn iterations, candidate blocks) exceeds 65536");
    for (int64_t r : c.engram_num_embeddings)
        need(r > 0 && r < (1LL << 40), "engram_num_embeddings entries must be in [1, 2^40)");
    need(c.engram_max_ngram_size <= 8 && c.hc_mult <= 8 && c.n_layers <= 1024,
         "hc_mult / n-gram size out of range");
    need(c.n_heads * c.head_dim <= (1LL << 24), "n_heads * head_dim exceeds 2^24");
    need(c.dim > 0 && c.dim % 32 == 0, "dim must be a positive multiple of 32");
    need(c.moe_inter_dim > 0 && c.moe_inter_dim % 32 == 0, "moe_inter_dim must be a positive multiple of 32");
    need(c.n_layers > 0 && c.n_layers <= 1024, "n_layers must be in [1, 1024]");
    need(c.n_heads > 0, "n_heads must be positive");
    need(c.head_dim > 0 && c.head_dim % 32 == 0, "head_dim must be a positive multiple of 32");
    need(c.rope_head_dim > 0 && c.rope_head_dim % 2 == 0 && c.rope_head_dim <= c.head_dim,
         "rope_head_dim must be even and <= head_dim");
    need(c.q_lora_rank > 0 && c.q_lora_rank % 32 == 0, "q_lora_rank must be a positive multiple of 32");
    need(c.o_groups > 0 && c.n_heads % c.o_groups == 0, "n_heads must be a multiple of o_groups");
    need(c.o_lora_rank > 0 && c.o_lora_rank % 32 == 0, "o_lora_rank must be a positive multiple of 32");
    need(c.window_size > 0, "window_size must be positive");
    need(c.n_routed_experts > 0, "n_routed_experts must be positive");
    need(c.n_activated_experts > 0 && c.n_activated_experts <= c.n_routed_experts,
         "n_activated_experts must be in [1, n_routed_experts]");
    need(c.n_shared_experts == 1, "exactly one shared expert is supported (n_shared_experts == 1)");
    need(c.score_func == "sqrtsoftplus", "score_func must be \"sqrtsoftplus\" (V4.1)");
    need(c.hc_mult > 0 && c.hc_mult <= 8, "hc_mult must be in [1, 8]");
    need(c.hc_sinkhorn_iters > 0, "hc_sinkhorn_iters must be positive");
    need(c.weight_block_size == 32, "weight_block_size must be 32 (V4.1 32x32 fp8 blocks)");
    need(c.dtype == "fp8", "dtype must be \"fp8\"");
    need(c.expert_dtype == "fp4", "expert_dtype must be \"fp4\"");
    need(static_cast<int64_t>(c.compress_ratios.size()) >= c.n_layers,
         "compress_ratios must have an entry per layer");
    for (int64_t l = 0; l < c.n_layers; ++l) {
        int r = c.compress_ratios[static_cast<size_t>(l)];
        need(r == 0 || r == 1 || r == 2, "compress_ratios entries must be 0, 1 or 2");
    }
    need(c.index_n_heads > 0 && c.index_head_dim > 0 && c.index_head_dim % 32 == 0 &&
             c.index_head_dim >= c.rope_head_dim,
         "index_n_heads / index_head_dim must be positive, index_head_dim a multiple of 32");
    need(c.index_topk > 0, "index_topk must be positive");
    need(c.head_dim % 16 == 0, "head_dim must be a multiple of 16 (fp4 KV blocks)");
    need(c.engram_layer_ids.size() == c.engram_num_embeddings.size(),
         "engram_num_embeddings needs one entry per engram layer");
    if (!c.engram_layer_ids.empty()) {
        need(c.engram_max_ngram_size >= 2 && c.engram_max_ngram_size <= 8,
             "engram_max_ngram_size must be in [2, 8]");
        need(c.engram_n_heads > 0 && c.engram_head_dim > 0 && c.engram_head_dim % 32 == 0,
             "engram_n_heads / engram_head_dim must be positive, head_dim a multiple of 32");
        need(c.engram_compressed_vocab_size > 0, "engram_compressed_vocab_size must be positive");
        need(c.engram_vocab_size > 1, "engram_vocab_size must be > 1");
    }
    if (c.candidate_source_layer >= 0)
        need(c.candidate_block_size > 0 && c.candidate_topk_blocks > 0,
             "candidate_block_size / candidate_topk_blocks must be positive");
}

}  // namespace

ModelConfig parse_model_config(std::string_view json_text, const std::string& path) {
    json root;
    try {
        // config.json is a shallow object: refuse absurd nesting (a hostile file could exhaust the stack).
        json::parser_callback_t depth_guard = [&path](int depth, json::parse_event_t, json&) {
            if (depth > 64)
                throw CheckpointError(strfmt("%s: JSON nested deeper than 64 levels", path.c_str()));
            return true;
        };
        root = json::parse(json_text.begin(), json_text.end(), depth_guard);
    } catch (const json::exception& e) {
        throw CheckpointError(strfmt("%s: not valid JSON (%s)", path.c_str(), e.what()));
    }
    if (!root.is_object()) throw CheckpointError(strfmt("%s: config must be a JSON object", path.c_str()));
    ModelConfig c;
    try {
        if (root.contains("text_config"))
            parse_hf(root, path, c);
        else
            parse_flat(root, path, c);
    } catch (const json::exception& e) {
        throw CheckpointError(strfmt("%s: malformed config (%s)", path.c_str(), e.what()));
    }
    check_config(c, path);
    return c;
}

ModelConfig load_model_config(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw CheckpointError(strfmt("%s: cannot open config (%s)", path.c_str(), errno_text(errno).c_str()));
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string text = ss.str();
    if (text.size() > (64u << 20))
        throw CheckpointError(strfmt("%s: config larger than 64 MiB", path.c_str()));
    return parse_model_config(text, path);
}

std::string LayerRole::describe() const {
    if (ratio == 0) return engram ? "window only + Engram" : "window only";
    std::string s;
    if (kv_source && index_source)
        s = strfmt("KV+index source (ratio %d)", ratio);
    else if (reindex)
        s = uses_candidates ? strfmt("reindex (keys of %d, candidates)", index_keys_from)
                            : strfmt("reindex (keys of %d, no candidates yet)", index_keys_from);
    else if (index_source)
        s = strfmt("index source (ratio %d)", ratio);
    else if (kv_source)
        s = strfmt("KV source (ratio %d)", ratio);
    else
        s = strfmt("consumer of %d/%d", kv_from, topk_from);
    if (kv_source && !index_source) s += strfmt(" (top-k of %d)", topk_from);
    if (candidate_source) s += " + candidate source";
    if (engram) s += " + Engram";
    return s;
}

std::vector<LayerRole> derive_layer_roles(const ModelConfig& c, const std::string& path) {
    auto in = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };
    auto fail = [&](const std::string& msg) {
        throw CheckpointError(strfmt("%s: invalid layer roles: %s", path.c_str(), msg.c_str()));
    };
    for (int l : c.kv_source_layers)
        if (l < 0 || l >= c.n_layers)
            fail(strfmt("kv source layer %d outside [0, %lld)", l, (long long)c.n_layers));
    for (int l : c.index_source_layers)
        if (l < 0 || l >= c.n_layers)
            fail(strfmt("index source layer %d outside [0, %lld)", l, (long long)c.n_layers));
    for (int l : c.engram_layer_ids)
        if (l < 0 || l >= c.n_layers)
            fail(strfmt("engram layer %d outside [0, %lld)", l, (long long)c.n_layers));
    std::vector<LayerRole> roles;
    // The reference (model.py Attention / Indexer, docs/MODEL.md 4.6, 5.6) keeps one shared slot each for
    // the compressed KV, the index keys, the top-k and the candidate mask; a layer reads whatever the
    // most recent writer left. It runs every pattern in which each slot a layer reads was written
    // earlier in the same forward by a layer of the same compress ratio; otherwise it reads None (a
    // crash) or rows of another ratio's cache that this prefill never wrote (stale or zero rows of a
    // previous forward), which no replay can reproduce: those patterns are refused, the rest are run
    // exactly as the reference runs them.
    struct Slot {
        int layer = -1, ratio = 0;
    };
    Slot kv_slot, keys_slot, topk_slot, cand_slot;
    const int cand_src = c.candidate_source_layer;
    auto need_slot = [&](const Slot& slot, int l, int ratio, const char* what, const char* writers) {
        if (slot.layer < 0)
            fail(strfmt("layer %d (ratio %d) reads the shared %s but no earlier layer writes it (%s)", l,
                        ratio, what, writers));
        if (slot.ratio != ratio)
            fail(strfmt("layer %d has ratio %d but the shared %s it reads comes from layer %d of ratio %d", l,
                        ratio, what, slot.layer, slot.ratio));
    };
    for (int l = 0; l < c.n_layers; ++l) {
        LayerRole r;
        r.layer = l;
        r.ratio = c.compress_ratio(l);
        r.engram = in(c.engram_layer_ids, l);
        r.kv_source = in(c.kv_source_layers, l);
        r.index_source = in(c.index_source_layers, l);
        if (r.ratio == 0) {
            if (r.kv_source || r.index_source)
                fail(strfmt("layer %d has compress ratio 0 but is a KV or index source", l));
        } else {
            if (r.kv_source) kv_slot = {l, r.ratio};
            need_slot(kv_slot, l, r.ratio, "compressed KV", "KV sources");
            r.kv_from = kv_slot.layer;
            if (r.index_source) {
                // model.py Indexer: owns_k = layer in kv_source_layers; a key-less indexer reads the
                // index_k slot (the most recent key owner's cache).
                r.owns_index_keys = r.kv_source;
                if (r.owns_index_keys) keys_slot = {l, r.ratio};
                need_slot(keys_slot, l, r.ratio, "index keys", "index sources that are also KV sources");
                r.reindex = !r.owns_index_keys;
                r.index_keys_from = keys_slot.layer;
                // is_candidate_source = layer == candidate_source_layer; uses_candidates =
                // 0 <= candidate_source_layer < layer (any later indexer, key owner or not). An indexer
                // before the candidate source scores all reachable positions (no mask).
                if (l == cand_src) {
                    r.candidate_source = true;
                    cand_slot = {l, r.ratio};
                } else if (cand_src >= 0 && cand_src < l) {
                    need_slot(cand_slot, l, r.ratio, "candidate mask",
                              "the candidate source, an index source");
                    r.uses_candidates = true;
                }
                topk_slot = {l, r.ratio};
            }
            // A layer that is not an index source (a KV source included) reuses the top-k slot.
            need_slot(topk_slot, l, r.ratio, "top-k", "index sources");
            r.topk_from = topk_slot.layer;
        }
        roles.push_back(r);
    }
    return roles;
}

}  // namespace ds4r
