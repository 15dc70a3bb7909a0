// tokens.jsonl reader (docs/DESIGN.md section 2 "Input"): one JSON value per line, {"id": ..., "tokens":
// [...]} (alias "input_ids"), or a bare [int, ...] array whose id is its line number. Extra fields
// are carried through. Every rejection is an InputError naming the line and what was expected.
//
// Rejected lines (each an InputError "<path>:<line>: <what>"; the reader then goes on with the next
// line, so --skip-bad can record the error and continue):
//  - not valid JSON (including numbers out of range such as 1e400), or nested deeper than 256;
//  - a UTF-8 byte order mark at the start of the file, a CRLF line end (the message says how to fix);
//  - a last line without newline that is not valid JSON ("truncated?");
//  - neither an object nor an array; an "id" that is not a string or an integer; both or neither of
//    "tokens" / "input_ids"; a token list that is not an array, is empty, is longer than max_len;
//  - a token that is not an integer (floats such as 1.0 or 1e+23, strings, booleans), is negative, or
//    is >= vocab;
//  - a line longer than 1 GiB (the rest of it is skipped).
// Blank lines (only spaces, tabs, a CR) are skipped and still counted. Duplicate ids are the
// caller's concern (run_score).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds4r {

struct InputRecord {
    int64_t line = 0;     // 1-based line number
    std::string id_json;  // the id as JSON text ("\"abc\"" or "17")
    std::vector<int32_t> tokens;
    std::string extra_json = "{}";  // other fields as a JSON object text
};

class InputReader {
public:
    // path "-" = stdin. vocab: ids must lie in [0, vocab); max_len: longest accepted sequence.
    // Throws InputError when the file cannot be opened or is a directory.
    InputReader(const std::string& path, int64_t vocab, int64_t max_len);
    // In-memory input (tests, fuzzing); `name` stands for the path in messages.
    static InputReader from_string(std::string text, std::string name, int64_t vocab, int64_t max_len);
    ~InputReader();
    InputReader(InputReader&& o) noexcept;
    InputReader& operator=(InputReader&&) = delete;
    InputReader(const InputReader&) = delete;
    InputReader& operator=(const InputReader&) = delete;

    // Reads the next non-blank line. Returns false at end of input. A bad line throws InputError
    // (message starts with "<path>:<line>: "); the reader then continues with the following line.
    // On a bad line, *bad_line_id receives the line's id when one could be read (for --skip-bad),
    // else it is left empty.
    bool next(InputRecord& rec, std::string* bad_line_id = nullptr);
    int64_t line() const { return line_no_; }
    const std::string& path() const { return path_; }
    // Bytes consumed so far (every line returned, rejected or skipped, with its newline).
    uint64_t bytes_consumed() const { return consumed_; }
    // Size of the input when it is a regular file or a string, else -1 (a pipe: unknown).
    int64_t size_bytes() const { return size_; }

    static constexpr size_t kMaxLineBytes = size_t{1} << 30;
    static constexpr int kMaxNesting = 256;

private:
    struct Unopened {};
    InputReader(Unopened, std::string name, int64_t vocab, int64_t max_len);
    // One line without its '\n' into `line`; false at end of input. `too_long` when the line passed
    // kMaxLineBytes (its rest was skipped).
    bool read_line(std::string& line, bool& had_newline, bool& too_long);
    bool fill();  // more bytes into buf_; false at end of input
    std::string path_;
    int fd_ = -1;
    bool own_fd_ = false;
    bool eof_ = false;
    std::string buf_;
    size_t pos_ = 0;
    int64_t vocab_, max_len_;
    int64_t line_no_ = 0;
    uint64_t consumed_ = 0;
    int64_t size_ = -1;
};

}  // namespace ds4r
