// The pre-tokenizer of tokenizer.json (Hugging Face `tokenizers`), the steps byte-level BPE uses:
// Split (a regex or a literal; Isolated or Removed; optionally inverted) and ByteLevel (optionally
// with GPT-2's own split regex and add_prefix_space), alone or in a Sequence. Regexes run on PCRE2
// (UTF + UCP, JIT-compiled) in place of the Oniguruma engine `tokenizers` uses; see pretokenize.cpp
// for the one place their syntax differs and how it is bridged.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r::text {

// A piece of pre-tokenized text: bytes [begin, end) of the text given to PreTokenizer::split, with
// `prefix_space` when ByteLevel's add_prefix_space put a ' ' before it.
struct Piece {
    size_t begin = 0, end = 0;
    bool prefix_space = false;
};

class PreTokenizer {
public:
    // `json_text`: the "pre_tokenizer" value of tokenizer.json; `where` names the file in errors.
    // Throws CheckpointError for a step that is not supported.
    PreTokenizer(std::string_view json_text, const std::string& where);
    ~PreTokenizer();
    PreTokenizer(const PreTokenizer&) = delete;
    PreTokenizer& operator=(const PreTokenizer&) = delete;

    // Splits valid UTF-8 `s` into pieces (replacing `out`), in order.
    void split(std::string_view s, std::vector<Piece>& out);

    struct Step;  // one step of the (flattened) Sequence; defined in pretokenize.cpp

private:
    std::vector<std::unique_ptr<Step>> steps_;
    std::vector<Piece> scratch_;
};

// Rewrites Oniguruma's \s / \S (outside character classes) and \s (inside them) to the exact set
// Oniguruma uses, for PCRE2. Exposed for tests.
std::string oniguruma_to_pcre2(std::string_view pattern);

}  // namespace ds4r::text
