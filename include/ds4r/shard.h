// Input sharding for many machines (`score --shard K/N`, `--shard auto`; issue 16): a deterministic
// split of a tokens.jsonl file into N contiguous parts balanced by token count, so that the outputs of
// shards 1..N, concatenated in shard order (`ds4replay merge`), are the unsharded output byte for byte.
//
// A "record" is one non-blank input line (a sequence, or a bad line that becomes an error record with
// --skip-bad): exactly the lines that each get one output line. Records are numbered from 0 in input
// order. Shard K of N (1-based K) owns the records [first_record, first_record + records).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ds4r/run_manifest.h"

namespace ds4r {

// Which shard this run is; count == 0: not sharded.
struct ShardSpec {
    int64_t index = 0;  // 1-based, 1 <= index <= count
    int64_t count = 0;
    bool enabled() const { return count > 0; }
};

constexpr int64_t kMaxShards = 100000;

// Looks up an environment variable (nullptr when unset): scheduler_env (ds4r/settings.h) in the
// program, a map in tests.
using EnvLookup = std::function<const char*(const char*)>;

// The shard a batch scheduler assigned to this process, read from the variables the schedulers
// document for it (the one place that reads them):
//  - Slurm job arrays: SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT, SLURM_ARRAY_TASK_MIN and
//    SLURM_ARRAY_TASK_STEP (default 1): index = (ID - MIN) / STEP + 1, so `--array=0-7`, `--array=1-8`
//    and `--array=0-14:2` all give shards 1..8 of 8. `count_flag` (> 0) must then equal the count.
//  - Kubernetes indexed Jobs: JOB_COMPLETION_INDEX (0-based); the count is `count_flag`
//    (`--shard-count N`, the Job's `completions`), which is required there.
// Throws InputError saying what is missing or inconsistent.
ShardSpec shard_from_scheduler_env(int64_t count_flag, const EnvLookup& env);

// "K/N" (1 <= K <= N <= kMaxShards) or "auto" (shard_from_scheduler_env); "" = not sharded.
// `count_flag` is --shard-count (0 when not given; only meaningful with "auto").
ShardSpec parse_shard_spec(const std::string& text, int64_t count_flag, const EnvLookup& env);

// Boundaries of a split of records with these weights into n contiguous parts: b[0] = 0, b[n] =
// weights.size(), part k (0-based) = [b[k], b[k+1]). b[k] is the record boundary whose weight prefix
// sum is nearest to k * total / n (the lower one on a tie); parts may be empty when n exceeds the
// number of records. Deterministic, integer arithmetic only.
std::vector<int64_t> balanced_boundaries(const std::vector<int64_t>& weights, int64_t n);

struct ShardPlan {
    int64_t index = 0, count = 0;           // as in ShardSpec
    int64_t first_record = 0, records = 0;  // this shard's records
    int64_t tokens = 0;                     // this shard's weight (tokens; a bad line counts 1)
    int64_t total_records = 0, total_tokens = 0;
    int64_t end_record() const { return first_record + records; }
    bool contains(int64_t record) const { return record >= first_record && record < end_record(); }
};

// Reads the whole input (a regular file: a pipe cannot be read twice, InputError otherwise) and plans
// shard `spec`: every record weighs its token count, a bad line 1 (it costs no compute, but it is a
// record of the output). vocab / max_len as for InputReader (they decide which lines are bad, as in
// the run itself).
ShardPlan plan_shard(const std::string& input_path, int64_t vocab, int64_t max_len, ShardSpec spec);
// The run sidecar's "shard" entry for this plan (`merge` reads it back).
RunManifest::Shard shard_manifest_entry(const ShardPlan& p);

// "shard 2/4: records 10..19 of 40 (1234 of 5000 tokens)" for the log.
std::string describe_shard_plan(const ShardPlan& p);

}  // namespace ds4r
