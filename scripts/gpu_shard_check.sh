#!/usr/bin/env bash
# Sharding on the GPU (issue 16): the golden tiny-a checkpoint scored with the CUDA backend unsharded,
# then as 3 shards run at the same time on the one GPU (`--shard K/3`, each its own output and hidden
# dir), merged with `ds4replay merge`; the merged results and hidden .npy files must be the unsharded
# bytes.
# Usage: scripts/gpu_shard_check.sh   (logs and outputs under $OUT, default ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
source scripts/gpu_common.sh
ensure_gpu_build
MODEL=tests/data/tiny-a/model
d="$OUT/shard"
rm -rf "$d" && mkdir -p "$d"
python3 - tests/data/tiny-a/tokens.jsonl "$d/in.jsonl" <<'EOF'
import json, sys
src = [json.loads(l) for l in open(sys.argv[1])]
long = next(r["tokens"] for r in src if r["id"] == "seq11")
with open(sys.argv[2], "w") as f:
    for i in range(40):
        n = 3 + (i * 11) % 29
        f.write(json.dumps({"id": f"s{i:02d}", "tokens": long[i * 5: i * 5 + n]}) + "\n")
EOF
flags=(--model "$MODEL" --backend cuda --input "$d/in.jsonl" --progress none --top-k 5 --capture-layers 2,6 --pass-tokens 200)
t=$(date +%s)
"$BIN" score "${flags[@]}" --output "$d/ref.jsonl" --hidden-dir "$d/ref-hidden" 2> "$d/ref.err"
rc0=$?
pids=()
for k in 1 2 3; do
  "$BIN" score "${flags[@]}" --shard $k/3 --output "$d/s$k.jsonl" --hidden-dir "$d/h$k" 2> "$d/s$k.err" &
  pids+=($!)
done
rcs=0
for p in "${pids[@]}"; do wait "$p" || rcs=1; done
"$BIN" merge "$d/merged.jsonl" "$d"/s*.jsonl --hidden-dir "$d/merged-hidden" 2> "$d/merge.err"
rcm=$?
same=1
cmp -s "$d/ref.jsonl" "$d/merged.jsonl" || same=0
for L in 2 6; do cmp -s "$d/ref-hidden/hidden_L$L.npy" "$d/merged-hidden/hidden_L$L.npy" || same=0; done
echo "== shard check: unsharded rc=$rc0, shards rc=$rcs, merge rc=$rcm ($(( $(date +%s) - t ))s)"
grep -h "shard " "$d"/s*.err | cut -c1-160
if [ $rc0 -eq 0 ] && [ $rcs -eq 0 ] && [ $rcm -eq 0 ] && [ $same -eq 1 ]; then
  echo "== shard check: PASSED (CUDA, 3 shards merged = unsharded: $(wc -l < "$d/ref.jsonl") records, hidden L2/L6 identical)"
else
  echo "== shard check: FAILED"; tail -n 3 "$d"/*.err; exit 1
fi
