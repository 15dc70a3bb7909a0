// The report's plain-text summary and the command itself (include/ds4r/report.h).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/log.h"
#include "ds4r/report.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

namespace {

std::string num(double v, const char* fmt = "%.3f") {
    return std::isnan(v) ? std::string("-") : strfmt(fmt, v);
}

std::string clip(const std::string& s, size_t n) {
    return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

void stats_row(std::FILE* out, const std::string& name, const SequenceStats& s) {
    std::fprintf(out, "%-24s %8lld %12s %9s %11s %9s %9s %7s\n", clip(name, 24).c_str(),
                 (long long)s.n_tokens, num(s.sum_logprob).c_str(), num(s.mean_logprob, "%.4f").c_str(),
                 num(s.perplexity, "%.2f").c_str(), num(s.mean_entropy, "%.4f").c_str(),
                 num(s.typicality_gap, "%+.4f").c_str(), num(s.top1_agreement * 100, "%.1f%%").c_str());
}

void check_html_target(const std::string& path, bool overwrite) {
    if (overwrite || !file_exists(path)) return;
    if (is_directory(path)) throw InputError("--html " + path + " is a directory");
    std::string head(256, '\0');
    std::ifstream in(path, std::ios::binary);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    if (head.find(kReportHtmlMarker) == std::string::npos)
        throw InputError(
            "--html " + path +
            " exists and is not a ds4replay report: not overwriting it (give --overwrite to replace it)");
}

}  // namespace

void write_text_report(const ReportFile& file, const std::vector<PairDiff>& pairs, const std::string& path,
                       std::FILE* out) {
    const SequenceStats tot = total_stats(file.records);
    std::fprintf(out, "%s: %zu sequences, %lld tokens, %lld scored positions", path.c_str(),
                 file.records.size(), (long long)tot.n_tokens, (long long)tot.positions);
    if (file.error_records) std::fprintf(out, " (%lld error records skipped)", (long long)file.error_records);
    std::fprintf(out, "\n\n%-24s %8s %12s %9s %11s %9s %9s %7s\n", "id", "tokens", "sum_logprob", "mean_lp",
                 "perplexity", "mean_ent", "typ_gap", "top1");
    for (const auto& r : file.records) stats_row(out, r.id, sequence_stats(r));
    stats_row(out, "total", tot);
    std::fprintf(
        out,
        "\nmean_lp: mean logprob per scored token (nats); perplexity = exp(-mean_lp); mean_ent: mean "
        "entropy of the next-token distribution;\ntyp_gap = mean_lp + mean_ent (about 0 for text the model "
        "would write itself, < 0 for surprising text); top1: positions where the actual token ranks 1.\n");
    for (const auto& d : pairs) {
        std::fprintf(out, "\npair %s vs %s: sum logprob %.4f vs %.4f, difference %+.4f\n", d.id_a.c_str(),
                     d.id_b.c_str(), d.sum_a, d.sum_b, d.delta);
        if (d.aligned_on_tokens) {
            std::fprintf(
                out,
                "  common prefix %lld tokens: %+.4f; changed middle (%lld vs %lld scored tokens): %+.4f; "
                "common suffix %lld tokens: %+.4f\n",
                (long long)d.prefix_tokens, d.delta_prefix, (long long)d.middle_a, (long long)d.middle_b,
                d.delta_middle, (long long)d.suffix_tokens, d.delta_suffix);
        } else {
            std::fprintf(out,
                         "  no token ids or token_text in the records: positions compared one for one: "
                         "common positions %+.4f, "
                         "extra positions %+.4f\n",
                         d.delta_suffix, d.delta_middle);
        }
        // The aligned tokens whose logprob moved most.
        std::vector<PairDiff::Aligned> top = d.aligned;
        std::sort(top.begin(), top.end(),
                  [](const auto& x, const auto& y) { return std::fabs(x.diff) > std::fabs(y.diff); });
        if (top.size() > 5) top.resize(5);
        for (const auto& a : top)
            if (a.diff != 0)
                std::fprintf(out, "  token %lld (A) / %lld (B): %+.4f\n", (long long)a.token_a,
                             (long long)a.token_b, a.diff);
    }
}

int run_report(const ReportOptions& opt, std::FILE* out) {
    if (!opt.html_path.empty()) check_html_target(opt.html_path, opt.overwrite);
    ReportFile file = read_report_records(opt.results_path);
    std::map<std::string, const ReportRecord*> by_id;
    for (const auto& r : file.records) by_id.emplace(r.id, &r);
    std::vector<PairDiff> pairs;
    for (const auto& [a, b] : opt.pairs) {
        auto ia = by_id.find(a), ib = by_id.find(b);
        if (ia == by_id.end())
            throw InputError("--pairs: no record with id \"" + a + "\" in " + opt.results_path);
        if (ib == by_id.end())
            throw InputError("--pairs: no record with id \"" + b + "\" in " + opt.results_path);
        pairs.push_back(compare_pair(*ia->second, *ib->second));
    }
    write_text_report(file, pairs, opt.results_path, out);
    if (opt.html_path.empty()) return 0;
    std::optional<Tokenizer> tok;
    if (!opt.tokenizer_path.empty()) tok = Tokenizer::load(opt.tokenizer_path);
    const std::string html =
        render_html_report(file, pairs, tok ? &*tok : nullptr, opt.results_path, opt.max_text_tokens);
    AtomicFileWriter w(opt.html_path);
    w.write(html);
    w.commit();
    log_info(strfmt("report: wrote %s (%zu bytes)", opt.html_path.c_str(), html.size()));
    return 0;
}

}  // namespace ds4r
