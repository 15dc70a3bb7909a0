#!/usr/bin/env bash
# Issue 14 on the H200 machine: the Engram gather and the weight reads on DENSE data, page cache out of
# the way. Builds build-gpu (-j16, sm_90), writes a full-width checkpoint with --layers $LAYERS (7.4 GB
# per layer) and one dense Engram table of $ENGRAM_ROWS rows (264 B per row: 90M rows = 23.8 GB; total
# ~42 GB, under 45 GB of the 64 GB disk), then, each after dropping the page cache (root):
#   1. bench workload b with O_DIRECT weights and the new gather (--engram-io auto), with the disk
#      measurements (sequential O_DIRECT MB/s; random 4 KiB reads/s at QD 1, 32, 256);
#   2. the same with the earlier engine (--engram-io mmap --engram-scales disk: page faults, rows and
#      scales each a random read);
#   3. score of a few sequences with --engram-io auto and mmap: the output bytes must be identical.
# Logs in $OUT; a short table last. Meant to finish in ~8 minutes (each bench run is capped by BENCH_TIMEOUT).
#   OUT=/tmp/out scripts/gpu_engram_io.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
MODEL="${DS4R_ENGRAM_MODEL:-/tmp/ds4r-engram-dense}"
LAYERS="${LAYERS:-2}"
ENGRAM_ROWS="${ENGRAM_ROWS:-90000000}"
B_SEQ="${B_SEQ:-80}"
B_TOK="${B_TOK:-1800}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-150}"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - T0 ))s)"; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "   (cannot drop the page cache: not root)"; }

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
  > "$OUT/cmake.log" 2>&1 && cmake --build build-gpu -j16 --target ds4replay > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -20 "$OUT/build.log"; exit 1; }
BIN=build-gpu/ds4replay
grep -h "io_uring" "$OUT/cmake.log" | sed 's/^/   /'
stamp "built"

if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
  rm -rf "$MODEL"
  "$BIN" make-tiny "$MODEL" --preset full-width --layers "$LAYERS" --engram-rows "$ENGRAM_ROWS" --seed 1 \
    > "$OUT/make_tiny.log" 2>&1 || { echo "make-tiny failed"; tail -5 "$OUT/make_tiny.log"; exit 1; }
fi
stamp "make-tiny: $(du -sh --apparent-size "$MODEL" | cut -f1) apparent, $(du -sh "$MODEL" | cut -f1) on disk, $(df -h --output=avail "$MODEL" | tail -1) free"
"$BIN" inspect --model "$MODEL" --pass-tokens $(( B_SEQ * B_TOK )) > "$OUT/inspect.txt" 2>&1

run_bench() {  # NAME ENGRAM_IO DISK_SECONDS ENGRAM_SCALES
  drop_caches
  timeout "$BENCH_TIMEOUT" "$BIN" bench --model "$MODEL" --workloads b --b-sequences "$B_SEQ" --b-tokens "$B_TOK" \
    --io direct --engram-io "$2" --disk-seconds "$3" --engram-scales "$4" --csv "$OUT/bench_$1.csv" \
    > "$OUT/bench_$1.txt" 2> "$OUT/bench_$1.err"
  local rc=$?
  stamp "bench $1 (--engram-io $2 --engram-scales $4) rc=$rc"
}
run_bench new auto 1 auto
run_bench old mmap 0 disk

# Byte identity on the dense tables: a few sequences through both engines (weights through the page cache).
python3 - "$OUT/tokens.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(4):
        f.write(json.dumps({"id": f"s{i}", "tokens": [r.randrange(129280) for _ in range(96)]}) + "\n")
PY
for m in auto mmap; do
  rm -f "$OUT/score_$m.jsonl"
  "$BIN" score --model "$MODEL" --input "$OUT/tokens.jsonl" --output "$OUT/score_$m.jsonl" --io buffered \
    --engram-io "$m" --progress none 2> "$OUT/score_$m.err"
  echo "   score --engram-io $m rc=$?"
done
if cmp -s "$OUT/score_auto.jsonl" "$OUT/score_mmap.jsonl" && [ -s "$OUT/score_auto.jsonl" ]; then SAME=identical; else SAME=DIFFERENT; fi
stamp "score outputs: $SAME"

echo
echo "---- inspect prediction (H200 defaults 1700 MB/s, 70k IOPS)"; tail -6 "$OUT/inspect.txt"
for n in new old; do
  echo "---- bench $n"
  grep -E "^disk|weights:|Engram gather|disk busy|Engram layers|total .* tokens/s" "$OUT/bench_$n.txt" | sed 's/^ *//'
  grep -E "^  [0-9]+ |layer " "$OUT/bench_$n.txt" | head -4
  tail -2 "$OUT/bench_$n.err"
done
echo
printf "%-6s %10s %10s %10s %12s %14s\n" run "rows/s" "IOPS" "stall s" "Engram/other" "weights MB/s"
for n in new old; do
  csv="$OUT/bench_$n.csv"
  v() { grep ",$1," "$csv" 2>/dev/null | head -1 | cut -d, -f8; }
  printf "%-6s %10s %10s %10s %12s %14s\n" "$n" "$(v engram_rows_per_s)" "$(v engram_iops)" "$(v engram_stall_s)" \
    "$(v engram_layer_wall_ratio)" "$(v weights_read_mb_s)"
done
grep -E ",disk_(seq|iops_qd(1|32|256))," "$OUT/bench_new.csv" | cut -d, -f2,8,9 | tr '\n' ' '; echo
echo "score --engram-io auto vs mmap on the dense tables: $SAME; total $(( $(date +%s) - T0 ))s"
