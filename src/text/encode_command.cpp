// `ds4replay encode` and `ds4replay decode` (see ds4r/text.h): JSONL in, JSONL out.
//
// encode, one input line -> one output line:
//   {"id", "text"}                         -> {"id", "tokens", carried fields...}
//   {"id", "messages", "tools"?, ...}      -> the chat rendered (chat_format.cpp), then encoded
//   {"id", "tokens"}                       -> passed through (so mixed files work)
// Carried fields are every other field of the record, in their order. With --with-text each token's
// text follows as "token_text". An "id" is a string or an integer; without one the line number is
// the id, as `score` does.
// decode: a record with "tokens" (or "input_ids"), or a bare array of ids -> the record plus "text".
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/text.h"
#include "ds4r/tokenizer.h"
#include "text/python_json.h"

namespace ds4r {

namespace {

using oj = nlohmann::ordered_json;

constexpr int kMaxNesting = text::kMaxJsonNesting;
constexpr size_t kOutputFlushBytes = size_t{1} << 20;

// Fields an encode record consumes; they are not carried to the output.
bool consumed_field(const std::string& k) {
    static const char* const kConsumed[] = {
        "id",      "text",   "messages",  "tools",     "thinking_mode", "reasoning_effort",
        "context", "tokens", "input_ids", "token_text"};
    for (const char* c : kConsumed)
        if (k == c) return true;
    return false;
}

// Line-by-line input from a file or stdin.
class LineSource {
public:
    explicit LineSource(const std::string& path) : name_(path == "-" ? "<stdin>" : path) {
        if (path == "-") {
            f_ = stdin;
        } else {
            struct stat st {};
            if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
                throw InputError(path + ": is a directory, expected a JSONL file");
            f_ = std::fopen(path.c_str(), "rb");
            if (!f_)
                throw InputError(strfmt("%s: cannot open input (%s)", path.c_str(), std::strerror(errno)));
            own_ = true;
        }
    }
    ~LineSource() {
        if (own_) std::fclose(f_);
        std::free(buf_);
    }
    LineSource(const LineSource&) = delete;
    LineSource& operator=(const LineSource&) = delete;
    bool next(std::string& line) {
        errno = 0;
        const ssize_t n = ::getline(&buf_, &cap_, f_);
        if (n < 0) {
            if (std::ferror(f_))
                throw RuntimeError(strfmt("%s: read error after line %lld (%s)", name_.c_str(),
                                          (long long)line_no_, std::strerror(errno)));
            return false;
        }
        ++line_no_;
        line.assign(buf_, static_cast<size_t>(n));
        if (!line.empty() && line.back() == '\n') line.pop_back();
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return true;
    }
    const std::string& name() const { return name_; }
    int64_t line_no() const { return line_no_; }

private:
    std::string name_;
    FILE* f_ = nullptr;
    bool own_ = false;
    char* buf_ = nullptr;
    size_t cap_ = 0;
    int64_t line_no_ = 0;
};

// Output to stdout or, atomically, to a new file (an existing non-empty file is never replaced).
class LineSink {
public:
    explicit LineSink(const std::string& path) {
        if (path != "-") {
            struct stat st {};
            if (::stat(path.c_str(), &st) == 0 && (S_ISDIR(st.st_mode) || st.st_size > 0))
                throw InputError(path + ": exists and is not empty; remove it or choose another --output");
            file_ = std::make_unique<AtomicFileWriter>(path);
        }
    }
    void write_line(const std::string& s) {
        buf_ += s;
        buf_ += '\n';
        if (buf_.size() >= kOutputFlushBytes) flush();
    }
    void flush() {
        if (file_) {
            file_->write(buf_);
        } else if (!buf_.empty()) {
            if (std::fwrite(buf_.data(), 1, buf_.size(), stdout) != buf_.size() || std::fflush(stdout) != 0)
                throw RuntimeError(strfmt("cannot write to stdout (%s)", std::strerror(errno)));
        }
        buf_.clear();
    }
    void finish() {
        flush();
        if (file_) file_->commit();
    }

private:
    std::unique_ptr<AtomicFileWriter> file_;
    std::string buf_;
};

std::string dump_line(const oj& v) {
    return v.dump(-1, ' ', false, oj::error_handler_t::replace);
}

// Parses one JSONL line; nullopt-like: returns false for blank lines. Throws "<where>what".
bool parse_line(const std::string& line, const std::string& where, oj& v) {
    if (line.find_first_not_of(" \t") == std::string::npos) return false;
    if (json_nesting_depth(line) > kMaxNesting)
        throw InputError(where + strfmt("JSON nested deeper than %d levels", kMaxNesting));
    v = oj::parse(line, nullptr, false);
    if (v.is_discarded()) throw InputError(where + "not valid JSON");
    return true;
}

oj record_id(const oj& rec, int64_t line_no, const std::string& where) {
    if (!rec.contains("id")) return oj(line_no);
    const oj& id = rec.at("id");
    if (!id.is_string() && !id.is_number_integer())
        throw InputError(where + "\"id\" must be a string or an integer, found " + id.dump().substr(0, 40));
    return id;
}

// Checked token ids of a JSON array.
std::vector<int32_t> token_ids(const oj& arr, const char* name, int64_t vocab, const std::string& where) {
    if (!arr.is_array()) throw InputError(where + "\"" + name + "\" must be an array of integer token ids");
    std::vector<int32_t> ids;
    ids.reserve(arr.size());
    for (size_t i = 0; i < arr.size(); ++i) {
        const oj& t = arr[i];
        const bool ok = t.is_number_unsigned()
                            ? t.get<uint64_t>() < static_cast<uint64_t>(vocab)
                            : t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab;
        if (!ok)
            throw InputError(where + strfmt("token %zu is %s, expected an integer id in [0, %lld)", i,
                                            t.dump().substr(0, 40).c_str(), (long long)vocab));
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
}

}  // namespace

int run_encode(const EncodeCommandOptions& opt) {
    const Tokenizer tok = Tokenizer::load(opt.tokenizer_path);
    TextEncoder encoder(tok);
    LineSource in(opt.input);
    LineSink out(opt.output);
    std::string line;
    oj rec;
    while (in.next(line)) {
        const std::string where = strfmt("%s:%lld: ", in.name().c_str(), (long long)in.line_no());
        if (!parse_line(line, where, rec)) continue;
        if (!rec.is_object())
            throw InputError(where +
                             "expected a JSON object {\"id\": ..., \"text\": \"...\"} or {\"id\": ..., "
                             "\"messages\": [...]}, found " +
                             rec.dump().substr(0, 40));
        oj result = oj::object();
        result["id"] = record_id(rec, in.line_no(), where);
        const bool has_text = rec.contains("text"), has_msgs = rec.contains("messages");
        const bool has_tokens = rec.contains("tokens") || rec.contains("input_ids");
        if (int(has_text) + int(has_msgs) + int(has_tokens) != 1)
            throw InputError(where +
                             "expected exactly one of \"text\" (a string), \"messages\" (a chat) or "
                             "\"tokens\" (ids, passed through)");
        std::vector<int32_t> ids;
        try {
            if (has_text) {
                if (!rec.at("text").is_string()) throw InputError("\"text\" must be a string");
                ids = encoder.encode(rec.at("text").get_ref<const std::string&>());
            } else if (has_msgs) {
                ids = encoder.encode(render_chat_prompt(line, opt.chat));
            } else {
                const char* name = rec.contains("tokens") ? "tokens" : "input_ids";
                ids = token_ids(rec.at(name), name, tok.size(), "");
            }
        } catch (const InputError& e) {
            throw InputError(where + e.what());
        }
        result["tokens"] = ids;
        for (auto it = rec.begin(); it != rec.end(); ++it)
            if (!consumed_field(it.key())) result[it.key()] = it.value();
        if (opt.with_text) {
            oj texts = oj::array();
            for (int32_t id : ids) texts.push_back(tok.decode_one(id));
            result["token_text"] = std::move(texts);
        }
        out.write_line(dump_line(result));
    }
    out.finish();
    return 0;
}

int run_decode(const EncodeCommandOptions& opt) {
    const Tokenizer tok = Tokenizer::load(opt.tokenizer_path);
    LineSource in(opt.input);
    LineSink out(opt.output);
    std::string line;
    oj rec;
    while (in.next(line)) {
        const std::string where = strfmt("%s:%lld: ", in.name().c_str(), (long long)in.line_no());
        if (!parse_line(line, where, rec)) continue;
        std::vector<int32_t> ids;
        if (rec.is_array()) {
            ids = token_ids(rec, "tokens", tok.size(), where);
            rec = oj{{"id", in.line_no()}, {"tokens", rec}};
        } else if (rec.is_object()) {
            const bool has_t = rec.contains("tokens"), has_i = rec.contains("input_ids");
            if (has_t == has_i)
                throw InputError(
                    where + (has_t ? "has both \"tokens\" and \"input_ids\"; give one"
                                   : "no \"tokens\" array (expected {\"id\": ..., \"tokens\": [int, ...]})"));
            const char* name = has_t ? "tokens" : "input_ids";
            ids = token_ids(rec.at(name), name, tok.size(), where);
        } else {
            throw InputError(where +
                             "expected a JSON object with \"tokens\" or an array of token ids, found " +
                             rec.dump().substr(0, 40));
        }
        rec["text"] = tok.decode(ids);
        if (opt.with_text) {
            oj texts = oj::array();
            for (int32_t id : ids) texts.push_back(tok.decode_one(id));
            rec["token_text"] = std::move(texts);
        }
        out.write_line(dump_line(rec));
    }
    out.finish();
    return 0;
}

}  // namespace ds4r
