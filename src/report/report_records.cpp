// Reading result records for the report, per-sequence statistics and paired-sequence differences
// (include/ds4r/report.h).
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/report.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const std::string& path, int64_t line, const std::string& what) {
    throw InputError(strfmt("%s:%lld: %s", path.c_str(), (long long)line, what.c_str()));
}

struct FieldReader {
    const json& rec;
    const std::string& path;
    int64_t line;

    const json* get(const char* key) const {
        auto it = rec.find(key);
        return it == rec.end() || it->is_null() ? nullptr : &*it;
    }
    const json& array(const char* key, size_t expected) const {
        const json& v = rec.at(key);
        if (!v.is_array()) fail(path, line, strfmt("\"%s\" must be an array", key));
        if (v.size() != expected)
            fail(path, line,
                 strfmt("\"%s\" has %zu entries, expected %zu (n_tokens - 1)", key, v.size(), expected));
        return v;
    }
    double number(const json& v, const char* key, size_t i) const {
        if (!v.is_number())
            fail(path, line, strfmt("\"%s\"[%zu] must be a number, found %s", key, i, v.dump().c_str()));
        return v.get<double>();
    }
    int64_t integer(const json& v, const char* key, size_t i) const {
        if (!v.is_number_integer())
            fail(path, line, strfmt("\"%s\"[%zu] must be an integer, found %s", key, i, v.dump().c_str()));
        return v.get<int64_t>();
    }
    std::vector<double> numbers(const char* key, size_t expected) const {
        const json& v = array(key, expected);
        std::vector<double> out(expected);
        for (size_t i = 0; i < expected; ++i) out[i] = number(v[i], key, i);
        return out;
    }
    std::vector<int64_t> integers(const char* key, size_t expected) const {
        const json& v = array(key, expected);
        std::vector<int64_t> out(expected);
        for (size_t i = 0; i < expected; ++i) out[i] = integer(v[i], key, i);
        return out;
    }
};

}  // namespace

bool parse_report_record(std::string_view line_text, const std::string& path, int64_t line,
                         ReportRecord* out) {
    json rec = json::parse(line_text.begin(), line_text.end(), nullptr, /*allow_exceptions=*/false);
    if (rec.is_discarded()) fail(path, line, "not valid JSON");
    if (!rec.is_object()) fail(path, line, "expected a JSON object (a ds4replay result record)");
    if (!rec.contains("id")) fail(path, line, "record without an \"id\"");
    if (rec.contains("error")) return false;
    FieldReader f{rec, path, line};
    ReportRecord r;
    r.line = line;
    const json& id = rec.at("id");
    r.id = id.is_string() ? id.get<std::string>() : id.dump();
    if (!rec.contains("logprob"))
        fail(path, line, "record without \"logprob\" (expected a ds4replay score result record)");
    const json& lp = rec.at("logprob");
    if (!lp.is_array()) fail(path, line, "\"logprob\" must be an array");
    if (const json* n = f.get("n_tokens")) {
        if (!n->is_number_integer() || n->get<int64_t>() < 1)
            fail(path, line, "\"n_tokens\" must be an integer >= 1, found " + n->dump());
        r.n_tokens = n->get<int64_t>();
    } else {
        r.n_tokens = static_cast<int64_t>(lp.size()) + 1;
    }
    const size_t m = static_cast<size_t>(r.n_tokens - 1);
    r.logprob = f.numbers("logprob", m);
    if (f.get("entropy")) r.entropy = f.numbers("entropy", m);
    if (f.get("rank")) r.rank = f.integers("rank", m);
    if (f.get("topk_ids") && f.get("topk_logprobs")) {
        const json& ids = f.array("topk_ids", m);
        const json& lps = f.array("topk_logprobs", m);
        r.topk_ids.resize(m);
        r.topk_logprobs.resize(m);
        for (size_t t = 0; t < m; ++t) {
            if (!ids[t].is_array() || !lps[t].is_array() || ids[t].size() != lps[t].size())
                fail(path, line,
                     strfmt("\"topk_ids\"[%zu] and \"topk_logprobs\"[%zu] must be arrays of one length", t,
                            t));
            for (size_t j = 0; j < ids[t].size(); ++j) {
                r.topk_ids[t].push_back(f.integer(ids[t][j], "topk_ids", t));
                r.topk_logprobs[t].push_back(f.number(lps[t][j], "topk_logprobs", t));
            }
        }
    }
    const char* tok_key = f.get("tokens") ? "tokens" : (f.get("input_ids") ? "input_ids" : nullptr);
    if (tok_key) {
        const json& v = rec.at(tok_key);
        if (!v.is_array() || v.size() != static_cast<size_t>(r.n_tokens))
            fail(path, line,
                 strfmt("\"%s\" must be an array of n_tokens (%lld) ids", tok_key, (long long)r.n_tokens));
        for (size_t i = 0; i < v.size(); ++i) r.tokens.push_back(f.integer(v[i], tok_key, i));
    }
    if (const json* tt = f.get("token_text")) {
        if (!tt->is_array() || tt->size() != static_cast<size_t>(r.n_tokens))
            fail(path, line,
                 strfmt("\"token_text\" must be an array of n_tokens (%lld) strings", (long long)r.n_tokens));
        for (size_t i = 0; i < tt->size(); ++i) {
            if (!(*tt)[i].is_string()) fail(path, line, strfmt("\"token_text\"[%zu] must be a string", i));
            r.token_text.push_back((*tt)[i].get<std::string>());
        }
    }
    *out = std::move(r);
    return true;
}

ReportFile read_report_records(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError("cannot open results file " + path + ": " + errno_text(errno));
    ReportFile file;
    std::string text;
    int64_t line = 0;
    while (std::getline(in, text)) {
        ++line;
        if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
        ReportRecord r;
        if (parse_report_record(text, path, line, &r))
            file.records.push_back(std::move(r));
        else
            ++file.error_records;
    }
    if (in.bad()) throw RuntimeError("read error on " + path + ": " + errno_text(errno));
    return file;
}

namespace {

struct Accumulator {
    int64_t n_tokens = 0, positions = 0, entropy_n = 0, rank_n = 0, top1 = 0;
    double sum_lp = 0, sum_ent = 0;
    void add(const ReportRecord& r) {
        n_tokens += r.n_tokens;
        positions += static_cast<int64_t>(r.logprob.size());
        for (double v : r.logprob) sum_lp += v;
        for (double v : r.entropy) sum_ent += v;
        entropy_n += static_cast<int64_t>(r.entropy.size());
        for (int64_t k : r.rank) top1 += k == 1;
        rank_n += static_cast<int64_t>(r.rank.size());
    }
    SequenceStats stats() const {
        SequenceStats s;
        s.n_tokens = n_tokens;
        s.positions = positions;
        s.sum_logprob = sum_lp;
        s.mean_logprob = positions ? sum_lp / positions : NAN;
        s.perplexity = positions ? std::exp(-s.mean_logprob) : NAN;
        s.mean_entropy = entropy_n ? sum_ent / entropy_n : NAN;
        s.typicality_gap = s.mean_logprob + s.mean_entropy;  // NAN propagates
        s.top1_agreement = rank_n ? static_cast<double>(top1) / rank_n : NAN;
        return s;
    }
};

}  // namespace

SequenceStats sequence_stats(const ReportRecord& r) {
    Accumulator a;
    a.add(r);
    return a.stats();
}

SequenceStats total_stats(const std::vector<ReportRecord>& records) {
    Accumulator a;
    for (const auto& r : records) a.add(r);
    return a.stats();
}

PairDiff compare_pair(const ReportRecord& a, const ReportRecord& b) {
    PairDiff d;
    d.id_a = a.id;
    d.id_b = b.id;
    for (double v : a.logprob) d.sum_a += v;
    for (double v : b.logprob) d.sum_b += v;
    d.delta = d.sum_a - d.sum_b;
    // Tokens are matched by id, else (records written without ids) by their "token_text".
    const bool by_id = !a.tokens.empty() && !b.tokens.empty();
    const bool by_text = !by_id && !a.token_text.empty() && !b.token_text.empty();
    if (!by_id && !by_text) {
        // No ids: positions one for one over the common length; the rest counts as "middle".
        const int64_t n = std::min(a.logprob.size(), b.logprob.size());
        for (int64_t t = 0; t < n; ++t) {
            d.aligned.push_back({t + 1, t + 1, a.logprob[t] - b.logprob[t]});
            d.delta_suffix += a.logprob[t] - b.logprob[t];
        }
        for (size_t t = n; t < a.logprob.size(); ++t) d.delta_middle += a.logprob[t];
        for (size_t t = n; t < b.logprob.size(); ++t) d.delta_middle -= b.logprob[t];
        d.middle_a = static_cast<int64_t>(a.logprob.size()) - n;
        d.middle_b = static_cast<int64_t>(b.logprob.size()) - n;
        return d;
    }
    d.aligned_on_tokens = true;
    const int64_t na = a.n_tokens, nb = b.n_tokens;
    int64_t p = 0;
    auto same = [&](int64_t i, int64_t j) {
        return by_id ? a.tokens[i] == b.tokens[j] : a.token_text[i] == b.token_text[j];
    };
    while (p < na && p < nb && same(p, p)) ++p;
    int64_t s = 0;
    while (s < na - p && s < nb - p && same(na - 1 - s, nb - 1 - s)) ++s;
    d.prefix_tokens = p;
    d.suffix_tokens = s;
    // Token j >= 1 is scored by logprob[j - 1]; token 0 is not scored.
    for (int64_t j = 1; j < p; ++j) {
        const double diff = a.logprob[j - 1] - b.logprob[j - 1];
        d.delta_prefix += diff;
        d.aligned.push_back({j, j, diff});
    }
    for (int64_t j = std::max<int64_t>(p, 1); j < na - s; ++j, ++d.middle_a)
        d.delta_middle += a.logprob[j - 1];
    for (int64_t j = std::max<int64_t>(p, 1); j < nb - s; ++j, ++d.middle_b)
        d.delta_middle -= b.logprob[j - 1];
    for (int64_t i = 0; i < s; ++i) {
        const int64_t ja = na - s + i, jb = nb - s + i;
        if (ja < 1 || jb < 1) {
            // The first token of a side (only when the prefix is empty): not scored on that side.
            if (ja >= 1) d.delta_middle += a.logprob[ja - 1], ++d.middle_a;
            if (jb >= 1) d.delta_middle -= b.logprob[jb - 1], ++d.middle_b;
            continue;
        }
        const double diff = a.logprob[ja - 1] - b.logprob[jb - 1];
        d.delta_suffix += diff;
        d.aligned.push_back({ja, jb, diff});
    }
    return d;
}

std::string html_escape(std::string_view s) {
    std::string out;
    out.reserve(s.size() + s.size() / 8);
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::string json_for_script(std::string_view json_text) {
    // <, > and & occur in JSON text only inside strings, where \u escapes mean the same characters.
    std::string out;
    out.reserve(json_text.size());
    for (char c : json_text) {
        switch (c) {
            case '<':
                out += "\\u003c";
                break;
            case '>':
                out += "\\u003e";
                break;
            case '&':
                out += "\\u0026";
                break;
            default:
                out += c;
        }
    }
    return out;
}

std::vector<std::string> token_texts(const ReportRecord& r, const Tokenizer* tok) {
    if (!r.token_text.empty()) return r.token_text;
    std::vector<std::string> out(static_cast<size_t>(r.n_tokens));
    if (r.tokens.empty() || !tok) return out;
    for (size_t i = 0; i < r.tokens.size(); ++i) {
        const int64_t id = r.tokens[i];
        out[i] = id >= 0 && id < tok->size() ? tok->decode_one(id) : strfmt("<id %lld>", (long long)id);
    }
    return out;
}

}  // namespace ds4r
