// Pre-tokenizer steps of tokenizer.json on PCRE2 (see pretokenize.h).
//
// Semantics reproduced from `tokenizers`: each step splits every piece the previous step produced,
// independently (a regex sees one piece only: a lookahead stops at the piece's end). Split finds the
// non-overlapping matches left to right; with Isolated each match and each gap between matches is
// a piece, with Removed the matches are dropped; `invert` swaps matches and gaps. ByteLevel maps
// bytes to GPT-2's alphabet (done later, in the BPE step) and, with use_regex, first splits with
// GPT-2's regex (Isolated). Empty pieces produce no tokens and are dropped.
//
// Oniguruma (the engine of `tokenizers`) and PCRE2 with UCP agree on \p{..} classes; they differ on
// \s: Oniguruma's is U+0009..U+000D, U+0085 and the Z categories, PCRE2's adds U+180E (in \h). The
// patterns are rewritten to Oniguruma's set so both engines split identically.
#include "text/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "ds4r/error.h"

namespace ds4r::text {

using json = nlohmann::json;

namespace {

// GPT-2's split regex, as `tokenizers`' ByteLevel pre-tokenizer has it (use_regex = true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr const char* kOnigSpaceSet = R"(\t-\r\x{85}\p{Z})";

class Regex {
public:
    Regex(const std::string& pattern, bool literal, const std::string& where) {
        int err = 0;
        PCRE2_SIZE off = 0;
        // (PCRE2_LITERAL admits UTF but not UCP; a literal has no classes anyway.)
        uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
        const std::string p = literal ? pattern : oniguruma_to_pcre2(pattern);
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), options, &err, &off, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw CheckpointError(strfmt(
                "%s: pre_tokenizer regex \"%s\" does not compile (PCRE2: %s at offset %zu)", where.c_str(),
                pattern.substr(0, 80).c_str(), reinterpret_cast<const char*>(msg), static_cast<size_t>(off)));
        }
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
        match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
        if (!match_) {
            pcre2_code_free(code_);
            throw RuntimeError("out of memory creating PCRE2 match data");
        }
    }
    ~Regex() {
        pcre2_match_data_free(match_);
        pcre2_code_free(code_);
    }
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Next match in s[0, n) at or after `start`; false when none. s must be valid UTF-8.
    bool find(const char* s, size_t n, size_t start, size_t* mb, size_t* me) {
        const auto subject = reinterpret_cast<PCRE2_SPTR>(s);
        int rc = jit_ ? pcre2_jit_match(code_, subject, n, start, 0, match_, nullptr)
                      : pcre2_match(code_, subject, n, start, PCRE2_NO_UTF_CHECK, match_, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) return false;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw RuntimeError(
                strfmt("pre-tokenizer regex failed (PCRE2: %s)", reinterpret_cast<const char*>(msg)));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
        *mb = ov[0];
        *me = ov[1];
        return true;
    }

private:
    pcre2_code* code_ = nullptr;
    pcre2_match_data* match_ = nullptr;
    bool jit_ = false;
};

size_t utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
    std::string out;
    out.reserve(p.size() + 32);
    bool in_class = false;
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c == '\\' && i + 1 < p.size()) {
            const char d = p[i + 1];
            if (d == 's') {
                out += in_class ? std::string(kOnigSpaceSet) : "[" + std::string(kOnigSpaceSet) + "]";
            } else if (d == 'S' && !in_class) {
                out += "[^" + std::string(kOnigSpaceSet) + "]";
            } else {
                out += c;
                out += d;
            }
            ++i;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            out += c;
            // A ']' right after '[' or '[^' is a literal member, not the end.
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
            continue;
        }
        if (in_class && c == ']') in_class = false;
        out += c;
    }
    return out;
}

struct PreTokenizer::Step {
    enum Kind { SplitIsolated, SplitRemoved, ByteLevel } kind = SplitIsolated;
    std::unique_ptr<Regex> regex;  // Split, and ByteLevel with use_regex
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
};

namespace {

void add_steps(const json& j, const std::string& where, int depth,
               std::vector<std::unique_ptr<PreTokenizer::Step>>& steps);

}  // namespace

PreTokenizer::PreTokenizer(std::string_view json_text, const std::string& where) {
    json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
    if (j.is_discarded()) throw CheckpointError(where + ": pre_tokenizer is not valid JSON");
    if (!j.is_null()) add_steps(j, where, 0, steps_);
}

PreTokenizer::~PreTokenizer() = default;

namespace {

void add_steps(const json& j, const std::string& where, int depth,
               std::vector<std::unique_ptr<PreTokenizer::Step>>& steps) {
    using Step = PreTokenizer::Step;
    if (depth > 8) throw CheckpointError(where + ": pre_tokenizer Sequence nesting is deeper than 8");
    if (!j.is_object() || !j.contains("type") || !j.at("type").is_string())
        throw CheckpointError(where + ": pre_tokenizer must be an object with a string 'type'");
    const std::string type = j.at("type").get<std::string>();
    auto flag = [&](const char* k, bool dflt) {
        return j.contains(k) && j.at(k).is_boolean() ? j.at(k).get<bool>() : dflt;
    };
    if (type == "Sequence") {
        if (!j.contains("pretokenizers") || !j.at("pretokenizers").is_array())
            throw CheckpointError(where + ": pre_tokenizer Sequence without a 'pretokenizers' array");
        for (const json& s : j.at("pretokenizers")) add_steps(s, where, depth + 1, steps);
        return;
    }
    auto step = std::make_unique<Step>();
    if (type == "Split") {
        const json* pat = j.contains("pattern") ? &j.at("pattern") : nullptr;
        bool literal;
        std::string pattern;
        if (pat && pat->is_object() && pat->contains("Regex") && pat->at("Regex").is_string()) {
            literal = false;
            pattern = pat->at("Regex").get<std::string>();
        } else if (pat && pat->is_object() && pat->contains("String") && pat->at("String").is_string()) {
            literal = true;
            pattern = pat->at("String").get<std::string>();
        } else {
            throw CheckpointError(
                where + ": pre_tokenizer Split needs a pattern {\"Regex\": ...} or {\"String\": ...}");
        }
        const std::string behavior =
            j.contains("behavior") && j.at("behavior").is_string() ? j.at("behavior").get<std::string>() : "";
        if (behavior == "Isolated")
            step->kind = Step::SplitIsolated;
        else if (behavior == "Removed")
            step->kind = Step::SplitRemoved;
        else
            throw CheckpointError(where + ": pre_tokenizer Split behavior '" + behavior +
                                  "' is not supported (Isolated and Removed are)");
        step->invert = flag("invert", false);
        step->regex = std::make_unique<Regex>(pattern, literal, where);
    } else if (type == "ByteLevel") {
        step->kind = Step::ByteLevel;
        step->add_prefix_space = flag("add_prefix_space", true);
        if (flag("use_regex", true)) step->regex = std::make_unique<Regex>(kGpt2Pattern, false, where);
    } else {
        throw CheckpointError(where + ": pre_tokenizer step '" + type +
                              "' is not supported (Sequence, Split and ByteLevel are)");
    }
    steps.push_back(std::move(step));
}

// Appends the pieces of s[p.begin, p.end) split by `re` (matches or gaps kept as `keep_*` says).
void split_piece(Regex& re, std::string_view s, const Piece& p, bool keep_matches, bool keep_gaps,
                 std::vector<Piece>& out) {
    const char* base = s.data() + p.begin;
    const size_t n = p.end - p.begin;
    size_t pos = 0, prev = 0, mb, me;
    bool first = true;
    auto emit = [&](size_t b, size_t e) {
        if (b == e) return;
        // A ByteLevel prefix space belongs to the piece's first byte.
        out.push_back({p.begin + b, p.begin + e, p.prefix_space && first && b == 0});
        first = false;
    };
    while (pos <= n && re.find(base, n, pos, &mb, &me)) {
        if (keep_gaps) emit(prev, mb);
        if (keep_matches) emit(mb, me);
        prev = me;
        if (me == mb) {
            if (me >= n) break;
            pos = me + utf8_len(static_cast<unsigned char>(base[me]));  // step over an empty match
        } else {
            pos = me;
        }
    }
    if (keep_gaps) emit(prev, n);
}

}  // namespace

void PreTokenizer::split(std::string_view s, std::vector<Piece>& out) {
    out.clear();
    if (s.empty()) return;
    out.push_back({0, s.size(), false});
    for (const auto& st : steps_) {
        scratch_.clear();
        for (Piece p : out) {
            if (st->kind == Step::ByteLevel) {
                // add_prefix_space: a ' ' before every piece that does not start with one.
                if (st->add_prefix_space && !p.prefix_space && s[p.begin] != ' ') p.prefix_space = true;
                if (st->regex && p.prefix_space) {
                    // The regex sees the space too; split " " + piece, then map offsets back.
                    std::string tmp = " ";
                    tmp.append(s.substr(p.begin, p.end - p.begin));
                    std::vector<Piece> sub;
                    split_piece(*st->regex, tmp, Piece{0, tmp.size(), false}, true, true, sub);
                    for (size_t k = 0; k < sub.size(); ++k) {
                        Piece q = sub[k];
                        if (q.begin == 0) {  // the piece holding the added space
                            scratch_.push_back(
                                {p.begin, p.begin + q.end - 1, true});  // may be the space alone
                        } else {
                            scratch_.push_back({p.begin + q.begin - 1, p.begin + q.end - 1, false});
                        }
                    }
                } else if (st->regex) {
                    split_piece(*st->regex, s, p, true, true, scratch_);
                } else {
                    scratch_.push_back(p);
                }
                continue;
            }
            const bool isolated = st->kind == Step::SplitIsolated;
            // invert: the matches play the gaps' part and the other way round.
            const bool keep_matches = isolated || st->invert;
            const bool keep_gaps = isolated || !st->invert;
            split_piece(*st->regex, s, p, keep_matches, keep_gaps, scratch_);
        }
        out.swap(scratch_);
    }
}

}  // namespace ds4r::text
