#!/usr/bin/env bash
# Nsight Compute summary of the sm90 forward kernel beside cuDNN's on the same inputs (issues 4
# and 5): duration, speed of light, warp stalls, scheduler and occupancy, one call of each.
# Shape from the environment: B, HQ, HKV, SQ, SK, D (default: the issue-4 short-sequence gap,
# B=32 HQ=HKV=16 SQ=SK=512 D=128), CAUSAL=0/1; fp16. Run after a build (ci/gpu.sh) on the
# GPU machine; full report in $OUT/ncu_sm90.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
cat > /tmp/fc_sm90_call.py <<'PY'
import os, torch, torch.nn.functional as F, flashcore
from torch.nn.attention import sdpa_kernel, SDPBackend
e = lambda n, d: int(os.environ.get(n, d))
b, hq, hkv, sq, sk, d = e("B", 32), e("HQ", 16), e("HKV", 16), e("SQ", 512), e("SK", 512), e("D", 128)
causal, gqa = bool(e("CAUSAL", 0)), hq != hkv
q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
print(flashcore.explain(q, k, v, is_causal=causal, enable_gqa=gqa))
for _ in range(3):  # the third call of each is profiled (--launch-skip 2 per kernel name)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    torch.ops.flashcore.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
torch.cuda.synchronize()
PY
# Kernel names: FlashCore's is flashcore::sm90::fwd_kernel, cuDNN's contains "sdpa"; the
# filter keeps PyTorch's randn and copy kernels out of the report.
timeout 300 ncu --kernel-name regex:"fwd_kernel|sdpa" --launch-skip 4 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats python3 /tmp/fc_sm90_call.py > "$OUT/ncu_sm90.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued|Achieved Active Warps|Registers Per|Grid Size|Cluster Size|Stall" \
  "$OUT/ncu_sm90.txt" | cut -c1-160 | head -60
