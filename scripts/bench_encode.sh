#!/usr/bin/env bash
# Encode throughput of `ds4replay encode` on one core (issue 15: target >= 5 MB/s of text).
#
#   scripts/bench_encode.sh [TOKENIZER_JSON] [MB]
#
# TOKENIZER_JSON defaults to the V4.1 tokenizer of tests/data/tokenizer/ (decompressed to a temp dir).
# The text is MB megabytes (default 32) of JSONL records {"id", "text"}, each ~4 KB: English prose
# (the licence texts of /usr/share/common-licenses), code (this repository's sources) and the 237
# multilingual ground-truth texts, in rotation. Start-up (loading tokenizer.json) is measured on a
# one-line input and subtracted. Prints MB/s of text (the "text" bytes, not the JSON).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${DS4R_BIN:-$root/build/ds4replay}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ds4r-bench-encode-XXXXXX")"
trap 'rm -rf "$work"' EXIT
tok="${1:-}"
if [[ -z "$tok" ]]; then
    tok="$work/tokenizer.json"
    gzip -dc "$root/tests/data/tokenizer/deepseek-v41-tokenizer.json.gz" >"$tok"
fi
mb="${2:-32}"
python3 - "$root" "$work/in.jsonl" "$work/one.jsonl" "$mb" <<'PY'
import glob, json, sys
root, out, one, mb = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
src = []
for p in sorted(glob.glob("/usr/share/common-licenses/*")):
    try: src.append(open(p, encoding="utf-8").read())
    except Exception: pass
for p in sorted(glob.glob(root + "/src/*/*.cpp"))[:40]:
    src.append(open(p, encoding="utf-8").read())
src.append("\n".join(json.loads(l)["text"] for l in open(root + "/tests/data/tokenizer/text_to_ids.jsonl")))
blob = "\n".join(src)
chunks = [blob[i:i + 4096] for i in range(0, len(blob), 4096)]
target, total, n = mb * 1000 * 1000, 0, 0
with open(out, "w") as f:
    while total < target:
        t = chunks[n % len(chunks)]
        f.write(json.dumps({"id": n, "text": t}, ensure_ascii=False) + "\n")
        total += len(t.encode()); n += 1
with open(one, "w") as f:
    f.write(json.dumps({"id": 0, "text": "hello"}) + "\n")
print(total, file=open(out + ".bytes", "w"))
PY
bytes=$(cat "$work/in.jsonl.bytes")
# CPU time (user + sys) of each run, not wall time: the number stays meaningful on a busy machine.
cpu() { python3 -c 'import os,subprocess,sys
p=subprocess.Popen(sys.argv[2:],stdout=open(sys.argv[1],"w"))
_,st,ru=os.wait4(p.pid,0)
sys.exit("failed") if st else print(ru.ru_utime+ru.ru_stime)' "$@"; }
start=$(cpu /dev/null taskset -c 0 "$bin" encode --tokenizer "$tok" "$work/one.jsonl")
total=$(cpu "$work/out.jsonl" taskset -c 0 "$bin" encode --tokenizer "$tok" "$work/in.jsonl")
python3 - "$bytes" "$start" "$total" "$work/out.jsonl" <<'PY'
import json, sys
b, start, run = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ntok = sum(len(json.loads(l)["tokens"]) for l in open(sys.argv[4]))
print(f"text {b/1e6:.1f} MB, {ntok} tokens ({b/ntok:.2f} bytes/token)")
print(f"CPU time: start-up (load tokenizer.json) {start:.2f} s; whole run {run:.2f} s")
print(f"encode throughput, one core: {b/1e6/(run-start):.1f} MB/s of text ({ntok/(run-start)/1e6:.2f} M tokens/s)")
PY
