"""Inference calls with an attn_mask: torch.ops.flashcore.sdpa against PyTorch's default
F.scaled_dot_product_attention on the same inputs, per head dim, length and dtype (HuggingFace's
left-padded causal bool mask, B = 16k tokens / S; also its additive form). CUDA-event medians,
the two interleaved. Prints one row per shape; --json writes them with the card."""
import argparse, json, math, sys
import torch
import torch.nn.functional as F
import flashcore  # noqa: F401  (registers torch.ops.flashcore)
from interleaved import medians  # tools/interleaved.py


def hf_mask(B, S, additive, dtype):
    i = torch.arange(S, device="cuda").view(1, 1, -1, 1)
    j = torch.arange(S, device="cuda").view(1, 1, 1, -1)
    pad = (torch.arange(B, device="cuda") * S // (2 * B)).view(-1, 1, 1, 1)
    keep = (j <= i) & ((j >= pad) | (j == i))
    if not additive:
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(~keep, torch.finfo(dtype).min)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dims", default="32,64,80,96,128,256")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'shape':34s} {'mask':8s} {'flashcore us':>12s} {'sdpa us':>10s} {'ratio':>6s}  path")
    for dtype in (torch.float16, torch.bfloat16):
        for D in (int(d) for d in args.dims.split(",")):
            for S in (int(s) for s in args.lengths.split(",")):
                H = 32 if D in (80, 96) else 2048 // D
                B = max(1, 16384 // S)
                q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
                for additive in (False, True):
                    if additive and D not in (64, 128):
                        continue
                    m = hf_mask(B, S, additive, dtype)
                    with torch.no_grad():
                        fc = lambda: torch.ops.flashcore.sdpa(q, k, v, m)
                        at = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                        t_fc, t_at = medians([fc, at], args.iters)
                        path = flashcore.explain(q, k, v, attn_mask=m)
                    name = f"B={B} H={H} S={S} D={D} {str(dtype)[6:]}"
                    kind = "additive" if additive else "bool"
                    print(f"{name:34s} {kind:8s} {t_fc:12.1f} {t_at:10.1f} {t_at / t_fc:6.3f}  {path[:60]}")
                    rows.append(dict(B=B, H=H, S=S, D=D, dtype=str(dtype)[6:], mask=kind, flashcore_us=t_fc,
                                     sdpa_us=t_at, speedup=t_at / t_fc, path=path))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
