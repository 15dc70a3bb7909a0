// The Engram compressed token map (docs/MODEL.md 4.2 "Compressed token map", 8.4): every token id is
// decoded alone, normalized by the `tokenizers` normalizer chain of the reference, and the distinct
// keys are numbered in order of first appearance.
//
// The chain is reproduced from the `tokenizers` Rust sources, step by step:
//   NFKC, NFD          unicode-normalization-alignments 0.1.12, Unicode 9.0.0 tables
//   StripAccents       drops chars with General_Category Mark (Mn, Mc AND Me, not only Mn), same
//                      Unicode 9.0 tables (`is_combining_mark`)
//   Lowercase          per char `char::to_lowercase` (NormalizedString::lowercase): full mapping
//                      of U+0130 to "i" + U+0307, no Final_Sigma context rule (that is
//                      `str::to_lowercase`, which the normalizer does not use)
//   Replace            onig regex `[ \t\r\n]+` -> " "
//   Replace            onig regex `^ $` -> U+E000 (after the step before no '\n' is left, so the
//                      line anchors match only the whole string " ")
//   Strip              both ends, `char::is_whitespace`
//   Replace            literal U+E000 -> " " (every occurrence, original ones included)
// utf8proc supplies the Unicode algorithms; code points assigned after Unicode 9.0 are kept out of
// them and marks come from a Unicode 9.0 table (see unicode9_tables.h), so the result matches the
// crate's 9.0 tables exactly.
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "ds4r/engram.h"
#include "ds4r/error.h"
#include "ds4r/log.h"
#include "ds4r/tokenizer.h"
#include "unicode9_tables.h"

namespace ds4r {

namespace {

constexpr char32_t kSentinel = 0xE000;  // the reference's placeholder for a lone " "

bool in_ranges(const unicode9::CodePointRange* begin, const unicode9::CodePointRange* end, char32_t c) {
    const auto v = static_cast<uint32_t>(c);
    auto it = std::upper_bound(begin, end, v,
                               [](uint32_t x, const unicode9::CodePointRange& r) { return x < r.first; });
    return it != begin && v <= (it - 1)->last;
}

bool assigned_in_unicode9(char32_t c) {
    return in_ranges(std::begin(unicode9::kAssigned), std::end(unicode9::kAssigned), c);
}

// General_Category Mark (Mn, Mc, Me) in Unicode 9.0: what StripAccents removes.
bool is_mark_unicode9(char32_t c) {
    return in_ranges(std::begin(unicode9::kMarks), std::end(unicode9::kMarks), c);
}

// Valid UTF-8 (callers pass utf8_from_bytes_lossy output) -> code points.
std::u32string to_code_points(const std::string& s) {
    std::u32string out;
    out.reserve(s.size());
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
    utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size()), i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
        if (len <= 0) {  // cannot happen for lossy-decoded text; keep going with U+FFFD
            cp = 0xFFFD;
            len = 1;
        }
        out.push_back(static_cast<char32_t>(cp));
        i += len;
    }
    return out;
}

std::string to_utf8(const std::u32string& cps) {
    std::string out;
    out.reserve(cps.size());
    utf8proc_uint8_t buf[4];
    for (char32_t c : cps) {
        utf8proc_ssize_t len = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
        out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
    }
    return out;
}

// utf8proc_map over one run of Unicode-9.0 code points.
void map_run(const std::u32string& run, utf8proc_option_t options, std::u32string* out) {
    if (run.empty()) return;
    // ASCII is invariant under every normalization form (the common case: most tokens).
    if (std::all_of(run.begin(), run.end(), [](char32_t c) { return c < 0x80; })) {
        *out += run;
        return;
    }
    std::string utf8 = to_utf8(run);
    utf8proc_uint8_t* dst = nullptr;
    utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                        static_cast<utf8proc_ssize_t>(utf8.size()), &dst, options);
    if (len < 0) {
        std::free(dst);
        throw RuntimeError(strfmt("utf8proc: %s", utf8proc_errmsg(len)));
    }
    std::string mapped(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
    std::free(dst);
    *out += to_code_points(mapped);
}

// A Unicode normalization form with Unicode 9.0 semantics: code points assigned later are
// starters that neither decompose nor compose, so they split the text into independent runs.
std::u32string normalize_unicode9(const std::u32string& in, utf8proc_option_t options) {
    std::u32string out, run;
    out.reserve(in.size());
    for (char32_t c : in) {
        if (assigned_in_unicode9(c)) {
            run.push_back(c);
        } else {
            map_run(run, options, &out);
            run.clear();
            out.push_back(c);
        }
    }
    map_run(run, options, &out);
    return out;
}

// Rust's char::is_whitespace (the White_Space property).
bool is_rust_whitespace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

// Rust's char::to_lowercase: the simple lowercase mapping, except U+0130 whose unconditional
// SpecialCasing entry is two chars. No context rules.
void append_lowercase(char32_t c, std::u32string* out) {
    if (c == 0x130) {
        out->push_back(U'i');
        out->push_back(0x307);
        return;
    }
    out->push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace

std::string engram_normalize(const std::string& text) {
    std::u32string s = to_code_points(utf8_from_bytes_lossy(text));
    // 1-2. NFKC, then NFD.
    s = normalize_unicode9(
        s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
    s = normalize_unicode9(s, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
    // 3-4. StripAccents, Lowercase.
    std::u32string t;
    t.reserve(s.size());
    for (char32_t c : s)
        if (!is_mark_unicode9(c)) append_lowercase(c, &t);
    // 5. [ \t\r\n]+ -> " ".
    std::u32string u;
    u.reserve(t.size());
    for (char32_t c : t) {
        bool ws = c == U' ' || c == U'\t' || c == U'\r' || c == U'\n';
        // Every ' ' already in `u` ends a run of the class, so a run extends it.
        if (!ws)
            u.push_back(c);
        else if (u.empty() || u.back() != U' ')
            u.push_back(U' ');
    }
    // 6. ^ $ -> U+E000.
    if (u == U" ") u = std::u32string(1, kSentinel);
    // 7. Strip.
    size_t b = 0, e = u.size();
    while (b < e && is_rust_whitespace(u[b])) ++b;
    while (e > b && is_rust_whitespace(u[e - 1])) --e;
    u = u.substr(b, e - b);
    // 8. U+E000 -> " ".
    for (char32_t& c : u)
        if (c == kSentinel) c = U' ';
    return to_utf8(u);
}

EngramTokenMap build_engram_token_map(const Tokenizer& tok, const ModelConfig& cfg,
                                      const std::string& tokenizer_path, bool check) {
    const int64_t n = tok.size();
    EngramTokenMap out;
    out.map.resize(static_cast<size_t>(n));
    std::unordered_map<std::string, int32_t> key_ids;
    key_ids.reserve(static_cast<size_t>(n));
    int64_t holes = 0;
    for (int64_t id = 0; id < n; ++id) {
        // A hole decodes to "" like `tokenizers` decode() of an unknown id; "" normalizes to ""
        // and so keeps the key "" (docs/MODEL.md 4.2: empty normalized key -> un-normalized text).
        if (!tok.has_token(id)) ++holes;
        std::string text = tok.decode_one(id);
        std::string key;
        if (text.find("\xEF\xBF\xBD") != std::string::npos) {
            key = tok.id_to_token(id);  // partial UTF-8 byte token: the raw token string
        } else {
            key = engram_normalize(text);
            if (key.empty()) key = std::move(text);
        }
        auto [it, inserted] = key_ids.try_emplace(std::move(key), static_cast<int32_t>(key_ids.size()));
        out.map[static_cast<size_t>(id)] = it->second;
    }
    out.num_keys = static_cast<int64_t>(key_ids.size());
    if (holes > 0)
        log_warn(
            strfmt("%s: %lld of the %lld ids have no token; they map to the key \"\" (the "
                   "reference's len(tokenizer) counts tokens, not 1 + the largest id)",
                   tokenizer_path.c_str(), (long long)holes, (long long)n));
    if (cfg.engram_pad_id < 0 || cfg.engram_pad_id >= n)
        throw CheckpointError(strfmt("%s: engram_pad_id %lld is outside the tokenizer's %lld ids",
                                     tokenizer_path.c_str(), (long long)cfg.engram_pad_id, (long long)n));
    out.pad_compressed = out.map[static_cast<size_t>(cfg.engram_pad_id)];
    if (check && out.num_keys != cfg.engram_compressed_vocab_size)
        throw CheckpointError(strfmt(
            "%s: the Engram token map has %lld distinct normalized keys, but the config's "
            "engram_compressed_vocab_size is %lld (docs/MODEL.md 4.2): tokenizer and checkpoint disagree",
            tokenizer_path.c_str(), (long long)out.num_keys, (long long)cfg.engram_compressed_vocab_size));
    return out;
}

}  // namespace ds4r
