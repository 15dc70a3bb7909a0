#!/usr/bin/env bash
# The main job on an embedded default: builds the ds4replay binary (not the tests: scripts/test.sh builds
# those), makes a tiny random checkpoint in the real layout, scores a few sequences (CUDA when a GPU is
# present, else the CPU backend) and prints a summary.
# Usage: scripts/demo.sh [OUT_DIR]   (default: /tmp/ds4replay-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${DS4R_BUILD_DIR:-build}"
cmake_args=()
# Without a loaded NVIDIA driver no GPU can run the CUDA backend: a first build then skips its kernels
# (minutes of nvcc on a small machine). An existing build directory keeps its configuration.
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && [ ! -e /proc/driver/nvidia/version ]; then
  echo "demo: no NVIDIA driver loaded: building the CPU backend only (-DDS4R_CUDA=OFF in $BUILD_DIR;" \
    "reconfigure with -DDS4R_CUDA=AUTO to build the CUDA backend)" >&2
  cmake_args+=(-DDS4R_CUDA=OFF)
fi
scripts/setup.sh --target ds4replay ${cmake_args[@]+"${cmake_args[@]}"}
BIN="$BUILD_DIR/ds4replay"
OUT="${1:-/tmp/ds4replay-demo}"
rm -rf "$OUT/model"
mkdir -p "$OUT"
"$BIN" make-tiny "$OUT/model" --preset tiny --seed 1
"$BIN" inspect --model "$OUT/model" | tail -n 4
rm -f "$OUT/results.jsonl"
"$BIN" score --model "$OUT/model" --input scripts/data/demo_tokens.jsonl --output "$OUT/results.jsonl" \
  --capture-layers 2 --hidden-dir "$OUT/hidden" --progress plain --overwrite  # re-runnable: replaces the last demo's files
python3 - "$OUT/results.jsonl" <<'PY' 2>/dev/null || head -c 600 "$OUT/results.jsonl"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    n = r["n_tokens"]
    mean = r["sum_logprob"] / max(n - 1, 1)
    print(f'{r["id"]:>10}: {n:4d} tokens, mean logprob {mean:8.4f}, final top-1 {r["final"]["topk_ids"][0]}')
PY
echo "results: $OUT/results.jsonl   hidden states: $OUT/hidden/"
