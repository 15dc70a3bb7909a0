// make-tiny's synthetic byte-level BPE tokenizer.json (Hugging Face `tokenizers` format).
// Ids: 3 special tokens (0..2), 256 byte tokens (3..258, GPT-2 bytes_to_unicode order, as the
// release and the golden tiny-a have them), merged tokens, 5 chat special tokens at the top.
// The merges come from BPE trained on the built-in text below (so the Engram normalizer meets case,
// accents, ligatures, full-width forms, CJK, emoji and whitespace variants, docs/MODEL.md 4.2), then from
// pairs of earlier tokens drawn by a fixed-seed generator until the vocabulary is full.
#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "checkpoint/make_tiny_weights.h"
#include "ds4r/error.h"
#include "ds4r/make_tiny.h"

namespace ds4r {

namespace {

// Training text (written for this generator). Repetition makes frequent pairs; the variants
// (The / the / THE, café / CAFÉ / cafe, ﬁ / fi, Ｆｕｌｌ, İstanbul, Ω, tabs, CRLF, runs of spaces)
// give normalized-key collisions like a real vocabulary's.
const char* const kCorpus =
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.\n"
    "The model reads the text and the text reads the model; the reader is the one who is read.\n"
    "We replay the tokens of a transcript through the model and record what the model thinks of "
    "every next token: its log probability, its rank, and the entropy of the distribution.\n"
    "A layer streams from the disk, then the next layer streams while this one computes.\n"
    "Caf\xc3\xa9 au lait, cafe noir, CAF\xc3\x89 CR\xc3\x88ME, na\xc3\xafve r\xc3\xa9sum\xc3\xa9, "
    "fa\xc3\xa7"
    "ade, \xc3\xbc"
    "ber, stra\xc3\x9f"
    "e, \xc3\x85ngstr\xc3\xb6m, se\xc3\xb1or, "
    "S\xc3\xa3o Paulo.\n"
    "The \xef\xac\x81rst \xef\xac\x82oor of the o\xef\xac\x83"
    "ce: ligatures \xef\xac\x81 and "
    "\xef\xac\x82 fold to fi and fl.\n"
    "\xef\xbc\xa6\xef\xbd\x95\xef\xbd\x8c\xef\xbd\x8c\xef\xbd\x97\xef\xbd\x89\xef\xbd\x84\xef\xbd"
    "\x94\xef\xbd\x88 letters and \xef\xbc\x91\xef\xbc\x92\xef\xbc\x93 digits, \xe2\x84\xa6 ohm and "
    "\xce\xa9 omega, \xc4\xb0stanbul and istanbul and ISTANBUL.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1024 2048 4096 65536 129280 3.14159 2.71828.\n"
    "Code: for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; } return sum;\n"
    "def f(x):\n    return x * x + 1\n\n"
    "if a == b and c != d or e <= f:\n\tprint(\"tab indented\")\r\n\tprint('crlf line')\r\n"
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x81\xa8"
    "\xe4\xb8\xad\xe6\x96\x87\xe7\x9a\x84\xe6\x96\x87\xe5\xad\x97\xe3\x80\x82"
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87\xe7\xab\xa0\xe3\x80\x82\n"
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8, "
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xeb\xac\xb8\xec\x9e\xa5.\n"
    "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80, "
    "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82. \xce\x93\xce\xb5\xce\xb9\xce\xac "
    "\xcf\x83\xce\xbf\xcf\x85 \xce\xba\xcf\x8c\xcf\x83\xce\xbc\xce\xb5.\n"
    "Emoji: \xf0\x9f\x98\x80 \xf0\x9f\x98\x83 \xf0\x9f\x9a\x80 \xf0\x9f\x98\x80\xf0\x9f\x9a\x80 "
    "\xe2\x9c\xa8 rocket \xf0\x9f\x9a\x80 smile \xf0\x9f\x98\x80.\n"
    "Spaces:  two  spaces,   three   spaces,\ttab,\t\ttwo tabs, trailing spaces   \n"
    "Punctuation: (parentheses), [brackets], {braces}, <angles>, \"quotes\", 'single', ... -- ?! ;:\n"
    "What is the answer? What was the question? Why is the sky blue? Because light scatters.\n"
    "The entropy of the next token is measured in nats, and the rank of the actual token is one plus "
    "the number of tokens with a larger logit.\n"
    "Therefore the replay is exact: the same tokens give the same numbers, every time, on every "
    "machine.\n"
    "the the the and and and of of of to to to in in in is is is that that that it it it for for "
    "with with with as as as on on on this this this be be be are are are\n";

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 + n.
std::vector<std::string> byte_level_chars(std::vector<int>* order) {
    std::vector<int> bs;
    for (int b = 33; b <= 126; ++b) bs.push_back(b);
    for (int b = 161; b <= 172; ++b) bs.push_back(b);
    for (int b = 174; b <= 255; ++b) bs.push_back(b);
    std::vector<int> cs = bs;
    int n = 0;
    for (int b = 0; b < 256; ++b)
        if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
            bs.push_back(b);
            cs.push_back(256 + n++);
        }
    std::vector<std::string> out(256);
    for (size_t i = 0; i < 256; ++i) {
        const int cp = cs[i];
        std::string s;
        if (cp < 0x80) {
            s += static_cast<char>(cp);
        } else {
            s += static_cast<char>(0xC0 | (cp >> 6));
            s += static_cast<char>(0x80 | (cp & 0x3F));
        }
        out[static_cast<size_t>(bs[i])] = s;
    }
    if (order) *order = bs;
    return out;
}

// Splits the text into pre-tokens like the ByteLevel pre-tokenizer's regex, approximately: an
// optional leading space plus a run of letters, of digits or of other symbols; runs of whitespace
// (leaving a single space to the next word).
std::vector<std::string> pre_tokenize(const std::string& text) {
    auto cp_len = [](unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; };
    auto cls = [&](size_t i) -> int {
        unsigned char c = static_cast<unsigned char>(text[i]);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return 0;  // whitespace
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return 1;           // letter
        if (c >= '0' && c <= '9') return 2;                             // digit
        if (c < 0x80) return 3;                                         // ASCII symbol
        if (c >= 0xF0 || (c == 0xE2)) return 3;  // emoji and U+2000.. symbols (not letters)
        return 1;                                // other non-ASCII: letters
    };
    std::vector<std::string> out;
    size_t i = 0;
    const size_t n = text.size();
    while (i < n) {
        const size_t start = i;
        const int c = cls(i);
        if (c == 0) {
            if (text[i] == ' ' && i + 1 < n && cls(i + 1) != 0) {  // " word": the space leads the word
                const int c2 = cls(i + 1);
                size_t k = i + 1;
                while (k < n && cls(k) == c2)
                    k += static_cast<size_t>(cp_len(static_cast<unsigned char>(text[k])));
                out.push_back(text.substr(start, k - start));
                i = k;
                continue;
            }
            size_t j = i;
            while (j < n && cls(j) == 0) ++j;
            if (j < n && j - 1 > i && text[j - 1] == ' ') --j;  // leave the last space to the next word
            out.push_back(text.substr(start, j - start));
            i = j;
            continue;
        }
        size_t k = i;
        while (k < n && cls(k) == c) k += static_cast<size_t>(cp_len(static_cast<unsigned char>(text[k])));
        out.push_back(text.substr(start, k - start));
        i = k;
    }
    return out;
}

bool is_ascii_letters(const std::string& s, size_t from) {
    if (s.size() <= from) return false;
    for (size_t i = from; i < s.size(); ++i)
        if (((s[i] | 0x20) < 'a') || ((s[i] | 0x20) > 'z')) return false;
    return true;
}

std::string jstr(const std::string& s) {
    return nlohmann::json(s).dump();
}

}  // namespace

std::string make_tiny_tokenizer_json(int64_t vocab_size) {
    static const char* const kHead[3] = {
        "<\xef\xbd\x9c"
        "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<\xef\xbd\x9c"
        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>"};
    static const char* const kTail[5] = {"<\xef\xbd\x9cSystem\xef\xbd\x9c>", "<\xef\xbd\x9cUser\xef\xbd\x9c>",
                                         "<\xef\xbd\x9c"
                                         "Assistant\xef\xbd\x9c>",
                                         "<think>", "</think>"};
    const int64_t n_merges = vocab_size - 3 - 256 - 5;
    if (n_merges < 0)
        DS4R_THROW(InputError,
                   "make-tiny: a vocabulary of %lld ids cannot hold the 264 special and byte tokens",
                   (long long)vocab_size);

    std::vector<std::string> tok;  // id -> byte-level string (vocab part)
    std::unordered_set<std::string> seen;
    for (auto* s : kHead) {
        tok.emplace_back(s);
        seen.insert(s);
    }
    std::vector<int> byte_order;
    const auto chars = byte_level_chars(&byte_order);
    std::vector<int> byte_id(256);
    for (int b : byte_order) {
        byte_id[static_cast<size_t>(b)] = static_cast<int>(tok.size());
        tok.push_back(chars[static_cast<size_t>(b)]);
        seen.insert(tok.back());
    }
    std::vector<std::pair<int, int>> merges;
    auto add_merge = [&](int a, int b) {
        merges.emplace_back(a, b);
        tok.push_back(tok[static_cast<size_t>(a)] + tok[static_cast<size_t>(b)]);
        seen.insert(tok.back());
    };

    // Phase 1: BPE on the built-in text (most frequent pair first; ties to the smaller id pair).
    std::map<std::string, int64_t> word_count;
    for (auto& w : pre_tokenize(kCorpus)) ++word_count[w];
    std::vector<std::pair<std::vector<int>, int64_t>> words;
    for (auto& [w, c] : word_count) {
        std::vector<int> ids;
        for (unsigned char ch : w) ids.push_back(byte_id[ch]);
        words.emplace_back(std::move(ids), c);
    }
    std::set<std::pair<int, int>> banned;  // pairs whose concatenation already is a token
    while (static_cast<int64_t>(merges.size()) < n_merges) {
        std::map<std::pair<int, int>, int64_t> pc;
        for (auto& [ids, c] : words)
            for (size_t i = 0; i + 1 < ids.size(); ++i) pc[{ids[i], ids[i + 1]}] += c;
        std::pair<int, int> best{-1, -1};
        int64_t best_c = 0;
        for (auto& [p, c] : pc)
            if (c > best_c && !banned.count(p)) {
                best = p;
                best_c = c;
            }
        if (best_c < 2) break;
        if (seen.count(tok[static_cast<size_t>(best.first)] + tok[static_cast<size_t>(best.second)])) {
            banned.insert(best);
            continue;
        }
        const int nid = static_cast<int>(tok.size());
        add_merge(best.first, best.second);
        for (auto& [ids, c] : words) {
            std::vector<int> out;
            out.reserve(ids.size());
            for (size_t i = 0; i < ids.size(); ++i) {
                if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
                    out.push_back(nid);
                    ++i;
                } else {
                    out.push_back(ids[i]);
                }
            }
            ids = std::move(out);
        }
    }

    // Phase 2: word-like tokens from pairs of earlier ones (a fixed seed: independent of --seed).
    std::vector<int> alpha, spaced, short_alpha;
    auto classify = [&](int id) {
        const std::string& s = tok[static_cast<size_t>(id)];
        if (is_ascii_letters(s, 0)) {
            alpha.push_back(id);
            if (s.size() <= 3) short_alpha.push_back(id);
        } else if (s.rfind("\xc4\xa0", 0) == 0 && is_ascii_letters(s, 2)) {
            spaced.push_back(id);
        }
    };
    for (int id = 3; id < static_cast<int>(tok.size()); ++id) classify(id);
    tiny::Rng rng(0x6d616b652d74696eull);
    int64_t attempts = 0;
    while (static_cast<int64_t>(merges.size()) < n_merges) {
        if (++attempts > 64 * (n_merges + 1000))
            DS4R_THROW(RuntimeError, "make-tiny: the tokenizer generator found no new merge (vocab %lld)",
                       (long long)vocab_size);
        const uint64_t r = rng.next();
        const int mode = static_cast<int>(r % 10);
        auto pick = [&](const std::vector<int>& v, uint64_t x) {
            return v[static_cast<size_t>(x % v.size())];
        };
        int a, b;
        if (mode == 0) {  // any two earlier tokens: byte salad, partial UTF-8 (U+FFFD keys)
            const uint64_t span = tok.size() - 3;
            a = 3 + static_cast<int>((r >> 8) % span);
            b = 3 + static_cast<int>((r >> 36) % span);
        } else if (mode <= 4 && !spaced.empty()) {
            a = pick(spaced, r >> 8);
            b = pick(short_alpha, r >> 36);
        } else {
            a = pick(alpha, r >> 8);
            b = pick(short_alpha, r >> 36);
        }
        const std::string s = tok[static_cast<size_t>(a)] + tok[static_cast<size_t>(b)];
        if (s.size() > 24 || seen.count(s)) continue;
        add_merge(a, b);
        classify(static_cast<int>(tok.size()) - 1);
    }

    // Render (the layout of the golden tiny-a tokenizer.json).
    const int64_t tail0 = vocab_size - 5;
    std::string o;
    o.reserve(static_cast<size_t>(vocab_size) * 48 + 4096);
    o += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
    auto added = [&](int64_t id, const char* content, bool first) {
        o += first ? "\n" : ",\n";
        o += "    {\n      \"id\": " + std::to_string(id) + ",\n      \"content\": " + jstr(content) +
             ",\n      \"single_word\": false,\n      \"lstrip\": false,\n      \"rstrip\": false,\n"
             "      \"normalized\": false,\n      \"special\": true\n    }";
    };
    for (int i = 0; i < 3; ++i) added(i, kHead[i], i == 0);
    for (int i = 0; i < 5; ++i) added(tail0 + i, kTail[i], false);
    o += "\n  ],\n  \"normalizer\": null,\n"
         "  \"pre_tokenizer\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": false,\n"
         "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n  \"post_processor\": null,\n"
         "  \"decoder\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
         "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n"
         "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
         "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
         "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n"
         "    \"vocab\": {";
    for (size_t id = 0; id < tok.size(); ++id) {
        o += id ? ",\n      " : "\n      ";
        o += jstr(tok[id]) + ": " + std::to_string(id);
    }
    o += "\n    },\n    \"merges\": [";
    for (size_t i = 0; i < merges.size(); ++i) {
        o += i ? ",\n      [" : "\n      [";
        o += jstr(tok[static_cast<size_t>(merges[i].first)]) + ", " +
             jstr(tok[static_cast<size_t>(merges[i].second)]) + "]";
    }
    o += "\n    ]\n  }\n}\n";
    return o;
}

}  // namespace ds4r
