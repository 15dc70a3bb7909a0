// tokenizer.json (Hugging Face `tokenizers` format, byte-level BPE): what ds4replay needs of it —
// the id -> token table (vocab + added tokens) and the byte-level decode of single tokens, which
// the Engram token map is built from (MODEL.md 4.2). No encoding: inputs are token ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r {

class Tokenizer {
public:
    // Parses tokenizer.json text; `path` names the file in errors. Throws CheckpointError for
    // malformed JSON, a missing model.vocab, ids that are negative / duplicated, or a decoder that
    // is not ByteLevel.
    static Tokenizer parse(std::string_view json_text, const std::string& path);
    static Tokenizer load(const std::string& path);

    // len(tokenizer): 1 + the largest id of vocab and added tokens (ids without a token are holes).
    int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
    // The raw token string (`id_to_token`), empty for holes.
    const std::string& id_to_token(int64_t id) const;
    bool is_added(int64_t id) const;  // an added token (special or not): decoded verbatim
    bool has_token(int64_t id) const;
    // tokenizer.decode([id], skip_special_tokens=False): byte-level decode of the token's chars to
    // bytes, then UTF-8 decoding with invalid sequences replaced by U+FFFD exactly as Rust's
    // String::from_utf8_lossy does. Returns UTF-8. Added tokens go through the same ByteLevel
    // decoder as `tokenizers` does it; in practice they come out verbatim because they contain a
    // char outside the byte table (e.g. U+FF5C) or only printable ASCII. Holes decode to "".
    std::string decode_one(int64_t id) const;

private:
    // [size()] each, indexed by id.
    std::vector<std::string> tokens_;
    std::vector<uint8_t> added_;  // 1 = added token
    std::vector<uint8_t> present_;
};

// Rust's String::from_utf8_lossy: valid UTF-8 is copied, each maximal invalid subpart (Unicode's
// "substitution of maximal subparts") becomes one U+FFFD.
std::string utf8_from_bytes_lossy(std::string_view bytes);
// The ByteLevel decoder on one token string: every char through the inverse of GPT-2's
// bytes_to_unicode table; if any char is outside the table, the token's own UTF-8 bytes instead;
// then utf8_from_bytes_lossy.
std::string byte_level_decode(std::string_view token);

}  // namespace ds4r
