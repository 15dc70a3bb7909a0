// `ds4replay bench` (docs/DESIGN.md section 8, issue "performance"): streaming and kernel benchmarks on a
// checkpoint with the real shapes (make-tiny --preset full-width). Benchmarks print a table and write
// CSV; they assert nothing.
//
// Workloads (synthetic random token ids, fixed seed):
//   a   4 sequences x 512 tokens
//   b   80 x 1,800 tokens (scaled down with --b-sequences / --b-tokens when host memory bounds it)
//   c   one 32,768-token sequence
//   d   the largest pass host memory allows (issue 13): --d-tokens per sequence, as many sequences as
//       half of MemAvailable (or --d-host-gb) holds at pass_host_bytes_per_token; reports tokens/s, the
//       disk (weights + Engram rows) and compute times projected to 40 layers, and which one bounds it
//   kernels  fp8 / fp4 dequant-GEMMs on the model's layer shapes vs cuBLAS bf16 on pre-dequantized
//            weights of the same shapes, and cuBLAS's measured bf16 rate at 8192^3 (CUDA only)
// Per layer: bytes and seconds read from disk, uploaded, computed, the stall, the overlap ratio
// wall / max(read, upload, compute); per workload: tokens/s, seconds per layer projected to 40
// layers, GEMM TFLOP/s and fraction of the measured bf16 rate, GPU memory high-water, host bytes
// per token.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "ds4r/expert_layout.h"
#include "ds4r/io_settings.h"

namespace ds4r {

struct BenchOptions {
    std::string model_dir;
    std::string workloads = "kernels,a,b,c";  // or d  // comma-separated subset
    std::string csv;                          // CSV output path (optional)
    std::string backend = "auto";
    int device = 0;
    double gpu_memory_gb = 0;  // CUDA memory budget (--gpu-memory-gb); 0: the default 22 GB
    std::string kernels = "auto";  // CUDA GEMM kernels (--kernels auto|portable|hopper, ds4r/backend.h)
    // --prepared-experts auto (kAutoExpertLayout) | fp16 | e5m2 | off (None): the widest layout allowed
    // (ds4r/replay.h plan_prepared_experts)
    ExpertLayout prepared_experts = kAutoExpertLayout;
    // --fp16-weights auto (true) | off (Backend::set_fp16_weights)
    bool fp16_weights = true;
    int64_t chunk_rows = 0;    // 0: sized from free memory, as `score`
    bool prefetch = true;      // false: the synchronous weight source (no overlap), for comparison
    int64_t b_sequences = 80, b_tokens = 1800;
    int64_t c_tokens = 32768;
    int64_t d_tokens = 1800;     // workload d: tokens per sequence
    double d_host_gb = 0;        // workload d: host memory for the pass's state; 0: half of MemAvailable
    int passes = 1;              // passes per workload (fresh tokens each); the last one is reported
    int64_t kernel_rows = 8192;  // M of the kernel benchmarks
    // --kernel-filter: only the kernel-table rows whose name contains this text (empty: every row)
    std::string kernel_filter;
    int iters = 10;
    uint64_t seed = 1;
    IoSettings io;              // --io, --read-threads, --read-request-mb, --engram-io, ...
    double disk_seconds = 1.0;  // per disk measurement before the workloads (0: none)
};

int run_bench(const BenchOptions& opt, std::FILE* out);

}  // namespace ds4r
