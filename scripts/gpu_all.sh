#!/usr/bin/env bash
# One GPU-machine call: the CUDA suite (scripts/gpu_suite.sh) then the benchmarks (scripts/gpu_bench.sh),
# logs packed into $OUT/logs.tar.gz (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT="${OUT:-$PWD/gpu-out}"
export OUT="$FINAL_OUT/logs"
mkdir -p "$OUT"
SUITE_MODE="${1:-full}"
BENCH_LAYERS="${2:-4}"
BENCH_WORKLOADS="${3:-kernels,a,b,c}"
bash scripts/gpu_suite.sh "$SUITE_MODE"
cp "$OUT/summary.txt" "$FINAL_OUT/summary.txt"
if [ "$BENCH_WORKLOADS" != none ]; then
  bash scripts/gpu_bench.sh "$BENCH_LAYERS" "$BENCH_WORKLOADS" | tee "$FINAL_OUT/bench_run.txt"
  cp "$OUT/bench.txt" "$OUT/bench.csv" "$FINAL_OUT/" 2>/dev/null
fi
tar -C "$OUT" -czf "$FINAL_OUT/logs.tar.gz" . && rm -rf "$OUT"
