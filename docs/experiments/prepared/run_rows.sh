#!/usr/bin/env bash
# The D=256 backward's dQ reductions at 16 (main), 32 and 64 rows (16, 32, 64 KB) per bulk
# reduction: three C-only trees (kReducedRows in kernels/sm90/bwd_d256.cuh), tools/bwd_probe.c's
# timings two passes each (1k / 4k / 16k keys, causal and not), then the C API test's backward
# cases on the 32- and 64-row trees. ~3 minutes on the H200 machine.
#   On the device: OUT=$OUT bash docs/experiments/prepared/run_rows.sh
cd "$(dirname "$0")/../../.." && . docs/experiments/prepared/common.sh
for n in 16 32 64; do
  t=_rows$n
  copy_tree "$t"
  sed -i "s/kReducedRows = 16;/kReducedRows = $n;/" "$t/kernels/sm90/bwd_d256.cuh"
  grep -q "kReducedRows = $n;" "$t/kernels/sm90/bwd_d256.cuh" || { echo "no kReducedRows in $t"; exit 1; }
  (cd "$t" && cmake -S . -B bp -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_CUDA_ARCHS=90a -DFLASHCORE_HEAD_DIMS=256 \
     -DFLASHCORE_BUILD_TORCH_OP=OFF -DFLASHCORE_PACKAGE_DIR="$PWD/bp/lib" > cfg.log 2>&1 && cmake --build bp > b.log 2>&1 &&
   nvcc -O2 -o bp/bwd_probe tools/bwd_probe.c -Ic_src -Lbp/lib -lflashcore -Xlinker -rpath="$PWD/bp/lib") ||
    { echo "BUILD FAILED $t"; tail -n 5 "$t/b.log"; } &
done
wait
echo "built ($(date +%T))"
for pass in 1 2; do
  for n in 16 32 64; do
    echo "== $n rows, pass $pass"
    PROBE_FAMILIES=sm90 PROBE_DIMS=256 timeout 60 _rows$n/bp/bwd_probe 1024 4096 16384 2>&1 | grep -E "bwd sm90"
  done
done
for n in 32 64; do
  echo "== C API backward cases, $n rows"
  (cd _rows$n/bp && FC_TEST_BWD_ONLY=1 timeout 90 ./tests/c/test_c_api_gpu 2>&1 | grep -E "FAIL|passed|failed" | tail -n 3)
done
echo "end ($(date +%T))"
