// tokenizer.json (Hugging Face `tokenizers`, byte-level BPE): the id -> token table and the
// single-token byte-level decode that the Engram token map is built from (docs/MODEL.md 4.2).
//
// What is reproduced, from the `tokenizers` Rust sources:
// - TokenizerImpl::decode looks an id up in the added vocabulary first, then in the model's vocab;
//   an id with neither is dropped, so a hole decodes to "".
// - Every token, added ones included, goes through the decoder. The ByteLevel decoder maps each
//   char of a token through the inverse of GPT-2's bytes_to_unicode table; when ANY char of the
//   token is outside the table the whole token contributes its own UTF-8 bytes instead. The bytes
//   are then turned into text by String::from_utf8_lossy.
#include "ds4r/tokenizer.h"

#include <fcntl.h>

#include <array>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/file_util.h"

namespace ds4r {

using json = nlohmann::json;

namespace {

// Ids above this are refused: the table is dense (one slot per id), and the released vocabulary
// has 129,280 ids. A bound keeps a corrupt or hostile file from allocating gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;
// tokenizer.json of the release is ~8 MB.
constexpr size_t kMaxTokenizerBytes = size_t{1} << 30;

// GPT-2's bytes_to_unicode, inverted: code point (< 324) -> byte, -1 if not in the table.
// Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF map to the same code point; the other 68 bytes map,
// in increasing byte order, to U+0100, U+0101, ...
const std::array<int16_t, 324>& char_to_byte_table() {
    static const std::array<int16_t, 324> table = [] {
        std::array<int16_t, 324> t{};
        t.fill(-1);
        auto identity = [](int b) {
            return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        };
        int next = 256;
        for (int b = 0; b < 256; ++b) {
            if (identity(b))
                t[static_cast<size_t>(b)] = static_cast<int16_t>(b);
            else
                t[static_cast<size_t>(next++)] = static_cast<int16_t>(b);
        }
        return t;
    }();
    return table;
}

// A UTF-8 lead byte of a multi-byte sequence: the sequence length and the allowed range of its second
// byte (the later ones are 0x80..0xBF). False for bytes that never lead one (0x80..0xC1, 0xF5..0xFF).
struct Utf8Lead {
    size_t len;
    uint8_t lo, hi;
};
bool utf8_lead(uint8_t c0, Utf8Lead* l) {
    *l = {0, 0x80, 0xBF};
    if (c0 >= 0xC2 && c0 <= 0xDF) {
        l->len = 2;
    } else if (c0 >= 0xE0 && c0 <= 0xEF) {
        l->len = 3;
        if (c0 == 0xE0) l->lo = 0xA0;  // no overlong forms
        if (c0 == 0xED) l->hi = 0x9F;  // no surrogates
    } else if (c0 >= 0xF0 && c0 <= 0xF4) {
        l->len = 4;
        if (c0 == 0xF0) l->lo = 0x90;  // no overlong forms
        if (c0 == 0xF4) l->hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return false;
    }
    return true;
}

// Decodes one strictly valid UTF-8 scalar at s[i]; returns its length (0 if invalid) and sets cp.
size_t utf8_scalar(std::string_view s, size_t i, uint32_t* cp) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const size_t n = s.size();
    uint8_t c0 = b(i);
    if (c0 < 0x80) {
        *cp = c0;
        return 1;
    }
    Utf8Lead l;
    if (!utf8_lead(c0, &l)) return 0;
    const size_t len = l.len;
    if (i + len > n) return 0;
    if (b(i + 1) < l.lo || b(i + 1) > l.hi) return 0;
    for (size_t k = 2; k < len; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    uint32_t v = c0 & (len == 2 ? 0x1Fu : len == 3 ? 0x0Fu : 0x07u);
    for (size_t k = 1; k < len; ++k) v = (v << 6) | (b(i + k) & 0x3Fu);
    *cp = v;
    return len;
}

// Length of the maximal prefix of s[i..] that could start a valid sequence (>= 1), for an
// invalid position: the lead byte plus the continuation bytes that were still acceptable.
size_t utf8_invalid_span(std::string_view s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    Utf8Lead l;
    if (!utf8_lead(b(i), &l)) return 1;  // never a lead byte
    size_t k = 1;
    for (; k < l.len && i + k < s.size(); ++k) {
        uint8_t c = b(i + k);
        uint8_t lo = (k == 1) ? l.lo : 0x80, hi = (k == 1) ? l.hi : 0xBF;
        if (c < lo || c > hi) break;
    }
    return k;
}

bool is_json_integer(const json& v) {
    return v.is_number_integer() || v.is_number_unsigned();
}

int64_t token_id(const json& v, const std::string& path, const char* where) {
    if (!is_json_integer(v))
        throw CheckpointError(
            strfmt("%s: %s: token id must be an integer, found a %s", path.c_str(), where, v.type_name()));
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(kMaxTokenId))
            throw CheckpointError(strfmt("%s: %s: token id %llu is above the supported maximum %lld",
                                         path.c_str(), where, (unsigned long long)u, (long long)kMaxTokenId));
        return static_cast<int64_t>(u);
    }
    int64_t id = v.get<int64_t>();
    if (id < 0)
        throw CheckpointError(strfmt("%s: %s: negative token id %lld", path.c_str(), where, (long long)id));
    if (id > kMaxTokenId)
        throw CheckpointError(strfmt("%s: %s: token id %lld is above the supported maximum %lld",
                                     path.c_str(), where, (long long)id, (long long)kMaxTokenId));
    return id;
}

// Accepts a ByteLevel decoder, alone or inside a Sequence whose other steps cannot change the
// decode of one token; `byte_level` counts the ByteLevel steps seen.
void check_decoder(const json& d, const std::string& path, int depth, int* byte_level) {
    if (depth > 8)
        throw CheckpointError(strfmt("%s: decoder: Sequence nesting is deeper than 8", path.c_str()));
    if (!d.is_object() || !d.contains("type") || !d.at("type").is_string())
        throw CheckpointError(strfmt("%s: decoder must be an object with a string 'type'", path.c_str()));
    const std::string type = d.at("type").get<std::string>();
    if (type == "ByteLevel") {
        ++*byte_level;
        return;
    }
    if (type == "Fuse") return;  // concatenates the decoded pieces: a no-op for one token
    if (type == "Strip") {
        // Strip(content, start, stop) removes up to start/stop chars; harmless only when both are 0.
        auto zero = [&](const char* k) {
            return !d.contains(k) || (d.at(k).is_number_integer() && d.at(k).get<int64_t>() == 0);
        };
        if (zero("start") && zero("stop")) return;
    }
    if (type == "Sequence") {
        if (!d.contains("decoders") || !d.at("decoders").is_array())
            throw CheckpointError(strfmt("%s: decoder Sequence without a 'decoders' array", path.c_str()));
        for (const json& step : d.at("decoders")) check_decoder(step, path, depth + 1, byte_level);
        return;
    }
    throw CheckpointError(
        strfmt("%s: decoder step '%s' is not supported: ds4replay decodes tokens as byte-level BPE and "
               "accepts only ByteLevel (optionally in a Sequence with Fuse or a no-op Strip)",
               path.c_str(), type.c_str()));
}

}  // namespace

std::string utf8_from_bytes_lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        uint32_t cp;
        size_t len = utf8_scalar(bytes, i, &cp);
        if (len) {
            out.append(bytes.substr(i, len));
            i += len;
        } else {
            out.append("\xEF\xBF\xBD");  // one U+FFFD per maximal invalid subpart
            i += utf8_invalid_span(bytes, i);
        }
    }
    return out;
}

void append_byte_level_bytes(std::string_view token, std::string& bytes) {
    const auto& table = char_to_byte_table();
    const size_t start = bytes.size();
    size_t i = 0;
    while (i < token.size()) {
        uint32_t cp;
        size_t len = utf8_scalar(token, i, &cp);
        if (!len || cp >= table.size() || table[cp] < 0) {
            // A char outside the table: the whole token keeps its own bytes (ByteLevel decoder).
            bytes.resize(start);
            bytes.append(token);
            return;
        }
        bytes.push_back(static_cast<char>(static_cast<uint8_t>(table[cp])));
        i += len;
    }
}

std::string byte_level_decode(std::string_view token) {
    std::string bytes;
    bytes.reserve(token.size());
    append_byte_level_bytes(token, bytes);
    return utf8_from_bytes_lossy(bytes);
}

Tokenizer Tokenizer::parse(std::string_view json_text, const std::string& path) {
    json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded()) throw CheckpointError(strfmt("%s: not valid JSON", path.c_str()));
    if (!root.is_object()) throw CheckpointError(strfmt("%s: top level must be a JSON object", path.c_str()));

    // --- decoder ---
    if (!root.contains("decoder") || root.at("decoder").is_null())
        throw CheckpointError(strfmt("%s: no decoder: expected a ByteLevel decoder", path.c_str()));
    int byte_level = 0;
    check_decoder(root.at("decoder"), path, 0, &byte_level);
    if (byte_level != 1)
        throw CheckpointError(strfmt("%s: decoder must contain exactly one ByteLevel step, found %d",
                                     path.c_str(), byte_level));

    // --- model.vocab ---
    if (!root.contains("model") || !root.at("model").is_object())
        throw CheckpointError(strfmt("%s: missing object 'model'", path.c_str()));
    const json& model = root.at("model");
    bool ignore_merges = false;
    if (model.contains("type") &&
        !(model.at("type").is_string() && model.at("type").get<std::string>() == "BPE"))
        throw CheckpointError(strfmt("%s: model.type must be \"BPE\"", path.c_str()));
    if (model.contains("ignore_merges") && model.at("ignore_merges").is_boolean())
        ignore_merges = model.at("ignore_merges").get<bool>();
    if (!model.contains("vocab") || !model.at("vocab").is_object())
        throw CheckpointError(strfmt("%s: missing object 'model.vocab' (token -> id)", path.c_str()));
    const json& vocab = model.at("vocab");

    std::vector<std::pair<int64_t, const std::string*>> vocab_entries;
    vocab_entries.reserve(vocab.size());
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        int64_t id = token_id(it.value(), path, "model.vocab");
        vocab_entries.emplace_back(id, &it.key());
        max_id = std::max(max_id, id);
    }

    // --- added_tokens ---
    std::vector<std::pair<int64_t, std::string>> added_entries;
    std::vector<AddedTokenInfo> added_info;
    if (root.contains("added_tokens") && !root.at("added_tokens").is_null()) {
        const json& added = root.at("added_tokens");
        if (!added.is_array())
            throw CheckpointError(strfmt("%s: 'added_tokens' must be an array", path.c_str()));
        for (const json& a : added) {
            if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a.at("content").is_string())
                throw CheckpointError(
                    strfmt("%s: each added_tokens entry needs an integer 'id' and a string 'content'",
                           path.c_str()));
            int64_t id = token_id(a.at("id"), path, "added_tokens");
            added_entries.emplace_back(id, a.at("content").get<std::string>());
            AddedTokenInfo info;
            info.id = id;
            info.content = added_entries.back().second;
            auto flag = [&](const char* k, bool dflt) {
                return a.contains(k) && a.at(k).is_boolean() ? a.at(k).get<bool>() : dflt;
            };
            info.special = flag("special", false);
            // `tokenizers` defaults: normalized = !special, the strip / word flags off.
            info.normalized = flag("normalized", !info.special);
            info.lstrip = flag("lstrip", false);
            info.rstrip = flag("rstrip", false);
            info.single_word = flag("single_word", false);
            added_info.push_back(std::move(info));
            max_id = std::max(max_id, id);
        }
    }
    if (max_id < 0) throw CheckpointError(strfmt("%s: the tokenizer has no tokens", path.c_str()));

    // --- merges (optional here: only the encoder needs them) ---
    std::vector<std::pair<std::string, std::string>> merges;
    if (model.contains("merges") && !model.at("merges").is_null()) {
        const json& m = model.at("merges");
        if (!m.is_array()) throw CheckpointError(strfmt("%s: model.merges must be an array", path.c_str()));
        merges.reserve(m.size());
        for (size_t r = 0; r < m.size(); ++r) {
            const json& e = m[r];
            if (e.is_string()) {
                const std::string& s = e.get_ref<const std::string&>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                    throw CheckpointError(
                        strfmt("%s: model.merges[%zu] must be \"A B\" (two tokens and one "
                               "space), found \"%s\"",
                               path.c_str(), r, s.substr(0, 40).c_str()));
                merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
            } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
                merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
            } else {
                throw CheckpointError(strfmt(
                    "%s: model.merges[%zu] must be a string \"A B\" or a pair [A, B]", path.c_str(), r));
            }
        }
    }

    Tokenizer tok;
    tok.merges_ = std::move(merges);
    tok.added_info_ = std::move(added_info);
    tok.ignore_merges_ = ignore_merges;
    if (root.contains("pre_tokenizer")) tok.pre_tokenizer_json_ = root.at("pre_tokenizer").dump();
    if (root.contains("normalizer")) tok.normalizer_json_ = root.at("normalizer").dump();
    const size_t n = static_cast<size_t>(max_id + 1);
    tok.tokens_.assign(n, std::string());
    tok.added_.assign(n, 0);
    tok.present_.assign(n, 0);
    for (const auto& [id, token] : vocab_entries) {
        auto u = static_cast<size_t>(id);
        if (tok.present_[u])
            throw CheckpointError(
                strfmt("%s: model.vocab: id %lld is used by two tokens", path.c_str(), (long long)id));
        tok.present_[u] = 1;
        tok.tokens_[u] = *token;
    }
    tok.model_vocab_ = tok.tokens_;
    // The added vocabulary wins over the model's vocab for the same id (TokenizerImpl::decode).
    std::vector<uint8_t> seen_added(n, 0);
    for (auto& [id, content] : added_entries) {
        auto u = static_cast<size_t>(id);
        if (seen_added[u])
            throw CheckpointError(
                strfmt("%s: added_tokens: id %lld appears twice", path.c_str(), (long long)id));
        seen_added[u] = 1;
        tok.present_[u] = 1;
        tok.added_[u] = 1;
        tok.tokens_[u] = std::move(content);
    }
    return tok;
}

Tokenizer Tokenizer::load(const std::string& path) {
    FileHandle f(path, O_RDONLY, 0644, /*checkpoint=*/true);
    uint64_t size = f.size();
    if (size > kMaxTokenizerBytes)
        throw CheckpointError(strfmt("%s: %llu bytes is too large for a tokenizer.json", path.c_str(),
                                     (unsigned long long)size));
    std::string text(static_cast<size_t>(size), '\0');
    if (size) f.pread_exact(text.data(), text.size(), 0);
    return parse(text, path);
}

const std::string& Tokenizer::id_to_token(int64_t id) const {
    static const std::string empty;
    if (!has_token(id)) return empty;
    return tokens_[static_cast<size_t>(id)];
}

bool Tokenizer::is_added(int64_t id) const {
    return id >= 0 && id < size() && added_[static_cast<size_t>(id)] != 0;
}

bool Tokenizer::has_token(int64_t id) const {
    return id >= 0 && id < size() && present_[static_cast<size_t>(id)] != 0;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string bytes;
    for (int32_t id : ids)
        if (has_token(id)) append_byte_level_bytes(tokens_[static_cast<size_t>(id)], bytes);
    return utf8_from_bytes_lossy(bytes);
}

std::string Tokenizer::decode_one(int64_t id) const {
    if (!has_token(id)) return std::string();  // decode drops ids without a token
    return byte_level_decode(tokens_[static_cast<size_t>(id)]);
}

}  // namespace ds4r
