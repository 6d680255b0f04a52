import torch, flashcore
from flashcore.varlen import varlen_attn
torch.manual_seed(0)
for d, causal in ((64, True), (128, False), (256, True)):
    q_lens = [1, 130, 0, 7, 257]; k_lens = q_lens if causal else [3, 0, 5, 400, 129]
    cq = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    ck = torch.tensor([0] + list(torch.tensor(k_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(q_lens) + 2, 4, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(k_lens), 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = varlen_attn(q, k, v, cq, ck, max(q_lens), max(k_lens), window_size=(-1, 0) if causal else (-1, -1), enable_gqa=True)
    torch.cuda.synchronize()
    # bad offsets straight into the op: clamped, never out of bounds
    bad = torch.tensor([5, 2, 10**6, -7, 3, 9], dtype=torch.int32, device="cuda")
    torch.ops.flashcore._varlen_fwd(q, k, v, bad, bad, 300, 300, causal, 0.1)
    torch.cuda.synchronize()
print("memcheck script done")
