// Input sharding (include/ds4r/shard.h): scheduler environment, K/N parsing, the balanced split.
#include "ds4r/shard.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "ds4r/error.h"
#include "ds4r/input.h"

namespace ds4r {

namespace {

// A non-negative decimal integer (the whole text), or -1.
int64_t parse_count(const std::string& s) {
    if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::strtoll(s.c_str(), nullptr, 10);
}

// An environment variable holding a non-negative integer; -1 when unset; InputError when malformed.
int64_t env_int(const EnvLookup& env, const char* name) {
    const char* v = env(name);
    if (!v) return -1;
    const int64_t n = parse_count(v);
    if (n < 0) throw InputError(strfmt("--shard auto: %s='%s' is not a non-negative integer", name, v));
    return n;
}

ShardSpec checked(ShardSpec s, const std::string& where) {
    if (s.count < 1 || s.count > kMaxShards)
        throw InputError(strfmt("%s: the shard count must be in [1, %lld], not %lld", where.c_str(),
                                (long long)kMaxShards, (long long)s.count));
    if (s.index < 1 || s.index > s.count)
        throw InputError(strfmt("%s: shard %lld of %lld: the index must be in [1, %lld]", where.c_str(),
                                (long long)s.index, (long long)s.count, (long long)s.count));
    return s;
}

}  // namespace

ShardSpec shard_from_scheduler_env(int64_t count_flag, const EnvLookup& env) {
    const int64_t slurm_id = env_int(env, "SLURM_ARRAY_TASK_ID");
    if (slurm_id >= 0) {
        const int64_t count = env_int(env, "SLURM_ARRAY_TASK_COUNT");
        const int64_t min = env_int(env, "SLURM_ARRAY_TASK_MIN");
        const int64_t max = env_int(env, "SLURM_ARRAY_TASK_MAX");
        int64_t step = env_int(env, "SLURM_ARRAY_TASK_STEP");
        if (step < 0) step = 1;
        if (count < 1 || min < 0)
            throw InputError(
                "--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT / SLURM_ARRAY_TASK_MIN "
                "are not (is this a job array task?)");
        if (step < 1 || slurm_id < min || (slurm_id - min) % step != 0 ||
            (max >= 0 && (max - min) / step + 1 != count))
            throw InputError(strfmt(
                "--shard auto: the job array is not a regular range (task %lld, min %lld, max %lld, step "
                "%lld, count %lld); submit it as --array=0-%lld (or 1-%lld)",
                (long long)slurm_id, (long long)min, (long long)max, (long long)step, (long long)count,
                (long long)count - 1, (long long)count));
        if (count_flag > 0 && count_flag != count)
            throw InputError(
                strfmt("--shard-count %lld differs from the job array's SLURM_ARRAY_TASK_COUNT %lld",
                       (long long)count_flag, (long long)count));
        return checked({(slurm_id - min) / step + 1, count}, "--shard auto (Slurm job array)");
    }
    const int64_t k8s_index = env_int(env, "JOB_COMPLETION_INDEX");
    if (k8s_index >= 0) {
        if (count_flag <= 0)
            throw InputError(
                "--shard auto: JOB_COMPLETION_INDEX is set (a Kubernetes indexed Job): give the number of "
                "shards (the Job's completions) with --shard-count N");
        return checked({k8s_index + 1, count_flag}, "--shard auto (Kubernetes JOB_COMPLETION_INDEX)");
    }
    throw InputError(
        "--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX (a "
        "Kubernetes indexed Job) is set; give the shard as --shard K/N");
}

ShardSpec parse_shard_spec(const std::string& text, int64_t count_flag, const EnvLookup& env) {
    if (text.empty()) {
        if (count_flag > 0) throw InputError("--shard-count needs --shard auto");
        return {};
    }
    if (text == "auto") return shard_from_scheduler_env(count_flag, env);
    if (count_flag > 0)
        throw InputError("--shard-count goes with --shard auto (--shard K/N names the count)");
    const size_t slash = text.find('/');
    const int64_t k = slash == std::string::npos ? -1 : parse_count(text.substr(0, slash));
    const int64_t n = slash == std::string::npos ? -1 : parse_count(text.substr(slash + 1));
    if (k < 0 || n < 0)
        throw InputError("--shard: expected K/N (shard K of N, 1 <= K <= N, e.g. 1/4) or auto, not '" + text +
                         "'");
    return checked({k, n}, "--shard " + text);
}

std::vector<int64_t> balanced_boundaries(const std::vector<int64_t>& weights, int64_t n) {
    DS4R_CHECK(n >= 1, "balanced_boundaries: %lld parts", (long long)n);
    const int64_t R = static_cast<int64_t>(weights.size());
    std::vector<int64_t> prefix(static_cast<size_t>(R) + 1, 0);
    for (int64_t i = 0; i < R; ++i) {
        DS4R_CHECK(weights[static_cast<size_t>(i)] >= 0, "negative weight");
        prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + weights[static_cast<size_t>(i)];
    }
    const int64_t total = prefix.back();
    std::vector<int64_t> b(static_cast<size_t>(n) + 1, 0);
    b[static_cast<size_t>(n)] = R;
    for (int64_t k = 1; k < n; ++k) {
        // Target k * total / n, compared as prefix * n against k * total (no rounding; both < 2^63 for
        // totals below ~10^13 tokens and n <= kMaxShards).
        const __int128 target = static_cast<__int128>(k) * total;
        auto scaled = [&](int64_t i) { return static_cast<__int128>(prefix[static_cast<size_t>(i)]) * n; };
        // First boundary i with prefix[i] * n >= target.
        int64_t lo = 0, hi = R;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (scaled(mid) >= target)
                hi = mid;
            else
                lo = mid + 1;
        }
        int64_t i = lo;
        if (i > 0 && target - scaled(i - 1) <= scaled(i) - target) i = i - 1;  // nearer (lower on a tie)
        b[static_cast<size_t>(k)] = std::max(i, b[static_cast<size_t>(k) - 1]);
    }
    return b;
}

ShardPlan plan_shard(const std::string& input_path, int64_t vocab, int64_t max_len, ShardSpec spec) {
    DS4R_CHECK(spec.enabled(), "plan_shard without a shard");
    struct stat st {};
    if (input_path == "-" || ::stat(input_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw InputError(
            (input_path == "-" ? std::string("<stdin>") : input_path) +
            ": --shard needs the input as a regular file (it counts the tokens of the whole input first, "
            "then every shard reads its own part); write the stream to a file first");
    InputReader reader(input_path, vocab, max_len);
    std::vector<int64_t> weights;
    InputRecord rec;
    for (;;) {
        try {
            if (!reader.next(rec)) break;
            weights.push_back(static_cast<int64_t>(rec.tokens.size()));
        } catch (const InputError&) {
            weights.push_back(1);  // a bad line: an error record (--skip-bad) or the run stops anyway
        }
    }
    const auto b = balanced_boundaries(weights, spec.count);
    ShardPlan p;
    p.index = spec.index;
    p.count = spec.count;
    p.first_record = b[static_cast<size_t>(spec.index - 1)];
    p.records = b[static_cast<size_t>(spec.index)] - p.first_record;
    p.total_records = static_cast<int64_t>(weights.size());
    for (int64_t i = 0; i < p.total_records; ++i) {
        p.total_tokens += weights[static_cast<size_t>(i)];
        if (p.contains(i)) p.tokens += weights[static_cast<size_t>(i)];
    }
    return p;
}

RunManifest::Shard shard_manifest_entry(const ShardPlan& p) {
    RunManifest::Shard s;
    s.index = static_cast<int>(p.index);
    s.count = static_cast<int>(p.count);
    s.first_record = p.first_record;
    s.records = p.records;
    return s;
}

std::string describe_shard_plan(const ShardPlan& p) {
    if (p.records == 0)
        return strfmt("shard %lld/%lld: no records (the input has %lld records for %lld shards)",
                      (long long)p.index, (long long)p.count, (long long)p.total_records, (long long)p.count);
    return strfmt("shard %lld/%lld: records %lld..%lld of %lld (%lld of %lld tokens)", (long long)p.index,
                  (long long)p.count, (long long)p.first_record + 1, (long long)p.end_record(),
                  (long long)p.total_records, (long long)p.tokens, (long long)p.total_tokens);
}

}  // namespace ds4r
