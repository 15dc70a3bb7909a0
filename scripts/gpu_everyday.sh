#!/usr/bin/env bash
# Issue 11 on a GPU machine: progress within a layer on the CUDA backend (a long sequence on a
# full-width synthetic checkpoint), -q silencing it, --top-k 0 and the echoed tokens on CUDA.
# Usage: scripts/gpu_everyday.sh   (logs under $OUT, default ./gpu-out; summary table last)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
MODEL="${DS4R_BENCH_MODEL:-/tmp/ds4r-fullwidth-4}"
source scripts/gpu_common.sh
ensure_gpu_build
ensure_fullwidth_model "$MODEL" 4 "$OUT/make_tiny.log"
in="$OUT/everyday_input.jsonl"
python3 - "$in" <<'PY'
import json, random, sys
random.seed(11)
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"id": "long", "tokens": [random.randrange(129280) for _ in range(32768)]}) + "\n")
    f.write(json.dumps({"id": "short", "tokens": [random.randrange(129280) for _ in range(40)]}) + "\n")
PY
rm -f "$OUT"/everyday_*.jsonl.out
"$BIN" score --model "$MODEL" --backend cuda --input "$in" --output "$OUT/everyday_plain.jsonl.out" \
  --max-batch-tokens 1024 --progress plain 2> "$OUT/everyday_plain.err"
rc1=$?
within=$(grep -c "tokens of the layer done" "$OUT/everyday_plain.err")
"$BIN" score --model "$MODEL" --backend cuda --input "$in" --output "$OUT/everyday_quiet.jsonl.out" \
  --max-batch-tokens 1024 --progress plain --top-k 0 -q 2> "$OUT/everyday_quiet.err"
rc2=$?
quiet_lines=$(wc -l < "$OUT/everyday_quiet.err")
same=$(python3 - "$OUT/everyday_plain.jsonl.out" "$OUT/everyday_quiet.jsonl.out" "$in" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
inp = [json.loads(l) for l in open(sys.argv[3])]
ok = len(a) == len(b) == 2
for x, y, i in zip(a, b, inp):
    ok &= x["logprob"] == y["logprob"] and x["tokens"] == i["tokens"] == y["tokens"]
    ok &= "topk_ids" not in y and "topk_ids" not in y["final"] and len(x["topk_ids"][0]) == 8
print("yes" if ok else "no")
PY
)
grep "tokens of the layer done" "$OUT/everyday_plain.err" | head -3
echo "== gpu_everyday summary"
printf "%-44s %s\n" "score --progress plain (rc)" "$rc1" \
  "lines of progress within a layer (want > 0)" "$within" \
  "score -q --top-k 0 (rc)" "$rc2" \
  "stderr lines with -q (want 0)" "$quiet_lines" \
  "same logprobs, tokens echoed, top-k 0 fields gone" "$same"
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$within" -gt 0 ] && [ "$quiet_lines" -eq 0 ] && [ "$same" = yes ]
