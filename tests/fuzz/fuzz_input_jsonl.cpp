// libFuzzer target: the tokens.jsonl reader (docs/DESIGN.md sections 2 and 6) over arbitrary bytes, plus
// the records built from what it returns. Expected rejections are ds4r::InputError, one per bad line,
// after which the reader goes on; anything else is a finding, and so is a record that breaks the
// documented guarantees:
//  - every accepted record: line numbers increase, 1 <= len <= max_len, ids in [0, vocab), the id is
//    a JSON string or integer, extra_json a JSON object without reserved names;
//  - a result record (format_record) and an error record (format_error_record, the message quoting the
//    bad bytes) are valid JSON that reads back the same id and carried-through fields;
//  - bytes_consumed() ends at the input size.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "ds4r/error.h"
#include "ds4r/input.h"
#include "ds4r/output.h"

namespace {

constexpr int64_t kVocab = 1000;
constexpr int64_t kMaxLen = 64;

ds4r::SequenceScores fake_scores(int64_t n, int k) {
    ds4r::SequenceScores s;
    s.n = n;
    s.logprob.assign(static_cast<size_t>(n - 1), -1.5);
    s.rank.assign(static_cast<size_t>(n - 1), 3);
    s.entropy.assign(static_cast<size_t>(n), 2.25);
    s.topk_ids.assign(static_cast<size_t>(n * k), 7);
    s.topk_logprobs.assign(static_cast<size_t>(n * k), -0.5);
    return s;
}

void check_record(const ds4r::InputRecord& rec, int64_t prev_line) {
    using json = nlohmann::json;
    if (rec.line <= prev_line) __builtin_trap();
    if (rec.tokens.empty() || static_cast<int64_t>(rec.tokens.size()) > kMaxLen) __builtin_trap();
    for (int32_t t : rec.tokens)
        if (t < 0 || t >= kVocab) __builtin_trap();
    const json id = json::parse(rec.id_json);  // throws (a finding) when not JSON
    if (!id.is_string() && !id.is_number_integer()) __builtin_trap();
    const json extra = json::parse(rec.extra_json);
    if (!extra.is_object()) __builtin_trap();
    for (const char* r : {"id", "tokens", "input_ids", "logprob", "hidden", "error"})
        if (extra.contains(r)) __builtin_trap();
    const int k = 2;
    const json out = json::parse(ds4r::format_record(
        rec.id_json, fake_scores(static_cast<int64_t>(rec.tokens.size()), k), k, {}, rec.extra_json));
    if (out.at("id") != id || out.at("n_tokens").get<size_t>() != rec.tokens.size()) __builtin_trap();
    for (auto it = extra.begin(); it != extra.end(); ++it)
        if (out.at(it.key()) != it.value()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using json = nlohmann::json;
    auto reader = ds4r::InputReader::from_string(std::string(reinterpret_cast<const char*>(data), size),
                                                 "fuzz.jsonl", kVocab, kMaxLen);
    int64_t prev_line = 0;
    for (int guard = 0; guard < 100000; ++guard) {
        ds4r::InputRecord rec;
        std::string bad_id;
        try {
            if (!reader.next(rec, &bad_id)) break;
            check_record(rec, prev_line);
            prev_line = rec.line;
        } catch (const ds4r::InputError& e) {
            if (reader.line() <= prev_line) __builtin_trap();
            prev_line = reader.line();
            if (std::string(e.what()).rfind("fuzz.jsonl:", 0) != 0) __builtin_trap();  // names the line
            const std::string id = bad_id.empty() ? std::to_string(reader.line()) : bad_id;
            const json er = json::parse(ds4r::format_error_record(id, reader.line(), e.what()));
            if (er.at("line").get<int64_t>() != reader.line() || !er.at("error").is_string())
                __builtin_trap();
            if (er.at("id") != json::parse(id)) __builtin_trap();
        }
    }
    if (reader.bytes_consumed() != size) __builtin_trap();
    return 0;
}
