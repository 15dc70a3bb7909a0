// JSONL result records and their durable writer.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "ds4r/output.h"
#include "ds4r/tokenizer.h"

namespace ds4r {

std::string format_double(double v) {
    DS4R_CHECK(std::isfinite(v), "non-finite value in a result record");
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    std::string s(buf, r.ptr);
    // Keep it a JSON number that reads back as a float in every language ("-3" -> "-3.0").
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
}

namespace {

// JSON string literal of `raw`; invalid UTF-8 (an error message quoting the bytes of a bad input
// line) becomes U+FFFD so the record stays valid JSON.
void append_json_string(std::string& out, const std::string& raw) {
    const bool ascii =
        std::all_of(raw.begin(), raw.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
    const std::string s = ascii ? raw : utf8_from_bytes_lossy(raw);
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    out += b;
                } else {
                    out += static_cast<char>(c);
                }
        }
    }
    out += '"';
}

template <class T, class F>
void append_array(std::string& out, const T* v, size_t n, F fmt) {
    out += '[';
    for (size_t i = 0; i < n; ++i) {
        if (i) out += ", ";
        out += fmt(v[i]);
    }
    out += ']';
}

std::string fmt_int(int32_t v) {
    return std::to_string(v);
}

// Inserts the members of a JSON object text ("{...}") before the closing brace of `out`.
void append_extra(std::string& out, const std::string& extra_json) {
    size_t b = extra_json.find('{'), e = extra_json.rfind('}');
    if (b == std::string::npos || e == std::string::npos || e <= b + 1) return;
    std::string inner = extra_json.substr(b + 1, e - b - 1);
    if (inner.find_first_not_of(" \t\r\n") == std::string::npos) return;
    out += ", ";
    out += inner;
}

}  // namespace

std::string format_record(const std::string& id_json, const SequenceScores& s, int top_k,
                          const std::vector<HiddenRef>& hidden, const std::string& extra_json,
                          const std::vector<int32_t>* tokens) {
    const size_t n1 = static_cast<size_t>(s.n - 1);
    // Alternatives stored per position in `s` (the stride) and written (top_k, at most that many).
    const size_t stride = s.n > 0 ? s.topk_ids.size() / static_cast<size_t>(s.n) : 0;
    const size_t K = std::min(static_cast<size_t>(std::max(top_k, 0)), stride);
    std::string out = "{\"id\": " + id_json + ", \"n_tokens\": " + std::to_string(s.n);
    if (tokens) {
        out += ", \"tokens\": ";
        append_array(out, tokens->data(), tokens->size(), fmt_int);
    }
    out += ", \"logprob\": ";
    append_array(out, s.logprob.data(), n1, format_double);
    out += ", \"rank\": ";
    append_array(out, s.rank.data(), n1, fmt_int);
    out += ", \"entropy\": ";
    append_array(out, s.entropy.data(), n1, format_double);
    if (K > 0) {
        out += ", \"topk_ids\": [";
        for (size_t t = 0; t < n1; ++t) {
            if (t) out += ", ";
            append_array(out, s.topk_ids.data() + t * stride, K, fmt_int);
        }
        out += "], \"topk_logprobs\": [";
        for (size_t t = 0; t < n1; ++t) {
            if (t) out += ", ";
            append_array(out, s.topk_logprobs.data() + t * stride, K, format_double);
        }
        out += "]";
    }
    out += ", \"final\": {\"entropy\": " + format_double(s.entropy[n1]);
    if (K > 0) {
        out += ", \"topk_ids\": ";
        append_array(out, s.topk_ids.data() + n1 * stride, K, fmt_int);
        out += ", \"topk_logprobs\": ";
        append_array(out, s.topk_logprobs.data() + n1 * stride, K, format_double);
    }
    double sum = 0.0;
    for (size_t t = 0; t < n1; ++t) sum += s.logprob[t];
    out += "}, \"sum_logprob\": " + format_double(sum);
    if (!hidden.empty()) {
        out += ", \"hidden\": [";
        for (size_t i = 0; i < hidden.size(); ++i) {
            if (i) out += ", ";
            out += "{\"layer\": " + std::to_string(hidden[i].layer) + ", \"file\": ";
            append_json_string(out, hidden[i].file);
            out += ", \"rows\": [" + std::to_string(hidden[i].row_begin) + ", " +
                   std::to_string(hidden[i].row_end) + "]}";
        }
        out += "]";
    }
    append_extra(out, extra_json);
    out += "}";
    return out;
}

std::string format_error_record(const std::string& id_json, int64_t line, const std::string& message) {
    std::string out = "{\"id\": " + id_json + ", \"error\": ";
    append_json_string(out, message);
    out += ", \"line\": " + std::to_string(line) + "}";
    return out;
}

ResultWriter::ResultWriter(const std::string& path) : path_(path), stdout_(path == "-") {
    if (stdout_) return;
    fh_ = FileHandle(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st {};
    // fsync only means something for a regular file (a FIFO or /dev/stdout would fail with EINVAL).
    regular_ = ::fstat(fh_.fd(), &st) == 0 && S_ISREG(st.st_mode);
    if (regular_) fsync_parent_dir(path);  // the file's directory entry is durable too
}

void ResultWriter::append(const std::string& line) {
    pending_ += line;
    pending_ += '\n';
    ++pending_lines_;
}

void ResultWriter::commit() {
    if (pending_.empty()) return;
    if (stdout_) {
        if (std::fwrite(pending_.data(), 1, pending_.size(), stdout) != pending_.size() ||
            std::fflush(stdout) != 0)
            throw RuntimeError("writing results to stdout failed: " + errno_text(errno));
    } else {
        fh_.write_all(pending_.data(), pending_.size());
        if (regular_) fh_.fsync_or_throw();
    }
    pending_.clear();
    committed_ += pending_lines_;
    pending_lines_ = 0;
}

}  // namespace ds4r

namespace ds4r {

void ResultWriter::commit_replacing(const std::map<int64_t, std::string>& replaced) {
    if (replaced.empty()) {
        commit();
        return;
    }
    DS4R_CHECK(regular_, "%s: lines can be replaced in a regular file only", path_.c_str());
    // Stream the file into its replacement, swapping the replaced lines, then the new lines.
    FileHandle in(path_, O_RDONLY);
    AtomicFileWriter out(path_);
    constexpr size_t kFlushBytes = size_t{4} << 20;
    std::string buf;
    int64_t index = 0;
    size_t seen = 0;
    const uint64_t complete = for_each_line(in, [&](const std::string& line, int64_t) {
        const bool blank = line.find_first_not_of(" \t\r") == std::string::npos;
        auto it = blank ? replaced.end() : replaced.find(index);
        buf += it == replaced.end() ? line : it->second;
        buf += '\n';
        if (it != replaced.end()) ++seen;
        if (!blank) ++index;
        if (buf.size() >= kFlushBytes) {
            out.write(buf);
            buf.clear();
        }
    });
    DS4R_CHECK(complete == in.size(), "%s: ends with a partial line; cannot replace lines", path_.c_str());
    DS4R_CHECK(seen == replaced.size(), "%s: %zu of the %zu lines to replace are not in the file",
               path_.c_str(), replaced.size() - seen, replaced.size());
    out.write(buf);
    out.write(pending_);
    out.commit();  // fsync, rename over the old file, fsync the directory
    fh_ = FileHandle(path_, O_WRONLY | O_APPEND | O_CLOEXEC, 0644);
    pending_.clear();
    committed_ += pending_lines_;
    pending_lines_ = 0;
}

}  // namespace ds4r
