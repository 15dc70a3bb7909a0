#!/usr/bin/env bash
# The Hopper wgmma kernels (issue 13) on an H100 / H200: builds build-gpu (sm_90 + the sm_90a kernels)
# with the CUDA tests; checks the SASS for QGMMA / HGMMA and local-memory spills; runs the
# Hopper-vs-portable-vs-CPU comparisons (their "[sm90]" lines are the numbers of docs/PERFORMANCE.md)
# and the portable kernels' reference tests; benchmarks the kernel table with --kernels portable and
# --kernels auto and hopper-fp8 in turn (each against cuBLAS in the same run). Output under $OUT; summary last.
# Usage: scripts/gpu_hopper.sh [WORKLOADS]   (default: kernels; e.g. kernels,b adds workload b)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
WORKLOADS="${1:-kernels}"
export PATH=/usr/local/cuda/bin:$PATH
t=$(date +%s)
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${DS4R_ARCHS:-90-real}" > "$OUT/cmake.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" --target ds4replay ds4r_cuda_tests > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; grep -E "error|Error" "$OUT/build.log" | head -30; exit 1; }
echo "== build: $(( $(date +%s) - t ))s"
BIN=build-gpu/ds4replay

obj=$(find build-gpu -name 'gemm_sm90.cu.o' | head -1)
if command -v cuobjdump >/dev/null && [ -n "$obj" ]; then
  cuobjdump -sass "$obj" > "$OUT/sm90.sass" 2>&1
  echo "== SASS of $obj: QGMMA $(grep -c QGMMA "$OUT/sm90.sass"), HGMMA $(grep -c HGMMA "$OUT/sm90.sass"), HMMA $(grep -c 'HMMA' "$OUT/sm90.sass"), local STL $(grep -c 'STL' "$OUT/sm90.sass") LDL $(grep -c 'LDL' "$OUT/sm90.sass")"
fi

t=$(date +%s)
timeout 300 build-gpu/tests/ds4r_cuda_tests --gtest_filter="${DS4R_HOPPER_TESTS:-CudaGemmSm90*:CudaGemmPaths*}" \
  > "$OUT/hopper_tests.txt" 2>&1
echo "== hopper tests rc=$? ($(( $(date +%s) - t ))s)"
grep -E "^\[sm90\]|Failure|FAILED|PASSED|\[  (OK|SKIPPED) \]" "$OUT/hopper_tests.txt" | head -80

# the golden / role tests on the Hopper kernels (both partial variants)
for k in ${DS4R_HOPPER_GOLDEN-hopper hopper-fp8}; do
  t=$(date +%s)
  DS4R_TEST_KERNELS=$k timeout 300 build-gpu/tests/ds4r_cuda_tests \
    --gtest_filter='CudaGolden*:CudaRoles*:CudaLinear*:CudaMoe*:CudaHead*' > "$OUT/golden_$k.txt" 2>&1
  echo "== golden / roles / linear / moe / head tests on --kernels $k: rc=$? ($(( $(date +%s) - t ))s)"
  grep -E "Failure|FAILED|PASSED|Expected|Which is|actual|bound" "$OUT/golden_$k.txt" | head -40
done

MODEL=/tmp/ds4r-fullwidth-headers
if [ "$WORKLOADS" = kernels ]; then
  "$BIN" make-tiny "$MODEL" --preset full-width --layers 1 --headers-only --force -q > /dev/null 2>&1
else
  MODEL=/tmp/ds4r-fullwidth-4
  [ -f "$MODEL/model.safetensors.index.json" ] || "$BIN" make-tiny "$MODEL" --preset full-width --layers 4 --seed 1 --force -q
fi
for k in ${DS4R_HOPPER_BENCH-portable auto hopper-fp8}; do
  t=$(date +%s)
  timeout "${BENCH_TIMEOUT:-200}" "$BIN" bench --model "$MODEL" --workloads "$WORKLOADS" --kernels "$k" \
    --csv "$OUT/bench_$k.csv" ${DS4R_BENCH_ARGS:-} > "$OUT/bench_$k.txt" 2> "$OUT/bench_$k.err"
  echo "== bench --kernels $k rc=$? ($(( $(date +%s) - t ))s)"
  tail -3 "$OUT/bench_$k.err"
  cat "$OUT/bench_$k.txt"
done
