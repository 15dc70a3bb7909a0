#!/usr/bin/env bash
# Benchmarks on a GPU machine: builds (if needed), writes a full-width synthetic checkpoint with
# make-tiny and runs `ds4replay bench` (kernels + workloads a, b, c). Output: $OUT/bench.txt, bench.csv,
# clocks.txt (nvidia-smi dmon during the bench), everything also in $OUT/0-logs.tgz.
# Usage: scripts/gpu_bench.sh [LAYERS] [WORKLOADS]     (defaults: 4, kernels,a,b,c)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAYERS="${1:-4}"
WORKLOADS="${2:-kernels,a,b,c}"
MODEL="${DS4R_BENCH_MODEL:-/tmp/ds4r-fullwidth-$LAYERS}"
source scripts/gpu_common.sh
trap pack_logs EXIT
ensure_gpu_build
t=$(date +%s)
ensure_fullwidth_model "$MODEL" "$LAYERS" "$OUT/make_tiny.log"
echo "== make-tiny full-width --layers $LAYERS: $(( $(date +%s) - t ))s, $(du -sh --apparent-size "$MODEL" | cut -f1) apparent, $(du -sh "$MODEL" | cut -f1) on disk"
"$BIN" inspect --model "$MODEL" > "$OUT/inspect.txt" 2>&1 || echo "inspect failed"
t=$(date +%s)
start_clock_log "$OUT/clocks.txt"
"$BIN" bench --model "$MODEL" --workloads "$WORKLOADS" --csv "$OUT/bench.csv" ${DS4R_BENCH_ARGS:-} > "$OUT/bench.txt" 2> "$OUT/bench.err"
rc=$?
stop_clock_log
echo "== bench rc=$rc ($(( $(date +%s) - t ))s); SM clock / power once a second: $OUT/clocks.txt"
tail -5 "$OUT/bench.err"
cat "$OUT/bench.txt"
