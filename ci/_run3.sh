set -u
export PYTHONPATH=$PWD/python
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_HEAD_DIMS="64;128" -DPython3_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && cmake --build build >> $OUT/build.log 2>&1 || { tail -20 $OUT/build.log; exit 1; }
cat > /tmp/small.py <<'P'
import torch, torch.nn.functional as F, flashcore, os
from torch.nn.attention import sdpa_kernel, SDPBackend
q,k,v=(torch.randn(1,8,512,64,device='cuda',dtype=torch.float16) for _ in range(3))
for i in range(3):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION): F.scaled_dot_product_attention(q,k,v)
    torch.ops.flashcore.sdpa(q,k,v)
torch.cuda.synchronize()
P
for s in 1 2 4; do FLASHCORE_KV_SPLITS=$s timeout 60 ncu --metrics gpu__time_duration.sum,launch__grid_size,launch__cluster_dim_x python3 /tmp/small.py > $OUT/ncu_$s.txt 2>&1; grep -E "^  [a-z_]|gpu__time|grid_size|cluster_dim" $OUT/ncu_$s.txt | tail -12 | sed "s/^/[$s] /"; done
M='S=128x4096|S=512x8192|S=256x32768|S=256x8192'
for s in 1 2 4 8 auto; do
  if [ $s = auto ]; then unset FLASHCORE_KV_SPLITS; else export FLASHCORE_KV_SPLITS=$s; fi
  timeout 60 python3 bench/bench.py --extra --no-bwd --impls cudnn,flash,flashcore --match "$M" --json $OUT/split_$s.json > $OUT/split_$s.log 2>&1 || echo "bench $s failed"
done
unset FLASHCORE_KV_SPLITS
python3 bench/compare.py $OUT/split_1.json $OUT/split_2.json $OUT/split_4.json $OUT/split_8.json $OUT/split_auto.json --impl flashcore 2>&1 | tail -8
grep -E "flashcore|cudnn|flash " $OUT/split_auto.log | head -14
