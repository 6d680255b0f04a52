"""One forced-sm80 FlashCore call beside PyTorch's flash backend (FlashAttention-2), three times
each, for Nsight Compute (PEER=flash tools/ncu_stalls.sh profiles the third of each with --launch-skip 4). Shape
from the environment as tools/sm90_call.py: B, HQ, HKV, SQ, SK, D, CAUSAL (fp16)."""
import os, torch, torch.nn.functional as F
os.environ["FLASHCORE_FAMILY"] = "sm80"
import flashcore
from torch.nn.attention import sdpa_kernel, SDPBackend
e = lambda n, d: int(os.environ.get(n, d))
b, hq, hkv, sq, sk, d = e("B", 8), e("HQ", 16), e("HKV", 16), e("SQ", 2048), e("SK", 2048), e("D", 128)
causal = bool(e("CAUSAL", 0))
q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16)
v = torch.randn_like(k)
print(flashcore.explain(q, k, v, is_causal=causal))
for _ in range(3):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.ops.flashcore.sdpa(q, k, v, is_causal=causal)
torch.cuda.synchronize()
