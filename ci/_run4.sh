set -u
export PYTHONPATH=$PWD/python
build() { cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_HEAD_DIMS="64;128" -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build_$1.log 2>&1 && cmake --build build >> $OUT/build_$1.log 2>&1 || { tail -20 $OUT/build_$1.log; exit 1; }; }
build a
cat > /tmp/small.py <<'P'
import torch, torch.nn.functional as F, flashcore, os
from torch.nn.attention import sdpa_kernel, SDPBackend
q,k,v=(torch.randn(1,8,512,64,device='cuda',dtype=torch.float16) for _ in range(3))
for i in range(2):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION): F.scaled_dot_product_attention(q,k,v)
    torch.ops.flashcore.sdpa(q,k,v)
torch.cuda.synchronize()
P
timeout 120 ncu --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --launch-skip 2 --launch-count 2 python3 /tmp/small.py > $OUT/ncu_detail.txt 2>&1
grep -E "fwd_kernel|cudnn|Duration|Elapsed Cycles|SM Frequency|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Active Warps Per|Registers Per|Shared Memory Config|Dynamic Shared|Waves Per SM|Avg. Active Threads" $OUT/ncu_detail.txt | head -40
M='B=1 H=8 S=512 |S=128x4096|S=256x8192'
timeout 60 python3 bench/bench.py --extra --no-bwd --impls cudnn,flashcore --match "$M" --json $OUT/a.json > $OUT/a.log 2>&1
git apply ci/_prefetch.patch 2>/dev/null || patch -p1 < ci/_prefetch.patch
build b
timeout 60 python3 bench/bench.py --extra --no-bwd --impls cudnn,flashcore --match "$M" --json $OUT/b.json > $OUT/b.log 2>&1
python3 bench/compare.py $OUT/a.json $OUT/b.json --impl flashcore 2>&1 | tail -8
grep -E "flashcore" $OUT/a.log $OUT/b.log | head
