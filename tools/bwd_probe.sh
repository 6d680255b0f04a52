#!/usr/bin/env bash
# On the GPU machine: a C-only Hopper build (no PyTorch op), the C API GPU test (forward and
# backward against float64 references), then tools/bwd_probe.c's backward timings and, unless
# NO_PEERS=1, PyTorch's cuDNN/flash backwards on the same shapes (tools/bwd_peers.py).
# NCU=1 adds an Nsight Compute pass over one sm90 backward launch (D=128 non-causal, S=4k: the 50th) to $OUT.
#   bash tools/bwd_probe.sh [S ...]
set -euo pipefail
cd "$(dirname "$0")/.."
B=build-probe
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA_ARCHS=90a -DFLASHCORE_HEAD_DIMS="64;128" \
  -DFLASHCORE_BUILD_TORCH_OP=OFF -DFLASHCORE_PACKAGE_DIR="$PWD/$B/lib" > $B.cfg.log 2>&1 || { tail -20 $B.cfg.log; exit 1; }
cmake --build $B > $B.log 2>&1 || { grep -E "error|spill" -A3 $B.log | head -40; exit 1; }
nvcc -O2 -o $B/bwd_probe tools/bwd_probe.c -Ic_src -L$B/lib -lflashcore -Xlinker -rpath="$PWD/$B/lib"
echo "== C API GPU test"
(cd $B && timeout 300 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|bwd|passed" | tail -30)
echo "== FlashCore backward (C API)"
timeout 300 $B/bwd_probe "$@"
if [ "${NO_PEERS:-0}" != 1 ]; then echo "== PyTorch backwards"; timeout 300 python3 tools/bwd_peers.py "$@"; fi
if [ "${NCU:-0}" = 1 ]; then
  PROBE_FAMILIES=sm90 timeout 300 ncu -k regex:bwd_kernel --launch-skip 49 --launch-count 1 --set full -o "${OUT:-/tmp}/bwd" $B/bwd_probe 4096 > /dev/null 2>&1 || true
  ncu --import "${OUT:-/tmp}/bwd.ncu-rep" --page details --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis 2>&1 | head -120
fi
