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
# Kernel names: FlashCore's is flashcore::sm90::fwd_kernel, cuDNN's contains "sdpa"; the
# filter keeps PyTorch's randn and copy kernels out of the report.
timeout 300 ncu --kernel-name regex:"fwd_kernel|sdpa" --launch-skip 4 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats python3 tools/sm90_call.py > "$OUT/ncu_sm90.txt" 2>&1
echo "ncu rc $?"
grep -E "^  [a-zA-Z_].*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|No Eligible|Issued Warp Per Scheduler|Warp Cycles Per Issued|Achieved Active Warps|Registers Per|Grid Size|Cluster Size|Stall" \
  "$OUT/ncu_sm90.txt" | cut -c1-160 | head -60
