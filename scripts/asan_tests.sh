#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run of the whole unit test suite (CPU only):
# configures build-asan with -DDS4R_SANITIZE=address -DDS4R_CUDA=OFF, builds ds4r_unit_tests and
# runs every unit test through CTest. Prints the build and test wall times.
#
#   scripts/asan_tests.sh               # JOBS=2 by default; BUILD_DIR=... to build elsewhere
#   FILTER='Prefetch|Checkpoint' scripts/asan_tests.sh   # a subset (CTest -R regex)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-asan}"
jobs="${JOBS:-2}"

t0=$(date +%s)
cmake -S "$root" -B "$build" -DDS4R_SANITIZE=address -DDS4R_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$jobs" --target ds4r_unit_tests
t1=$(date +%s)

# detect_leaks: the prefetcher's buffers and threads must all be released; UBSan stops at the first report.
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=0 strict_init_order=1 ${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1 ${UBSAN_OPTIONS:-}"

args=(--test-dir "$build" -L ds4r_unit_tests --output-on-failure -j"$jobs")
if [[ -n "${FILTER:-}" ]]; then args+=(-R "$FILTER"); fi
status=0
ctest "${args[@]}" || status=$?
t2=$(date +%s)
echo "asan_tests: build $(( t1 - t0 )) s, tests $(( t2 - t1 )) s, status $status (build dir $build)"
exit $status
