#!/usr/bin/env bash
# Hardware counters of the Hopper wgmma GEMMs (Nsight Compute, --clock-control none: the clocks are left
# as they are). Needs build-gpu (scripts/gpu_hopper.sh or gpu_suite.sh builds it).
#   scripts/gpu_profile_hopper.sh [LAUNCHES]   summary counters (tensor pipe, issue slots, warp states) of
#       the first kernel-table launches under `bench --kernels auto` (default 10: wq_a, wq_b, ... x 3);
#       $OUT/ncu_hopper.txt and a digest on stdout.
#   scripts/gpu_profile_hopper.sh source [SKIP] SASS-level stall sampling of one launch (default SKIP 3:
#       the first attn.wq_b launch) with each partial variant (--kernels auto and hopper-fp8): reports
#       under /tmp, the source page as $OUT/sass_<kernels>.csv, and scripts/ncu_sass_summary.py's digest
#       (stall reasons, instructions per loop body, the most-stalled instructions) on stdout. This is how
#       docs/PERFORMANCE.md's "Where the block-scaled kernels' time goes" was measured.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
BIN=build-gpu/ds4replay
MODEL=/tmp/ds4r-fullwidth-headers
[ -f "$MODEL/model.safetensors.index.json" ] ||
  "$BIN" make-tiny "$MODEL" --preset full-width --layers 1 --headers-only --force -q > /dev/null 2>&1

if [ "${1:-}" = source ]; then
  for k in ${DS4R_PROFILE_KERNELS:-auto hopper-fp8}; do
    rm -f "/tmp/ncu_src_$k.ncu-rep"
    timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none -k regex:'dense_kernel|grouped_kernel' \
      --launch-skip "${2:-3}" --launch-count 1 --section SourceCounters --section WarpStateStats \
      --section SchedulerStats -o "/tmp/ncu_src_$k" \
      "$BIN" bench --model "$MODEL" --workloads kernels --iters 1 --kernels "$k" --disk-seconds 0 \
      > "/tmp/ncu_src_$k.log" 2>&1
    echo "== ncu --kernels $k rc=$?"
    ncu --import "/tmp/ncu_src_$k.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_$k.csv" 2>&1
    ncu --import "/tmp/ncu_src_$k.ncu-rep" --page details 2>&1 |
      grep -E "dense_kernel|grouped_kernel|Issued Warp|Active Warps|Eligible Warps|Warp Cycles Per Issued"
    python3 scripts/ncu_sass_summary.py "$OUT/sass_$k.csv" 12
  done
  exit 0
fi

timeout "${NCU_TIMEOUT:-120}" ncu --clock-control none -k regex:'dense_kernel|grouped_kernel' \
  --launch-count "${1:-10}" --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
  "$BIN" bench --model "$MODEL" --workloads kernels --iters 1 --kernels auto --disk-seconds 0 > "$OUT/ncu_hopper.txt" 2> "$OUT/ncu_hopper.err"
echo "== ncu rc=$?"
grep -E "dense_kernel|grouped_kernel|gmma|issue_active|Duration|Issue Slots Busy|No Eligible|Eligible Warps|Stall|Compute \(SM\) Throughput|Memory Throughput" "$OUT/ncu_hopper.txt" |
  sed -E 's/_ZN4ds4r4kern[^ ]*(dense_kernel|grouped_kernel)[^ ]*Op(E[0-9])(Lb[01])[^ ]*/\1 \2\3/' | head -90
tail -3 "$OUT/ncu_hopper.err"
