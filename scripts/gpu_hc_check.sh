#!/usr/bin/env bash
# Issue 10 on a GPU machine: the accurate mHC mix accumulation and the long fp32 reductions.
# Builds build-gpu (sm_90, -j16), runs the CUDA tests that touch them (hc accumulation variants vs the
# CPU's fp64 sums on the golden data, the norm / mHC / Engram op tests, teacher-forced and end to end
# on the golden checkpoint, the role-pattern checkpoint CPU vs CUDA) and times the hc_mixes kernel
# for every variant at M = 8192 rows, D = 5120 (`bench --workloads kernels`, full-width checkpoint).
# Logs under $OUT (teacher_forced_cuda.txt / _cpu.txt: the per-layer tables); a summary table last.
# Usage: scripts/gpu_hc_check.sh      (DS4R_HC_ROWS=8192 by default)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
ROWS="${DS4R_HC_ROWS:-8192}"
t=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real \
  > "$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j16 --target ds4replay ds4r_cuda_tests ds4r_golden_tests > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
echo "== build: $(( $(date +%s) - t ))s"

FILTER='CudaHcAccum.*:CudaMisc.RmsNorm*:CudaMisc.HcMixes*:CudaMisc.EngramUpdate*:CudaGolden.*:CudaRoles.*'
t=$(date +%s)
DS4R_REPORT_DIR="$OUT" build-gpu/tests/ds4r_cuda_tests --gtest_filter="$FILTER" > "$OUT/cuda_tests.log" 2>&1
cuda_rc=$?
echo "== CUDA tests rc=$cuda_rc ($(( $(date +%s) - t ))s)"
t=$(date +%s)
DS4R_REPORT_DIR="$OUT" build-gpu/tests/ds4r_golden_tests > "$OUT/golden_cpu_tests.log" 2>&1
golden_rc=$?
echo "== CPU golden tests rc=$golden_rc ($(( $(date +%s) - t ))s)"

# Timing: the kernels workload on a 1-layer full-width checkpoint (V4.1 dims: D = 5120, hc = 4).
source scripts/gpu_common.sh
BIN=build-gpu/ds4replay
MODEL="${DS4R_BENCH_MODEL:-/tmp/ds4r-fullwidth-1}"
ensure_fullwidth_model "$MODEL" 1 "$OUT/make_tiny.log"
"$BIN" bench --model "$MODEL" --workloads kernels --kernel-rows "$ROWS" --csv "$OUT/bench.csv" \
  > "$OUT/bench.txt" 2> "$OUT/bench.err"
bench_rc=$?
echo "== bench rc=$bench_rc"

echo
echo "== summary (issue 10)"
printf '%-14s %-60s\n' "what" "result"
grep -E '^hc_accum ' "$OUT/cuda_tests.log" | sed 's/^/accuracy       /'
grep -E 'hc_mixes \(M' "$OUT/bench.txt" | sed 's/^ */time           /'
grep -E '^(worst outside|head: worst|CUDA vs reference|CUDA vs CPU backend|tiny-roles CUDA vs CPU)' "$OUT/cuda_tests.log" |
  sed 's/^/cuda golden    /'
grep -E '^\[  (PASSED|FAILED) ' "$OUT/cuda_tests.log" | sed 's/^/cuda tests     /'
grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/cuda_tests.log" | sed 's/^/cuda tests     /'
grep -E '^\[  (PASSED|FAILED) ' "$OUT/golden_cpu_tests.log" | sed 's/^/cpu golden     /'
echo "(* = the default variant, kernels/hc.cuh kHcMixAccumDefault; time in ms per call)"
[ "$cuda_rc" = 0 ] && [ "$golden_rc" = 0 ] && [ "$bench_rc" = 0 ]
