#!/usr/bin/env bash
# Layer-level view of the GEMM kernels on a GPU machine, in one call: builds build-gpu (sm_90 with the
# sm_90a kernels unless DS4R_ARCHS says otherwise); runs the GEMM / MoE / head CUDA tests on the
# default kernels (and the MoE / head ones on the portable kernels); benchmarks the kernel table
# (--kernels $KERNELS, default auto: on an H200 the grouped experts at the passes' chunk average are
# timed with both Hopper tile shapes); then workload b from the page cache on a $LAYERS-layer
# full-width checkpoint with DS4R_PROFILE=1 (GPU time per region, moe/* and head/* steps), once with
# the default chunks (8,192 rows at full width on the 22 GB budget: ~128 rows per expert in each MoE
# launch) and once with --max-batch-tokens $SMALL_CHUNK (default 2,420: ~38 rows per expert, where the
# grouped experts take the 64-row tiles).
#   OUT=/tmp/out scripts/gpu_layer_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LAYERS="${LAYERS:-2}"
KERNELS="${KERNELS:-auto}"
SMALL_CHUNK="${SMALL_CHUNK:-2420}"
MODEL="${DS4R_PROFILE_MODEL:-/tmp/ds4r-fullwidth-$LAYERS}"
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - T0 ))s)"; }

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${DS4R_ARCHS:-90-real}" \
  > "$OUT/cmake.log" 2>&1 && cmake --build build-gpu -j "$(nproc)" --target ds4replay ds4r_cuda_tests \
  > "$OUT/build.log" 2>&1 || { echo "build failed"; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
BIN=build-gpu/ds4replay
stamp "built"

tests() {  # NAME KERNELS FILTER
  DS4R_TEST_KERNELS=$2 timeout 300 build-gpu/tests/ds4r_cuda_tests --gtest_filter="$3" > "$OUT/tests_$1.txt" 2>&1
  stamp "tests $1 (--kernels $2, $3): rc=$? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests_$1.txt" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]|Failure" "$OUT/tests_$1.txt" | head -20
  grep -E "^\[sm90\]" "$OUT/tests_$1.txt" | head -40
}
tests default "$KERNELS" "${DS4R_LAYER_TESTS:-CudaGemmSm90*:CudaGemmPaths*:CudaMoe*:CudaHead*}"
tests portable portable "${DS4R_LAYER_PORTABLE_TESTS:-CudaMoe*:CudaHead*}"

"$BIN" make-tiny /tmp/ds4r-fullwidth-headers --preset full-width --layers 1 --headers-only --force -q > /dev/null 2>&1
timeout "${BENCH_TIMEOUT:-200}" "$BIN" bench --model /tmp/ds4r-fullwidth-headers --workloads kernels \
  --kernels "$KERNELS" --csv "$OUT/bench_kernels.csv" > "$OUT/bench_kernels.txt" 2> "$OUT/bench_kernels.err"
stamp "bench kernels rc=$?"
cat "$OUT/bench_kernels.txt"

[ -f "$MODEL/model.safetensors.index.json" ] ||
  "$BIN" make-tiny "$MODEL" --preset full-width --layers "$LAYERS" --seed 1 --force -q > "$OUT/make_tiny.log" 2>&1
stamp "make-tiny $LAYERS layers"
for mem in default "$SMALL_CHUNK"; do
  extra=()
  [ "$mem" = default ] || extra=(--max-batch-tokens "$mem")
  DS4R_PROFILE=1 timeout "${BENCH_TIMEOUT:-200}" "$BIN" bench --model "$MODEL" --workloads b --io buffered \
    --read-threads 8 --kernels "$KERNELS" "${extra[@]}" --csv "$OUT/bench_b_$mem.csv" \
    > "$OUT/bench_b_$mem.txt" 2> "$OUT/bench_b_$mem.err"
  stamp "bench b, chunks $mem: rc=$?"
  grep -E "^workload|^total|layer GEMM|GPU memory" "$OUT/bench_b_$mem.txt" | sed 's/^ *//'
  grep -E "^  [0-9]+ |^  head|layer " "$OUT/bench_b_$mem.txt" | head -6
  awk '/profile \(/{f=1; print; next} f && /^    /{print; next} {f=0}' "$OUT/bench_b_$mem.txt" | head -24
  tail -2 "$OUT/bench_b_$mem.err"
done
stamp "done"
