#!/usr/bin/env bash
# Nsight Compute summary of the decode kernel (issue 5): speed of light, memory, warp stalls,
# occupancy, for one call of B=8, Hq=32, Hkv=$HKV (default 32), Sq=1, Sk=$SK (default 8192),
# D=128 fp16. Run after a build (ci/gpu.sh) on the GPU machine; output to $OUT/ncu_decode.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
cat > /tmp/fc_decode_call.py <<PY
import os, torch, flashcore
hkv, sk = int(os.environ.get("HKV", 32)), int(os.environ.get("SK", 8192))
q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.float16)
k = torch.randn(8, hkv, sk, 128, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
print(flashcore.explain(q, k, v, enable_gqa=hkv != 32))
for _ in range(3):
    torch.ops.flashcore.sdpa(q, k, v, enable_gqa=hkv != 32)
torch.cuda.synchronize()
PY
timeout 300 ncu --kernel-name regex:"decode|combine" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats python3 /tmp/fc_decode_call.py > "$OUT/ncu_decode.txt" 2>&1
echo "ncu rc $?"
grep -E "decode_kernel|combine_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Grid Size|Block Limit|Stall|Warp Cycles Per Issued" "$OUT/ncu_decode.txt" | head -60
