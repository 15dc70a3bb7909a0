#!/usr/bin/env bash
# Shared by the GPU-machine scripts (sourced, not run): the Release build in build-gpu and the
# full-width synthetic checkpoint, each made only when missing.

# Builds build-gpu/ds4replay (sm_90 unless DS4R_ARCHS is set) if it is not there; sets BIN.
ensure_gpu_build() {
  export PATH=/usr/local/cuda/bin:$PATH
  if [ ! -x build-gpu/ds4replay ]; then
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS4R_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${DS4R_ARCHS:-90}" >/dev/null &&
      cmake --build build-gpu -j "$(nproc)" --target ds4replay >/dev/null || { echo "build failed"; exit 1; }
  fi
  BIN=build-gpu/ds4replay
}

# ensure_fullwidth_model DIR LAYERS LOG: `make-tiny --preset full-width` into DIR if it holds no checkpoint.
ensure_fullwidth_model() {
  if [ ! -f "$1/model.safetensors.index.json" ]; then
    "$BIN" make-tiny "$1" --preset full-width --layers "$2" --seed 1 --force 2> "$3" ||
      { echo "make-tiny failed"; tail -5 "$3"; exit 1; }
  fi
}

# The GPU machine hands back at most 8 files of $OUT: pack_logs puts every file of $OUT into one archive
# whose name sorts first (0-logs.tgz). The scripts call it on exit.
pack_logs() { tar czf "$OUT/0-logs.tgz" -C "$OUT" --exclude=0-logs.tgz . 2>/dev/null || true; }

# SM clock, memory clock and power once a second (nvidia-smi dmon) while a benchmark runs: tells a kernel
# that slows down under sustained load (power or thermal limit) from a slower kernel.
start_clock_log() { nvidia-smi dmon -s pc -d 1 -o T > "$1" 2>&1 & CLOCK_LOG_PID=$!; }
stop_clock_log() {
  if [ -n "${CLOCK_LOG_PID:-}" ]; then kill "$CLOCK_LOG_PID" 2>/dev/null; wait "$CLOCK_LOG_PID" 2>/dev/null; fi
  CLOCK_LOG_PID=
}
