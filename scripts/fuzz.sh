#!/usr/bin/env bash
# Fuzz the parsers with libFuzzer (docs/DESIGN.md section 6). Not part of CI.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Configures and builds build-fuzz with clang when needed (ASan + UBSan + libFuzzer), then runs each
# target (default: every tests/fuzz/fuzz_*.cpp) for SECONDS (default 60) over a scratch copy of its
# seed corpus tests/fuzz/corpus/<target>/ (the seeds are never modified). Crashing inputs are kept in
# tests/fuzz/crashers/<target>-crash-<sha1> (and leak-/timeout-/oom-); reproduce one with
#   build-fuzz/tests/fuzz/<target> tests/fuzz/crashers/<file>
# Environment: JOBS (build parallelism, default 2), BUILD_DIR (default build-fuzz), FUZZ_ARGS (extra
# libFuzzer flags), KEEP_CORPUS=1 (print the scratch corpus directory instead of deleting it).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build-fuzz}"
secs="${1:-60}"
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ "$secs" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/fuzz.sh [SECONDS] [TARGET...]" >&2
    exit 2
fi

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    for f in "$root"/tests/fuzz/fuzz_*.cpp; do
        [[ -e "$f" ]] && targets+=("$(basename "$f" .cpp)")
    done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "fuzz.sh: no tests/fuzz/fuzz_*.cpp targets" >&2
    exit 2
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then
    CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DDS4R_FUZZ=ON -DDS4R_CUDA=OFF -DDS4R_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"

crashers="$root/tests/fuzz/crashers"
mkdir -p "$crashers"
summary=()
failed=0
for t in "${targets[@]}"; do
    bin="$build/tests/fuzz/$t"
    work="$(mktemp -d "${TMPDIR:-/tmp}/ds4r-fuzz-$t-XXXXXX")"
    mkdir -p "$work/corpus"
    if [[ -d "$root/tests/fuzz/corpus/$t" ]]; then
        cp -r "$root/tests/fuzz/corpus/$t/." "$work/corpus/"
    fi
    before="$(find "$crashers" -name "$t-*" | wc -l)"
    echo "=== $t: ${secs}s (log: $work/log)"
    set +e
    # shellcheck disable=SC2086
    "$bin" "$work/corpus" -max_total_time="$secs" -artifact_prefix="$crashers/$t-" -print_final_stats=1 \
        -rss_limit_mb=4096 -timeout=10 ${FUZZ_ARGS:-} >"$work/log" 2>&1
    rc=$?
    set -e
    after="$(find "$crashers" -name "$t-*" | wc -l)"
    execs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$work/log" | grep -Eo '[0-9]+$' || echo '?')"
    cov="$(grep -Eo 'cov: [0-9]+' "$work/log" | tail -1 | grep -Eo '[0-9]+' || echo '?')"
    ncorp="$(find "$work/corpus" -type f | wc -l)"
    if [[ $rc -eq 0 ]]; then
        status="ok"
    else
        status="FAILED (rc $rc, $((after - before)) new crasher(s))"
        failed=1
        grep -E 'ERROR|SUMMARY|runtime error|==[0-9]+==' "$work/log" | head -n 8 || true
    fi
    summary+=("$(printf '%-28s %-10s execs %-10s cov %-6s corpus %-6s %s' "$t" "${secs}s" "$execs" "$cov" "$ncorp" "$status")")
    if [[ "${KEEP_CORPUS:-0}" == "1" || $rc -ne 0 ]]; then
        echo "    kept $work"
    else
        rm -rf "$work"
    fi
done

echo
echo "fuzz summary:"
for s in "${summary[@]}"; do echo "  $s"; done
exit $failed
