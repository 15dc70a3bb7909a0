// tokens.jsonl reader (DESIGN.md section 2 "Input"): one JSON value per line, {"id": ..., "tokens":
// [...]} (alias "input_ids"), or a bare [int, ...] array whose id is its line number. Extra fields
// are carried through. Every rejection is an InputError naming the line and what was expected.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace ds4r {

struct InputRecord {
    int64_t line = 0;              // 1-based line number
    std::string id_json;           // the id as JSON text ("\"abc\"" or "17")
    std::vector<int32_t> tokens;
    std::string extra_json = "{}"; // other fields as a JSON object text
};

class InputReader {
public:
    // path "-" = stdin. vocab: ids must lie in [0, vocab); max_len: longest accepted sequence.
    InputReader(const std::string& path, int64_t vocab, int64_t max_len);
    ~InputReader();
    // Reads the next non-blank line. Returns false at end of input. A bad line throws InputError
    // (message starts with "<path>:<line>: "); the reader then continues with the following line.
    // On a bad line, *bad_line_id receives the line's id when one could be read (for --skip-bad).
    bool next(InputRecord& rec, std::string* bad_line_id = nullptr);
    int64_t line() const { return line_no_; }
    const std::string& path() const { return path_; }

private:
    bool read_line(std::string& line, bool& had_newline);
    std::string path_;
    FILE* f_ = nullptr;
    bool own_ = false;
    int64_t vocab_, max_len_;
    int64_t line_no_ = 0;
};

}  // namespace ds4r
