#!/usr/bin/env bash
# score --devices on the GPU (issue 16): the multi-device path (one weight reader, one worker thread
# and CUDA backend per entry) must give the bytes of a one-device run.
#  1. the CUDA tests CudaDevices.* (golden tiny-a: --devices 0,0 / 0,0,0 / 0,1 vs --device 0);
#  2. golden tiny-a through the binary: --device 0 vs --devices 0,0 and 0,0,0 (and 0,1 and all when
#     2+ GPUs are visible), results + hidden L2/L6 compared with cmp; then a --devices 0,0 output cut in
#     the middle of a line and finished with --resume --devices 0,0,0;
#  3. a full-width synthetic checkpoint (make-tiny --preset full-width, 4 layers): --device 0 vs
#     --devices 0,0, compared, with the wall time of each (on one card 0,0 is a code-path check, not
#     a speed-up: the two workers share the GPU).
# Usage: scripts/gpu_devices_check.sh   (build in build-gpu with -j16; logs and outputs under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
source scripts/gpu_common.sh
ensure_gpu_build
cmake --build build-gpu -j16 --target ds4r_cuda_tests >"$OUT/devices_build.log" 2>&1 || { echo "build failed"; tail -20 "$OUT/devices_build.log"; exit 1; }
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
declare -a rows
fail=0
row() { rows+=("$(printf '%-44s %-8s %s' "$1" "$2" "$3")"); [ "$2" = PASS ] || [ "$2" = SKIP ] || fail=1; }

# 1. CUDA tests
build-gpu/tests/ds4r_cuda_tests --gtest_filter='CudaDevices*' >"$OUT/devices_gtest.log" 2>&1
if [ $? -eq 0 ]; then row "gtest CudaDevices.*" PASS "$(grep -c '\[       OK \]' "$OUT/devices_gtest.log") ok, $(grep -c '\[  SKIPPED \]' "$OUT/devices_gtest.log") skipped"
else row "gtest CudaDevices.*" FAIL "see devices_gtest.log"; fi

# 2. golden tiny-a through the binary
d="${DS4R_DEVICES_WORK:-/tmp/ds4r-devices}"  # outputs stay on the machine; logs go to $OUT
rm -rf "$d" && mkdir -p "$d"
MODEL=tests/data/tiny-a/model
flags=(--model "$MODEL" --backend cuda --input tests/data/tiny-a/tokens.jsonl --progress none --capture-layers 2,6 --pass-tokens 300)
"$BIN" score "${flags[@]}" --device 0 --output "$d/one.jsonl" --hidden-dir "$d/one-h" 2>"$d/one.err" || { row "tiny-a --device 0" FAIL "rc $?"; }
same() {  # same NAME: results and hidden files of run NAME equal the one-device run's
  cmp -s "$d/one.jsonl" "$d/$1.jsonl" && cmp -s "$d/one-h/hidden_L2.npy" "$d/$1-h/hidden_L2.npy" &&
    cmp -s "$d/one-h/hidden_L6.npy" "$d/$1-h/hidden_L6.npy"
}
lists=("0,0" "0,0,0")
[ "$NGPU" -ge 2 ] && lists+=("0,1" "all")
for l in "${lists[@]}"; do
  n="m${l//,/}"
  t0=$(date +%s.%N)
  "$BIN" score "${flags[@]}" --devices "$l" --output "$d/$n.jsonl" --hidden-dir "$d/$n-h" 2>"$d/$n.err"
  rc=$?
  dt=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
  if [ $rc -eq 0 ] && same "$n"; then row "tiny-a --devices $l" PASS "identical bytes (${dt} s)"
  else row "tiny-a --devices $l" FAIL "rc $rc; see $n.err"; fi
done
# resume: cut the 0,0 output in the middle of its 5th line, finish with 3 workers
head -c "$(head -n 4 "$d/m00.jsonl" | wc -c)" "$d/m00.jsonl" >"$d/res.jsonl"
sed -n 5p "$d/m00.jsonl" | head -c 100 >>"$d/res.jsonl"
cp "$d/m00.jsonl.run.json" "$d/res.jsonl.run.json" 2>/dev/null
cp -r "$d/m00-h" "$d/res-h"
"$BIN" score "${flags[@]}" --devices 0,0,0 --resume --output "$d/res.jsonl" --hidden-dir "$d/res-h" 2>"$d/res.err"
rc=$?
if [ $rc -eq 0 ] && same res; then row "tiny-a truncated, --resume --devices 0,0,0" PASS "identical bytes"
else row "tiny-a truncated, --resume --devices 0,0,0" FAIL "rc $rc; see res.err"; fi

# 3. full-width synthetic checkpoint (DS4R_DEVICES_FULLWIDTH=0 skips it: ~30 GB written, two 4-layer runs)
if [ "${DS4R_DEVICES_FULLWIDTH:-1}" = 1 ]; then
FW=/tmp/ds4r-fullwidth-4
declare -A fw_t
ensure_fullwidth_model "$FW" 4 "$OUT/devices_make_tiny.log"
python3 - "$d/fw.jsonl" <<'PY'
import json, random, sys
random.seed(16)
with open(sys.argv[1], "w") as f:
    for i in range(24):
        f.write(json.dumps({"id": i, "tokens": [random.randrange(1000) for _ in range(300 + 37 * i)]}) + "\n")
PY
fwflags=(--model "$FW" --backend cuda --input "$d/fw.jsonl" --progress none --allow-zero-weights --pass-tokens 8000 --capture-layers 2)
for l in one "0,0"; do
  n="fw${l//,/}"
  t0=$(date +%s.%N)
  if [ "$l" = one ]; then "$BIN" score "${fwflags[@]}" --device 0 --output "$d/$n.jsonl" --hidden-dir "$d/$n-h" 2>"$d/$n.err"
  else "$BIN" score "${fwflags[@]}" --devices "$l" --output "$d/$n.jsonl" --hidden-dir "$d/$n-h" 2>"$d/$n.err"; fi
  rc=$?
  dt=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
  echo "$n rc=$rc ${dt} s" >>"$d/fw_times.txt"
  [ $rc -eq 0 ] || row "full-width 4 layers, $l" FAIL "rc $rc; see $n.err"
  fw_t[$n]=$dt
done
if cmp -s "$d/fwone.jsonl" "$d/fw00.jsonl" && cmp -s "$d/fwone-h/hidden_L2.npy" "$d/fw00-h/hidden_L2.npy"; then
  row "full-width 4 layers: --devices 0,0 vs --device 0" PASS "identical bytes; ${fw_t[fwone]:-?} s vs ${fw_t[fw00]:-?} s"
else row "full-width 4 layers: --devices 0,0 vs --device 0" FAIL "outputs differ (or a run failed)"; fi
grep -h "device .*(worker" "$d/fw00.err" | tail -n 2 | cut -c1-160
else row "full-width 4 layers: --devices 0,0 vs --device 0" SKIP "DS4R_DEVICES_FULLWIDTH=0"; fi

echo "== devices check ($NGPU GPU(s) visible)"
printf '%s\n' "${rows[@]}"
[ $fail -eq 0 ] && echo "== devices check: PASSED" || { echo "== devices check: FAILED"; exit 1; }
