#!/usr/bin/env bash
# On the GPU machine: a C-only Hopper build (no PyTorch op), the C API GPU test (forward and
# backward against float64 references), then tools/bwd_probe.c's backward timings and, unless
# NO_PEERS=1, PyTorch's cuDNN/flash backwards on the same shapes (tools/bwd_peers.py).
# NCU=1 adds an Nsight Compute pass over one sm90 backward launch at S=4k (NCU_DIM, default 128;
# NCU_CAUSAL=1 for causal; the first timed launch) to $OUT: the summary sections, and the stall
# samples per SASS instruction as CSV ($OUT/bwd_source.csv). PROBE_MASK=hf (bwd_probe.c) times and
# profiles the masked kernels instead (HuggingFace's padded causal bool mask, non-causal calls).
#   bash tools/bwd_probe.sh [S ...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-probe
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA_ARCHS=90a -DFLASHCORE_HEAD_DIMS="64;128;256" \
  -DFLASHCORE_BUILD_TORCH_OP=OFF -DFLASHCORE_PACKAGE_DIR="$PWD/$B/lib" > $B.cfg.log 2>&1 || { tail -20 $B.cfg.log; exit 1; }
cmake --build $B > $B.log 2>&1 || { grep -E "error|spill" -A3 $B.log | head -40; exit 1; }
nvcc -O2 -o $B/bwd_probe tools/bwd_probe.c -Ic_src -L$B/lib -lflashcore -Xlinker -rpath="$PWD/$B/lib"
echo "== C API GPU test"
(cd $B && timeout 300 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|bwd|passed" | tail -30)
echo "== FlashCore backward (C API)"
timeout 300 $B/bwd_probe "$@"
if [ "${NO_PEERS:-0}" != 1 ]; then echo "== PyTorch backwards"; timeout 300 python3 tools/bwd_peers.py "$@"; fi
if [ "${NCU:-0}" = 1 ]; then
  # bwd_probe runs full then causal, 3 warm-up and 20 timed launches each: skip to the first timed one.
  skip=$(( ${NCU_CAUSAL:-0} == 1 ? 26 : 3 ))
  PROBE_FAMILIES=sm90 PROBE_DIMS=${NCU_DIM:-128} timeout 300 ncu -k regex:bwd_kernel --launch-skip $skip --launch-count 1 \
    --set full --import-source yes -o "${OUT:-/tmp}/bwd" $B/bwd_probe 4096 > /dev/null 2>&1 || true
  ncu --import "${OUT:-/tmp}/bwd.ncu-rep" --page details --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis 2>&1 | head -120
  timeout 120 ncu --import "${OUT:-/tmp}/bwd.ncu-rep" --page source --csv --print-source sass > "${OUT:-/tmp}/bwd_source.csv" 2>/dev/null || true
fi
