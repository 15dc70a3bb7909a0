// Text -> token ids (`ds4replay encode`) and back (`ds4replay decode`), as DeepSeek's own tooling does
// it: Hugging Face `tokenizers`' byte-level BPE over tokenizer.json, and DeepSeek V4.1's chat format
// (encoding/encoding.py of the release; docs/DESIGN.md section 2 "Input").
//
// TextEncoder reproduces `Tokenizer.encode(text, add_special_tokens=False)`:
//  1. added tokens are cut out of the text first (leftmost-longest; the non-normalized ones, then the
//     normalized ones in what is left, as tokenizers' AddedVocabulary does);
//  2. the rest goes through the pre-tokenizer: Split regexes (PCRE2, UTF + UCP, JIT) and ByteLevel;
//  3. each piece is mapped to GPT-2's byte alphabet and merged by merge rank (words are cached).
// Only identity normalizers (null or an empty Sequence) are accepted, and added tokens without the
// lstrip / rstrip / single_word flags; anything else is refused with a CheckpointError naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ds4r {

class Tokenizer;

class TextEncoder {
public:
    // Builds the merge table, the added-token matcher and the pre-tokenizer from `tok` (which must
    // outlive the encoder). Throws CheckpointError for what cannot be reproduced exactly.
    explicit TextEncoder(const Tokenizer& tok);
    ~TextEncoder();
    TextEncoder(const TextEncoder&) = delete;
    TextEncoder& operator=(const TextEncoder&) = delete;

    // Token ids of `text` (UTF-8). Throws InputError for text that is not valid UTF-8 (the message
    // names the byte offset). Not thread-safe (the word cache and the regex match data are shared).
    std::vector<int32_t> encode(std::string_view text);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// DeepSeek V4.1 chat format (encoding.py's encode_messages): renders one chat record to the prompt
// string, which TextEncoder then encodes (special tokens are written inline and matched as added
// tokens). `record_json` is a JSON object:
//   {"messages": [...], "tools"?: [...], "thinking_mode"?: "chat"|"thinking",
//    "reasoning_effort"?: 1..100|"low"|"high"|"max", "context"?: [...]}
// Messages in the OpenAI format (roles system, user, assistant, tool, latest_reminder; content a
// string or a list of blocks; reasoning_content; tool_calls; task; wo_eos). Images become the image
// placeholder token only. Throws InputError (no location: the caller adds file:line) for anything
// encoding.py would reject, or that is not a chat record.
struct ChatOptions {
    std::string default_thinking_mode = "chat";  // when the record has no "thinking_mode"
    // The header encoding.py appends after the last message when the model is to answer it
    // (`<｜Assistant｜>` + `<think>`/`</think>`, or a task's token). false leaves it out.
    bool add_generation_prompt = true;
};
std::string render_chat_prompt(std::string_view record_json, const ChatOptions& opt = {});

// `ds4replay encode` / `ds4replay decode` (src/text/encode_command.cpp).
struct EncodeCommandOptions {
    std::string tokenizer_path;  // tokenizer.json
    std::string input = "-";     // JSONL, "-" = stdin
    std::string output = "-";    // JSONL, "-" = stdout
    ChatOptions chat;
    bool with_text = false;  // add "token_text": [the decoded text of each token]
};
// Reads JSONL records and writes one output line per record. encode: {"id", "text"} or
// {"id", "messages", ...} -> {"id", "tokens", carried fields...}; decode: records with "tokens" ->
// the same record plus "text". Bad input: InputError "<file>:<line>: <what was expected>".
// Returns the exit code (0).
int run_encode(const EncodeCommandOptions& opt);
int run_decode(const EncodeCommandOptions& opt);

}  // namespace ds4r
