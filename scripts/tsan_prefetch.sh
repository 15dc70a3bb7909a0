#!/usr/bin/env bash
# ThreadSanitizer run of the prefetching weight source's tests (the pool of reader threads with several
# requests in flight, the completion thread, the fake asynchronous copy queue, slot recycling, schedule
# churn, a failed request stopping the other readers, stop mid-read, DirectReader used by several
# threads) and of the pass runner's chunk state ring and out-of-memory retry on that asynchronous queue
# (ChunkRing, ChunkRetry), and the Engram gather's engines (the pread pool, io_uring, mmap threads, the
# pass gather's background thread: EngramGather, EngramPassGather, EngramRowPlan; the rows' dequant threads:
# EngramRowDequant; the next pass's gather
# during the current pass, its gate and an exception mid-pass with it in flight: EngramNextPass; the next
# chunk's Engram rows dequantized while the chunk before computes: EngramInTheSweep), and
# score --devices (the worker threads behind one fan-out weight reader: MultiDevice, ScoreDevices). CPU
# only: configures build-tsan with -DDS4R_SANITIZE=thread -DDS4R_CUDA=OFF,
# builds ds4r_unit_tests and runs those tests through CTest; any TSan report fails the run (exit != 0).
#
#   scripts/tsan_prefetch.sh            # JOBS=2 by default; BUILD_DIR=... to build elsewhere
#   REPEAT=5 scripts/tsan_prefetch.sh   # run the tests several times (races are timing dependent)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-tsan}"
jobs="${JOBS:-2}"
repeat="${REPEAT:-3}"

cmake -S "$root" -B "$build" -DDS4R_SANITIZE=thread -DDS4R_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$jobs" --target ds4r_unit_tests

# halt_on_error: the first race fails the test; second_deadlock_stack: full lock-order reports.
# suppressions: liburing's ring memory, mapped behind TSan's back (see the file).
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$root/tests/tsan.supp ${TSAN_OPTIONS:-}"

start=$(date +%s)
ctest --test-dir "$build" -R 'Prefetch|DirectReader|Chunk|EngramGather|EngramPassGather|EngramRowPlan|EngramRowDequant|EngramNextPass|EngramInTheSweep|MultiDevice|ScoreDevices' --output-on-failure --repeat until-fail:"$repeat"
echo "tsan_prefetch: passed in $(( $(date +%s) - start )) s (build dir $build)"
