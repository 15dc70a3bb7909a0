#!/usr/bin/env bash
# Benchmarks on a GPU machine: builds (if needed), writes a full-width synthetic checkpoint with
# make-tiny and runs `ds4replay bench` (kernels + workloads a, b, c). Output: $OUT/bench.txt, bench.csv.
# Usage: scripts/gpu_bench.sh [LAYERS] [WORKLOADS]     (defaults: 4, kernels,a,b,c)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAYERS="${1:-4}"
WORKLOADS="${2:-kernels,a,b,c}"
MODEL="${DS4R_BENCH_MODEL:-/tmp/ds4r-fullwidth-$LAYERS}"
export PATH=/usr/local/cuda/bin:$PATH
if [ ! -x build-gpu/ds4replay ]; then
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${DS4R_ARCHS:-90}" >/dev/null &&
    cmake --build build-gpu -j "$(nproc)" --target ds4replay >/dev/null || { echo "build failed"; exit 1; }
fi
BIN=build-gpu/ds4replay
t=$(date +%s)
if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
  "$BIN" make-tiny "$MODEL" --preset full-width --layers "$LAYERS" --seed 1 --force 2> "$OUT/make_tiny.log" ||
    { echo "make-tiny failed"; tail -5 "$OUT/make_tiny.log"; exit 1; }
fi
echo "== make-tiny full-width --layers $LAYERS: $(( $(date +%s) - t ))s, $(du -sh --apparent-size "$MODEL" | cut -f1) apparent, $(du -sh "$MODEL" | cut -f1) on disk"
"$BIN" inspect --model "$MODEL" > "$OUT/inspect.txt" 2>&1 || echo "inspect failed"
t=$(date +%s)
"$BIN" bench --model "$MODEL" --workloads "$WORKLOADS" --csv "$OUT/bench.csv" ${DS4R_BENCH_ARGS:-} > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "== bench rc=$? ($(( $(date +%s) - t ))s)"
tail -5 "$OUT/bench.err"
cat "$OUT/bench.txt"
