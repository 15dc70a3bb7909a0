// The report as one self-contained HTML file (include/ds4r/report.h): inline CSS, inline SVG, one
// inline script; nothing is fetched. Every piece of record text goes through html_escape, the data
// for the script through json_for_script.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/report.h"
#include "ds4r/tokenizer.h"
#include "report/report_assets.h"

namespace ds4r {

using json = nlohmann::json;

namespace {

std::string num(double v, const char* fmt) {
    return std::isnan(v) ? std::string("&ndash;") : strfmt(fmt, v);
}

// Surprisal -> background colour: transparent-ish yellow for likely tokens, deep red past 12 nats.
constexpr double kSurprisalScaleMax = 12.0;

std::string surprisal_colour(double logprob) {
    const double t = std::clamp(-logprob / kSurprisalScaleMax, 0.0, 1.0);
    // Hue 55 (yellow) -> 0 (red); lightness 94% -> 58%.
    return strfmt("hsl(%.0f,90%%,%.0f%%)", 55.0 * (1.0 - t), 94.0 - 36.0 * t);
}

std::string stats_cells(const SequenceStats& s) {
    return strfmt("<td data-v=\"%lld\">%lld</td>", (long long)s.n_tokens, (long long)s.n_tokens) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.sum_logprob, num(s.sum_logprob, "%.3f").c_str()) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.mean_logprob, num(s.mean_logprob, "%.4f").c_str()) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.perplexity, num(s.perplexity, "%.2f").c_str()) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.mean_entropy, num(s.mean_entropy, "%.4f").c_str()) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.typicality_gap, num(s.typicality_gap, "%+.4f").c_str()) +
           strfmt("<td data-v=\"%.17g\">%s</td>", s.top1_agreement,
                  num(s.top1_agreement * 100, "%.1f%%").c_str());
}

const char* kStatsHeader =
    "<th data-k=\"n\">tokens</th><th data-k=\"n\">sum logprob</th><th data-k=\"n\">mean logprob</th>"
    "<th data-k=\"n\">perplexity</th><th data-k=\"n\">mean entropy</th>"
    "<th data-k=\"n\" title=\"mean logprob + mean entropy: about 0 for text the model would write itself\">"
    "typicality gap</th><th data-k=\"n\" title=\"positions where the actual token is the model's first "
    "choice\">"
    "top-1</th>";

std::string card(const char* label, const std::string& value, const char* hint) {
    return strfmt(
        "<div class=\"card\"><div class=\"cv\">%s</div><div class=\"cl\">%s</div>"
        "<div class=\"ch\">%s</div></div>",
        value.c_str(), label, hint);
}

// Histogram of every scored position's logprob as an inline SVG.
std::string histogram_svg(const std::vector<ReportRecord>& records) {
    std::vector<double> v;
    for (const auto& r : records) v.insert(v.end(), r.logprob.begin(), r.logprob.end());
    if (v.empty()) return "<p class=\"note\">No scored positions (every sequence has one token).</p>";
    const double lo_data = *std::min_element(v.begin(), v.end());
    const double lo = std::min(-1.0, std::floor(lo_data));
    const int bins = 40;
    const double width = -lo / bins;
    std::vector<int64_t> count(bins, 0);
    for (double x : v) count[std::clamp(static_cast<int>((x - lo) / width), 0, bins - 1)]++;
    const int64_t cmax = *std::max_element(count.begin(), count.end());
    const double W = 760, H = 220, L = 52, R = 12, T = 12, B = 40;
    const double pw = W - L - R, ph = H - T - B;
    std::string s = strfmt(
        "<svg class=\"hist\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"histogram of "
        "per-token logprobs\">",
        W, H);
    // Horizontal grid lines and counts.
    for (int g = 0; g <= 4; ++g) {
        const double y = T + ph - ph * g / 4.0;
        s +=
            strfmt("<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", L, y, L + pw, y);
        s += strfmt("<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%lld</text>", L - 6, y + 4,
                    (long long)std::llround(cmax * g / 4.0));
    }
    for (int b = 0; b < bins; ++b) {
        const double h = cmax ? ph * count[b] / cmax : 0;
        const double x = L + pw * b / bins;
        const double a = lo + width * b;
        s += strfmt(
            "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
            "style=\"fill:%s\"><title>[%.2f, %.2f): %lld positions</title></rect>",
            x + 1, T + ph - h, pw / bins - 2, h, surprisal_colour(a + width / 2).c_str(), a, a + width,
            (long long)count[b]);
    }
    // x axis ticks: about 8 integer ticks from lo to 0.
    const int step = std::max(1, static_cast<int>(std::ceil(-lo / 8)));
    for (int t = 0; t >= lo; t -= step) {
        const double x = L + pw * (t - lo) / -lo;
        s += strfmt("<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", x, T + ph, x,
                    T + ph + 5);
        s += strfmt("<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>", x,
                    T + ph + 18, t);
    }
    s += strfmt("<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", L, T + ph, L + pw,
                T + ph);
    s += strfmt(
        "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">logprob of the actual next token "
        "(nats)</text>",
        L + pw / 2, H - 4);
    s += "</svg>";
    return s;
}

// Bars of the per-token logprob difference A - B along A's tokens (aligned prefix and suffix); the
// changed middle is shaded.
std::string pair_svg(const PairDiff& d, int64_t n_a) {
    if (d.aligned.empty())
        return "<p class=\"note\">No tokens to compare one for one: the two sequences share no prefix or "
               "suffix, so the whole difference is in the changed part.</p>";
    const double W = 760, H = 150, L = 52, R = 12, T = 10, B = 24;
    const double pw = W - L - R, ph = H - T - B, mid = T + ph / 2;
    double m = 1e-9;
    for (const auto& a : d.aligned) m = std::max(m, std::fabs(a.diff));
    const double n = static_cast<double>(std::max<int64_t>(n_a, 1));
    std::string s = strfmt(
        "<svg class=\"pair\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"per-token logprob "
        "difference\">",
        W, H);
    if (d.aligned_on_tokens && n_a - d.suffix_tokens > d.prefix_tokens) {
        const double x0 = L + pw * d.prefix_tokens / n, x1 = L + pw * (n_a - d.suffix_tokens) / n;
        s += strfmt(
            "<rect class=\"changed\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"><title>changed "
            "middle: %lld tokens of A</title></rect>",
            x0, T, std::max(1.0, x1 - x0), ph, (long long)(n_a - d.suffix_tokens - d.prefix_tokens));
    }
    for (const auto& a : d.aligned) {
        const double x = L + pw * a.token_a / n, h = (ph / 2) * std::fabs(a.diff) / m;
        s += strfmt(
            "<rect class=\"%s\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"><title>token %lld (A) / "
            "%lld (B): %+.4f</title></rect>",
            a.diff >= 0 ? "up" : "down", x, a.diff >= 0 ? mid - h : mid, std::max(0.8, pw / n - 0.6), h,
            (long long)a.token_a, (long long)a.token_b, a.diff);
    }
    s +=
        strfmt("<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>", L, mid, L + pw, mid);
    s += strfmt("<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%+.2f</text>", L - 6, T + 8, m);
    s += strfmt("<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%+.2f</text>", L - 6, T + ph,
                -m);
    s += strfmt(
        "<text class=\"ax\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">token of A (A &minus; B logprob; "
        "shaded: the changed part)</text>",
        L + pw / 2, H - 4);
    s += "</svg>";
    return s;
}

}  // namespace

std::string render_html_report(const ReportFile& file, const std::vector<PairDiff>& pairs,
                               const Tokenizer* tok, const std::string& results_path,
                               int64_t max_text_tokens) {
    const auto& recs = file.records;
    const SequenceStats tot = total_stats(recs);
    bool any_tokens = false, all_tokens = true;
    for (const auto& r : recs) {
        const bool has = !r.tokens.empty() || !r.token_text.empty();
        any_tokens |= has;
        all_tokens &= has;
    }
    std::string h;
    h.reserve(1 << 16);
    h += "<!DOCTYPE html>\n";
    h += kReportHtmlMarker;
    h += "\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
         "<meta name=\"generator\" content=\"ds4replay report\">";
    h += "<title>ds4replay report: " + html_escape(results_path) + "</title>";
    h += "<style>";
    h += report_assets::kCss;
    h += "</style></head><body><main>";
    h += "<header><h1>ds4replay report</h1><p class=\"sub\"><code>" + html_escape(results_path) +
         "</code> &middot; " +
         strfmt("%zu sequences &middot; %lld tokens &middot; %lld scored positions", recs.size(),
                (long long)tot.n_tokens, (long long)tot.positions);
    if (file.error_records)
        h += strfmt(" &middot; %lld error records skipped", (long long)file.error_records);
    h += "</p></header>";

    h += "<section class=\"cards\">";
    h += card("mean logprob", num(tot.mean_logprob, "%.3f"), "nats per scored token");
    h += card("perplexity", num(tot.perplexity, "%.2f"), "exp(&minus;mean logprob)");
    h += card("mean entropy", num(tot.mean_entropy, "%.3f"), "nats, next-token distribution");
    h += card("typicality gap", num(tot.typicality_gap, "%+.3f"),
              "mean logprob + mean entropy; &asymp;0 for the "
              "model's own text");
    h += card("top-1 agreement", num(tot.top1_agreement * 100, "%.1f%%"), "actual token ranked first");
    h += "</section>";

    h += "<section><h2>Sequences</h2><p class=\"note\">Click a column to sort, an id to jump to its text.</p>"
         "<div class=\"tw\"><table id=\"seqtable\"><thead><tr><th data-k=\"s\">id</th>";
    h += kStatsHeader;
    h += "</tr></thead><tbody>";
    for (size_t i = 0; i < recs.size(); ++i)
        h += strfmt("<tr><td data-v=\"%zu\"><a href=\"#seq-%zu\">", i, i) + html_escape(recs[i].id) +
             "</a></td>" + stats_cells(sequence_stats(recs[i])) + "</tr>";
    h += "</tbody><tfoot><tr><td>total</td>" + stats_cells(tot) + "</tr></tfoot></table></div></section>";

    h += "<section><h2>Per-token logprob</h2>" + histogram_svg(recs) + "</section>";

    if (!pairs.empty()) {
        h += "<section><h2>Pairs</h2>";
        for (const auto& d : pairs) {
            size_t ia = 0;
            while (ia < recs.size() && recs[ia].id != d.id_a) ++ia;
            size_t ib = 0;
            while (ib < recs.size() && recs[ib].id != d.id_b) ++ib;
            h += "<div class=\"pairbox\"><h3><a href=\"#seq-" + std::to_string(ia) + "\">" +
                 html_escape(d.id_a) + "</a> vs <a href=\"#seq-" + std::to_string(ib) + "\">" +
                 html_escape(d.id_b) + "</a></h3>";
            h += strfmt("<p>Sum logprob %.4f vs %.4f: difference <b class=\"%s\">%+.4f</b> nats.</p>",
                        d.sum_a, d.sum_b, d.delta >= 0 ? "pos" : "neg", d.delta);
            if (d.aligned_on_tokens)
                h += strfmt(
                    "<table class=\"parts\"><tr><th>common prefix</th><th>changed middle</th><th>common "
                    "suffix</th></tr><tr><td>%lld tokens: %+.4f</td><td>%lld vs %lld scored tokens: "
                    "%+.4f</td><td>%lld tokens: %+.4f</td></tr></table>",
                    (long long)d.prefix_tokens, d.delta_prefix, (long long)d.middle_a, (long long)d.middle_b,
                    d.delta_middle, (long long)d.suffix_tokens, d.delta_suffix);
            else
                h += strfmt(
                    "<p class=\"note\">No token ids or token text in these records: positions compared one "
                    "for one "
                    "(common positions %+.4f, extra positions %+.4f).</p>",
                    d.delta_suffix, d.delta_middle);
            h += pair_svg(d, ia < recs.size() ? recs[ia].n_tokens : 1) + "</div>";
        }
        h += "</section>";
    }

    h += "<section><h2>Text</h2>";
    if (!any_tokens)
        h +=
            "<p class=\"note warn\">The records carry no token ids (<code>tokens</code>) or token text "
            "(<code>token_text</code>): positions are shown instead of text. Score with "
            "<code>--echo-tokens</code>, or keep the input's <code>tokens</code> field, to see the text.</p>";
    else if (!all_tokens)
        h += "<p class=\"note warn\">Some records carry no token ids: their positions are shown instead of "
             "text.</p>";
    if (any_tokens && !tok)
        h += "<p class=\"note\">No tokenizer given (<code>--tokenizer</code> / <code>--model</code>): tokens "
             "without <code>token_text</code> are shown as ids.</p>";
    h += strfmt(
        "<div class=\"legend\"><span>surprisal (&minus;logprob):</span><span class=\"sw\" "
        "style=\"background:%s\">0</span><span class=\"sw\" style=\"background:%s\">3</span><span "
        "class=\"sw\" style=\"background:%s\">6</span><span class=\"sw\" style=\"background:%s\">9</span>"
        "<span class=\"sw\" style=\"background:%s\">&ge;12 nats</span><span class=\"sw first\">first token "
        "(not scored)</span><span class=\"hint\">hover a token for its logprob, rank and the top "
        "alternatives</span></div>",
        surprisal_colour(0).c_str(), surprisal_colour(-3).c_str(), surprisal_colour(-6).c_str(),
        surprisal_colour(-9).c_str(), surprisal_colour(-12).c_str());

    json data = json::array();
    int64_t shown_tokens = 0;
    size_t text_omitted = 0;
    for (size_t i = 0; i < recs.size(); ++i) {
        const ReportRecord& r = recs[i];
        // The page stays readable (and its size bounded): past max_text_tokens, sequences get the table
        // row and histogram only.
        if (shown_tokens + r.n_tokens > max_text_tokens && shown_tokens > 0) {
            data.push_back(nullptr);
            ++text_omitted;
            continue;
        }
        shown_tokens += r.n_tokens;
        const std::vector<std::string> text = token_texts(r, tok);
        const bool has_text = !r.tokens.empty() || !r.token_text.empty();
        json js{{"id", r.id}, {"lp", r.logprob}, {"rank", r.rank}, {"ent", r.entropy}, {"tok", r.tokens}};
        // Top-k alternatives as [text, logprob] per position, decoded with the tokenizer when there is one.
        json alts = json::array();
        for (size_t t = 0; t < r.topk_ids.size(); ++t) {
            json row = json::array();
            for (size_t j = 0; j < r.topk_ids[t].size(); ++j) {
                const int64_t id = r.topk_ids[t][j];
                const std::string label = tok && id >= 0 && id < tok->size() ? tok->decode_one(id) : "";
                row.push_back(json::array({id, label, r.topk_logprobs[t][j]}));
            }
            alts.push_back(std::move(row));
        }
        js["alt"] = std::move(alts);
        data.push_back(std::move(js));

        h +=
            strfmt("<div class=\"seq\" id=\"seq-%zu\"><h3>", i) + html_escape(r.id) +
            strfmt(
                "<span class=\"meta\">%lld tokens &middot; sum logprob %.3f</span></h3><div class=\"toks%s\" "
                "data-s=\"%zu\">",
                (long long)r.n_tokens, sequence_stats(r).sum_logprob, has_text ? "" : " pos", i);
        for (int64_t j = 0; j < r.n_tokens; ++j) {
            std::string shown;
            if (!has_text)
                shown = "#" + std::to_string(j);
            else if (!text[j].empty())
                shown = text[j];
            else if (!r.tokens.empty())
                shown = strfmt("\u27e8%lld\u27e9", (long long)r.tokens[j]);
            const bool special = tok && !r.tokens.empty() && r.tokens[j] >= 0 && r.tokens[j] < tok->size() &&
                                 tok->is_added(r.tokens[j]);
            std::string cls = j == 0 ? "t first" : "t";
            if (special) cls += " sp";
            std::string style =
                j == 0 ? "" : " style=\"background:" + surprisal_colour(r.logprob[j - 1]) + "\"";
            h += "<span class=\"" + cls + "\" data-p=\"" + std::to_string(j) + "\"" + style + ">" +
                 html_escape(shown) + "</span>";
        }
        h += "</div></div>";
    }
    if (text_omitted)
        h += strfmt(
            "<p class=\"note warn\">The text of %zu more sequences is left out: this page shows at most "
            "%lld tokens of text (<code>--max-text-tokens</code>). They are in the table and the "
            "histogram.</p>",
            text_omitted, (long long)max_text_tokens);
    h += "</section>";
    h += "<footer>Generated by <code>ds4replay report</code>. Self-contained: no network access.</footer>";
    h += "</main><div id=\"tip\" class=\"tip\" hidden></div>";
    h += "<script type=\"application/json\" id=\"ds4r-data\">" + json_for_script(data.dump()) + "</script>";
    h += "<script>";
    h += report_assets::kScript;
    h += "</script></body></html>\n";
    return h;
}

}  // namespace ds4r
