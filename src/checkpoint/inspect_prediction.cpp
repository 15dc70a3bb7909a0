// `inspect --pass-tokens N`: bytes read from disk per pass and the predicted pass time (ds4r/inspect.h).
#include <cmath>
#include <nlohmann/json.hpp>

#include "ds4r/binding.h"
#include "ds4r/inspect.h"
#include "ds4r/log.h"

namespace ds4r {

namespace {
// Expected distinct cells hit by n uniform draws over m cells.
double distinct(double n, double m) {
    return m > 0 ? m * -std::expm1(-n / m) : 0;
}
}  // namespace

PassIoPrediction predict_pass_io(const Checkpoint& ck, int64_t pass_tokens, double seq_mb_s, double iops,
                                 bool scales_in_memory) {
    const ModelConfig& c = ck.config();
    PassIoPrediction p;
    p.pass_tokens = pass_tokens;
    p.seq_mb_s = seq_mb_s;
    p.iops = iops;
    p.scales_in_memory = scales_in_memory;
    for (const LayerRole& r : ck.roles()) p.layer_bytes += ck.layer_read_bytes(r.layer);
    // The head and final norm are read once per pass too; the embedding rows are gathered per token.
    p.layer_bytes += ck.bytes_of(TensorClass::Global) - ck.at(kEmbedTensorName).nbytes;
    const double cols = static_cast<double>(c.engram_hash_cols());
    for (int L : c.engram_layer_ids) {
        const TensorLocation& w = ck.at(engram_table_tensor_name(L));
        const TensorLocation& s = ck.at(engram_table_scale_tensor_name(L));
        const double rows = static_cast<double>(w.shape.at(0)), hd = static_cast<double>(w.shape.at(1));
        const double lookups = static_cast<double>(pass_tokens) * cols;
        // Each hash column draws from its own prime-sized slice of the table (docs/MODEL.md 4.2): ~rows /
        // cols.
        const double rows_hit = cols * distinct(static_cast<double>(pass_tokens), rows / cols);
        const double pages = rows * hd / 4096.0, scale_pages = static_cast<double>(s.nbytes) / 4096.0;
        p.engram_lookups += static_cast<uint64_t>(lookups);
        p.engram_rows += rows_hit;
        p.engram_requests += distinct(rows_hit, pages);
        if (!scales_in_memory) p.engram_requests += distinct(rows_hit, scale_pages);
        p.scale_bytes += s.nbytes;
    }
    p.layer_s = seq_mb_s > 0 ? static_cast<double>(p.layer_bytes) / 1e6 / seq_mb_s : 0;
    p.engram_s = iops > 0 ? p.engram_requests / iops : 0;
    p.scales_s = scales_in_memory && seq_mb_s > 0 ? static_cast<double>(p.scale_bytes) / 1e6 / seq_mb_s : 0;
    p.pass_s = p.layer_s + p.engram_s;
    return p;
}

std::string pass_io_text(const PassIoPrediction& p) {
    std::string s =
        strfmt("\npass of %lld tokens, disk at %.0f MB/s sequential and %.0f random 4 KiB reads/s:\n",
               (long long)p.pass_tokens, p.seq_mb_s, p.iops);
    s += strfmt("  layers + head   %s read sequentially: %.1f s\n", format_bytes(p.layer_bytes).c_str(),
                p.layer_s);
    if (p.engram_lookups > 0) {
        s += strfmt(
            "  Engram rows     %llu lookups -> %.0f distinct rows -> %.0f random reads (%s%s): %.1f s\n",
            (unsigned long long)p.engram_lookups, p.engram_rows, p.engram_requests,
            format_bytes(static_cast<uint64_t>(p.engram_requests * 4096)).c_str(),
            p.scales_in_memory ? "" : ", rows + their scales", p.engram_s);
        if (p.scales_in_memory)
            s += strfmt("  Engram scales   %s in host memory, read once per run: %.1f s\n",
                        format_bytes(p.scale_bytes).c_str(), p.scales_s);
    }
    s += strfmt("  predicted pass  %.1f s of disk time (compute runs under it), %.0f tokens/s\n", p.pass_s,
                p.pass_s > 0 ? static_cast<double>(p.pass_tokens) / p.pass_s : 0.0);
    return s;
}

int run_inspect(const std::string& model_dir, bool as_json, std::FILE* out, int64_t pass_tokens,
                double seq_mb_s, double iops, bool scales_in_memory) {
    if (pass_tokens <= 0) return run_inspect(model_dir, as_json, out);
    if (seq_mb_s <= 0 || iops <= 0) throw InputError("--disk-seq-mbps and --disk-iops must be positive");
    Checkpoint ck = Checkpoint::open(model_dir);
    const PassIoPrediction p = predict_pass_io(ck, pass_tokens, seq_mb_s, iops, scales_in_memory);
    std::string report;
    if (as_json) {
        nlohmann::json j = nlohmann::json::parse(inspect_json(ck));
        j["pass_prediction"] = {{"pass_tokens", p.pass_tokens},
                                {"disk_seq_mb_s", p.seq_mb_s},
                                {"disk_iops", p.iops},
                                {"scales_in_memory", p.scales_in_memory},
                                {"layer_bytes", p.layer_bytes},
                                {"engram_lookups", p.engram_lookups},
                                {"engram_rows", p.engram_rows},
                                {"engram_reads", p.engram_requests},
                                {"scale_bytes", p.scale_bytes},
                                {"layer_s", p.layer_s},
                                {"engram_s", p.engram_s},
                                {"scales_s", p.scales_s},
                                {"pass_s", p.pass_s}};
        report = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    } else {
        report = inspect_text(ck) + pass_io_text(p);
    }
    std::fwrite(report.data(), 1, report.size(), out);
    std::fflush(out);
    return 0;
}

}  // namespace ds4r
