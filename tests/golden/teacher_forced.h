// Teacher-forced golden comparison: every layer of every dumped sequence is fed the reference's exact
// inputs (stream, pre-mix, shared slots of the latest source layers) and its outputs are compared with
// the reference's (issue 3 item 5). Shared by the CPU (tests/golden) and CUDA (tests/cuda) suites.
#pragma once

#include <string>
#include <vector>

namespace ds4r::test {

struct LayerCompare {
    int seq = 0, layer = 0, len = 0;
    bool engram = false;
    double engram_equal = 1, engram_rel_l2 = 0;  // Engram output vs block_in
    double stream_equal = 0, stream_rel_l2 = 0;  // block output vs pre_engram[L+1]
    double premix_rel_l2 = 0;                    // f_pre vs premix[L+1]
    double attn_rel_l2 = 0, moe_rel_l2 = 0;
    double route_sets_equal = 0;  // fraction of tokens with the same expert set
    double route_w_rel_l2 = 0;
    int topk_rows = 0, topk_rows_equal = 0;      // index-source layers: our top-k rows vs the reference's
    int cand_rows = 0, cand_rows_equal = 0;      // candidate source: candidate masks
    double cmp_kv_equal = 1, index_k_equal = 1;  // KV sources: compressed KV / index keys bitwise fraction
    bool topk_all_equal() const { return topk_rows_equal == topk_rows; }
};

struct HeadCompare {
    int seq = 0, len = 0;
    double max_abs_logprob_diff = 0;  // ours vs log-softmax of the reference logits, all positions' targets
    double collapsed_equal = 0;       // final collapse (bf16) vs final_hidden_bf16
};

struct TeacherForcedReport {
    std::vector<LayerCompare> layers;
    std::vector<HeadCompare> heads;
    std::string table() const;  // human-readable per-layer table
};

TeacherForcedReport run_teacher_forced(const std::string& backend);
// Prints the table (and writes it to $DS4R_REPORT_DIR/teacher_forced_<backend>.txt when set) and
// asserts the targets with GoogleTest expectations.
void check_teacher_forced_report(const TeacherForcedReport& rep, const std::string& backend);

}  // namespace ds4r::test
