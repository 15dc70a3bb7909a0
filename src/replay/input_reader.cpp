// tokens.jsonl parsing with errors that name the line (docs/DESIGN.md section 2, issue "bad input").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/input.h"
#include "ds4r/json_util.h"

namespace ds4r {

using json = nlohmann::json;

namespace {

// Output fields of a record: an input field with one of these names cannot be carried through.
const char* const kReserved[] = {"id",          "tokens",  "input_ids", "n_tokens",      "logprob",
                                 "rank",        "entropy", "topk_ids",  "topk_logprobs", "final",
                                 "sum_logprob", "hidden",  "error",     "line"};
bool reserved(const std::string& k) {
    for (const char* r : kReserved)
        if (k == r) return true;
    return false;
}

constexpr size_t kReadChunk = size_t{1} << 20;

bool starts_with_bom(const std::string& s) {
    return s.size() >= 3 && static_cast<unsigned char>(s[0]) == 0xEF &&
           static_cast<unsigned char>(s[1]) == 0xBB && static_cast<unsigned char>(s[2]) == 0xBF;
}

// The id a bad line would have had (for its --skip-bad error record), or "" when none can be read.
std::string salvage_id(std::string text, int64_t line_no) {
    if (starts_with_bom(text)) text.erase(0, 3);
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (json_nesting_depth(text) > InputReader::kMaxNesting) return {};
    json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_array()) return std::to_string(line_no);
    if (v.is_object() && v.contains("id") && (v.at("id").is_string() || v.at("id").is_number_integer()))
        return v.at("id").dump();
    return {};
}

}  // namespace

InputReader::InputReader(Unopened, std::string name, int64_t vocab, int64_t max_len)
    : path_(std::move(name)), vocab_(vocab), max_len_(max_len) {}

InputReader::InputReader(const std::string& path, int64_t vocab, int64_t max_len)
    : InputReader(Unopened{}, path == "-" ? std::string("<stdin>") : path, vocab, max_len) {
    if (path == "-") {
        fd_ = STDIN_FILENO;
    } else {
        do {
            fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        } while (fd_ < 0 && errno == EINTR);
        if (fd_ < 0)
            throw InputError(strfmt("%s: cannot open input (%s)", path.c_str(), errno_text(errno).c_str()));
        own_fd_ = true;
    }
    struct stat st {};
    if (::fstat(fd_, &st) == 0) {
        if (S_ISDIR(st.st_mode)) throw InputError(path_ + ": is a directory, expected a tokens.jsonl file");
        if (S_ISREG(st.st_mode)) size_ = static_cast<int64_t>(st.st_size);
    }
}

InputReader InputReader::from_string(std::string text, std::string name, int64_t vocab, int64_t max_len) {
    InputReader r(Unopened{}, std::move(name), vocab, max_len);
    r.size_ = static_cast<int64_t>(text.size());
    r.buf_ = std::move(text);
    r.eof_ = true;
    return r;
}

InputReader::InputReader(InputReader&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(o.fd_),
      own_fd_(o.own_fd_),
      eof_(o.eof_),
      buf_(std::move(o.buf_)),
      pos_(o.pos_),
      vocab_(o.vocab_),
      max_len_(o.max_len_),
      line_no_(o.line_no_),
      consumed_(o.consumed_),
      size_(o.size_) {
    o.fd_ = -1;
    o.own_fd_ = false;
}

InputReader::~InputReader() {
    if (own_fd_ && fd_ >= 0) ::close(fd_);
}

bool InputReader::fill() {
    if (eof_) return false;
    if (pos_ > 0) {
        buf_.erase(0, pos_);
        pos_ = 0;
    }
    const size_t old = buf_.size();
    buf_.resize(old + kReadChunk);
    ssize_t n;
    do {
        n = ::read(fd_, buf_.data() + old, kReadChunk);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        const int err = errno;
        buf_.resize(old);
        throw InputError(strfmt("%s: read error after line %lld (%s)", path_.c_str(), (long long)line_no_,
                                errno_text(err).c_str()));
    }
    buf_.resize(old + static_cast<size_t>(n));
    if (n == 0) eof_ = true;
    return n > 0;
}

bool InputReader::read_line(std::string& line, bool& had_newline, bool& too_long) {
    line.clear();
    had_newline = false;
    too_long = false;
    bool any = false;
    for (;;) {
        if (pos_ >= buf_.size() && !fill()) return any;
        any = true;
        const char* b = buf_.data() + pos_;
        const size_t avail = buf_.size() - pos_;
        const void* nl = std::memchr(b, '\n', avail);
        const size_t take = nl ? static_cast<size_t>(static_cast<const char*>(nl) - b) : avail;
        if (!too_long) {
            if (line.size() + take > kMaxLineBytes) {
                too_long = true;  // keep reading to the newline, dropping the bytes
                line.clear();
            } else {
                line.append(b, take);
            }
        }
        pos_ += take + (nl ? 1 : 0);
        consumed_ += take + (nl ? 1 : 0);
        if (nl) {
            had_newline = true;
            return true;
        }
    }
}

bool InputReader::next(InputRecord& rec, std::string* bad_line_id) {
    std::string line;
    bool nl = false, too_long = false;
    if (bad_line_id) bad_line_id->clear();
    for (;;) {
        if (!read_line(line, nl, too_long)) return false;
        ++line_no_;
        if (too_long || line.find_first_not_of(" \t\r") != std::string::npos) break;  // skip blank lines
    }
    const std::string where = strfmt("%s:%lld: ", path_.c_str(), (long long)line_no_);
    // Every rejection below carries the line's id when it can be read.
    auto fail = [&](const std::string& msg) -> bool {
        if (bad_line_id && bad_line_id->empty() && !too_long) *bad_line_id = salvage_id(line, line_no_);
        throw InputError(where + msg);
    };
    if (too_long) fail(strfmt("line longer than %zu bytes", kMaxLineBytes));
    if (line_no_ == 1 && starts_with_bom(line))
        fail(
            "the file starts with a UTF-8 byte order mark (EF BB BF); remove it, e.g. sed -i "
            "'1s/^\\xEF\\xBB\\xBF//' FILE");
    if (line.back() == '\r')
        fail("the line ends with CRLF; convert the file to LF line ends (e.g. dos2unix FILE)");
    if (json_nesting_depth(line) > kMaxNesting)
        fail(strfmt("JSON nested deeper than %d levels", kMaxNesting));
    json v;
    try {
        v = json::parse(line);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
        if (!nl)
            fail(strfmt("the last line is not valid JSON and has no newline: truncated? (%s)", e.what()));
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
        if (!toks->is_array())
            fail(std::string("\"") + (has_t ? "tokens" : "input_ids") +
                 "\" must be an array of integers, found " + toks->dump().substr(0, 40));
        json extra = json::object();
        for (auto it = v.begin(); it != v.end(); ++it)
            if (!reserved(it.key())) extra[it.key()] = it.value();
        rec.extra_json = extra.dump();
    } else {
        fail("expected a JSON object {\"id\": ..., \"tokens\": [...]} or an array of token ids, found " +
             v.dump().substr(0, 40));
    }
    if (bad_line_id) *bad_line_id = rec.id_json;
    if (toks->empty()) fail("empty token sequence");
    if (static_cast<int64_t>(toks->size()) > max_len_)
        fail(
            strfmt("sequence of %zu tokens is longer than the maximum %lld (--max-seq-len): split it, or "
                   "raise --max-seq-len (default: the model's max_position_embeddings)",
                   toks->size(), (long long)max_len_));
    rec.tokens.reserve(toks->size());
    for (size_t i = 0; i < toks->size(); ++i) {
        const json& t = (*toks)[i];
        if (t.is_number_float() &&
            std::fabs(t.get<double>()) >= 9.2e18)  // an integer literal too large for 64 bits
            fail(strfmt("token %zu is a number too large for a token id (%s); ids lie in [0, %lld)", i,
                        t.dump().substr(0, 40).c_str(), (long long)vocab_));
        if (!t.is_number_integer())
            fail(strfmt("token %zu is %s, expected an integer id in [0, %lld)", i,
                        t.dump().substr(0, 40).c_str(), (long long)vocab_));
        if (t.is_number_unsigned() ? t.get<uint64_t>() >= static_cast<uint64_t>(vocab_)
                                   : (t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab_))
            fail(strfmt("token %zu is %s, outside the vocabulary [0, %lld)", i,
                        t.dump().substr(0, 40).c_str(), (long long)vocab_));
        rec.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return true;
}

}  // namespace ds4r
