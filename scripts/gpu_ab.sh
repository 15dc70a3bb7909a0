#!/usr/bin/env bash
# A same-run A/B of a code change: speed is reported side by side with the baseline of the same run
# (docs/PERFORMANCE.md). Builds ds4replay from this tree (B) and from this tree with PATCH reversed (A) in
# one build folder, one after the other (the second build recompiles only what the patch touches), runs
# the same command with each binary, A first, and prints each CSV row of both: name | A | B | B / A.
#
# PATCH: the change from A to B, made where the tree is checked out, e.g. (.ab/ is git-ignored)
#   mkdir -p .ab && git diff main next/tail-split > .ab/ab.patch   (then check out B; carry .ab to the GPU)
# The tree must hold B when the script starts; it holds B again when the script ends (also on an error or
# Ctrl-C). The command follows `--`; the script adds `--csv FILE`. Output in $OUT (default ./gpu-out):
# ab_A.txt / ab_B.txt (each run's stdout and stderr), ab_A.csv / ab_B.csv, ab.txt (the side-by-side rows).
#   OUT=/tmp/out scripts/gpu_ab.sh .ab/ab.patch -- bench --model M --workloads kernels --kernel-filter "routed rows"
# BUILD_DIR (default build-gpu; a configured one keeps its settings unless DS4R_ARCHS is given), DS4R_ARCHS
# (default 90-real) and JOBS (default nproc) set the build.
set -uo pipefail
cd "$(dirname "$0")/.."
PATCH="${1:?usage: scripts/gpu_ab.sh PATCH -- COMMAND...}"
shift
[ "${1:-}" = "--" ] || { echo "usage: scripts/gpu_ab.sh PATCH -- COMMAND..." >&2; exit 2; }
shift
[ $# -gt 0 ] || { echo "gpu_ab.sh: no command after --" >&2; exit 2; }
[ -f "$PATCH" ] || { echo "gpu_ab.sh: no patch file $PATCH" >&2; exit 2; }
OUT="${OUT:-$PWD/gpu-out}"
BUILD_DIR="${BUILD_DIR:-build-gpu}"
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH

# the patch tool: git apply where git is there (it also works outside a repository), else patch
apply_patch() {  # apply_patch [-R] [--check]
  local reverse= check=
  for a in "$@"; do
    case $a in -R) reverse=1 ;; --check) check=1 ;; esac
  done
  if command -v git > /dev/null; then
    git apply ${reverse:+-R} ${check:+--check} "$PATCH"
  else
    patch -p1 -s -f ${reverse:+-R} ${check:+--dry-run} < "$PATCH"
  fi
}
apply_patch -R --check || { echo "gpu_ab.sh: $PATCH does not reverse cleanly: does the tree hold B?" >&2; exit 2; }

REVERSED=0
restore() { if [ "$REVERSED" = 1 ]; then apply_patch && REVERSED=0; fi; }
trap 'restore' EXIT
trap 'restore; exit 130' INT TERM

# a build folder that is configured already keeps its settings unless DS4R_ARCHS is given
configure() {
  [ -f "$BUILD_DIR/CMakeCache.txt" ] && [ -z "${DS4R_ARCHS:-}" ] && return 0
  local cuda=OFF
  command -v nvcc > /dev/null && cuda=ON
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=$cuda \
    -DCMAKE_CUDA_ARCHITECTURES="${DS4R_ARCHS:-90-real}" > "$OUT/ab_configure.log" 2>&1
}
build() {  # build NAME: the ds4replay binary of the tree as it is now, copied to $OUT/ds4replay_NAME
  cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target ds4replay > "$OUT/ab_build_$1.log" 2>&1 ||
    { echo "gpu_ab.sh: build $1 failed (see $OUT/ab_build_$1.log)" >&2; grep -E "error" "$OUT/ab_build_$1.log" | head -20 >&2; return 1; }
  cp "$BUILD_DIR/ds4replay" "$OUT/ds4replay_$1"
}

t0=$(date +%s)
configure || { echo "gpu_ab.sh: configure failed (see $OUT/ab_configure.log)" >&2; exit 1; }
apply_patch -R && REVERSED=1 || { echo "gpu_ab.sh: cannot reverse $PATCH" >&2; exit 1; }
build A || exit 1
restore
[ "$REVERSED" = 0 ] || { echo "gpu_ab.sh: cannot re-apply $PATCH: the tree is left as A" >&2; exit 1; }
build B || exit 1
echo "== built A and B ($(( $(date +%s) - t0 ))s)"

for v in A B; do
  s=$(date +%s)
  "$OUT/ds4replay_$v" "$@" --csv "$OUT/ab_$v.csv" > "$OUT/ab_$v.txt" 2>&1
  echo "== $v: rc=$? ($(( $(date +%s) - s ))s)"
done

python3 - "$OUT/ab_A.csv" "$OUT/ab_B.csv" <<'PY' | tee "$OUT/ab.txt"
import csv, sys

def rows(path):
    try:
        with open(path, newline="") as f:
            r = list(csv.reader(f))
    except OSError:
        return {}, []
    out, order = {}, []
    for row in r[1:]:
        if len(row) < 9:
            continue
        key = (row[0], row[1], row[2], row[4], row[5], row[6])  # section, name, layer, m, n, k
        out[key] = (float(row[7]), row[8])
        order.append(key)
    return out, order

a, order = rows(sys.argv[1])
b, order_b = rows(sys.argv[2])
order += [k for k in order_b if k not in a]
print("section | name | layer | m n k | A | B | B / A | unit")
for k in order:
    va = a.get(k, (None, ""))[0]
    vb, unit = b.get(k, (None, a.get(k, (None, ""))[1]))
    ratio = f"{vb / va:.3f}" if va and vb is not None else "-"
    fa = "-" if va is None else f"{va:.6g}"
    fb = "-" if vb is None else f"{vb:.6g}"
    print(f"{k[0]} | {k[1]} | {k[2]} | {k[3]} {k[4]} {k[5]} | {fa} | {fb} | {ratio} | {unit}")
PY
