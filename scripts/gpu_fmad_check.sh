#!/usr/bin/env bash
# --fmad=false (the kernels' default since issue 12; head.cu and norm_rope.cu keep --fmad=true, see
# CMakeLists.txt) against --fmad=true everywhere (-DDS4R_CUDA_FMAD=ON, the old flag) on a GPU machine:
# builds both (build-gpu-nofmad, build-gpu-fmad), runs the CUDA and golden test suites with each,
# scores the same input on a random tiny model and on tests/data/tiny-a with each and compares every
# output byte (results JSONL, hidden-state .npy), and times the scoring and `bench --workloads kernels`
# with each. Logs under $OUT (or ./gpu-out/fmad). Last: a summary table.
# Usage: scripts/gpu_fmad_check.sh            (DS4R_ARCHS picks the CUDA architectures, default 90)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}/fmad"
mkdir -p "$OUT"
ARCHS="${DS4R_ARCHS:-90}"
export PATH=/usr/local/cuda/bin:$PATH
declare -A RES
for v in nofmad fmad; do
  flag=OFF; [ "$v" = fmad ] && flag=ON
  t=$(date +%s)
  cmake -S . -B "build-gpu-$v" -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
    -DDS4R_CUDA_FMAD=$flag > "$OUT/configure_$v.log" 2>&1 &&
    cmake --build "build-gpu-$v" -j 16 --target ds4replay ds4r_cuda_tests ds4r_golden_tests > "$OUT/build_$v.log" 2>&1 ||
    { echo "build $v FAILED"; grep -E "error" "$OUT/build_$v.log" | head -30; exit 1; }
  RES[build_$v]="$(( $(date +%s) - t ))s"
  BIN="build-gpu-$v/ds4replay"
  # Test suites (CUDA ops vs CPU, golden teacher-forced / end-to-end on the GPU).
  for suite in ds4r_cuda_tests ds4r_golden_tests; do
    "build-gpu-$v/tests/$suite" > "$OUT/${suite}_$v.log" 2>&1
    RES[${suite}_$v]="rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/${suite}_$v.log" | tr '\n' ' ')"
  done
  # Output bytes: a random tiny model (every layer role) and the golden tiny-a checkpoint.
  [ -f "$OUT/tiny/config.json" ] || "build-gpu-nofmad/ds4replay" make-tiny "$OUT/tiny" --seed 7 --force > /dev/null 2>&1
  python3 - "$OUT/input.jsonl" <<'PY'
import json, random, sys
random.seed(12)
with open(sys.argv[1], "w") as f:
    for i, n in enumerate([1, 2, 3, 17, 64, 150, 300, 500]):
        f.write(json.dumps({"id": f"s{i}", "tokens": [random.randrange(512) for _ in range(n)]}) + "\n")
PY
  for m in tiny tiny-a; do
    dir="$OUT/tiny"; [ "$m" = tiny-a ] && dir=tests/data/tiny-a/model
    rm -rf "$OUT/out_${m}_$v" && mkdir -p "$OUT/out_${m}_$v"
    t=$(date +%s)
    "$BIN" score --model "$dir" --backend cuda --input "$OUT/input.jsonl" --output "$OUT/out_${m}_$v/results.jsonl" \
      --top-k 20 --capture-layers 1,2 --hidden-dir "$OUT/out_${m}_$v/hidden" --progress none \
      2> "$OUT/score_${m}_$v.err"
    RES[score_${m}_$v]="rc=$? $(( $(date +%s) - t ))s"
  done
  # Kernel speed: the GEMM / op benchmarks on the real shapes (a headers-only full-width checkpoint
  # suffices: the kernels use random operands of the config's shapes).
  [ -f "$OUT/fw/model.safetensors.index.json" ] ||
    "build-gpu-nofmad/ds4replay" make-tiny "$OUT/fw" --preset full-width --layers 4 --headers-only --force > /dev/null 2>&1
  "$BIN" bench --model "$OUT/fw" --backend cuda --workloads kernels --iters 20 --csv "$OUT/bench_$v.csv" \
    > "$OUT/bench_$v.txt" 2> "$OUT/bench_$v.err"
  RES[bench_$v]="rc=$?"
done
echo "== --fmad=false (nofmad) vs --fmad=true (fmad)" | tee "$OUT/summary.txt"
for k in build ds4r_cuda_tests ds4r_golden_tests score_tiny score_tiny-a bench; do
  printf "%-22s nofmad: %-60s fmad: %s\n" "$k" "${RES[${k}_nofmad]:-}" "${RES[${k}_fmad]:-}" | tee -a "$OUT/summary.txt"
done
for m in tiny tiny-a; do
  if diff -r "$OUT/out_${m}_nofmad" "$OUT/out_${m}_fmad" > "$OUT/diff_$m.txt" 2>&1; then
    echo "bytes $m: IDENTICAL (results.jsonl + hidden .npy)" | tee -a "$OUT/summary.txt"
  else
    echo "bytes $m: DIFFER ($(wc -l < "$OUT/diff_$m.txt") diff lines, see diff_$m.txt)" | tee -a "$OUT/summary.txt"
  fi
done
echo "kernel TFLOP/s (nofmad | fmad):" | tee -a "$OUT/summary.txt"
# (the CSV quotes the names that hold commas: read it as CSV, not with cut)
python3 - "$OUT/bench_nofmad.csv" "$OUT/bench_fmad.csv" <<'PY' | tee -a "$OUT/summary.txt"
import csv, sys
a, b = ([r for r in csv.reader(open(p, newline=""))][1:] for p in sys.argv[1:3])
for x, y in zip(a, b):
    print(f"{x[1]}|{x[7]}|{y[7]}")
PY
