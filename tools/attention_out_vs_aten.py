"""Attention as a model calls it, output included: q, k, v as (B, S, H, D)-ordered views
(what a projection followed by .view(B, S, H, D).transpose(1, 2) gives), then the output turned
back into (B, S, H * D) rows for the output projection (out.transpose(1, 2).reshape(...)), which
is a view where the output lies in (B, S, H, D)-ordered storage and a copy otherwise.
torch.ops.flashcore.sdpa against PyTorch's default F.scaled_dot_product_attention on the same
inputs, CUDA-event medians interleaved call by call; one row per case, with whether each side's
reshape was a view. Cases: unmasked causal prefill (a FlashCore kernel), and an additive
HuggingFace-style mask (which the op sends to PyTorch's SDPA on Hopper)."""
import argparse, json, os, sys
import torch
import torch.nn.functional as F
import flashcore
from interleaved import medians  # tools/interleaved.py


def inputs(B, S, Hq, Hkv, D, dtype):
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype).transpose(1, 2)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype).transpose(1, 2)
    return q, k, v


def additive_causal_padding(B, S, dtype):
    """HuggingFace's (B, 1, S, S) float mask: causal, row b's first b * S / (2B) keys padding."""
    pad = (torch.arange(B, device="cuda") * S // (2 * B)).view(-1, 1, 1, 1)
    i = torch.arange(S, device="cuda").view(1, 1, -1, 1)
    j = torch.arange(S, device="cuda").view(1, 1, 1, -1)
    keep = (j <= i) & ((j >= pad) | (j == i))
    return torch.zeros(B, 1, S, S, device="cuda", dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--queue", type=int, default=1,
                    help="calls issued back to back per timed sample (1: each call's host time shows "
                         "where it exceeds its GPU time; 8: the host runs ahead, as in a model)")
    ap.add_argument("--json")
    args = ap.parse_args()
    dtype = torch.bfloat16
    rows = []
    cases = [("causal", 4, 1024, 32, 8, 128), ("causal", 1, 4096, 32, 8, 128), ("causal", 8, 1024, 16, 16, 64),
             ("additive", 4, 1024, 32, 8, 128), ("additive", 2, 2048, 16, 16, 64)]
    for form, B, S, Hq, Hkv, D in cases:
        q, k, v = inputs(B, S, Hq, Hkv, D, dtype)
        kw = dict(enable_gqa=Hq != Hkv)
        if form == "causal":
            kw["is_causal"] = True
        else:
            kw["attn_mask"] = additive_causal_padding(B, S, dtype)
        rows_of = lambda out: out.transpose(1, 2).reshape(B, S, Hq * D)
        fc = lambda: rows_of(torch.ops.flashcore.sdpa(q, k, v, **kw))
        pt = lambda: rows_of(F.scaled_dot_product_attention(q, k, v, **kw))
        torch.testing.assert_close(fc().float(), pt().float(), atol=2e-2, rtol=2e-2)
        view = lambda out: rows_of(out).data_ptr() == out.data_ptr() and out.transpose(1, 2).is_contiguous()
        fc_view = view(torch.ops.flashcore.sdpa(q, k, v, **kw))
        pt_view = view(F.scaled_dot_product_attention(q, k, v, **kw))
        t_fc, t_pt = medians([fc, pt], args.iters, args.queue)
        row = dict(form=form, B=B, S=S, Hq=Hq, Hkv=Hkv, D=D, dtype="bf16",
                   explain=flashcore.explain(q, k, v, **kw), flashcore_us=round(t_fc, 1),
                   pytorch_us=round(t_pt, 1), speedup=round(t_pt / t_fc, 3), queue=args.queue,
                   flashcore_reshape_is_view=fc_view, pytorch_reshape_is_view=pt_view)
        rows.append(row)
        print(f"{form:8s} B={B} S={S} Hq={Hq} Hkv={Hkv} D={D}: flashcore {t_fc:8.1f} us  pytorch "
              f"{t_pt:8.1f} us  {t_pt / t_fc:5.2f}x  views: flashcore {fc_view}, pytorch {pt_view}"
              f"  ({row['explain'][:40]})", flush=True)
    if args.json:
        meta = dict(card=torch.cuda.get_device_name(), torch=torch.__version__,
                    commit=os.environ.get("FLASHCORE_SHA", "unknown"))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
