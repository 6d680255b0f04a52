"""One sm90-forward call of FlashCore beside cuDNN's, three times each, for Nsight Compute
(tools/ncu_sm90.sh, tools/ncu_stalls.sh profile the third of each with --launch-skip 4). Shape from
the environment: B, HQ, HKV, SQ, SK, D, CAUSAL (fp16)."""
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
