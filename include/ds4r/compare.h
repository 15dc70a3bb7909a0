// `ds4replay compare A.jsonl B.jsonl`: fidelity statistics between two result files (docs/DESIGN.md 2).
//
// Input: two JSONL files, one JSON object per line (blank lines skipped; a line that is not JSON or
// has no "id" is an InputError naming the file and line). Each record of A is paired with the first
// record of B with the same "id" (compared as JSON values: "7" and 7 differ); ids missing from the
// other file are counted, not errors; no common id at all is an error. Records with an "error" field
// (--skip-bad) are skipped. Paired ds4replay records must have the same number of positions. Each
// record is one of:
//  1. A ds4replay result record: "logprob" [n-1 numbers] (required), "n_tokens", optional "rank"
//     [n-1 ints], "topk_ids" [[k ints] x n-1] with "topk_logprobs" [[k numbers] x n-1].
//  2. An API record, the per-token logprobs a served model returns for the tokens it generated:
//       {"id": ..., "logprobs": {"content": [
//          {"token": "Hello", "logprob": -0.12,
//           "top_logprobs": [{"token": "Hello", "logprob": -0.12}, {"token": " Hi", "logprob": -2.3}, ...]},
//          ...]}}
//     or a whole chat-completion response whose "choices"[0] holds that "logprobs" object (the
//     response's own "id" must then be set to the replayed sequence's id). Content entry i is the
//     i-th generated token; generated tokens are the LAST len(content) tokens of the replayed
//     sequence, so entry i is compared with position n - 1 - len(content) + i of the ds4replay
//     record (n = its n_tokens; position t scores token t+1). len(content) > n - 1 is an error.
//     Only "logprob" of an entry is compared with the replay's logprob; its "top_logprobs" give the
//     top-k. A top-k entry's token id is: its integer "token_id" (or "id") field; else its "token"
//     string "token_id:<decimal>" (vLLM's return_tokens_as_token_ids); else the token text looked up
//     among the single-token decodings of tokenizer.json (--tokenizer FILE or --model DIR). A text
//     that decodes from several ids (byte tokens of partial UTF-8 all read "\uFFFD") is ambiguous:
//     kept out of top-1 and KL and counted. Top-k entries with logprob <= -9999 (the API's "below
//     its top-k" sentinel) are ignored. One of the two files must hold ds4replay records.
// Statistics, per sequence and over all paired positions:
//  - |d logprob| = |logprob_A - logprob_B| of the actual next token: median, mean, p95 (linear
//    interpolation between order statistics, numpy's default), max;
//  - top-1 agreement: fraction of positions (with top-k on both sides) whose top-1 ids are equal;
//  - rank agreement: fraction of positions (with ranks on both sides: ds4replay vs ds4replay) whose
//    ranks are equal;
//  - KL(A || B) over the shared top-k: at positions where >= 2 ids are in both top-k lists, both
//    distributions are renormalized over those shared ids, KL = sum p_A (log p_A - log p_B) (>= 0);
//    mean, median and max over those positions.
// Output: a text report (totals, the |d logprob| line, top-1 / rank agreement, KL, one line per
// sequence unless per_sequence is false) or, with json, one object: sequences, positions,
// median_abs_dlogprob, mean_abs_dlogprob, p95_abs_dlogprob, max_abs_dlogprob, top1_agreement,
// rank_agreement, kl_positions, kl_mean, kl_median, kl_max (each null when undefined: no positions), a, b,
// missing_in_b, missing_in_a, ambiguous_topk_entries, per_sequence: [{"id": ..., the same statistics}].
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ds4r {

struct CompareOptions {
    std::string file_a, file_b;
    std::string tokenizer_path;  // for API records with token text only
    bool json = false;           // one JSON object instead of the text report
    bool per_sequence = true;
};

struct CompareStats {
    int64_t sequences = 0, positions = 0;
    double median_abs = 0, mean_abs = 0, p95_abs = 0, max_abs = 0;  // |d logprob| of the actual next token
    double top1_agreement = 0;  // fraction of positions with the same top-1 id (when both have top-k)
    double rank_agreement = 0;  // fraction with the same rank (when both have ranks)
    double kl_mean = 0, kl_median = 0, kl_max = 0;  // KL(A || B) over the shared top-k ids, renormalized
    int64_t kl_positions = 0;
};

// Computes overall + per-sequence statistics and writes the report to `out`. Throws InputError naming
// the file and line for malformed input; returns 0.
int run_compare(const CompareOptions& opt, std::FILE* out);

}  // namespace ds4r
