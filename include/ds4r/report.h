// `ds4replay report results.jsonl`: what a person reads of a results file (issue 15).
//
// Input: ds4replay result records, one JSON object per line (blank lines skipped). Each needs "id",
// "logprob" [n-1 numbers] and "n_tokens"; "entropy" and "rank" [n-1] and "topk_ids" / "topk_logprobs"
// [[k] x n-1] are used when present. The record's own token ids come from "tokens" (score
// --echo-tokens, or carried through from the input) or "input_ids"; per-token text from "token_text"
// [n strings] when present, else from the tokenizer. Records with an "error" field (score --skip-bad)
// are counted and skipped. A line that is not a JSON object, or whose arrays do not have the stated
// lengths, is an InputError naming file:line (exit 2).
//
// Statistics per sequence, over its n-1 scored positions (position t scores token t+1):
//   sum and mean logprob, perplexity = exp(-mean logprob), mean entropy (nats),
//   typicality gap = mean logprob + mean entropy (about 0 for text the model itself would write,
//   negative for text more surprising than the model expects), top-1 agreement = fraction of
//   positions with rank == 1. Totals pool all scored positions of all sequences.
// Output: a plain-text table on `out`; with html_path also one self-contained HTML file (inline CSS,
// inline JS, inline SVG; no network): the table, a histogram of per-token logprobs, each sequence's
// text with every token coloured by its surprisal (hover: logprob, rank, top-k alternatives), and
// the --pairs comparisons.
//
// Pairs (A, B: two record ids, the same conversation with one line changed): the difference of total
// logprob and where it arises. With token ids on both sides (else "token_text" on both sides, the
// tokens then matched by their text), the sequences are aligned on their
// longest common prefix and suffix (suffix not overlapping the prefix): scored tokens in the common
// prefix (same context, same token: difference 0), the changed middle (each side's own tokens), and
// the common suffix, compared token for token (same token, different context). Without token ids the
// positions are compared one for one over the shorter length.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds4r {

class Tokenizer;

// Tokens shown as text in the HTML report by default (about 0.3 KB of page per token with top-8).
inline constexpr int64_t kDefaultMaxTextTokens = 100000;

struct ReportOptions {
    std::string results_path;
    std::string tokenizer_path;  // may be empty: token text from "token_text" fields, else ids
    std::string html_path;       // empty: text summary only
    std::vector<std::pair<std::string, std::string>> pairs;  // (id A, id B)
    bool overwrite = false;                                  // allow replacing an existing html_path
    int64_t max_text_tokens = kDefaultMaxTextTokens;         // HTML: tokens shown as text
};

// One result record as the report reads it.
struct ReportRecord {
    std::string id;  // the "id" value as text (strings unquoted, other JSON values dumped)
    int64_t line = 0;
    int64_t n_tokens = 0;
    std::vector<double> logprob;                     // [n-1]
    std::vector<double> entropy;                     // [n-1] or empty
    std::vector<int64_t> rank;                       // [n-1] or empty
    std::vector<std::vector<int64_t>> topk_ids;      // [n-1][k] or empty
    std::vector<std::vector<double>> topk_logprobs;  // [n-1][k] or empty
    std::vector<int64_t> tokens;                     // [n] or empty
    std::vector<std::string> token_text;             // [n] or empty
};

struct ReportFile {
    std::vector<ReportRecord> records;
    int64_t error_records = 0;  // --skip-bad error records, skipped
};

// Reads a results file. Throws InputError "file:line: what" for malformed input.
ReportFile read_report_records(const std::string& path);
// Parses one line (used by read_report_records and the tests); returns false for an error record.
bool parse_report_record(std::string_view line_text, const std::string& path, int64_t line,
                         ReportRecord* out);

struct SequenceStats {
    int64_t n_tokens = 0;
    int64_t positions = 0;      // scored positions (n_tokens - 1)
    double sum_logprob = 0;     // 0 for a one-token sequence
    double mean_logprob = 0;    // NAN when positions == 0
    double perplexity = 0;      // exp(-mean_logprob); NAN when positions == 0
    double mean_entropy = 0;    // NAN without entropy
    double typicality_gap = 0;  // mean_logprob + mean_entropy; NAN when either is
    double top1_agreement = 0;  // fraction of rank == 1; NAN without ranks
};

SequenceStats sequence_stats(const ReportRecord& r);
// Pools every scored position of `records` (totals row).
SequenceStats total_stats(const std::vector<ReportRecord>& records);

struct PairDiff {
    std::string id_a, id_b;
    double sum_a = 0, sum_b = 0, delta = 0;  // delta = sum_a - sum_b
    bool aligned_on_tokens = false;          // false: one-for-one positions (no token ids or texts)
    int64_t prefix_tokens = 0;               // common prefix length (tokens)
    int64_t suffix_tokens = 0;               // common suffix length (tokens)
    // Contributions to delta (they add up to it): scored tokens in the common prefix, the changed
    // middle (sum over A's middle tokens minus sum over B's), the common suffix.
    double delta_prefix = 0, delta_middle = 0, delta_suffix = 0;
    int64_t middle_a = 0, middle_b = 0;  // scored tokens in each side's changed middle
    // Per aligned token (prefix and suffix; without tokens: every common position):
    // token index in A and in B (the scored token, >= 1), logprob difference A - B.
    struct Aligned {
        int64_t token_a, token_b;
        double diff;
    };
    std::vector<Aligned> aligned;
    // Without token ids on both sides: delta_suffix sums the common positions (compared one for one),
    // delta_middle the longer side's extra positions; prefix_tokens = suffix_tokens = 0.
};

PairDiff compare_pair(const ReportRecord& a, const ReportRecord& b);

// The HTML report's first lines: <!DOCTYPE html> and this comment. An existing --html file is
// replaced only when it carries it (a report this command wrote), unless --overwrite.
inline constexpr const char* kReportHtmlMarker = "<!-- ds4replay report -->";

// HTML-escapes & < > " ' (text and attribute values).
std::string html_escape(std::string_view s);
// A JSON text made safe inside <script type="application/json">: <, > and & become \u escapes.
std::string json_for_script(std::string_view json_text);

// The text of each token of `r` ([n_tokens]); empty strings when neither "token_text" nor tokens
// with a tokenizer are available. Token ids outside the tokenizer read as "<id N>".
std::vector<std::string> token_texts(const ReportRecord& r, const Tokenizer* tok);

void write_text_report(const ReportFile& file, const std::vector<PairDiff>& pairs, const std::string& path,
                       std::FILE* out);
// The whole HTML document. Sequences are shown as text (with their per-token data) in file order
// until max_text_tokens tokens are shown (the first one always); the rest get a note.
std::string render_html_report(const ReportFile& file, const std::vector<PairDiff>& pairs,
                               const Tokenizer* tok, const std::string& results_path,
                               int64_t max_text_tokens = kDefaultMaxTextTokens);

// The command: reads, prints the text summary to `out`, writes the HTML when asked. Returns 0.
int run_report(const ReportOptions& opt, std::FILE* out);

}  // namespace ds4r
