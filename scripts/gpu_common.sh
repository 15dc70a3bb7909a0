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
