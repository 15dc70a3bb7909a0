#!/usr/bin/env bash
# Installs what is missing (Debian packages) and builds ds4replay into ./build.
# Sourced by scripts/demo.sh and scripts/test.sh; usable alone: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(cmake g++ make libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libgtest-dev libutf8proc-dev libpcre2-dev zlib1g-dev liburing-dev)
# The Python package tests (tests/python: pytest, numpy).
PKGS+=(python3-numpy python3-pytest)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CUDA comes from /usr/local/cuda when present; without nvcc the CPU backend alone is built.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
BUILD_DIR="${DS4R_BUILD_DIR:-build}"
JOBS="${DS4R_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
