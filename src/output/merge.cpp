// Shard outputs -> the unsharded output (include/ds4r/merge.h).
#include "ds4r/merge.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "ds4r/error.h"
#include "ds4r/file_util.h"
#include "ds4r/npy.h"

namespace ds4r {

namespace {

using json = nlohmann::json;
constexpr size_t npos = std::string::npos;

// --- A minimal scanner of one JSON object's top level (the record text is kept byte for byte) ---

size_t skip_ws(const std::string& s, size_t i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
    return i;
}

// Index just past the JSON string that starts at s[i] == '"'; npos when it is not terminated.
size_t skip_string(const std::string& s, size_t i) {
    for (++i; i < s.size(); ++i) {
        if (s[i] == '\\')
            ++i;
        else if (s[i] == '"')
            return i + 1;
    }
    return npos;
}

// Index just past the JSON value that starts at s[i]; npos when it is not terminated.
size_t skip_value(const std::string& s, size_t i) {
    if (i >= s.size()) return npos;
    if (s[i] == '"') return skip_string(s, i);
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        while (i < s.size()) {
            const char c = s[i];
            if (c == '"') {
                i = skip_string(s, i);
                if (i == npos) return npos;
                continue;
            }
            if (c == '{' || c == '[') ++depth;
            if ((c == '}' || c == ']') && --depth == 0) return i + 1;
            ++i;
        }
        return npos;
    }
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ') ++i;
    return i;
}

// [vb, ve) of the value of the top-level member `key` of the object text `s`; false when absent.
bool find_top_level_value(const std::string& s, const std::string& key, size_t& vb, size_t& ve) {
    size_t i = skip_ws(s, 0);
    if (i >= s.size() || s[i] != '{') return false;
    i = skip_ws(s, i + 1);
    while (i < s.size() && s[i] == '"') {
        const size_t ke = skip_string(s, i);
        if (ke == npos) return false;
        const bool match = s.compare(i + 1, ke - i - 2, key) == 0 && ke - i - 2 == key.size();
        i = skip_ws(s, ke);
        if (i >= s.size() || s[i] != ':') return false;
        i = skip_ws(s, i + 1);
        const size_t e = skip_value(s, i);
        if (e == npos) return false;
        if (match) {
            vb = i;
            ve = e;
            return true;
        }
        i = skip_ws(s, e);
        if (i >= s.size() || s[i] != ',') return false;
        i = skip_ws(s, i + 1);
    }
    return false;
}

std::string hidden_file_name(int layer) {
    return "hidden_L" + std::to_string(layer) + ".npy";  // as HiddenNpyWriter::file_name
}

struct RowRef {
    int layer = 0;
    std::string file;
    int64_t begin = 0, end = 0;
};

// The "hidden" value exactly as format_record (src/output/records.cpp) writes it.
std::string format_hidden(const std::vector<RowRef>& refs) {
    std::string out = "[";
    for (size_t i = 0; i < refs.size(); ++i) {
        if (i) out += ", ";
        out += "{\"layer\": " + std::to_string(refs[i].layer) + ", \"file\": " + json(refs[i].file).dump() +
               ", \"rows\": [" + std::to_string(refs[i].begin) + ", " + std::to_string(refs[i].end) + "]}";
    }
    return out + "]";
}

// Calls fn(line, line_number) for every complete line of the file; returns the bytes after the last
// newline (a partial line: a run killed mid-write, or still running).
uint64_t for_each_line(const std::string& path, const std::function<void(const std::string&, int64_t)>& fn) {
    FileHandle f(path, O_RDONLY | O_CLOEXEC);
    return f.size() - ds4r::for_each_line(f, fn);
}

bool same_inode(const std::string& a, const std::string& b) {
    struct stat sa {
    }, sb{};
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

std::string shard_name(const MergeShard& s) {
    return strfmt("shard %lld/%lld (%s)", (long long)s.index, (long long)s.count, s.results.c_str());
}

// One shard's captured layer: its .npy header and the rows its records reference.
struct ShardLayer {
    std::string path;
    NpyHeader header;
    int64_t max_end = 0;  // the largest row end its records reference
    int64_t rows = 0;     // rows its records reference (their ranges' total length)
};

Shape row_shape_of(const NpyHeader& h) {
    return Shape(h.shape.begin() + (h.shape.empty() ? 0 : 1), h.shape.end());
}

uint64_t row_bytes_of(const NpyHeader& h) {
    NpyArray a;  // for its item size (from descr)
    a.descr = h.descr;
    return static_cast<uint64_t>(shape_numel(row_shape_of(h))) * a.item_size();
}

void copy_range(const FileHandle& src, uint64_t offset, uint64_t bytes, FileHandle& dst) {
    std::vector<char> buf(std::min<uint64_t>(bytes, uint64_t{8} << 20));
    while (bytes > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes, buf.size()));
        src.pread_exact(buf.data(), n, offset);
        dst.write_all(buf.data(), n);
        offset += n;
        bytes -= n;
    }
}

// Temporary files renamed into place on commit; removed when the merge fails first.
class PendingFiles {
public:
    ~PendingFiles() {
        for (auto& [tmp, final_path] : files_) ::unlink(tmp.c_str());
    }
    std::string add(const std::string& final_path) {
        const std::string tmp = final_path + strfmt(".merge-tmp.%d", (int)::getpid());
        files_.emplace_back(tmp, final_path);
        return tmp;
    }
    void commit() {  // in the order added
        for (auto& [tmp, final_path] : files_) {
            if (::rename(tmp.c_str(), final_path.c_str()) != 0)
                throw RuntimeError(strfmt("%s: cannot rename %s into place (%s)", final_path.c_str(),
                                          tmp.c_str(), errno_text(errno).c_str()));
            fsync_parent_dir(final_path);
        }
        files_.clear();
    }

private:
    std::vector<std::pair<std::string, std::string>> files_;
};

void throw_problems(const std::vector<std::string>& problems) {
    if (problems.empty()) return;
    std::string msg = "merge: refused, nothing was written:";
    for (const auto& p : problems) msg += "\n  - " + p;
    throw InputError(msg);
}

}  // namespace

std::string remap_hidden_rows(const std::string& line, const RowMap& map, const std::string& where) {
    size_t vb = 0, ve = 0;
    if (!find_top_level_value(line, "hidden", vb, ve)) return line;
    const std::string text = line.substr(vb, ve - vb);
    std::vector<RowRef> refs;
    try {
        const json h = json::parse(text);
        if (!h.is_array()) throw InputError(where + ": \"hidden\" is not an array");
        for (const auto& e : h) {
            RowRef r;
            r.layer = e.at("layer").get<int>();
            r.file = e.at("file").get<std::string>();
            const auto& rows = e.at("rows");
            if (!rows.is_array() || rows.size() != 2)
                throw InputError(where + ": \"hidden\" rows must be [start, end]");
            r.begin = rows.at(0).get<int64_t>();
            r.end = rows.at(1).get<int64_t>();
            if (r.begin < 0 || r.end < r.begin || r.end > (int64_t{1} << 48))
                throw InputError(strfmt("%s: hidden rows [%lld, %lld) of layer %d are not a range",
                                        where.c_str(), (long long)r.begin, (long long)r.end, r.layer));
            if (r.file != hidden_file_name(r.layer))
                throw InputError(strfmt("%s: hidden rows of layer %d in \"%s\", expected \"%s\"",
                                        where.c_str(), r.layer, r.file.c_str(),
                                        hidden_file_name(r.layer).c_str()));
            refs.push_back(r);
        }
    } catch (const json::exception& e) {
        throw InputError(where + ": malformed \"hidden\" entry (" + e.what() + ")");
    }
    // Only the row numbers may change: the entry must read back exactly as this program writes it.
    if (format_hidden(refs) != text)
        throw InputError(where + ": \"hidden\" entry not in the layout ds4replay writes: " + text);
    for (RowRef& r : refs) {
        const int64_t n = r.end - r.begin;
        r.begin = map(r.layer, r.begin, r.end);
        r.end = r.begin + n;
    }
    return line.substr(0, vb) + format_hidden(refs) + line.substr(ve);
}

MergeSummary merge_shard_outputs(const std::vector<MergeShard>& shards, const MergeTarget& target) {
    std::vector<std::string> problems;
    if (shards.empty()) throw InputError("merge: no shard outputs given");
    DS4R_CHECK(target.output != "-" && !target.output.empty(), "merge needs an output file");

    // 1. The shards are one split: same count, every index once, planned ranges tiling the input.
    const int64_t n = shards[0].count;
    for (const auto& s : shards)
        if (s.count != n)
            problems.push_back(strfmt("%s and %s come from different splits (%lld and %lld shards)",
                                      shard_name(shards[0]).c_str(), shard_name(s).c_str(), (long long)n,
                                      (long long)s.count));
    throw_problems(problems);
    std::map<int64_t, std::vector<const MergeShard*>> by_index;
    for (const auto& s : shards) by_index[s.index].push_back(&s);
    std::string missing;
    for (int64_t k = 1; k <= n; ++k)
        if (!by_index.count(k))
            missing += (missing.empty() ? "" : ", ") + strfmt("%lld/%lld", (long long)k, (long long)n);
    if (!missing.empty()) problems.push_back("missing shards: " + missing);
    for (const auto& [k, list] : by_index)
        if (list.size() > 1) {
            std::string files;
            for (const auto* s : list) files += (files.empty() ? "" : ", ") + s->results;
            problems.push_back(strfmt("shard %lld/%lld is given %zu times: %s", (long long)k, (long long)n,
                                      list.size(), files.c_str()));
        }
    throw_problems(problems);
    std::vector<const MergeShard*> order;
    for (const auto& [k, list] : by_index) order.push_back(list[0]);
    int64_t expect_first = 0;
    for (const auto* s : order) {
        if (s->first_record != expect_first)
            problems.push_back(
                strfmt("%s was planned to start at record %lld, expected %lld: the shards come "
                       "from different inputs or plans",
                       shard_name(*s).c_str(), (long long)s->first_record + 1, (long long)expect_first + 1));
        expect_first = s->first_record + s->records;
    }
    if (expect_first != target.total_records)
        problems.push_back(strfmt("the shards' planned records end at %lld, but the input has %lld",
                                  (long long)expect_first, (long long)target.total_records));

    // 2. Where the merged files go: nothing existing is replaced without --overwrite, no shard file ever.
    const bool hidden = !target.capture_layers.empty();
    if (hidden && target.hidden_dir.empty())
        problems.push_back("the shards hold hidden states: give --hidden-dir DIR for the merged .npy files");
    if (file_exists(target.output) && !target.overwrite)  // (run_merge reports it first)
        problems.push_back(target.output +
                           " exists: merge never replaces a file (use --overwrite to replace it)");
    for (const auto* s : order) {
        if (s->results == target.output || same_inode(s->results, target.output))
            problems.push_back(target.output + " is the results file of " + shard_name(*s));
        if (hidden && !target.hidden_dir.empty() &&
            (s->hidden_dir == target.hidden_dir || same_inode(s->hidden_dir, target.hidden_dir)))
            problems.push_back("--hidden-dir " + target.hidden_dir + " is the hidden dir of " +
                               shard_name(*s) + ": give the merged files a directory of their own");
    }
    if (hidden && !target.hidden_dir.empty() && !target.overwrite)
        for (int L : target.capture_layers) {
            const std::string p = path_join(target.hidden_dir, hidden_file_name(L));
            if (file_exists(p))
                problems.push_back(p +
                                   " exists: merge never replaces a file (use --overwrite to replace it)");
        }

    // 3. Every shard complete: exactly its planned records, whole lines, well-formed hidden entries.
    struct Referenced {
        int64_t max_end = 0, rows = 0;
    };
    std::vector<std::map<int, Referenced>> shard_rows(order.size());  // per shard: layer -> rows
    for (size_t i = 0; i < order.size(); ++i) {
        const MergeShard& s = *order[i];
        if (!file_exists(s.results)) {
            problems.push_back(shard_name(s) + ": the results file does not exist");
            continue;
        }
        int64_t lines = 0;
        uint64_t tail = 0;
        const RowMap note = [&](int layer, int64_t begin, int64_t end) {
            Referenced& r = shard_rows[i][layer];
            r.max_end = std::max(r.max_end, end);
            r.rows += end - begin;
            return begin;
        };
        try {
            tail = for_each_line(s.results, [&](const std::string& line, int64_t no) {
                ++lines;
                remap_hidden_rows(line, note, strfmt("%s:%lld", s.results.c_str(), (long long)no));
            });
        } catch (const InputError& e) {
            problems.push_back(e.what());
            continue;
        }
        if (tail > 0)
            problems.push_back(
                strfmt("%s: ends with a partial line (%llu bytes): the shard is still running or "
                       "was killed; finish it with `score --resume`",
                       shard_name(s).c_str(), (unsigned long long)tail));
        if (lines != s.records)
            problems.push_back(strfmt("%s holds %lld records, its part of the input has %lld: %s",
                                      shard_name(s).c_str(), (long long)lines, (long long)s.records,
                                      lines < s.records ? "incomplete, finish it with `score --resume`"
                                                        : "more than planned, not this split's output"));
        for (const auto& [L, rows] : shard_rows[i])
            if (std::find(target.capture_layers.begin(), target.capture_layers.end(), L) ==
                target.capture_layers.end())
                problems.push_back(
                    strfmt("%s references hidden rows of layer %d, which the run did not capture",
                           shard_name(s).c_str(), L));
    }
    throw_problems(problems);

    // 4. The shards' .npy files hold the referenced rows, all of one dtype and row shape per layer.
    std::map<int, std::vector<ShardLayer>> layers;  // layer -> per shard (in order)
    for (int L : target.capture_layers) {
        auto& per_shard = layers[L];
        per_shard.reserve(order.size());    // `first` points into it
        const ShardLayer* first = nullptr;  // the first shard whose file could be read
        for (size_t i = 0; i < order.size(); ++i) {
            ShardLayer& sl = per_shard.emplace_back();
            sl.path = path_join(order[i]->hidden_dir, hidden_file_name(L));
            const auto it = shard_rows[i].find(L);
            if (it != shard_rows[i].end()) {
                sl.max_end = it->second.max_end;
                sl.rows = it->second.rows;
            }
            uint64_t size = 0;
            try {
                sl.header = read_npy_header(sl.path);
                size = FileHandle(sl.path, O_RDONLY | O_CLOEXEC).size();
            } catch (const Error& e) {
                problems.push_back(shard_name(*order[i]) + ": " + e.what());
                continue;
            }
            if (sl.header.shape.empty()) {
                problems.push_back(sl.path + ": a 0-dimensional array, expected rows of hidden states");
                continue;
            }
            if (!first) first = &sl;
            if (sl.header.descr != first->header.descr ||
                row_shape_of(sl.header) != row_shape_of(first->header))
                problems.push_back(sl.path + ": dtype or row shape differs from " + first->path);
            else if (sl.header.shape[0] < sl.max_end ||
                     size < sl.header.data_offset + row_bytes_of(sl.header) * sl.max_end)
                problems.push_back(strfmt("%s: holds %lld rows, the records of %s reference rows up to %lld",
                                          sl.path.c_str(), (long long)sl.header.shape[0],
                                          shard_name(*order[i]).c_str(), (long long)sl.max_end));
        }
    }
    throw_problems(problems);

    // 5. Write (to temporary names): each record's hidden rows are appended to the merged files in
    // record order (runs of consecutive rows copied at once) and its "rows" point at them; so the rows
    // are in input order, as in an unsharded run, even where a shard's were not (a --skip-bad line
    // retried by --resume has its rows at the end of its shard's files).
    MergeSummary sum;
    PendingFiles pending;
    struct OutLayer {
        FileHandle out;
        uint64_t row_bytes = 0;
        int64_t next_row = 0;
        // The run of source rows not yet copied: [run_begin, run_end) of the current shard's file.
        int64_t run_begin = 0, run_end = 0;
    };
    std::map<int, OutLayer> outs;
    if (hidden) make_dirs(target.hidden_dir);
    for (auto& [L, per_shard] : layers) {
        const NpyHeader& h0 = per_shard[0].header;
        int64_t total = 0;
        for (const auto& sl : per_shard) total += sl.rows;
        Shape shape{total};
        const Shape row_shape = row_shape_of(h0);
        shape.insert(shape.end(), row_shape.begin(), row_shape.end());
        // The same header the unsharded run writes (HiddenNpyWriter reserves room for any row count):
        // padded to the shards' header size.
        const std::string header = npy_header(h0.descr, shape, h0.data_offset);
        OutLayer& o = outs[L];
        o.out = FileHandle(pending.add(path_join(target.hidden_dir, hidden_file_name(L))),
                           O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        o.out.write_all(header.data(), header.size());
        o.row_bytes = row_bytes_of(h0);
        sum.hidden_rows[L] = total;
    }
    FileHandle results(pending.add(target.output), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    std::string buf;
    for (size_t i = 0; i < order.size(); ++i) {
        std::map<int, FileHandle> in;  // this shard's hidden files
        for (auto& [L, per_shard] : layers) in[L] = FileHandle(per_shard[i].path, O_RDONLY | O_CLOEXEC);
        auto flush = [&](int L) {
            OutLayer& o = outs.at(L);
            copy_range(in.at(L), layers.at(L)[i].header.data_offset + o.row_bytes * o.run_begin,
                       o.row_bytes * (o.run_end - o.run_begin), o.out);
            o.run_begin = o.run_end = 0;
        };
        const RowMap gather = [&](int L, int64_t begin, int64_t end) {
            OutLayer& o = outs.at(L);
            if (begin != o.run_end) {
                flush(L);
                o.run_begin = o.run_end = begin;
            }
            o.run_end = end;
            const int64_t at = o.next_row;
            o.next_row += end - begin;
            return at;
        };
        for_each_line(order[i]->results, [&](const std::string& line, int64_t no) {
            buf +=
                remap_hidden_rows(line, gather, strfmt("%s:%lld", order[i]->results.c_str(), (long long)no));
            buf += '\n';
            ++sum.records;
            if (buf.size() >= (size_t{8} << 20)) {
                results.write_all(buf.data(), buf.size());
                buf.clear();
            }
        });
        for (auto& [L, o] : outs) flush(L);
    }
    results.write_all(buf.data(), buf.size());
    results.fsync_or_throw();
    for (auto& [L, o] : outs) {
        DS4R_CHECK(o.next_row == sum.hidden_rows[L], "merge: layer %d: %lld rows written, %lld planned", L,
                   (long long)o.next_row, (long long)sum.hidden_rows[L]);
        o.out.fsync_or_throw();
    }
    pending.commit();
    return sum;
}

}  // namespace ds4r
