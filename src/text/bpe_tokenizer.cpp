// TextEncoder: `tokenizers`' Tokenizer.encode(text, add_special_tokens=False) for byte-level BPE
// (see ds4r/text.h for the pipeline).
//
// Reproduced from the `tokenizers` Rust sources:
// - AddedVocabulary::extract_and_normalize: the added tokens with normalized = false are cut out of
//   the raw text first, then (after the normalizer, here the identity) those with normalized = true
//   out of what is left. Each pass is an Aho-Corasick LeftmostLongest search: the match that starts
//   first, the longest of those.
// - BPE::merge_word: a word starts as one symbol per byte (GPT-2's byte alphabet); the pair with the
//   lowest merge rank is merged first, the leftmost of equal ranks first; a queued pair whose
//   symbols changed since is skipped. Bytes whose character is not in the vocab are dropped (no
//   unk_token). With ignore_merges, a word that is itself in the vocab is one token.
// - The BPE word cache (words of fewer than 256 characters).
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "ds4r/error.h"
#include "ds4r/text.h"
#include "ds4r/tokenizer.h"
#include "text/pretokenize.h"
#include "text/utf8_check.h"

namespace ds4r {

namespace {

// GPT-2's bytes_to_unicode: byte -> the UTF-8 of its stand-in character.
std::array<std::string, 256> byte_chars() {
    std::array<std::string, 256> t;
    auto identity = [](int b) {
        return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
        const int cp = identity(b) ? b : next++;
        std::string s;
        if (cp < 0x80) {
            s.push_back(static_cast<char>(cp));
        } else {
            s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
        }
        t[static_cast<size_t>(b)] = s;
    }
    return t;
}

// Open-addressing map (id_a, id_b) -> (rank, merged id); 127,741 merges in the release.
class MergeTable {
public:
    struct Value {
        int32_t rank = -1, id = -1;
    };
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, Value{});
        mask_ = cap - 1;
    }
    // First insertion wins (a duplicated merge keeps its lowest rank, as the Rust HashMap built in
    // rank order with `insert` would not: there the last wins; tokenizer.json never repeats one).
    void put(int32_t a, int32_t b, Value v) {
        const uint64_t k = key(a, b);
        for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
            if (keys_[i] == kEmpty) {
                keys_[i] = k;
                vals_[i] = v;
                return;
            }
            if (keys_[i] == k) {
                vals_[i] = v;  // last wins, like HashMap::insert
                return;
            }
        }
    }
    const Value* get(int32_t a, int32_t b) const {
        const uint64_t k = key(a, b);
        for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
            if (keys_[i] == k) return &vals_[i];
            if (keys_[i] == kEmpty) return nullptr;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t key(int32_t a, int32_t b) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    }
    static size_t hash(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        return static_cast<size_t>(k);
    }
    std::vector<uint64_t> keys_;
    std::vector<Value> vals_;
    size_t mask_ = 0;
};

// Leftmost-longest search over a set of strings (the added tokens of one pass).
class AddedTokenMatcher {
public:
    void add(const std::string& content, int32_t id) {
        if (content.empty()) return;
        entries_.push_back({content, id});
        first_byte_[static_cast<unsigned char>(content[0])] = true;
    }
    void finish() {
        std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) { return a.s < b.s; });
        // The same content twice: keep the first id (AddedVocabulary maps content -> one id).
        entries_.erase(std::unique(entries_.begin(), entries_.end(),
                                   [](const Entry& a, const Entry& b) { return a.s == b.s; }),
                       entries_.end());
    }
    bool empty() const { return entries_.empty(); }
    // The longest token starting at s[i], or nullptr.
    const std::pair<size_t, int32_t>* match_at(std::string_view s, size_t i,
                                               std::pair<size_t, int32_t>* out) const {
        if (!first_byte_[static_cast<unsigned char>(s[i])]) return nullptr;
        size_t lo = 0, hi = entries_.size();
        bool found = false;
        for (size_t k = 0; i + k < s.size() && lo < hi; ++k) {
            const char c = s[i + k];
            // Narrow [lo, hi) to the entries whose byte k is c (all share bytes 0..k-1 already).
            auto byte_at = [k](const Entry& e) {
                return e.s.size() > k ? static_cast<int>(static_cast<unsigned char>(e.s[k])) : -1;
            };
            const int want = static_cast<unsigned char>(c);
            size_t a = lo, b = hi;
            while (a < b) {  // first with byte_at >= want
                size_t m = (a + b) / 2;
                if (byte_at(entries_[m]) < want)
                    a = m + 1;
                else
                    b = m;
            }
            size_t e = a, f = hi;
            while (e < f) {  // first with byte_at > want
                size_t m = (e + f) / 2;
                if (byte_at(entries_[m]) <= want)
                    e = m + 1;
                else
                    f = m;
            }
            lo = a;
            hi = e;
            if (lo < hi && entries_[lo].s.size() == k + 1) {
                *out = {k + 1, entries_[lo].id};
                found = true;
            }
        }
        return found ? out : nullptr;
    }

private:
    struct Entry {
        std::string s;
        int32_t id;
    };
    std::vector<Entry> entries_;
    std::array<bool, 256> first_byte_{};
};

constexpr size_t kCacheMaxWordBytes = 256 * 4;  // `tokenizers` caches words under 256 chars
constexpr size_t kCacheMaxEntries = 1 << 16;

}  // namespace

struct TextEncoder::Impl {
    const Tokenizer& tok;
    std::array<int32_t, 256> byte_id{};  // byte -> id of its one-char token, -1 if absent
    std::array<std::string, 256> byte_char;
    MergeTable merges;
    std::unordered_map<std::string, int32_t> vocab;  // model.vocab token -> id (ignore_merges only)
    bool ignore_merges = false;
    AddedTokenMatcher raw_added, normalized_added;
    text::PreTokenizer pre;
    std::unordered_map<std::string, std::vector<int32_t>> cache;
    std::vector<text::Piece> pieces;
    // merge_word scratch
    struct Symbol {
        int32_t id, prev, next, alive;
    };
    std::vector<Symbol> syms;

    Impl(const Tokenizer& t, const std::string& where) : tok(t), pre(t.pre_tokenizer_json(), where) {}

    void encode_word(std::string_view bytes, bool prefix_space, std::vector<int32_t>& out);
    void merge_word(std::string_view bytes, bool prefix_space, std::vector<int32_t>& out);
    void encode_plain(std::string_view s, std::vector<int32_t>& out);
};

TextEncoder::TextEncoder(const Tokenizer& tok) {
    const std::string where = "tokenizer.json";
    // Normalizer: only the identity is reproduced.
    {
        nlohmann::json n = nlohmann::json::parse(tok.normalizer_json(), nullptr, false);
        const bool identity =
            n.is_null() || (n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                            n.at("normalizers").is_array() && n.at("normalizers").empty());
        if (!identity)
            throw CheckpointError(where + ": normalizer " + tok.normalizer_json().substr(0, 80) +
                                  " is not supported by ds4replay encode (only none or an empty Sequence)");
    }
    impl_ = std::make_unique<Impl>(tok, where);
    Impl& m = *impl_;
    m.ignore_merges = tok.ignore_merges();

    // model.vocab: token string -> id.
    const auto& mv = tok.model_vocab();
    std::unordered_map<std::string_view, int32_t> ids;
    ids.reserve(mv.size() * 2);
    for (size_t i = 0; i < mv.size(); ++i)
        if (!mv[i].empty()) ids.emplace(mv[i], static_cast<int32_t>(i));
    if (m.ignore_merges)
        for (const auto& [s, id] : ids) m.vocab.emplace(std::string(s), id);

    m.byte_char = byte_chars();
    for (int b = 0; b < 256; ++b) {
        auto it = ids.find(m.byte_char[static_cast<size_t>(b)]);
        m.byte_id[static_cast<size_t>(b)] = it == ids.end() ? -1 : it->second;
    }

    const auto& merges = tok.merges();
    m.merges.reserve(merges.size());
    std::string joined;
    for (size_t r = 0; r < merges.size(); ++r) {
        const auto& [a, b] = merges[r];
        auto ia = ids.find(a), ib = ids.find(b);
        joined = a + b;
        auto in = ids.find(joined);
        if (ia == ids.end() || ib == ids.end() || in == ids.end())
            throw CheckpointError(strfmt("%s: model.merges[%zu] \"%s %s\": %s is not in model.vocab",
                                         where.c_str(), r, a.c_str(), b.c_str(),
                                         ia == ids.end()   ? a.c_str()
                                         : ib == ids.end() ? b.c_str()
                                                           : joined.c_str()));
        m.merges.put(ia->second, ib->second, {static_cast<int32_t>(r), in->second});
    }

    for (const AddedTokenInfo& a : tok.added_tokens()) {
        if (a.lstrip || a.rstrip || a.single_word)
            throw CheckpointError(
                where + ": added token \"" + a.content +
                "\" has lstrip / rstrip / single_word set, which ds4replay encode does not reproduce");
        (a.normalized ? m.normalized_added : m.raw_added).add(a.content, static_cast<int32_t>(a.id));
    }
    m.raw_added.finish();
    m.normalized_added.finish();
}

TextEncoder::~TextEncoder() = default;

void TextEncoder::Impl::merge_word(std::string_view bytes, bool prefix_space, std::vector<int32_t>& out) {
    syms.clear();
    auto push_byte = [&](unsigned char c) {
        const int32_t id = byte_id[c];
        if (id < 0) return;  // not in the vocab and no unk_token: dropped
        const int32_t n = static_cast<int32_t>(syms.size());
        syms.push_back({id, n - 1, n + 1, 1});
    };
    if (prefix_space) push_byte(' ');
    for (char c : bytes) push_byte(static_cast<unsigned char>(c));
    if (syms.empty()) return;
    syms.back().next = -1;

    // Min-heap of (rank << 32 | position).
    std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> queue;
    auto enqueue = [&](int32_t pos) {
        const int32_t nx = syms[static_cast<size_t>(pos)].next;
        if (nx < 0) return;
        const MergeTable::Value* v =
            merges.get(syms[static_cast<size_t>(pos)].id, syms[static_cast<size_t>(nx)].id);
        if (v) queue.push((static_cast<uint64_t>(v->rank) << 32) | static_cast<uint32_t>(pos));
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) enqueue(i);
    while (!queue.empty()) {
        const uint64_t top = queue.top();
        queue.pop();
        const int32_t rank = static_cast<int32_t>(top >> 32);
        const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
        Symbol& s = syms[static_cast<size_t>(pos)];
        if (!s.alive || s.next < 0) continue;
        Symbol& right = syms[static_cast<size_t>(s.next)];
        const MergeTable::Value* v = merges.get(s.id, right.id);
        if (!v || v->rank != rank) continue;  // the pair changed since it was queued
        s.id = v->id;
        right.alive = 0;
        s.next = right.next;
        if (s.next >= 0) syms[static_cast<size_t>(s.next)].prev = pos;
        if (s.prev >= 0) enqueue(s.prev);
        enqueue(pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next)
        out.push_back(syms[static_cast<size_t>(i)].id);
}

void TextEncoder::Impl::encode_word(std::string_view bytes, bool prefix_space, std::vector<int32_t>& out) {
    if (ignore_merges) {
        std::string w = prefix_space ? byte_char[' '] : std::string();
        for (char c : bytes) w += byte_char[static_cast<unsigned char>(c)];
        auto it = vocab.find(w);
        if (it != vocab.end()) {
            out.push_back(it->second);
            return;
        }
    }
    const bool cacheable = bytes.size() < kCacheMaxWordBytes;
    std::string key;
    if (cacheable) {
        key.reserve(bytes.size() + 1);
        key.push_back(prefix_space ? '\1' : '\0');
        key.append(bytes);
        auto it = cache.find(key);
        if (it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    const size_t start = out.size();
    merge_word(bytes, prefix_space, out);
    if (cacheable) {
        if (cache.size() >= kCacheMaxEntries) cache.clear();
        cache.emplace(std::move(key),
                      std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
    }
}

void TextEncoder::Impl::encode_plain(std::string_view s, std::vector<int32_t>& out) {
    if (s.empty()) return;
    pre.split(s, pieces);
    for (const text::Piece& p : pieces) encode_word(s.substr(p.begin, p.end - p.begin), p.prefix_space, out);
}

std::vector<int32_t> TextEncoder::encode(std::string_view text) {
    const size_t bad = text::first_invalid_utf8(text);
    if (bad != std::string_view::npos) throw InputError(strfmt("text is not valid UTF-8 (byte %zu)", bad));
    Impl& m = *impl_;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    // Second pass: the normalized added tokens in a stretch the first pass left.
    auto second = [&](std::string_view s) {
        if (m.normalized_added.empty()) {
            m.encode_plain(s, out);
            return;
        }
        size_t start = 0;
        std::pair<size_t, int32_t> hit;
        for (size_t i = 0; i < s.size();) {
            if (m.normalized_added.match_at(s, i, &hit)) {
                m.encode_plain(s.substr(start, i - start), out);
                out.push_back(hit.second);
                i += hit.first;
                start = i;
            } else {
                ++i;
            }
        }
        m.encode_plain(s.substr(start), out);
    };
    size_t start = 0;
    std::pair<size_t, int32_t> hit;
    for (size_t i = 0; i < text.size();) {
        if (!m.raw_added.empty() && m.raw_added.match_at(text, i, &hit)) {
            second(text.substr(start, i - start));
            out.push_back(hit.second);
            i += hit.first;
            start = i;
        } else {
            ++i;
        }
    }
    second(text.substr(start));
    return out;
}

}  // namespace ds4r
