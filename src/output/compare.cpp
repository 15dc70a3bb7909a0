#include "ds4r/compare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/plural.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

using json = nlohmann::json;

namespace {

// One scored position: logprob of the actual next token, optional rank and top-k alternatives.
struct Pos {
    double logprob = NAN;
    int64_t rank = -1;
    std::vector<std::pair<int64_t, double>> topk;  // (token id, logprob)
};

struct Seq {
    std::string id;
    int64_t n_tokens = -1;  // -1 for API records (unknown)
    std::vector<Pos> pos;   // ds4replay: index t = position t; API: the generated tail
    bool api = false;
    int64_t line = 0;
};

// Token id of an API top-k entry; kAmbiguous when its text is the decoding of several ids.
constexpr int64_t kAmbiguous = -1;

class TokenMapper {
public:
    explicit TokenMapper(std::string path) : path_(std::move(path)) {}
    int64_t id_of(const json& entry, const std::string& file, int64_t line) {
        auto fail = [&](const std::string& m) -> int64_t {
            throw InputError(strfmt("%s:%lld: %s", file.c_str(), (long long)line, m.c_str()));
        };
        for (const char* k : {"token_id", "id"})
            if (entry.contains(k)) {
                const json& v = entry.at(k);
                if (!v.is_number_integer() ||
                    (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
                    fail(std::string("top_logprobs entry: \"") + k +
                         "\" must be a non-negative integer, found " + v.dump());
                return v.get<int64_t>();
            }
        if (!entry.contains("token") || !entry.at("token").is_string())
            fail("top_logprobs entry without a \"token\" string (or an integer \"token_id\")");
        const std::string t = entry.at("token").get<std::string>();
        if (t.rfind("token_id:", 0) == 0) {
            const std::string digits = t.substr(9);
            if (digits.empty() || digits.size() > 12 ||
                digits.find_first_not_of("0123456789") != std::string::npos)
                fail("bad token " + json(t).dump() + " (expected \"token_id:<decimal id>\")");
            return std::stoll(digits);
        }
        load();
        auto it = by_text_.find(t);
        if (it == by_text_.end())
            fail("token text " + json(t).dump() + " is not the decoding of any token of " + path_);
        if (it->second == kAmbiguous) ++ambiguous_;
        return it->second;
    }
    int64_t ambiguous() const { return ambiguous_; }

private:
    void load() {
        if (loaded_) return;
        if (path_.empty())
            throw InputError(
                "API records carry token text: give --tokenizer tokenizer.json (or --model DIR) to map it to "
                "ids");
        Tokenizer tok = Tokenizer::load(path_);
        for (int64_t i = 0; i < tok.size(); ++i) {
            if (!tok.has_token(i)) continue;
            auto [it, fresh] = by_text_.emplace(tok.decode_one(i), i);
            // Several ids decode to the same text (e.g. the byte tokens of partial UTF-8 sequences,
            // all "\uFFFD"): the text cannot name one of them.
            if (!fresh) it->second = kAmbiguous;
        }
        loaded_ = true;
    }
    std::string path_;
    bool loaded_ = false;
    int64_t ambiguous_ = 0;
    std::unordered_map<std::string, int64_t> by_text_;
};

const json* api_logprobs(const json& v) {
    if (v.contains("logprobs") && v.at("logprobs").is_object()) return &v.at("logprobs");
    if (v.contains("choices") && v.at("choices").is_array() && !v.at("choices").empty()) {
        const json& c = v.at("choices").at(0);
        if (c.is_object() && c.contains("logprobs") && c.at("logprobs").is_object()) return &c.at("logprobs");
    }
    return nullptr;
}

std::vector<Seq> read_file(const std::string& path, TokenMapper& mapper) {
    if (is_directory(path)) throw InputError(path + ": is a directory, expected a JSONL file");
    std::ifstream f(path);
    if (!f) throw InputError(strfmt("%s: cannot open (%s)", path.c_str(), errno_text(errno).c_str()));
    std::vector<Seq> out;
    std::string line;
    int64_t ln = 0;
    while (std::getline(f, line)) {
        ++ln;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        json v;
        try {
            v = json::parse(line);
        } catch (const json::parse_error& e) {
            throw InputError(strfmt("%s:%lld: not valid JSON (%s)", path.c_str(), (long long)ln, e.what()));
        }
        if (!v.is_object() || !v.contains("id"))
            throw InputError(
                strfmt("%s:%lld: expected a JSON object with an \"id\"", path.c_str(), (long long)ln));
        Seq s;
        s.id = v.at("id").dump();
        s.line = ln;
        try {
            if (v.contains("error")) continue;  // error records of --skip-bad carry no scores
            if (v.contains("logprob") && v.at("logprob").is_array()) {
                s.n_tokens = v.value("n_tokens", static_cast<int64_t>(v.at("logprob").size()) + 1);
                const auto& lp = v.at("logprob");
                s.pos.resize(lp.size());
                for (size_t t = 0; t < lp.size(); ++t) {
                    s.pos[t].logprob = lp.at(t).get<double>();
                    if (v.contains("rank")) s.pos[t].rank = v.at("rank").at(t).get<int64_t>();
                    if (v.contains("topk_ids") && v.contains("topk_logprobs")) {
                        const auto& ids = v.at("topk_ids").at(t);
                        const auto& lps = v.at("topk_logprobs").at(t);
                        for (size_t j = 0; j < ids.size() && j < lps.size(); ++j)
                            s.pos[t].topk.emplace_back(ids.at(j).get<int64_t>(), lps.at(j).get<double>());
                    }
                }
            } else if (const json* lp = api_logprobs(v)) {
                s.api = true;
                const json& content = lp->at("content");
                for (const auto& e : content) {
                    Pos p;
                    p.logprob = e.at("logprob").get<double>();
                    if (e.contains("top_logprobs"))
                        for (const auto& a : e.at("top_logprobs")) {
                            const double l = a.at("logprob").get<double>();
                            if (l <= -9999.0) continue;  // the API's "below top-k" sentinel
                            p.topk.emplace_back(mapper.id_of(a, path, ln), l);
                        }
                    std::sort(p.topk.begin(), p.topk.end(), [](const auto& x, const auto& y) {
                        return x.second > y.second || (x.second == y.second && x.first < y.first);
                    });
                    s.pos.push_back(std::move(p));
                }
            } else {
                throw InputError(strfmt(
                    "%s:%lld: neither a ds4replay record (\"logprob\") nor an API record (\"logprobs\")",
                    path.c_str(), (long long)ln));
            }
        } catch (const json::exception& e) {
            throw InputError(strfmt("%s:%lld: malformed record (%s)", path.c_str(), (long long)ln, e.what()));
        }
        out.push_back(std::move(s));
    }
    return out;
}

double quant(std::vector<double> v, double q) {
    if (v.empty()) return NAN;
    std::sort(v.begin(), v.end());
    const double pos = q * (v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// KL(P || Q) over the ids both top-k lists contain, each renormalized over that shared set.
bool shared_kl(const Pos& a, const Pos& b, double& kl) {
    std::map<int64_t, double> qb;
    for (const auto& [id, l] : b.topk) qb[id] = l;
    std::vector<std::pair<double, double>> pairs;
    for (const auto& [id, l] : a.topk) {
        auto it = qb.find(id);
        if (it != qb.end()) pairs.emplace_back(l, it->second);
    }
    if (pairs.size() < 2) return false;
    double ma = -INFINITY, mb = -INFINITY;
    for (auto& [x, y] : pairs) ma = std::max(ma, x), mb = std::max(mb, y);
    double za = 0, zb = 0;
    for (auto& [x, y] : pairs) za += std::exp(x - ma), zb += std::exp(y - mb);
    kl = 0;
    for (auto& [x, y] : pairs) {
        const double lp = x - ma - std::log(za), lq = y - mb - std::log(zb);
        kl += std::exp(lp) * (lp - lq);
    }
    kl = std::max(kl, 0.0);
    return true;
}

struct Acc {
    std::vector<double> d, kl;
    int64_t top1_n = 0, top1_eq = 0, rank_n = 0, rank_eq = 0;
    CompareStats stats(int64_t seqs) const {
        CompareStats s;
        s.sequences = seqs;
        s.positions = static_cast<int64_t>(d.size());
        // Statistics over no positions are undefined (NaN: "n/a" in text, null in JSON), not 0.
        s.median_abs = quant(d, 0.5);
        s.p95_abs = quant(d, 0.95);
        s.max_abs = d.empty() ? NAN : *std::max_element(d.begin(), d.end());
        for (double x : d) s.mean_abs += x;
        s.mean_abs = d.empty() ? NAN : s.mean_abs / static_cast<double>(d.size());
        s.top1_agreement = top1_n ? static_cast<double>(top1_eq) / top1_n : NAN;
        s.rank_agreement = rank_n ? static_cast<double>(rank_eq) / rank_n : NAN;
        s.kl_positions = static_cast<int64_t>(kl.size());
        s.kl_median = quant(kl, 0.5);
        s.kl_max = kl.empty() ? NAN : *std::max_element(kl.begin(), kl.end());
        for (double x : kl) s.kl_mean += x;
        s.kl_mean = kl.empty() ? NAN : s.kl_mean / static_cast<double>(kl.size());
        return s;
    }
    void add(const Pos& a, const Pos& b) {
        d.push_back(std::fabs(a.logprob - b.logprob));
        if (!a.topk.empty() && !b.topk.empty()) {
            // An ambiguous API top-1 (text of several ids) cannot be compared.
            if (a.topk[0].first != kAmbiguous && b.topk[0].first != kAmbiguous) {
                ++top1_n;
                top1_eq += a.topk[0].first == b.topk[0].first;
            }
            double k;
            if (shared_kl(a, b, k)) kl.push_back(k);
        }
        if (a.rank >= 0 && b.rank >= 0) {
            ++rank_n;
            rank_eq += a.rank == b.rank;
        }
    }
};

json stats_json(const CompareStats& s) {
    auto num = [](double x) { return std::isnan(x) ? json(nullptr) : json(x); };
    return json{{"sequences", s.sequences},
                {"positions", s.positions},
                {"median_abs_dlogprob", num(s.median_abs)},
                {"mean_abs_dlogprob", num(s.mean_abs)},
                {"p95_abs_dlogprob", num(s.p95_abs)},
                {"max_abs_dlogprob", num(s.max_abs)},
                {"top1_agreement", num(s.top1_agreement)},
                {"rank_agreement", num(s.rank_agreement)},
                {"kl_positions", s.kl_positions},
                {"kl_mean", num(s.kl_mean)},
                {"kl_median", num(s.kl_median)},
                {"kl_max", num(s.kl_max)}};
}

std::string pct(double x) {
    return std::isnan(x) ? std::string("n/a") : strfmt("%.1f%%", 100 * x);
}

// printf-formats x, or "n/a" when it is undefined (no positions to compare).
std::string num_or_na(const char* fmt, double x) {
    return std::isnan(x) ? std::string("n/a") : strfmt(fmt, x);
}

}  // namespace

int run_compare(const CompareOptions& opt, std::FILE* out) {
    TokenMapper mapper(opt.tokenizer_path);
    auto a = read_file(opt.file_a, mapper), b = read_file(opt.file_b, mapper);
    std::map<std::string, const Seq*> bmap;
    for (const auto& s : b) bmap.emplace(s.id, &s);
    std::set<std::string> a_ids;
    for (const auto& s : a) a_ids.insert(s.id);
    int64_t missing_in_a = 0;
    for (const auto& [id, seq] : bmap) missing_in_a += a_ids.count(id) == 0;
    Acc all;
    json per = json::array();
    std::string text;
    int64_t matched = 0, missing = 0;
    for (const auto& sa : a) {
        auto it = bmap.find(sa.id);
        if (it == bmap.end()) {
            ++missing;
            continue;
        }
        const Seq& sb = *it->second;
        if (sa.api && sb.api)
            throw InputError(
                strfmt("id %s: both files hold API records; one must be ds4replay results", sa.id.c_str()));
        ++matched;
        Acc one;
        // Align: API records cover the last positions of the replayed sequence.
        const Seq& rep = sa.api ? sb : sa;
        const Seq& other = sa.api ? sa : sb;
        const int64_t n = static_cast<int64_t>(rep.pos.size()), m = static_cast<int64_t>(other.pos.size());
        if (m > n)
            throw InputError(strfmt("id %s: %lld compared positions but the replay record has only %lld",
                                    sa.id.c_str(), (long long)m, (long long)n));
        const int64_t off = other.api ? n - m : 0;
        if (!other.api && m != n)
            throw InputError(strfmt("id %s: %lld positions in %s but %lld in %s", sa.id.c_str(),
                                    (long long)sa.pos.size(), opt.file_a.c_str(), (long long)sb.pos.size(),
                                    opt.file_b.c_str()));
        for (int64_t i = 0; i < m; ++i) {
            const Pos& pr = rep.pos[static_cast<size_t>(off + i)];
            const Pos& po = other.pos[static_cast<size_t>(i)];
            // KL and |d| are taken as A vs B in the user's order.
            if (sa.api) {
                one.add(po, pr);
                all.add(po, pr);
            } else {
                one.add(pr, po);
                all.add(pr, po);
            }
        }
        if (opt.per_sequence) {
            CompareStats s = one.stats(1);
            if (opt.json) {
                json j = stats_json(s);
                j["id"] = json::parse(sa.id);
                per.push_back(j);
            } else {
                text += strfmt("  %-24s %6lld pos  |d| median %s mean %s max %s  top-1 %s  KL %s\n",
                               sa.id.substr(0, 24).c_str(), (long long)s.positions,
                               num_or_na("%.4f", s.median_abs).c_str(), num_or_na("%.4f", s.mean_abs).c_str(),
                               num_or_na("%.4f", s.max_abs).c_str(), pct(s.top1_agreement).c_str(),
                               num_or_na("%.4g", s.kl_mean).c_str());
            }
        }
    }
    if (matched == 0) throw InputError("no common ids between " + opt.file_a + " and " + opt.file_b);
    CompareStats s = all.stats(matched);
    if (opt.json) {
        json j = stats_json(s);
        j["a"] = opt.file_a;
        j["b"] = opt.file_b;
        j["missing_in_b"] = missing;
        j["missing_in_a"] = missing_in_a;
        j["ambiguous_topk_entries"] = mapper.ambiguous();
        if (opt.per_sequence) j["per_sequence"] = per;
        std::fprintf(out, "%s\n", j.dump().c_str());
    } else {
        std::fprintf(out, "compare %s vs %s: %s, %s%s%s\n", opt.file_a.c_str(), opt.file_b.c_str(),
                     plural(s.sequences, "sequence").c_str(), plural(s.positions, "position").c_str(),
                     missing ? (" (" + plural(missing, "id") + " of A not in B)").c_str() : "",
                     missing_in_a ? (" (" + plural(missing_in_a, "id") + " of B not in A)").c_str() : "");
        if (mapper.ambiguous())
            std::fprintf(out, "  %s had a text shared by several token ids (left out of top-1 / KL)\n",
                         plural(mapper.ambiguous(), "API top-k entry", "API top-k entries").c_str());
        std::fprintf(out, "  |d logprob|  median %s  mean %s  p95 %s  max %s\n",
                     num_or_na("%.4f", s.median_abs).c_str(), num_or_na("%.4f", s.mean_abs).c_str(),
                     num_or_na("%.4f", s.p95_abs).c_str(), num_or_na("%.4f", s.max_abs).c_str());
        std::fprintf(out, "  top-1 agreement %s  rank agreement %s\n", pct(s.top1_agreement).c_str(),
                     pct(s.rank_agreement).c_str());
        std::fprintf(out, "  KL(A||B) over shared top-k (%s): mean %s median %s max %s\n",
                     plural(s.kl_positions, "position").c_str(), num_or_na("%.4g", s.kl_mean).c_str(),
                     num_or_na("%.4g", s.kl_median).c_str(), num_or_na("%.4g", s.kl_max).c_str());
        if (opt.per_sequence) std::fprintf(out, "per sequence:\n%s", text.c_str());
    }
    return 0;
}

}  // namespace ds4r
