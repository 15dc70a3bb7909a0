#!/usr/bin/env bash
# Issue 14 on the H200 machine: the Engram gather and the weight reads on DENSE data, page cache out of
# the way. Builds build-gpu (-j16, sm_90), writes a full-width checkpoint with --layers $LAYERS (default 4;
# 7.4 GB per layer, layer 1 has Engram) and one dense Engram table of $ENGRAM_ROWS rows (264 B per row:
# 40M rows = 10.6 GB; with 4 layers 41 GB of the 64 GB disk), then, each after dropping the page cache:
#   1. bench workload b, $NEXT_PASSES passes (default 3), O_DIRECT weights, the gather at its default
#      queue depth (256) with --engram-next-pass auto (each pass's rows gathered during the pass before),
#      with the disk measurements first (sequential O_DIRECT MB/s with the weight reader's requests;
#      random 4 KiB reads/s at QD 1, 32, 256): the last pass's Engram layer wall vs the others, the
#      gather's IOPS vs the disk's best, weight MB/s vs the disk's sequential rate, the disk's busy time
#      split. (With LAYERS=2 a full-size pass is too short to hold the next pass's gather: the
#      2026-12-02 run, docs/PERFORMANCE.md.)
#   2. the same with --engram-next-pass off, 1 pass (the gather inside its own pass, for comparison);
#   3. SMALL: b with $B_SEQ_SMALL sequences, 2 passes, next pass auto: a pass whose gather fits behind
#      the pass before;
#   3b. CACHED (only when RUNS names it): b, 2 passes, weights through the page cache (--io buffered, the
#      cache not dropped, so the second pass is compute-bound) and the gather from the dense table with
#      O_DIRECT as always: the Engram layer's wall against a plain layer's where reads do not set the pace;
#   4. score of a few sequences in several passes with --engram-next-pass on, off and --engram-io mmap:
#      the output bytes must be identical.
# RUNS picks among 1-3 (default "next nonext small"); DS4R_PROFILE=1 adds the GPU time per region.
# Logs in $OUT (all of them also in $OUT/0-logs.tgz; clocks_<run>.txt: nvidia-smi dmon during each bench
# run); a short table last. Meant to finish in one ~9-minute device call (each bench run is
# capped by BENCH_TIMEOUT).
#   OUT=/tmp/out scripts/gpu_engram_io.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAYERS="${LAYERS:-4}"
MODEL="${DS4R_ENGRAM_MODEL:-/tmp/ds4r-engram-dense-$LAYERS}"
ENGRAM_ROWS="${ENGRAM_ROWS:-40000000}"
B_SEQ="${B_SEQ:-80}"
B_TOK="${B_TOK:-1800}"
B_SEQ_SMALL="${B_SEQ_SMALL:-16}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-200}"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
source scripts/gpu_common.sh
trap pack_logs EXIT
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

run_bench() {  # NAME B_SEQUENCES PASSES DISK_SECONDS EXTRA_FLAGS... (IO=buffered: weights via the page cache, kept)
  local name=$1 seqs=$2 passes=$3 disk=$4
  shift 4
  [ "${IO:-direct}" = direct ] && drop_caches
  start_clock_log "$OUT/clocks_$name.txt"
  timeout "$BENCH_TIMEOUT" "$BIN" bench --model "$MODEL" --workloads b --b-sequences "$seqs" --b-tokens "$B_TOK" \
    --passes "$passes" --io "${IO:-direct}" --disk-seconds "$disk" --csv "$OUT/bench_$name.csv" "$@" \
    > "$OUT/bench_$name.txt" 2> "$OUT/bench_$name.err"
  local rc=$?
  stop_clock_log
  stamp "bench $name ($seqs x $B_TOK, $passes passes, $*) rc=$rc"
}
RUNS="${RUNS:-next nonext small}"  # which of the three bench runs (e.g. RUNS=next)
for n in $RUNS; do
  case $n in
    next) run_bench next "$B_SEQ" "${NEXT_PASSES:-3}" 1 --engram-next-pass auto ;;
    nonext) run_bench nonext "$B_SEQ" 1 0 --engram-next-pass off ;;
    small) run_bench small "$B_SEQ_SMALL" 2 0 --engram-next-pass auto ;;
    cached) IO=buffered run_bench cached "$B_SEQ" 2 0 --engram-next-pass auto ;;
  esac
done

# Byte identity on the dense tables: 6 sequences in 3 passes, next-pass gather on / off / the mmap engine
# (weights through the page cache).
python3 - "$OUT/tokens.jsonl" <<'PY'
import json, random, sys
r = random.Random(7)
with open(sys.argv[1], "w") as f:
    for i in range(6):
        f.write(json.dumps({"id": f"s{i}", "tokens": [r.randrange(129280) for _ in range(96)]}) + "\n")
PY
score_run() {  # NAME FLAGS...
  local name=$1
  shift
  rm -f "$OUT/score_$name.jsonl"
  "$BIN" score --model "$MODEL" --input "$OUT/tokens.jsonl" --output "$OUT/score_$name.jsonl" --io buffered \
    --pass-tokens 200 --progress none "$@" 2> "$OUT/score_$name.err"
  echo "   score $name ($*) rc=$?: $(grep -o 'in [0-9]* passes' "$OUT/score_$name.err" | tail -1)"
}
score_run on --engram-next-pass on
score_run off --engram-next-pass off
score_run mmap --engram-next-pass auto --engram-io mmap
SAME=identical
for n in off mmap; do
  cmp -s "$OUT/score_on.jsonl" "$OUT/score_$n.jsonl" && [ -s "$OUT/score_on.jsonl" ] || SAME=DIFFERENT
done
stamp "score outputs (next pass on / off / mmap engine): $SAME"

echo
echo "---- inspect prediction (H200 defaults 1700 MB/s, 70k IOPS)"; tail -6 "$OUT/inspect.txt"
for n in $RUNS; do
  echo "---- bench $n"
  grep -E "^disk|^workload|weights:|Engram gather|next-pass|disk busy|Engram layers|total .* tokens/s" "$OUT/bench_$n.txt" | sed 's/^ *//'
  grep -E "^  [0-9]+ |layer " "$OUT/bench_$n.txt" | head -4
  awk '/profile \(/{f=1; print; next} f && /^    /{print; next} {f=0}' "$OUT/bench_$n.txt" | head -30
  tail -2 "$OUT/bench_$n.err"
done
echo
printf "%-7s %10s %10s %9s %9s %13s %13s %8s %8s\n" run "rows/s" "IOPS" "stall s" "Engram/oth" "weights MB/s" "busy w/e s" "ready" "wall s"
for n in $RUNS; do
  csv="$OUT/bench_$n.csv"
  v() { grep ",$1," "$csv" 2>/dev/null | head -1 | cut -d, -f8; }
  printf "%-7s %10s %10s %9s %9s %13s %13s %8s %8s\n" "$n" "$(v engram_rows_per_s)" "$(v engram_iops)" "$(v engram_stall_s)" \
    "$(v engram_layer_wall_ratio)" "$(v weights_read_mb_s)" "$(v disk_busy_weights_s)/$(v disk_busy_engram_s)" \
    "$(v engram_tables_ready_at_start)" "$(grep -E '^  total' "$OUT/bench_$n.txt" | head -1 | awk '{print $2}')"
done
echo "disk (next run's probe): $(grep -E ",disk_(seq|iops_qd(1|32|256))," "$OUT/bench_next.csv" | cut -d, -f2,8,9 | tr '\n' ' ')"
echo "(IOPS over the disk's best = the gather's fraction; weights MB/s over disk_seq <= 100% expected; stall and"
echo " Engram/oth are pass 2's for next/small; ready = tables all in when pass 2 began)"
echo "score --engram-next-pass on/off/mmap engine on the dense tables: $SAME; total $(( $(date +%s) - T0 ))s"
