#!/usr/bin/env bash
# Renders a `ds4replay report --html` page in headless Chromium (Debian's chromium, installed when
# missing) and checks it: the page's script ran to its end (data-ds4r-ok="1" in the DOM), no uncaught
# script error (data-ds4r-error, "Uncaught" on the console log), hovering the first scored token
# fills the tooltip, and the screenshot is a real picture (decoded: many colours, not blank).
#
#   scripts/check_report_browser.sh [REPORT.html]
#
# Without an argument it builds a report from the golden tiny-a results (tests/data/tiny-a: the
# expected results with the input's tokens, the tiny tokenizer, one --pairs comparison). Writes the
# screenshot and logs to $OUT (default: a new temporary directory) and prints where. Exit 0 when
# every check passes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$(mktemp -d /tmp/ds4r-report-check.XXXXXX)}"
mkdir -p "$OUT"
BIN="${DS4REPLAY_BIN:-build/ds4replay}"
PY="$(command -v /usr/bin/python3 || command -v python3)"

browser=""
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then browser="$(command -v "$b")"; break; fi
done
if [ -z "$browser" ]; then
  echo "check_report_browser: installing Debian's chromium" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
  browser="$(command -v chromium)"
fi

report="${1:-}"
if [ -z "$report" ]; then
  [ -x "$BIN" ] || { echo "check_report_browser: $BIN not built (scripts/setup.sh)" >&2; exit 2; }
  # Golden results + the input's tokens (what score --echo-tokens writes).
  "$PY" - tests/data/tiny-a/tokens.jsonl tests/data/tiny-a/expected.jsonl "$OUT/results.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1]) as t, open(sys.argv[2]) as r, open(sys.argv[3], "w") as out:
    for tl, rl in zip(t, r):
        rec = json.loads(rl)
        rec["tokens"] = json.loads(tl)["tokens"]
        out.write(json.dumps(rec) + "\n")
EOF
  report="$OUT/report.html"
  "$BIN" report "$OUT/results.jsonl" --model tests/data/tiny-a/model --html "$report" \
    --pairs seq04,seq05 >"$OUT/report.txt"
fi
[ -f "$report" ] || { echo "check_report_browser: no such file: $report" >&2; exit 2; }
url="file://$(cd "$(dirname "$report")" && pwd)/$(basename "$report")#ds4r-check"

profile="$(mktemp -d /tmp/ds4r-chromium.XXXXXX)"
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
  --disable-component-update --disable-sync --disable-extensions --hide-scrollbars
  --user-data-dir="$profile" --enable-logging=stderr --v=0 --virtual-time-budget=5000)
start=$(date +%s)
timeout 120 "$browser" "${flags[@]}" --dump-dom "$url" >"$OUT/dom.html" 2>"$OUT/dom.log" || true
timeout 120 "$browser" "${flags[@]}" --window-size=1280,1400 --screenshot="$OUT/screenshot.png" "$url" \
  >/dev/null 2>"$OUT/screenshot.log" || true
end=$(date +%s)

set +e  # each check below reports its own result
fail=0
check() {  # check NAME CONDITION-EXIT-CODE
  if [ "$2" -eq 0 ]; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi
}
echo "check_report_browser: $report in $("$browser" --version 2>/dev/null | head -1) ($((end - start)) s)"
grep -q 'data-ds4r-ok="1"' "$OUT/dom.html"; check "script ran to the end (data-ds4r-ok)" $?
! grep -q 'data-ds4r-error="' "$OUT/dom.html"; check "no uncaught error in the page" $?
! grep -Eq 'Uncaught|CONSOLE.*(Error|error)' "$OUT/dom.log" "$OUT/screenshot.log"; check "no script error on the console" $?
grep -q 'data-ds4r-tip="ok"' "$OUT/dom.html"; check "hover tooltip shows logprob" $?
"$PY" - "$OUT/screenshot.png" <<'EOF'
# Decodes the PNG (8-bit RGB/RGBA, not interlaced, as Chromium writes it) with the standard library
# and requires a picture: >= 2% non-white pixels and >= 50 distinct colours.
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and ctype in (2, 6) and interlace == 0, "unexpected PNG format"
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours, nonwhite = set(), 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    if y % 4 == 0:
        for x in range(0, w, 4):
            px = bytes(line[x * bpp:x * bpp + 3])
            colours.add(px)
            nonwhite += px != b"\xff\xff\xff"
samples = ((h + 3) // 4) * ((w + 3) // 4)
print("  screenshot %dx%d: %.1f%% non-white, %d colours (sampled)" % (w, h, 100.0 * nonwhite / samples, len(colours)))
sys.exit(0 if nonwhite / samples >= 0.02 and len(colours) >= 50 else 1)
EOF
check "screenshot is a picture" $?
echo "screenshot: $OUT/screenshot.png  (DOM: $OUT/dom.html, logs: $OUT/*.log)"
exit $fail
