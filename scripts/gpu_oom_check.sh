#!/usr/bin/env bash
# Out-of-memory recovery on a GPU machine, end to end (docs/DESIGN.md section 6): scores the same input on a
# full-width synthetic checkpoint twice with the CUDA backend, once with a GPU budget too small for the
# forced chunk size (the pass runner must halve its chunks and run the pass again) and once with small
# chunks and the normal budget; the two outputs must be the same bytes.
# Usage: scripts/gpu_oom_check.sh [BUDGET_GB]   (default 17: two 7.55 GB weight slots + ~1.9 GB)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUDGET="${1:-17}"
MODEL="${DS4R_BENCH_MODEL:-/tmp/ds4r-fullwidth-4}"
source scripts/gpu_common.sh
ensure_gpu_build
ensure_fullwidth_model "$MODEL" 4 "$OUT/make_tiny.log"
in="$OUT/oom_input.jsonl"
python3 - "$in" <<'EOF'
import json, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for i, n in enumerate([3000, 2500, 1, 17, 3001]):
        f.write(json.dumps({"id": f"s{i}", "tokens": [random.randrange(129280) for _ in range(n)]}) + "\n")
EOF
t=$(date +%s)
"$BIN" score --model "$MODEL" --backend cuda --gpu-memory-gb "$BUDGET" --input "$in" --output "$OUT/oom_small_budget.jsonl" \
  --max-batch-tokens 8192 --progress none 2> "$OUT/oom_small_budget.err"
rc1=$?
"$BIN" score --model "$MODEL" --backend cuda --input "$in" --output "$OUT/oom_reference.jsonl" \
  --max-batch-tokens 1000 --progress none 2> "$OUT/oom_reference.err"
rc2=$?
echo "== small budget ($BUDGET GB, chunks of 8192 forced): rc=$rc1; reference (chunks of 1000): rc=$rc2 ($(( $(date +%s) - t ))s)"
grep -E "out of backend memory|chunks of" "$OUT/oom_small_budget.err" | cut -c1-220
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$OUT/oom_small_budget.jsonl" "$OUT/oom_reference.jsonl"; then
  echo "== oom check: PASSED (identical outputs, $(wc -l < "$OUT/oom_reference.jsonl") records)"
else
  echo "== oom check: FAILED"; tail -3 "$OUT/oom_small_budget.err" "$OUT/oom_reference.err"; exit 1
fi
