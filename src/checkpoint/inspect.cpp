// `ds4replay inspect` report (include/ds4r/inspect.h).
#include "ds4r/inspect.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ds4r/safetensors.h"
#include "ds4r/zero_weights.h"

namespace ds4r {

using json = nlohmann::json;

std::string format_bytes(uint64_t n) {
    if (n < 1000) return strfmt("%llu B", (unsigned long long)n);
    static const char* dec[] = {"KB", "MB", "GB", "TB", "PB"};
    static const char* bin[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    double d = static_cast<double>(n) / 1000.0;
    int di = 0;
    while (d >= 1000.0 && di < 4) d /= 1000.0, ++di;
    if (n < 1024) return strfmt("%.2f %s (%llu B)", d, dec[di], (unsigned long long)n);
    double b = static_cast<double>(n) / 1024.0;
    int bi = 0;
    while (b >= 1024.0 && bi < 4) b /= 1024.0, ++bi;
    return strfmt("%.2f %s (%.2f %s)", d, dec[di], b, bin[bi]);
}

namespace {

template <class T>
std::string list_str(const std::vector<T>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

struct ByteSummary {
    uint64_t streamed = 0, stream_min = 0, stream_max = 0;
    uint64_t read = 0;
    uint64_t globals = 0, engram = 0, unused = 0, unknown = 0, total = 0;
    size_t n_global = 0, n_layer = 0, n_engram = 0, n_unused = 0, n_unknown = 0;
};

ByteSummary summarize(const Checkpoint& ck) {
    ByteSummary b;
    for (int l = 0; l < static_cast<int>(ck.roles().size()); ++l) {
        uint64_t s = ck.layer_stream_bytes(l);
        b.streamed += s;
        b.stream_min = l == 0 ? s : std::min(b.stream_min, s);
        b.stream_max = std::max(b.stream_max, s);
        b.read += ck.layer_read_bytes(l);
    }
    for (const auto& t : ck.tensors()) {
        b.total += t.nbytes;
        switch (t.cls) {
            case TensorClass::Global:
                b.globals += t.nbytes, ++b.n_global;
                break;
            case TensorClass::Layer:
                ++b.n_layer;
                break;
            case TensorClass::EngramTable:
                b.engram += t.nbytes, ++b.n_engram;
                break;
            case TensorClass::Unused:
                b.unused += t.nbytes, ++b.n_unused;
                break;
            case TensorClass::Unknown:
                b.unknown += t.nbytes, ++b.n_unknown;
                break;
        }
    }
    return b;
}

}  // namespace

std::string inspect_text(const Checkpoint& ck) {
    const ModelConfig& c = ck.config();
    std::string o;
    o += strfmt("checkpoint: %s\n", ck.dir().c_str());
    o += strfmt("config: config.json (%s form)\n",
                c.form == "hf" ? "Hugging Face" : "flat inference/config.json");
    o += strfmt(
        "  vocab %lld, dim %lld, %lld layers (+%lld MTP, unused), %lld heads x %lld (RoPE on the last "
        "%lld)\n",
        (long long)c.vocab_size, (long long)c.dim, (long long)c.n_layers, (long long)c.n_mtp_layers,
        (long long)c.n_heads, (long long)c.head_dim, (long long)c.rope_head_dim);
    o += strfmt(
        "  q_lora %lld, o_lora %lld x %lld groups, window %lld, hc_mult %lld (%lld Sinkhorn iterations)\n",
        (long long)c.q_lora_rank, (long long)c.o_lora_rank, (long long)c.o_groups, (long long)c.window_size,
        (long long)c.hc_mult, (long long)c.hc_sinkhorn_iters);
    o += strfmt("  experts: %lld routed (top-%lld, %s, scale %g) + %lld shared, width %lld\n",
                (long long)c.n_routed_experts, (long long)c.n_activated_experts, c.score_func.c_str(),
                c.route_scale, (long long)c.n_shared_experts, (long long)c.moe_inter_dim);
    o += strfmt(
        "  compressed attention: KV sources %s, index sources %s, indexer %lld heads x %lld, top-%lld\n",
        list_str(c.kv_source_layers).c_str(), list_str(c.index_source_layers).c_str(),
        (long long)c.index_n_heads, (long long)c.index_head_dim, (long long)c.index_topk);
    if (c.candidate_source_layer >= 0)
        o += strfmt("  candidates: layer %d, %lld blocks of %lld\n", c.candidate_source_layer,
                    (long long)c.candidate_topk_blocks, (long long)c.candidate_block_size);
    o += strfmt("  RoPE: base %g (window layers), %g with YaRN x%g from %lld (compressed layers)\n",
                c.rope_theta, c.compress_rope_theta, c.rope_factor, (long long)c.original_seq_len);
    if (!c.engram_layer_ids.empty())
        o += strfmt(
            "  Engram: layers %s, table rows %s x %lld, n-grams 2..%lld x %lld heads, compressed vocab "
            "%lld\n",
            list_str(c.engram_layer_ids).c_str(), list_str(c.engram_num_embeddings).c_str(),
            (long long)c.engram_head_dim, (long long)c.engram_max_ngram_size, (long long)c.engram_n_heads,
            (long long)c.engram_compressed_vocab_size);
    else
        o += "  Engram: none\n";

    o += "layers:\n";
    o += strfmt("  %5s %5s  %-44s %7s  %s\n", "layer", "ratio", "role", "tensors", "streamed");
    for (const LayerRole& r : ck.roles()) {
        const auto runs = ck.layer_runs(r.layer);
        o += strfmt("  %5d %5d  %-44s %7zu  %s in %zu read%s\n", r.layer, r.ratio, r.describe().c_str(),
                    ck.layer_tensor_count(r.layer), format_bytes(ck.layer_stream_bytes(r.layer)).c_str(),
                    runs.size(), runs.size() == 1 ? "" : "s");
    }

    const ByteSummary b = summarize(ck);
    o += "bytes:\n";
    o +=
        strfmt("  streamed layers:  %s (%zu tensors; per layer %s .. %s)\n", format_bytes(b.streamed).c_str(),
               b.n_layer, format_bytes(b.stream_min).c_str(), format_bytes(b.stream_max).c_str());
    if (b.read != b.streamed)
        o += strfmt("  read per pass:    %s (gaps of <= 64 KiB between tensors included)\n",
                    format_bytes(b.read).c_str());
    o += strfmt("  globals:          %s (embed, norm, head)\n", format_bytes(b.globals).c_str());
    o += strfmt("  Engram tables:    %s (%zu tensors, gathered by row, never streamed)\n",
                format_bytes(b.engram).c_str(), b.n_engram);
    o += strfmt("  unused (prefill): %s (%zu tensors: mtp, vision, aligner, image_*, bias_vl)\n",
                format_bytes(b.unused).c_str(), b.n_unused);
    if (b.n_unknown)
        o += strfmt("  unknown:          %s (%zu tensors, ignored)\n", format_bytes(b.unknown).c_str(),
                    b.n_unknown);
    o += strfmt("  total:            %s in %zu tensors, %zu shard%s (%s)\n", format_bytes(b.total).c_str(),
                ck.tensors().size(), ck.shards().size(), ck.shards().size() == 1 ? "" : "s",
                ck.index_file().c_str());
    if (checkpoint_has_zero_weights(ck))
        o += "  weights:          ZEROS (make-tiny --headers-only: shards are headers plus holes); score "
             "refuses it without --allow-zero-weights\n";
    o += "checkpoint OK\n";
    return o;
}

std::string inspect_json(const Checkpoint& ck) {
    const ModelConfig& c = ck.config();
    json j;
    j["ok"] = true;
    j["model_dir"] = ck.dir();
    j["index_file"] = ck.index_file();
    std::vector<int> ratios(c.compress_ratios.begin(),
                            c.compress_ratios.begin() +
                                std::min<size_t>(c.compress_ratios.size(), static_cast<size_t>(c.n_layers)));
    j["config"] = {
        {"form", c.form},
        {"vocab_size", c.vocab_size},
        {"dim", c.dim},
        {"n_layers", c.n_layers},
        {"n_mtp_layers", c.n_mtp_layers},
        {"n_heads", c.n_heads},
        {"head_dim", c.head_dim},
        {"rope_head_dim", c.rope_head_dim},
        {"q_lora_rank", c.q_lora_rank},
        {"o_groups", c.o_groups},
        {"o_lora_rank", c.o_lora_rank},
        {"window_size", c.window_size},
        {"moe_inter_dim", c.moe_inter_dim},
        {"n_routed_experts", c.n_routed_experts},
        {"n_activated_experts", c.n_activated_experts},
        {"n_shared_experts", c.n_shared_experts},
        {"hc_mult", c.hc_mult},
        {"compress_ratios", ratios},
        {"kv_source_layers", c.kv_source_layers},
        {"index_source_layers", c.index_source_layers},
        {"index_n_heads", c.index_n_heads},
        {"index_head_dim", c.index_head_dim},
        {"index_topk", c.index_topk},
        {"candidate_source_layer", c.candidate_source_layer},
        {"candidate_topk_blocks", c.candidate_topk_blocks},
        {"candidate_block_size", c.candidate_block_size},
        {"engram_layer_ids", c.engram_layer_ids},
        {"engram_num_embeddings", c.engram_num_embeddings},
        {"engram_head_dim", c.engram_head_dim},
        {"engram_n_heads", c.engram_n_heads},
        {"engram_max_ngram_size", c.engram_max_ngram_size},
        {"engram_compressed_vocab_size", c.engram_compressed_vocab_size},
    };
    json layers = json::array();
    for (const LayerRole& r : ck.roles()) {
        const auto runs = ck.layer_runs(r.layer);
        uint64_t read = 0;
        for (const auto& run : runs) read += run.size();
        layers.push_back({
            {"layer", r.layer},
            {"ratio", r.ratio},
            {"role", r.describe()},
            {"kv_source", r.kv_source},
            {"index_source", r.index_source},
            {"owns_index_keys", r.owns_index_keys},
            {"candidate_source", r.candidate_source},
            {"reindex", r.reindex},
            {"engram", r.engram},
            {"kv_from", r.kv_from},
            {"topk_from", r.topk_from},
            {"index_keys_from", r.index_keys_from},
            {"tensors", ck.layer_tensor_count(r.layer)},
            {"stream_bytes", ck.layer_stream_bytes(r.layer)},
            {"read_bytes", read},
            {"read_runs", runs.size()},
        });
    }
    j["layers"] = std::move(layers);
    const ByteSummary b = summarize(ck);
    j["bytes"] = {{"streamed", b.streamed},    {"read", b.read},     {"globals", b.globals},
                  {"engram_tables", b.engram}, {"unused", b.unused}, {"unknown", b.unknown},
                  {"total", b.total}};
    j["tensors"] = {{"total", ck.tensors().size()}, {"global", b.n_global}, {"layer", b.n_layer},
                    {"engram_table", b.n_engram},   {"unused", b.n_unused}, {"unknown", b.n_unknown}};
    json shards = json::array();
    for (const auto& s : ck.shards())
        shards.push_back({{"file", s.file_name}, {"size", s.file_size}, {"tensors", s.n_tensors}});
    j["shards"] = std::move(shards);
    j["zero_weights"] = checkpoint_has_zero_weights(ck);
    j["unknown_tensors"] = ck.unknown_tensor_names();
    // Names come from files: replace invalid UTF-8 rather than throw while printing.
    return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string inspect_error_json(const std::string& model_dir, const Error& e) {
    json j = {{"ok", false}, {"model_dir", model_dir}, {"error", e.what()}, {"exit_code", e.exit_code()}};
    return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

int run_inspect(const std::string& model_dir, bool as_json, std::FILE* out) {
    try {
        Checkpoint ck = Checkpoint::open(model_dir);
        const std::string report = as_json ? inspect_json(ck) : inspect_text(ck);
        std::fwrite(report.data(), 1, report.size(), out);
        std::fflush(out);
        return 0;
    } catch (const Error& e) {
        if (as_json) {
            const std::string s = inspect_error_json(model_dir, e);
            std::fwrite(s.data(), 1, s.size(), out);
            std::fflush(out);
        }
        throw;
    }
}

}  // namespace ds4r
