// The I/O parts of `ds4replay bench` (issue 14): the disk measurement and, per workload, the weight
// reads and Engram gathers as fractions of it, the disk's busy time split, and the stall at Engram layers.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ds4r/disk_probe.h"
#include "ds4r/engram_io.h"
#include "ds4r/replay.h"
#include "ds4r/weights.h"

namespace ds4r {

class Checkpoint;

// name, value, unit -> one CSV row of the workload.
using BenchCsvRow = std::function<void(const std::string&, double, const std::string&)>;

// Measures the disk under the checkpoint's largest shard (a dense Engram table when there is one) and
// prints the rates. seconds <= 0: nothing measured (all rates 0).
DiskRates bench_measure_disk(const Checkpoint& ck, double seconds, std::FILE* out, const BenchCsvRow& csv);

// After a workload: weight read rate vs the disk's sequential rate, gather rows/s and IOPS vs its best
// random rate, disk busy time (weights vs Engram rows), and the wall of Engram layers vs the others.
void bench_report_io(const Checkpoint& ck, const std::vector<LayerTiming>& timings,
                     const WeightSourceStats& ws, const EngramGatherStats& eg, double wall,
                     const DiskRates& disk, std::FILE* out, const BenchCsvRow& csv);

}  // namespace ds4r
