#!/usr/bin/env bash
# Hardware counters of the GEMM kernels (Nsight Compute) on a GPU machine: what limits them. Builds
# (if needed), writes a 1-layer full-width checkpoint for the shapes, and runs `ds4replay bench
# --workloads kernels --iters 1` under ncu, profiling the first launches of our GEMM kernels.
# Output: $OUT/ncu_gemm.txt (per kernel: tensor-pipe and issue utilisation, warp stall reasons).
# Usage: scripts/gpu_profile_gemm.sh [LAUNCHES]     (default 24: every shape of `bench kernels`)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAUNCHES="${1:-24}"
MODEL="${DS4R_PROFILE_MODEL:-/tmp/ds4r-fullwidth-1}"
source scripts/gpu_common.sh
ensure_gpu_build
ensure_fullwidth_model "$MODEL" 1 "$OUT/make_tiny_1.log"
# --clock-control none: leave the clocks as they are (the device notes ask for it).
ncu --clock-control none -k regex:'gemm_kernel|grouped_fp4_kernel' --launch-count "$LAUNCHES" \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
  --section Occupancy --section LaunchStats \
  "$BIN" bench --model "$MODEL" --workloads kernels --iters 1 > "$OUT/ncu_gemm.txt" 2> "$OUT/ncu_gemm.err"
echo "== ncu sections rc=$?"
# Pipe utilisation and stall breakdown as raw metrics (a separate run: an unknown metric name fails
# the whole invocation, and the sections above must not depend on it).
stalls=""
for r in barrier short_scoreboard long_scoreboard math_pipe_throttle mio_throttle wait not_selected selected \
         dispatch_stall lg_throttle no_instruction branch_resolving membar sleeping tex_throttle drain imc_miss; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
ncu --clock-control none -k regex:'gemm_kernel|grouped_fp4_kernel' --launch-count "$LAUNCHES" --page raw \
  --metrics "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum${stalls}" \
  "$BIN" bench --model "$MODEL" --workloads kernels --iters 1 > "$OUT/ncu_gemm_raw.txt" 2> "$OUT/ncu_gemm_raw.err"
echo "== ncu metrics rc=$?"
grep -E "gemm_kernel|grouped_fp4_kernel|Duration|Issue Slots Busy|Issued Ipc Active|Executed Ipc Active|SM Busy|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Stall|One or More Eligible|No Eligible|Active Warps Per Scheduler|Eligible Warps" "$OUT/ncu_gemm.txt" | head -400 > "$OUT/ncu_gemm_summary.txt"
head -120 "$OUT/ncu_gemm_summary.txt"
grep -E "gemm_kernel|grouped_fp4_kernel|pct_of_peak|inst_executed|stalled|duration" "$OUT/ncu_gemm_raw.txt" | head -300 > "$OUT/ncu_gemm_raw_summary.txt"
tail -5 "$OUT/ncu_gemm_raw.err"
