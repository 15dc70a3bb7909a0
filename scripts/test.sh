#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the test suite through CTest.
# CUDA tests skip without a GPU ("no GPU found: CUDA tests skipped"); CTest lists them as Skipped and
# the reasons are printed after its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${DS4R_BUILD_DIR:-build}"
rc=0
ctest --output-on-failure -j "${DS4R_JOBS:-$(nproc)}" "$@" || rc=$?
# GoogleTest prints "file:line: Skipped" then the message: count the distinct reasons.
if [ -f Testing/Temporary/LastTest.log ]; then
  reasons=$(awk 'f { print; f = 0 } /: Skipped$/ { f = 1 }' Testing/Temporary/LastTest.log | sort | uniq -c)
  if [ -n "$reasons" ]; then
    echo "Skip reasons (tests x reason):"
    echo "$reasons"
  fi
fi
exit $rc
