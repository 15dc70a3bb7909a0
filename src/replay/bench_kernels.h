// The kernel table of `ds4replay bench` (--workloads kernels): our GEMMs, grouped experts, head logits
// and mHC mixes on the model's shapes against cuBLAS bf16 in the same run, through the backend's
// KernelBench (ds4r/kernel_bench.h). --kernel-filter times only the rows whose name contains its text.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "ds4r/bench.h"
#include "ds4r/config.h"
#include "ds4r/kernel_bench.h"

namespace ds4r {

// name, m, n, k, value, unit, note -> one CSV row of the "kernels" section.
using KernelCsvRow = std::function<void(const std::string&, int64_t, int64_t, int64_t, double,
                                        const std::string&, const std::string&)>;

// Prints the table to `out` and a CSV row per measurement; *bf16_peak: the cuBLAS bf16 8192^3 rate
// (always measured: the reference of every row). pass_chunk_rows: the rows per chunk a pass would run
// (the grouped experts' "chunk average" case).
void bench_kernels(KernelBench& kb, const ModelConfig& c, const BenchOptions& opt, int64_t pass_chunk_rows,
                   const KernelCsvRow& csv, std::FILE* out, double* bf16_peak);

}  // namespace ds4r
