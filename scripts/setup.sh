#!/usr/bin/env bash
# Installs what is missing (Debian packages) and builds ds4replay into ./build.
# Called by scripts/demo.sh (binary only) and scripts/test.sh (everything); usable alone:
#   scripts/setup.sh [--target NAME]... [extra cmake args]
# --target builds only the named CMake targets (repeatable; e.g. --target ds4replay); without it, all.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
cmake_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) targets+=("$2"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    *) cmake_args+=("$1"); shift ;;
  esac
done

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
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${cmake_args[@]+"${cmake_args[@]}"} >/dev/null
if [ ${#targets[@]} -gt 0 ]; then
  echo "setup: building ${targets[*]} in $BUILD_DIR" >&2
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
