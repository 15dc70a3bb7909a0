// tokenizer.json (Hugging Face `tokenizers` format, byte-level BPE): what ds4replay needs of it —
// the id -> token table (vocab + added tokens) and the byte-level decode of single tokens, which
// the Engram token map is built from (docs/MODEL.md 4.2), plus what the encoder in src/text/ needs
// (merges, pre-tokenizer, normalizer, added-token flags; see ds4r/text.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r {

// One entry of tokenizer.json's added_tokens, with the flags that steer matching in text.
struct AddedTokenInfo {
    int64_t id = 0;
    std::string content;
    bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

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
    // tokenizer.decode(ids, skip_special_tokens=False): the ByteLevel decoder over the whole
    // sequence (every token's bytes concatenated, then ONE lossy UTF-8 decode, so a character split
    // across tokens comes back whole). Ids without a token are dropped, as `tokenizers` does.
    std::string decode(const std::vector<int32_t>& ids) const;

    // --- for the encoder (src/text/) ---
    // model.vocab alone (without the added tokens), indexed by id; "" for ids not in it.
    const std::vector<std::string>& model_vocab() const { return model_vocab_; }
    // model.merges in rank order, each as its two token strings ("a b" strings or [a, b] pairs).
    const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }
    const std::vector<AddedTokenInfo>& added_tokens() const { return added_info_; }
    // The raw JSON of "pre_tokenizer" and "normalizer" ("null" when absent).
    const std::string& pre_tokenizer_json() const { return pre_tokenizer_json_; }
    const std::string& normalizer_json() const { return normalizer_json_; }
    bool ignore_merges() const { return ignore_merges_; }

private:
    // [size()] each, indexed by id.
    std::vector<std::string> tokens_;
    std::vector<uint8_t> added_;  // 1 = added token
    std::vector<uint8_t> present_;
    std::vector<std::string> model_vocab_;
    std::vector<std::pair<std::string, std::string>> merges_;
    std::vector<AddedTokenInfo> added_info_;
    std::string pre_tokenizer_json_ = "null", normalizer_json_ = "null";
    bool ignore_merges_ = false;
};

// Rust's String::from_utf8_lossy: valid UTF-8 is copied, each maximal invalid subpart (Unicode's
// "substitution of maximal subparts") becomes one U+FFFD.
std::string utf8_from_bytes_lossy(std::string_view bytes);
// The ByteLevel decoder on one token string: every char through the inverse of GPT-2's
// bytes_to_unicode table; if any char is outside the table, the token's own UTF-8 bytes instead;
// then utf8_from_bytes_lossy.
std::string byte_level_decode(std::string_view token);
// The bytes one token stands for under the ByteLevel decoder, before any UTF-8 decoding, appended.
void append_byte_level_bytes(std::string_view token, std::string& bytes);

}  // namespace ds4r
