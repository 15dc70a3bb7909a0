#!/usr/bin/env bash
# Installs what is missing, builds everything and runs the test suite through CTest.
# CUDA tests skip with a message on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cd "${DS4R_BUILD_DIR:-build}"
ctest --output-on-failure -j "${DS4R_JOBS:-$(nproc)}" "$@"
