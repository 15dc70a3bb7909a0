// Helpers for the tests against the golden data (tests/data/tiny-a: DeepSeek's reference run on a GPU).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ds4r/backend.h"
#include "ds4r/checkpoint.h"
#include "ds4r/npy.h"
#include "ds4r/replay.h"
#include "test_util.h"

namespace ds4r::test {

std::string golden_dir();  // tests/data/tiny-a (golden_model_dir(): test_util.h)

struct GoldenSeq {
    std::string id;
    std::vector<int32_t> tokens;
};
std::vector<GoldenSeq> golden_sequences();  // tokens.jsonl in order

// A parsed record of expected.jsonl / our output.
struct Record {
    std::string id;
    int64_t n_tokens = 0;
    std::vector<double> logprob, entropy, topk_logprobs_flat;
    std::vector<int64_t> rank, topk_ids_flat;
    double final_entropy = 0;
    std::vector<int64_t> final_topk_ids;
    std::vector<double> final_topk_logprobs;
};
std::vector<Record> read_records(const std::string& jsonl_path);

NpyArray dump(const std::string& name);  // tests/data/tiny-a/dumps/<name>
bool dump_exists(const std::string& name);

// Comparison statistics of two bf16 (uint16 bit pattern) arrays.
struct Bf16Stats {
    double equal_frac = 0;  // bitwise equal fraction
    double rel_l2 = 0;      // ||a - b|| / ||b||
    double max_abs = 0;
};
Bf16Stats compare_bf16(const uint16_t* ours, const uint16_t* ref, size_t n);
double rel_l2_f32(const float* ours, const float* ref, size_t n);

// The checkpoint, CPU backend, weights and Engram resources, opened once per process.
struct GoldenModel {
    std::unique_ptr<Checkpoint> ckpt;
    std::unique_ptr<Backend> be;
    std::unique_ptr<WeightSource> weights;
    std::unique_ptr<EngramResources> engram;
};
GoldenModel& golden_model(const std::string& backend = "cpu");

// Captures hidden rows in memory, keyed by (layer, sequence index).
struct MemSink : HiddenSink {
    std::map<std::pair<int, int>, std::vector<uint16_t>> rows;
    void add_rows(int layer, int seq, const uint16_t* d, int64_t n, int64_t e) override {
        rows[{layer, seq}].assign(d, d + n * e);
    }
};

// Scores the golden sequences in `groups` (each group of sequence indices = one pass) and returns
// the formatted output record of every sequence index. With a sink, layers 2 and 6 are captured
// (keyed by the golden sequence index).
std::map<int, std::string> score_golden(const std::vector<std::vector<int>>& groups, int64_t chunk_rows,
                                        MemSink* sink = nullptr, const std::string& backend = "cpu");
std::vector<int> all_golden_indices();

// Median / quantile of |values|.
double quantile(std::vector<double> v, double q);

}  // namespace ds4r::test
