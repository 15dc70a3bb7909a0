// Safetensors header parser and index parser (include/ds4r/safetensors.h).
//
// The header is parsed with nlohmann's SAX interface into a strict schema, so memory stays bounded
// by the result (no DOM of a hostile 100 MiB header), nesting is never recursed into, and errors
// can name the tensor being read. Every failure is a CheckpointError; nlohmann exceptions are
// caught and converted.
#include "ds4r/safetensors.h"

#include <fcntl.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ds4r/error.h"
#include "ds4r/file_util.h"

namespace ds4r {

using json = nlohmann::json;

std::string printable_name(std::string_view s) {
    constexpr size_t kMax = 200;
    std::string out;
    for (size_t i = 0; i < s.size() && i < kMax; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f) {
            out.push_back(static_cast<char>(c));
        } else {
            out += strfmt("\\x%02x", c);
        }
    }
    if (s.size() > kMax) out += strfmt("...(%zu bytes)", s.size());
    return out;
}

const SafetensorsTensor* SafetensorsHeader::find(std::string_view name) const {
    for (const auto& t : tensors)
        if (t.name == name) return &t;
    return nullptr;
}

namespace {

// nlohmann parse-error texts quote the bytes last read, which may be binary garbage.
std::string printable_message(const std::string& s) {
    return printable_name(s.substr(0, 300));
}

// A header entry while it is being read.
struct PendingTensor {
    std::string name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    std::string dtype;
    Shape shape;
    std::vector<uint64_t> offsets;
};

// SAX handler accepting exactly {"name": {"dtype": s, "shape": [ints], "data_offsets": [u, u]},
// "__metadata__": {"k": "v"}}. Unknown fields inside a tensor entry are skipped (as the reference
// Rust reader does); everything else that deviates is an error naming the tensor.
class HeaderSax {
public:
    explicit HeaderSax(const std::string& path) : path_(path) {}

    std::vector<PendingTensor> tensors;
    std::vector<std::pair<std::string, std::string>> metadata;

    // --- nlohmann::json_sax interface ---
    bool null() { return scalar("null"); }
    bool boolean(bool) { return scalar("a boolean"); }
    bool number_integer(json::number_integer_t v) {
        if (skip_) return true;
        if (state_ == State::Shape || state_ == State::Offsets) {
            if (v < 0) fail_value(strfmt("a negative number (%lld)", (long long)v));
            return push_number(static_cast<uint64_t>(v));
        }
        return scalar("a number");
    }
    bool number_unsigned(json::number_unsigned_t v) {
        if (skip_) return true;
        if (state_ == State::Shape || state_ == State::Offsets) return push_number(v);
        return scalar("a number");
    }
    bool number_float(json::number_float_t, const std::string&) {
        if (skip_) return true;
        if (state_ == State::Shape || state_ == State::Offsets) fail_value("a non-integer number");
        return scalar("a number");
    }
    bool string(std::string& s) {
        if (skip_) return true;
        if (state_ == State::Tensor && field_ == Field::Dtype) {
            cur_.dtype = std::move(s);
            cur_.has_dtype = true;
            return true;
        }
        if (state_ == State::Metadata) {
            metadata.emplace_back(std::move(meta_key_), std::move(s));
            return true;
        }
        return scalar("a string");
    }
    bool binary(json::binary_t&) { return scalar("binary data"); }

    bool start_object(std::size_t) {
        if (skip_) return ++skip_, true;
        switch (state_) {
            case State::Start:
                state_ = State::Root;
                return true;
            case State::Root:
                if (entry_is_metadata_) {
                    state_ = State::Metadata;
                } else {
                    state_ = State::Tensor;
                }
                return true;
            case State::Tensor:
                if (field_ == Field::Unknown) return ++skip_, true;
                break;
            default:
                break;
        }
        return scalar("an object");
    }
    bool end_object() {
        if (skip_) return end_skip();
        if (state_ == State::Tensor) {
            finish_tensor();
            state_ = State::Root;
        } else if (state_ == State::Metadata) {
            state_ = State::Root;
        } else if (state_ == State::Root) {
            state_ = State::Done;
        }
        return true;
    }
    bool start_array(std::size_t) {
        if (skip_) return ++skip_, true;
        if (state_ == State::Tensor) {
            if (field_ == Field::Shape) {
                state_ = State::Shape;
                cur_.shape.clear();
                cur_.has_shape = true;
                return true;
            }
            if (field_ == Field::Offsets) {
                state_ = State::Offsets;
                cur_.offsets.clear();
                cur_.has_offsets = true;
                return true;
            }
            if (field_ == Field::Unknown) return ++skip_, true;
        }
        return scalar("an array");
    }
    bool end_array() {
        if (skip_) return end_skip();
        if (state_ == State::Shape || state_ == State::Offsets) state_ = State::Tensor;
        return true;
    }
    bool key(std::string& k) {
        if (skip_) return true;
        if (state_ == State::Root) {
            entry_is_metadata_ = (k == "__metadata__");
            if (entry_is_metadata_) {
                if (seen_metadata_)
                    throw CheckpointError(
                        strfmt("%s: '__metadata__' appears twice in the header", path_.c_str()));
                seen_metadata_ = true;
            }
            cur_ = PendingTensor();
            cur_.name = std::move(k);
            return true;
        }
        if (state_ == State::Metadata) {
            meta_key_ = std::move(k);
            return true;
        }
        if (state_ == State::Tensor) {
            Field f = Field::Unknown;
            bool dup = false;
            if (k == "dtype") {
                f = Field::Dtype;
                dup = cur_.has_dtype;
            } else if (k == "shape") {
                f = Field::Shape;
                dup = cur_.has_shape;
            } else if (k == "data_offsets") {
                f = Field::Offsets;
                dup = cur_.has_offsets;
            }
            if (dup)
                throw CheckpointError(strfmt("%s: tensor '%s': field '%s' appears twice", path_.c_str(),
                                             printable_name(cur_.name).c_str(), k.c_str()));
            field_ = f;
            return true;
        }
        return true;  // unreachable: keys only occur inside objects handled above
    }
    bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& ex) {
        throw CheckpointError(strfmt("%s: header is not valid JSON (at byte %zu of the header: %s)",
                                     path_.c_str(), pos, printable_message(ex.what()).c_str()));
    }

private:
    enum class State { Start, Root, Tensor, Metadata, Shape, Offsets, Done };
    enum class Field { None, Dtype, Shape, Offsets, Unknown };

    bool end_skip() {
        --skip_;
        return true;
    }

    // A scalar (or container) where the schema has no place for it: skip it inside an unknown
    // tensor field, reject it everywhere else.
    bool scalar(const char* what) {
        if (skip_) return true;
        if (state_ == State::Tensor && field_ == Field::Unknown) return true;
        fail_value(what);
        return false;
    }

    [[noreturn]] void fail_value(const std::string& what) {
        switch (state_) {
            case State::Start:
                throw CheckpointError(
                    strfmt("%s: header must be a JSON object, found %s", path_.c_str(), what.c_str()));
            case State::Root:
                throw CheckpointError(strfmt("%s: header entry '%s' must be an object, found %s",
                                             path_.c_str(), printable_name(cur_.name).c_str(), what.c_str()));
            case State::Metadata:
                throw CheckpointError(strfmt("%s: '__metadata__' entry '%s' must be a string, found %s",
                                             path_.c_str(), printable_name(meta_key_).c_str(), what.c_str()));
            case State::Tensor:
                throw CheckpointError(strfmt("%s: tensor '%s': field '%s' must be %s, found %s",
                                             path_.c_str(), printable_name(cur_.name).c_str(), field_name(),
                                             field_ == Field::Dtype ? "a string" : "an array of integers",
                                             what.c_str()));
            case State::Shape:
                throw CheckpointError(
                    strfmt("%s: tensor '%s': shape must hold non-negative integers, found %s", path_.c_str(),
                           printable_name(cur_.name).c_str(), what.c_str()));
            case State::Offsets:
                throw CheckpointError(
                    strfmt("%s: tensor '%s': data_offsets must hold non-negative integers, found %s",
                           path_.c_str(), printable_name(cur_.name).c_str(), what.c_str()));
            case State::Done:
                break;
        }
        throw CheckpointError(
            strfmt("%s: unexpected %s after the header object", path_.c_str(), what.c_str()));
    }

    const char* field_name() const {
        switch (field_) {
            case Field::Dtype:
                return "dtype";
            case Field::Shape:
                return "shape";
            case Field::Offsets:
                return "data_offsets";
            default:
                return "?";
        }
    }

    bool push_number(uint64_t v) {
        if (state_ == State::Shape) {
            if (cur_.shape.size() >= kSafetensorsMaxRank)
                throw CheckpointError(strfmt("%s: tensor '%s': shape has more than %zu dimensions",
                                             path_.c_str(), printable_name(cur_.name).c_str(),
                                             kSafetensorsMaxRank));
            if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
                throw CheckpointError(strfmt("%s: tensor '%s': shape dimension %llu is too large",
                                             path_.c_str(), printable_name(cur_.name).c_str(),
                                             (unsigned long long)v));
            cur_.shape.push_back(static_cast<int64_t>(v));
        } else {
            if (cur_.offsets.size() >= 2)
                throw CheckpointError(
                    strfmt("%s: tensor '%s': data_offsets must be [begin, end], found more than "
                           "2 numbers",
                           path_.c_str(), printable_name(cur_.name).c_str()));
            cur_.offsets.push_back(v);
        }
        return true;
    }

    void finish_tensor() {
        const std::string nm = printable_name(cur_.name);
        if (!cur_.has_dtype || !cur_.has_shape || !cur_.has_offsets)
            throw CheckpointError(
                strfmt("%s: tensor '%s' needs dtype, shape and data_offsets; '%s' is missing", path_.c_str(),
                       nm.c_str(),
                       !cur_.has_dtype   ? "dtype"
                       : !cur_.has_shape ? "shape"
                                         : "data_offsets"));
        if (cur_.offsets.size() != 2)
            throw CheckpointError(
                strfmt("%s: tensor '%s': data_offsets must be [begin, end], found %zu number(s)",
                       path_.c_str(), nm.c_str(), cur_.offsets.size()));
        tensors.push_back(std::move(cur_));
        cur_ = PendingTensor();
        field_ = Field::None;
    }

    const std::string& path_;
    State state_ = State::Start;
    Field field_ = Field::None;
    size_t skip_ = 0;  // depth inside an unknown tensor field's value that is being skipped
    bool entry_is_metadata_ = false, seen_metadata_ = false;
    PendingTensor cur_;
    std::string meta_key_;
};

// numel * elem_size, or nullopt on overflow of uint64.
std::optional<uint64_t> checked_nbytes(const Shape& shape, uint64_t elem_size) {
    uint64_t n = elem_size;
    bool zero = false;
    for (int64_t d : shape)
        if (d == 0) zero = true;
    if (zero) return 0;
    for (int64_t d : shape) {
        uint64_t ud = static_cast<uint64_t>(d);
        if (n > std::numeric_limits<uint64_t>::max() / ud) return std::nullopt;
        n *= ud;
    }
    return n;
}

uint64_t sat_add(uint64_t a, uint64_t b) {
    return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

}  // namespace

uint64_t safetensors_header_length(const uint8_t* bytes, size_t n, uint64_t file_size,
                                   const std::string& path) {
    if (file_size < 8)
        throw CheckpointError(
            strfmt("%s: file is %llu bytes, too short for a safetensors file (needs at least the "
                   "8-byte header length; truncated shard?)",
                   path.c_str(), (unsigned long long)file_size));
    if (n < 8 || bytes == nullptr)
        throw CheckpointError(
            strfmt("%s: only %zu bytes of the 8-byte header length are available (truncated read)",
                   path.c_str(), n));
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | bytes[i];  // little endian
    if (len > kSafetensorsMaxHeaderBytes)
        throw CheckpointError(
            strfmt("%s: header length %llu exceeds the %llu-byte (100 MiB) limit (corrupt header?)",
                   path.c_str(), (unsigned long long)len, (unsigned long long)kSafetensorsMaxHeaderBytes));
    if (len > file_size - 8)
        throw CheckpointError(
            strfmt("%s: header length %llu runs past the end of the file (%llu bytes; truncated or "
                   "corrupt shard?)",
                   path.c_str(), (unsigned long long)len, (unsigned long long)file_size));
    return len;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t n, uint64_t file_size,
                                           const std::string& path) {
    const uint64_t len = safetensors_header_length(bytes, n, file_size, path);
    if (n - 8 < len)
        throw CheckpointError(strfmt("%s: header is %llu bytes but only %zu are available (truncated read)",
                                     path.c_str(), (unsigned long long)len, n - 8));
    SafetensorsHeader h;
    h.path = path;
    h.file_size = file_size;
    h.header_len = len;
    h.data_begin = 8 + len;
    const uint64_t data_size = file_size - h.data_begin;

    HeaderSax sax(path);
    const char* first = reinterpret_cast<const char*>(bytes + 8);
    try {
        json::sax_parse(first, first + len, &sax, nlohmann::detail::input_format_t::json, /*strict=*/true);
    } catch (const CheckpointError&) {
        throw;
    } catch (const json::exception& e) {
        throw CheckpointError(
            strfmt("%s: header is not valid JSON (%s)", path.c_str(), printable_message(e.what()).c_str()));
    }

    h.metadata = std::move(sax.metadata);
    h.tensors.reserve(sax.tensors.size());
    uint64_t max_end = 0;
    std::string max_end_name;
    for (auto& p : sax.tensors) {
        const std::string nm = printable_name(p.name);
        auto dt = dtype_from_name(p.dtype);
        if (!dt)
            throw CheckpointError(
                strfmt("%s: tensor '%s' has unknown dtype '%s' (expected one of BF16 F16 F32 F64 I8 U8 "
                       "I16 I32 I64 BOOL F8_E4M3 F8_E5M2 F8_E8M0)",
                       path.c_str(), nm.c_str(), printable_name(p.dtype).c_str()));
        const uint64_t begin = p.offsets[0], end = p.offsets[1];
        if (begin > end)
            throw CheckpointError(strfmt("%s: tensor '%s': data_offsets [%llu, %llu] has begin > end",
                                         path.c_str(), nm.c_str(), (unsigned long long)begin,
                                         (unsigned long long)end));
        auto nbytes = checked_nbytes(p.shape, dtype_size(*dt));
        if (!nbytes)
            throw CheckpointError(strfmt("%s: tensor '%s': shape %s x %zu bytes overflows 64 bits",
                                         path.c_str(), nm.c_str(), shape_str(p.shape).c_str(),
                                         dtype_size(*dt)));
        if (end - begin != *nbytes)
            throw CheckpointError(
                strfmt("%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, expected %llu "
                       "(%s %s)",
                       path.c_str(), nm.c_str(), (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), (unsigned long long)*nbytes, dtype_name(*dt),
                       shape_str(p.shape).c_str()));
        if (end > max_end) {
            max_end = end;
            max_end_name = nm;
        }
        SafetensorsTensor t;
        t.name = std::move(p.name);
        t.dtype = *dt;
        t.shape = std::move(p.shape);
        t.offset = h.data_begin + begin;  // begin <= end <= max_end checked below against data_size
        t.nbytes = *nbytes;
        h.tensors.push_back(std::move(t));
    }
    if (max_end > data_size)
        throw CheckpointError(
            strfmt("%s: file is %llu bytes but its header says data ends at byte %llu (tensor '%s'; "
                   "truncated shard?)",
                   path.c_str(), (unsigned long long)file_size,
                   (unsigned long long)sat_add(h.data_begin, max_end), max_end_name.c_str()));
    h.data_end = h.data_begin + max_end;

    // Duplicate names (the JSON object would silently keep one of them).
    {
        std::vector<const SafetensorsTensor*> by_name;
        by_name.reserve(h.tensors.size());
        for (const auto& t : h.tensors) by_name.push_back(&t);
        std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
        for (size_t i = 1; i < by_name.size(); ++i)
            if (by_name[i]->name == by_name[i - 1]->name)
                throw CheckpointError(strfmt("%s: tensor '%s' appears twice in the header", path.c_str(),
                                             printable_name(by_name[i]->name).c_str()));
    }
    // Overlaps: sorted by offset, every non-empty tensor must start at or after the end of all before it.
    std::sort(h.tensors.begin(), h.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
        if (a.offset != b.offset) return a.offset < b.offset;
        if (a.nbytes != b.nbytes) return a.nbytes < b.nbytes;
        return a.name < b.name;
    });
    uint64_t reach = h.data_begin;
    const SafetensorsTensor* reach_by = nullptr;
    for (const auto& t : h.tensors) {
        if (t.nbytes == 0) continue;
        if (t.offset < reach)
            throw CheckpointError(strfmt(
                "%s: tensors '%s' (bytes [%llu, %llu)) and '%s' (bytes [%llu, %llu)) overlap", path.c_str(),
                printable_name(reach_by->name).c_str(), (unsigned long long)(reach_by->offset - h.data_begin),
                (unsigned long long)(reach_by->offset + reach_by->nbytes - h.data_begin),
                printable_name(t.name).c_str(), (unsigned long long)(t.offset - h.data_begin),
                (unsigned long long)(t.offset + t.nbytes - h.data_begin)));
        reach = t.offset + t.nbytes;
        reach_by = &t;
    }
    return h;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
    FileHandle f(path, O_RDONLY, 0644, /*checkpoint=*/true);
    return read_safetensors_header(f);
}

SafetensorsHeader read_safetensors_header(const FileHandle& f) {
    const std::string& path = f.path();
    const uint64_t size = f.size();
    uint8_t prefix[8] = {};
    size_t got = f.pread_some(prefix, std::min<uint64_t>(8, size), 0);
    const uint64_t len = safetensors_header_length(prefix, got, size, path);
    std::vector<uint8_t> buf(static_cast<size_t>(8 + len));
    got = f.pread_some(buf.data(), buf.size(), 0);  // short only if the file shrank meanwhile
    return parse_safetensors_header(buf.data(), got, size, path);
}

// ---------------------------------------------------------------------------------------------
// model.safetensors.index.json
// ---------------------------------------------------------------------------------------------

namespace {
constexpr int kIndexMaxDepth = 32;
constexpr size_t kIndexMaxBytes = 512u << 20;  // the real index is ~10 MB

bool plain_file_name(const std::string& s) {
    if (s.empty() || s == "." || s == "..") return false;
    for (char c : s)
        if (c == '/' || c == '\\' || c == '\0') return false;
    return true;
}
}  // namespace

SafetensorsIndex parse_safetensors_index(std::string_view text, const std::string& path) {
    SafetensorsIndex idx;
    idx.path = path;
    json root;
    try {
        // The callback bounds nesting (a deep DOM would cost recursion elsewhere) and rejects a tensor
        // listed twice in weight_map (the DOM would silently keep one of the two shards).
        std::string top_key;
        std::unordered_set<std::string> names;
        auto cb = [&](int depth, json::parse_event_t ev, json& parsed) -> bool {
            if ((ev == json::parse_event_t::object_start || ev == json::parse_event_t::array_start) &&
                depth >= kIndexMaxDepth)
                throw CheckpointError(
                    strfmt("%s: JSON nested deeper than %d levels", path.c_str(), kIndexMaxDepth));
            if (ev == json::parse_event_t::key) {
                if (depth == 1) {
                    top_key = parsed.get<std::string>();
                } else if (depth == 2 && top_key == "weight_map") {
                    if (!names.insert(parsed.get<std::string>()).second)
                        throw CheckpointError(strfmt("%s: tensor '%s' is listed twice in weight_map",
                                                     path.c_str(),
                                                     printable_name(parsed.get<std::string>()).c_str()));
                }
            }
            return true;
        };
        root = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
    } catch (const CheckpointError&) {
        throw;
    } catch (const json::exception& e) {
        throw CheckpointError(
            strfmt("%s: not valid JSON (%s)", path.c_str(), printable_message(e.what()).c_str()));
    }
    if (!root.is_object())
        throw CheckpointError(strfmt("%s: must be a JSON object, found %s", path.c_str(), root.type_name()));
    auto wm = root.find("weight_map");
    if (wm == root.end())
        throw CheckpointError(strfmt("%s: no 'weight_map' object (tensor name -> shard file)", path.c_str()));
    if (!wm->is_object())
        throw CheckpointError(
            strfmt("%s: 'weight_map' must be an object, found %s", path.c_str(), wm->type_name()));
    idx.weight_map.reserve(wm->size());
    for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string())
            throw CheckpointError(strfmt("%s: weight_map['%s'] must be a shard file name (string), found %s",
                                         path.c_str(), printable_name(it.key()).c_str(),
                                         it.value().type_name()));
        const std::string& file = it.value().get_ref<const std::string&>();
        if (!plain_file_name(file))
            throw CheckpointError(
                strfmt("%s: weight_map['%s'] = '%s' is not a plain file name in the model directory",
                       path.c_str(), printable_name(it.key()).c_str(), printable_name(file).c_str()));
        idx.weight_map.emplace_back(it.key(), file);
    }
    std::sort(idx.weight_map.begin(), idx.weight_map.end());
    auto md = root.find("metadata");
    if (md != root.end() && !md->is_null()) {
        if (!md->is_object())
            throw CheckpointError(
                strfmt("%s: 'metadata' must be an object, found %s", path.c_str(), md->type_name()));
        auto ts = md->find("total_size");
        if (ts != md->end() && !ts->is_null()) {
            if (ts->is_number_unsigned()) {
                idx.total_size = ts->get<uint64_t>();
            } else if (ts->is_number_float() && ts->get<double>() >= 0 && ts->get<double>() < 1.8e19 &&
                       ts->get<double>() == static_cast<double>(static_cast<uint64_t>(ts->get<double>()))) {
                idx.total_size = static_cast<uint64_t>(ts->get<double>());  // some writers emit 1.2e+10
            } else {
                throw CheckpointError(
                    strfmt("%s: metadata.total_size must be a non-negative integer, found %s", path.c_str(),
                           ts->type_name()));
            }
        }
    }
    return idx;
}

SafetensorsIndex read_safetensors_index(const std::string& path) {
    FileHandle f(path, O_RDONLY, 0644, /*checkpoint=*/true);
    const uint64_t size = f.size();
    if (size > kIndexMaxBytes)
        throw CheckpointError(strfmt("%s: %llu bytes, more than the %zu MiB allowed for an index",
                                     path.c_str(), (unsigned long long)size, kIndexMaxBytes >> 20));
    std::string text(static_cast<size_t>(size), '\0');
    size_t got = f.pread_some(text.data(), text.size(), 0);
    text.resize(got);
    return parse_safetensors_index(text, path);
}

}  // namespace ds4r
