#!/usr/bin/env bash
# Hardware counters of the Hopper wgmma GEMMs (Nsight Compute): tensor pipe, issue slots, warp stalls of
# the first kernel-table shapes (wq_a, wq_b, wkv fp8 and wo_a bf16) under `bench --kernels auto`.
# Output: $OUT/ncu_hopper.txt and a summary on stdout. Needs build-gpu (scripts/gpu_hopper.sh builds it).
# Usage: scripts/gpu_profile_hopper.sh [LAUNCHES]   (default 10: 3 launches per shape, iters 1)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
BIN=build-gpu/ds4replay
MODEL=/tmp/ds4r-fullwidth-headers
[ -f "$MODEL/model.safetensors.index.json" ] ||
  "$BIN" make-tiny "$MODEL" --preset full-width --layers 1 --headers-only --force -q > /dev/null 2>&1
# --clock-control none: leave the clocks as they are (the device notes ask for it).
timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none -k regex:'dense_kernel|grouped_kernel' \
  --launch-count "${1:-10}" --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
  "$BIN" bench --model "$MODEL" --workloads kernels --iters 1 --kernels auto --disk-seconds 0 > "$OUT/ncu_hopper.txt" 2> "$OUT/ncu_hopper.err"
echo "== ncu rc=$?"
grep -E "dense_kernel|grouped_kernel|gmma|issue_active|Duration|Issue Slots Busy|No Eligible|Eligible Warps|Stall|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu_hopper.txt" |
  sed -E 's/_ZN4ds4r4kern[^ ]*(dense_kernel|grouped_kernel)[^ ]*Op(E[0-9])(Lb[01])[^ ]*/\1 \2\3/' | head -90
tail -3 "$OUT/ncu_hopper.err"
