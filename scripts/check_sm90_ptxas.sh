#!/usr/bin/env bash
# Compiles the Hopper wgmma kernels (kernels/hopper/gemm_sm90.cu) for sm_90a with ptxas' report and fails
# when ptxas serializes wgmma (advisories C7514 / C7515, and C7517: a wait it injected), ignores
# setmaxnreg (C7508) or spills registers to local memory: each silently costs most of the kernels' speed
# (docs/PERFORMANCE.md, "Hopper kernels"). Needs nvcc only (no GPU): CTest runs it as sm90_ptxas_check.
# Usage: scripts/check_sm90_ptxas.sh [NVCC]
set -uo pipefail
cd "$(dirname "$0")/.."
NVCC="${1:-${CUDACXX:-/usr/local/cuda/bin/nvcc}}"
log=$(mktemp)
trap 'rm -f "$log" "$log.o"' EXIT
"$NVCC" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --fmad=false -Iinclude -Ikernels -Xptxas -v \
  -c kernels/hopper/gemm_sm90.cu -o "$log.o" > "$log" 2>&1 || { cat "$log"; echo "FAIL: nvcc failed"; exit 1; }
kernels=$(grep -c "Compiling entry function" "$log")
bad=$(grep -E "C7514|C7515|C7517|C7508" "$log" | sed -E 's/in (the )?function .*//' | sort | uniq -c)
spills=$(grep -E "bytes spill (stores|loads)" "$log" | grep -vc " 0 bytes spill stores, 0 bytes spill loads")
echo "sm90a kernels compiled: $kernels; wgmma / setmaxnreg advisories: ${bad:-none}; kernels with spills: $spills"
[ "$kernels" -gt 0 ] && [ -z "$bad" ] && [ "$spills" -eq 0 ] || { echo "FAIL"; exit 1; }
echo "OK"
