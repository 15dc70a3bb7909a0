// `ds4replay compare A.jsonl B.jsonl`: fidelity statistics between two result files (DESIGN.md 2).
//
// Each file holds either ds4replay result records (id, logprob, rank, topk_ids, topk_logprobs) or
// per-token top-k logprob records as a served API returns them ("API records"), one JSON object
// per line:
//   {"id": ..., "logprobs": {"content": [{"token": "Hello", "logprob": -0.12,
//                                          "top_logprobs": [{"token": "Hello", "logprob": -0.12}, ...]}, ...]}}
// (also accepted: the same "logprobs" object inside "choices"[0], i.e. a whole chat-completion
// response with an "id"). An API record covers the tokens the server generated: they are the LAST
// len(content) tokens of the replayed sequence, so entry i is compared with position
// n_tokens - 1 - len(content) + i of the ds4replay record of the same id. Tokens are matched by id:
// "token_id" / "id" integer fields when present, "token_id:123" strings, else the token text mapped
// through tokenizer.json (--tokenizer or --model); entries with logprob <= -9999 (the API's sentinel
// below its top-k) are ignored.
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
    double top1_agreement = 0;   // fraction of positions with the same top-1 id (when both have top-k)
    double rank_agreement = 0;   // fraction with the same rank (when both have ranks)
    double kl_mean = 0, kl_median = 0, kl_max = 0;  // KL(A || B) over the shared top-k ids, renormalized
    int64_t kl_positions = 0;
};

// Computes overall + per-sequence statistics and writes the report to `out`. Throws InputError naming
// the file and line for malformed input; returns 0.
int run_compare(const CompareOptions& opt, std::FILE* out);

}  // namespace ds4r
