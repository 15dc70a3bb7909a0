#!/usr/bin/env bash
# The complete GPU-machine check in one call: CUDA suite + sanitizers (gpu_suite.sh full), then the
# benchmarks on a 4-layer full-width checkpoint: kernels and workloads a, b, c with O_DIRECT reads,
# and workload b again with buffered (page-cache) reads. Logs packed into $OUT/logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
FINAL_OUT="${OUT:-$PWD/gpu-out}"
export OUT="$FINAL_OUT/logs"
mkdir -p "$OUT"
bash scripts/gpu_suite.sh full
cp "$OUT/summary.txt" "$FINAL_OUT/summary.txt"
DS4R_BENCH_ARGS="--io direct" DS4R_PROFILE=1 bash scripts/gpu_bench.sh 4 kernels,a,b,c > "$FINAL_OUT/bench_direct.txt" 2>&1
cp "$OUT/bench.csv" "$FINAL_OUT/bench_direct.csv"
DS4R_BENCH_ARGS="--io buffered --read-threads 8" bash scripts/gpu_bench.sh 4 b > "$FINAL_OUT/bench_buffered.txt" 2>&1
cp "$OUT/bench.csv" "$FINAL_OUT/bench_buffered.csv"
tar -C "$OUT" -czf "$FINAL_OUT/logs.tar.gz" . && rm -rf "$OUT"
cat "$FINAL_OUT/summary.txt"; grep -E "tokens/s|projected|weights read|high-water|kernels|TF/s" "$FINAL_OUT"/bench_*.txt | head -40
