// tokens.jsonl parsing with errors that name the line (DESIGN.md section 2, issue "bad input").
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/input.h"

namespace ds4r {

using json = nlohmann::json;

namespace {
// Output fields of a record: an input field with one of these names cannot be carried through.
const char* const kReserved[] = {"id", "tokens", "input_ids", "n_tokens", "logprob", "rank", "entropy",
                                 "topk_ids", "topk_logprobs", "final", "sum_logprob", "hidden", "error", "line"};
bool reserved(const std::string& k) {
    for (const char* r : kReserved)
        if (k == r) return true;
    return false;
}
}  // namespace

InputReader::InputReader(const std::string& path, int64_t vocab, int64_t max_len)
    : path_(path), vocab_(vocab), max_len_(max_len) {
    if (path == "-") {
        f_ = stdin;
        path_ = "<stdin>";
    } else {
        f_ = std::fopen(path.c_str(), "rb");
        if (!f_) throw InputError(strfmt("%s: cannot open input (%s)", path.c_str(), errno_text(errno).c_str()));
        own_ = true;
    }
}

InputReader::~InputReader() {
    if (own_ && f_) std::fclose(f_);
}

bool InputReader::read_line(std::string& line, bool& had_newline) {
    line.clear();
    had_newline = false;
    int c;
    bool any = false;
    while ((c = std::getc(f_)) != EOF) {
        any = true;
        if (c == '\n') {
            had_newline = true;
            break;
        }
        line += static_cast<char>(c);
        if (line.size() > (size_t(1) << 31))
            throw InputError(strfmt("%s:%lld: line longer than 2 GiB", path_.c_str(), (long long)line_no_ + 1));
    }
    if (std::ferror(f_)) throw InputError(strfmt("%s: read error (%s)", path_.c_str(), errno_text(errno).c_str()));
    return any;
}

bool InputReader::next(InputRecord& rec, std::string* bad_line_id) {
    std::string line;
    bool nl = false;
    for (;;) {
        if (!read_line(line, nl)) return false;
        ++line_no_;
        if (line.find_first_not_of(" \t") != std::string::npos) break;  // skip blank lines
    }
    const std::string where = strfmt("%s:%lld: ", path_.c_str(), (long long)line_no_);
    auto fail = [&](const std::string& msg) -> bool { throw InputError(where + msg); };
    if (line_no_ == 1 && line.size() >= 3 && static_cast<unsigned char>(line[0]) == 0xEF &&
        static_cast<unsigned char>(line[1]) == 0xBB && static_cast<unsigned char>(line[2]) == 0xBF)
        fail("the file starts with a UTF-8 byte order mark (EF BB BF); remove it, e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' FILE");
    if (!line.empty() && line.back() == '\r')
        fail("the line ends with CRLF; convert the file to LF line ends (e.g. dos2unix FILE)");
    json v;
    try {
        v = json::parse(line);
    } catch (const json::parse_error& e) {
        if (!nl) fail(strfmt("the last line is not valid JSON and has no newline: truncated? (%s)", e.what()));
        fail(strfmt("not valid JSON (%s)", e.what()));
    }
    rec = InputRecord();
    rec.line = line_no_;
    const json* toks = nullptr;
    if (v.is_array()) {
        toks = &v;
        rec.id_json = std::to_string(line_no_);
    } else if (v.is_object()) {
        if (v.contains("id")) {
            const json& id = v.at("id");
            if (!id.is_string() && !id.is_number_integer())
                fail("\"id\" must be a string or an integer, found " + id.dump().substr(0, 40));
            rec.id_json = id.dump();
        } else {
            rec.id_json = std::to_string(line_no_);
        }
        if (bad_line_id) *bad_line_id = rec.id_json;
        const bool has_t = v.contains("tokens"), has_i = v.contains("input_ids");
        if (has_t && has_i) fail("has both \"tokens\" and \"input_ids\"; give one");
        if (!has_t && !has_i) fail("no \"tokens\" array (expected {\"id\": ..., \"tokens\": [int, ...]})");
        toks = &v.at(has_t ? "tokens" : "input_ids");
        if (!toks->is_array()) fail(std::string("\"") + (has_t ? "tokens" : "input_ids") + "\" must be an array of integers");
        json extra = json::object();
        for (auto it = v.begin(); it != v.end(); ++it)
            if (!reserved(it.key())) extra[it.key()] = it.value();
        rec.extra_json = extra.dump();
    } else {
        fail("expected a JSON object {\"id\": ..., \"tokens\": [...]} or an array of token ids");
    }
    if (bad_line_id) *bad_line_id = rec.id_json;
    if (toks->empty()) fail("empty token sequence");
    if (static_cast<int64_t>(toks->size()) > max_len_)
        fail(strfmt("sequence of %zu tokens is longer than the maximum %lld (--max-seq-len)", toks->size(),
                    (long long)max_len_));
    rec.tokens.reserve(toks->size());
    for (size_t i = 0; i < toks->size(); ++i) {
        const json& t = (*toks)[i];
        if (!t.is_number_integer())
            fail(strfmt("token %zu is %s, expected an integer id", i, t.dump().substr(0, 40).c_str()));
        if (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(vocab_)
                                   : (t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_))
            fail(strfmt("token %zu is %s, outside the vocabulary [0, %lld)", i, t.dump().substr(0, 40).c_str(),
                        (long long)vocab_));
        rec.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return true;
}

}  // namespace ds4r
