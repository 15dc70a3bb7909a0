#!/usr/bin/env bash
# The CUDA test suite on a GPU machine, in one call: build (sm_90 unless DS4R_ARCHS is set), CUDA op tests,
# golden tests on the GPU, selftest, and compute-sanitizer memcheck/racecheck on the kernel tests.
# Logs go to $OUT (or ./gpu-out), and all of them into $OUT/0-logs.tgz on exit. Usage: scripts/gpu_suite.sh [quick|full|gpu]
# On compute capability 9.0 the CUDA tests run twice: Hopper kernels (auto) and DS4R_TEST_KERNELS=portable.
# DS4R_SANITIZER_FILTER narrows the compute-sanitizer runs (gtest filter; default every Cuda* test but golden),
# DS4R_PORTABLE_FILTER the portable rerun (default all).
# (gpu: everything of full but the CPU unit and golden suites, which are CI's job).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
MODE="${1:-full}"
ARCHS="${DS4R_ARCHS:-90}"
source scripts/gpu_common.sh
trap pack_logs EXIT
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv; nvcc --version | tail -2; ldd --version | head -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$OUT/summary.txt"
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" > "$OUT/configure.log" 2>&1 || { log "configure FAILED"; tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" --target ds4replay ds4r_cuda_tests > "$OUT/build.log" 2>&1 || { log "build FAILED"; grep -E "error" "$OUT/build.log" | head -40; exit 1; }
# The CPU suites are CI's job; build them too but do not stop the GPU run if they fail here.
cmake --build build-gpu -j "$(nproc)" --target ds4r_unit_tests ds4r_golden_tests >> "$OUT/build.log" 2>&1 || log "CPU test targets failed to build (see build.log)"
log "build ok ($(( $(date +%s) - t0 ))s)"
cd build-gpu
export DS4R_REPORT_DIR="$OUT"
run() {  # name, command...
  local name=$1; shift
  local s=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: rc=$rc ($(( $(date +%s) - s ))s) $(grep -E '^\[  (PASSED|FAILED)  \]|tests? ran|selftest (passed|FAILED)|ERROR SUMMARY' "$OUT/$name.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/$name.log" | head -20 | tee -a "$OUT/summary.txt"
}
run cuda_tests ./tests/ds4r_cuda_tests
# On an H100 / H200 the run above used the Hopper wgmma kernels (--kernels auto); the portable ones too:
if nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | grep -q '^9\.0'; then
  DS4R_TEST_KERNELS=portable run cuda_tests_portable ./tests/ds4r_cuda_tests --gtest_filter="${DS4R_PORTABLE_FILTER:-*}"
fi
run selftest ./ds4replay selftest --backend cuda
if [ "$MODE" != quick ]; then
  if [ "$MODE" != gpu ]; then
    run unit_tests ./tests/ds4r_unit_tests
    run golden_tests ./tests/ds4r_golden_tests
  fi
  # kill -9 / SIGINT / SIGTERM and --resume with the CUDA backend (the unit suite runs them on the CPU)
  DS4R_RESUME_BACKEND=cuda run resume_cuda ./tests/ds4r_unit_tests --gtest_filter='Resume*'
  export DS4R_SANITIZER_RUN=1
  FILTER="${DS4R_SANITIZER_FILTER:-Cuda*:-CudaGolden*}"
  SAN_TIMEOUT="${DS4R_SANITIZER_TIMEOUT:-240}"
  run memcheck timeout "$SAN_TIMEOUT" compute-sanitizer --tool memcheck --error-exitcode 9 ./tests/ds4r_cuda_tests --gtest_filter="$FILTER"
  if [ "$MODE" = full ] || [ "$MODE" = gpu ]; then
    run racecheck timeout "$SAN_TIMEOUT" compute-sanitizer --tool racecheck --error-exitcode 9 ./tests/ds4r_cuda_tests --gtest_filter="$FILTER"
  fi
fi
log "total $(( $(date +%s) - t0 ))s"
