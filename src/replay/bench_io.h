// The I/O parts of `ds4replay bench` (issue 14): the disk measurement and, per workload, the weight
// reads and Engram gathers as fractions of it, the disk's busy time split, and the stall at Engram layers.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ds4r/config.h"
#include "ds4r/disk_probe.h"
#include "ds4r/engram_io.h"
#include "ds4r/replay.h"
#include "ds4r/weights.h"

namespace ds4r {

class Checkpoint;

// One field of bench's CSV (RFC 4180): as it is, or in double quotes with its quotes doubled where it
// holds a comma, a quote or a line break (the kernel table's row names hold commas: "attn.wq_a fp8, GEMM
// alone, fp16 weights, TMA").
std::string csv_field(const std::string& s);

// name, value, unit -> one CSV row of the workload.
using BenchCsvRow = std::function<void(const std::string&, double, const std::string&)>;

// GEMM and attention-core FLOPs per token of one layer of role r, for sequences of seq_tokens tokens:
// every linear (Engram's wkv on an Engram layer), the router and mHC mixes, and QK + PV over the slots a
// query attends (the window, plus the compressed rows' top-k on a layer of ratio > 0). Not counted: the
// indexer's scores, norms, softmax and the other elementwise work.
double layer_flops_per_token(const ModelConfig& c, const LayerRole& r, int64_t seq_tokens);

// Measures the disk under the checkpoint's largest dense shard (pick_disk_probe_file: a dense Engram table
// when there is one, never a sparse one) and prints the rates; the sequential test reads as the weight reader
// does with `io` (request size, requests in flight, O_DIRECT). seconds <= 0: nothing measured (all rates 0).
DiskRates bench_measure_disk(const Checkpoint& ck, double seconds, const IoSettings& io, std::FILE* out,
                             const BenchCsvRow& csv);

// After a workload: weight read rate vs the disk's sequential rate, gather rows/s and IOPS vs its best
// random rate, disk busy time (weights vs Engram rows), and the wall of Engram layers vs the others, also
// per FLOP (the Engram layers compute more: Engram's wkv).
// timings: the last pass's; flops[i]: timings[i]'s layer FLOPs in that pass (layer_flops_per_token x
// tokens; empty: the per-FLOP ratio is not printed); eg, ws and wall: every pass's; last_pass_stall_s: the
// last pass's Engram stall.
void bench_report_io(const Checkpoint& ck, const std::vector<LayerTiming>& timings,
                     const std::vector<double>& flops, const WeightSourceStats& ws,
                     const EngramGatherStats& eg, double last_pass_stall_s, double wall,
                     const DiskRates& disk, std::FILE* out, const BenchCsvRow& csv);

// Workload d's sequences of `tokens_per_seq`: the largest pass whose host state (pass_host_bytes_per_token
// with io.engram_next_pass) fits in host_gb x 1e9 bytes, or in half of MemAvailable when host_gb <= 0 (as
// `score` sizes passes); at least 1. Prints how it was sized.
int64_t workload_d_sequences(const ModelConfig& cfg, double host_gb, int64_t tokens_per_seq,
                             const IoSettings& io, std::FILE* out);

// A per-layer figure (metric(i) of timings[i]; the head's: layer < 0) projected to the released 40 layers
// by role where the checkpoint's layers allow it (the 4-layer and 2-layer full-width checkpoints), else
// the mean layer x 40; plus the head. `how` names the formula.
double project_40(const Checkpoint& ck, const std::vector<LayerTiming>& timings,
                  const std::function<double(size_t)>& metric, std::string* how = nullptr);

// Workload d's 40-layer pass, projected from the measured layers (project_40).
struct PassBoundInputs {
    int64_t tokens = 0;
    double wall_s = 0;        // the pass's projected wall
    double read_s = 0;        // weight reads (wall of each layer's reads, summed)
    double compute_s = 0;     // compute
    double weight_bytes = 0;  // weight bytes read
    bool scales_in_memory = true;
};
// Prints tokens/s, the disk time (weights at the disk's sequential rate, or at the measured read rate
// without a disk measurement; the Engram rows of this checkpoint's tables at its best random rate,
// inspect's prediction), the compute time, and which one bounds the pass.
void bench_report_pass_bound(const Checkpoint& ck, const PassBoundInputs& p, const DiskRates& disk,
                             std::FILE* out, const BenchCsvRow& csv);

}  // namespace ds4r
