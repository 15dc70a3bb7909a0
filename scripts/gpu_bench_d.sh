#!/usr/bin/env bash
# Bench workload d on the H200 machine (issue 13): the largest pass host memory allows (half of MemAvailable
# at `score`'s bytes per token, or D_HOST_GB), weights read with O_DIRECT from disk, page cache dropped.
# The machine's 64 GB disk holds only a few full-width layers (7.4 GB each), so the pass runs on $LAYERS
# layers and bench projects it to 40 layers (as workload b): tokens/s end to end, the disk time (weights at
# the disk's measured sequential rate + this checkpoint's Engram rows at its best random rate) against the
# compute time, and which one bounds the pass. The checkpoint's Engram tables are sparse (make-tiny without
# --engram-rows: holes of the released row count, no disk reads), so the measured pass is weights + compute;
# the printed Engram figure is inspect's prediction for this checkpoint's tables (with LAYERS=2 one of the
# released two: double it for the released model) at the disk's measured best random rate.
# Builds build-gpu (-j16, sm_90). Logs in $OUT; a short summary last. Meant for one ~8-minute device call.
#   OUT=/tmp/out scripts/gpu_bench_d.sh            # D_HOST_GB=40 to size the pass by hand
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAYERS="${LAYERS:-2}"
MODEL="${DS4R_BENCH_D_MODEL:-/tmp/ds4r-fullwidth-$LAYERS}"
D_HOST_GB="${D_HOST_GB:-0}"
D_TOKENS="${D_TOKENS:-1800}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-420}"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - T0 ))s)"; }

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
  > "$OUT/cmake.log" 2>&1 && cmake --build build-gpu -j16 --target ds4replay > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
BIN=build-gpu/ds4replay
stamp "built"
source scripts/gpu_common.sh
ensure_fullwidth_model "$MODEL" "$LAYERS" "$OUT/make_tiny.log"
stamp "make-tiny: $(du -sh --apparent-size "$MODEL" | cut -f1) apparent, $(du -sh "$MODEL" | cut -f1) on disk; $(grep MemAvailable /proc/meminfo)"

sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "   (cannot drop the page cache: not root)"
timeout "$BENCH_TIMEOUT" "$BIN" bench --model "$MODEL" --workloads d --d-host-gb "$D_HOST_GB" --d-tokens "$D_TOKENS" \
  --io direct --disk-seconds 1 --csv "$OUT/bench_d.csv" > "$OUT/bench_d.txt" 2> "$OUT/bench_d.err"
stamp "bench d rc=$?"
tail -3 "$OUT/bench_d.err"
cat "$OUT/bench_d.txt"
echo
v() { grep ",$1," "$OUT/bench_d.csv" 2>/dev/null | head -1 | cut -d, -f8; }
printf "%-10s %12s %10s %10s %12s %12s %10s %8s\n" tokens "tokens/s" "pass s" "disk s" "weights s" "Engram s" \
  "compute s" "disk-bound"
printf "%-10s %12s %10s %10s %12s %12s %10s %8s\n" "$(grep ',d_tokens_per_s,' "$OUT/bench_d.csv" | cut -d, -f4)" \
  "$(v d_tokens_per_s)" "$(v d_pass_s)" "$(v d_disk_s)" "$(v d_disk_weights_s)" "$(v d_disk_engram_s)" \
  "$(v d_compute_s)" "$(v d_disk_bound)"
echo "(40-layer projections; disk-bound 1 = the ~300 GB of weight reads per pass (+ Engram rows) bound it, 0 = compute)"
