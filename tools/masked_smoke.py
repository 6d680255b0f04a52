"""One masked call per head dim in the sm90 family (for compute-sanitizer): left-padded causal bool mask, ragged keys."""
import sys
import torch, flashcore
plain = "--no-mask" in sys.argv  # the same calls without the mask, for comparison
for D in (64, 128):
    q, k, v = (torch.randn(2, 4, 272, D, device="cuda", dtype=torch.float16) for _ in range(3))
    m = torch.ones(272, 272, device="cuda", dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
    m[1, :, :, :37] = False
    if plain:
        m = None
    print(flashcore.explain(q, k, v, attn_mask=m)[:40])
    out = torch.ops.flashcore.sdpa(q, k, v, m)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)
    ok = torch.isfinite(ref)
    print(D, (out.float() - ref)[ok].abs().max().item())
torch.cuda.synchronize()
