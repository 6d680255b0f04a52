"""Bench of flashcore.attention's band (sliding window, bottom-right causal) against what a user
has without it, side by side on the same inputs in one run (issue 34):

  band     flashcore.attention with window_size / causal_alignment (the sm90 kernel's band)
  dense    flashcore.attention with the same band as an explicit bool mask (FlashCore's masked
           path: what FlashCore did before the band)
  sdpa     F.scaled_dot_product_attention with the same bool mask (PyTorch's default for it)
  causal   FlashCore's full top-left causal call of the same shape (the time a band should
           shrink, in proportion to its (query, key) pairs)

Each row: forward medians (CUDA events, L2 flushed, backends timed call by call in turn, as
bench.py's Timer), TFLOP/s counted over the pairs the band keeps, and the band's time against
`causal x pairs(band) / pairs(causal)` (the issue's target: <= 1.15) and against dense (>= 3x at
S=16k). --bwd adds the same four as forward + backward (a training call; "fwd+bwd" lines).
Then sinks (with / without, forward) and the logit softcap: each sweep shape (16k tokens) with
softcap=50 and without, forward and (--bwd) forward + backward (the issue's target: <= 1.10x
forward), and, with --flex, FlexAttention with the same softcap as its score_mod (the PyTorch
user's other way to a softcap; compiled once per shape, not timed). Writes JSON with the card
and the git SHA.

    python bench/bench_variants.py [--quick] [--bwd] [--flex] [--json PATH]
"""
import argparse
import datetime as _dt
import importlib.util
import json
import os
import sys

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import flashcore  # noqa: E402
from flashcore import _band  # noqa: E402


def load_bench():
    spec = importlib.util.spec_from_file_location("flashcore_bench_py", os.path.join(REPO, "bench", "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# (name, B, Hq, Hkv, Sq, Sk, D, causal, window, alignment)
SHAPES = [
    ("window 4k, S=8k", 1, 32, 8, 8192, 8192, 128, True, (4096, 0), "top_left"),
    ("window 4k, S=16k", 1, 32, 8, 16384, 16384, 128, True, (4096, 0), "top_left"),
    ("window 1k, S=8k, D=64", 2, 16, 16, 8192, 8192, 64, True, (1024, 0), "top_left"),
    ("window 4k, S=16k, D=256 (Gemma 2)", 1, 8, 4, 16384, 16384, 256, True, (4096, 0), "top_left"),
    ("chunk 512 on 8k keys", 1, 32, 8, 512, 8192, 128, True, (-1, -1), "bottom_right"),
    ("chunk 512 on 32k keys", 1, 32, 8, 512, 32768, 128, True, (-1, -1), "bottom_right"),
    ("spec decode 4 on 8k", 8, 32, 8, 4, 8192, 128, True, (-1, -1), "bottom_right"),
]
QUICK = {"window 4k, S=8k", "chunk 512 on 8k keys"}


def pairs_of(sq, sk, band):
    rows = torch.arange(sq, dtype=torch.int64)
    lo = (rows + band.lo).clamp(0, sk)
    hi = (rows + band.hi + 1).clamp(0, sk)
    return int((hi - lo).clamp(min=0).sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bwd", action="store_true", help="also time forward + backward")
    ap.add_argument("--flex", action="store_true", help="softcap rows: also FlexAttention")
    ap.add_argument("--only", choices=["softcap"], default=None, help="only the softcap rows")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_variants: no CUDA device; nothing to time")
        return 0
    bench = load_bench()
    timer = bench.Timer(warmup=3, iters=args.iters)
    dtype = torch.bfloat16
    card = torch.cuda.get_device_name()
    rows = []
    print(f"# {card}, bf16, forward, us (median of {args.iters}); TFLOP/s over the band's pairs")
    print(f"{'shape':26} {'band':>9} {'dense':>9} {'sdpa':>9} {'causal':>9} {'TF/s':>6} "
          f"{'vs causal*frac':>14} {'dense/band':>10}  path")
    for name, B, Hq, Hkv, Sq, Sk, D, causal, window, alignment in SHAPES:
        if args.only or (args.quick and name not in QUICK):
            continue
        torch.manual_seed(0)
        q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype)
        k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype)
        v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype)
        br = alignment == "bottom_right"
        band = _band.band_bounds(Sq, Sk, causal, *window, br)
        keep = _band.band_mask(range(Sq), Sk, band, "cuda")
        kw = dict(is_causal=causal, causal_alignment=alignment, window_size=window, enable_gqa=True)
        path = flashcore.explain_attention(q, k, v, **kw)
        # the full causal call's pairs: top-left causal over Sq x Sk (Sq <= Sk here)
        full = _band.band_bounds(Sq, Sk, True, -1, -1, False)
        n_band, n_full = pairs_of(Sq, Sk, band), pairs_of(Sq, Sk, full)
        calls = [
            (torch.no_grad, lambda: flashcore.attention(q, k, v, **kw)),
            (torch.no_grad, lambda: flashcore.attention(q, k, v, keep, enable_gqa=True)),
            (torch.no_grad, lambda: F.scaled_dot_product_attention(q, k, v, keep, enable_gqa=True)),
            (torch.no_grad, lambda: flashcore.attention(q, k, v, is_causal=True, enable_gqa=True)),
        ]
        t_band, t_dense, t_sdpa, t_causal = timer.eager_us(calls)
        bwd = {}
        if args.bwd and Sq > 64:
            # forward + backward (the training call), same four ways
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            dout = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype)

            def step(fn):
                def run():
                    fn().backward(dout)
                    qg.grad = kg.grad = vg.grad = None
                return run
            steps = [
                (torch.enable_grad, step(lambda: flashcore.attention(qg, kg, vg, **kw))),
                (torch.enable_grad, step(lambda: flashcore.attention(qg, kg, vg, keep, enable_gqa=True))),
                (torch.enable_grad, step(lambda: F.scaled_dot_product_attention(qg, kg, vg, keep, enable_gqa=True))),
                (torch.enable_grad, step(lambda: flashcore.attention(qg, kg, vg, is_causal=True, enable_gqa=True))),
            ]
            bwd = dict(zip(("band_fb_us", "dense_fb_us", "sdpa_mask_fb_us", "causal_fb_us"), timer.eager_us(steps)))
        out = flashcore.attention(q, k, v, **kw)
        ref = flashcore.attention(q, k, v, keep, enable_gqa=True)
        max_diff = (out.float() - ref.float()).abs().max().item()
        tflops = 4 * B * Hq * n_band * D / (t_band * 1e-6) / 1e12
        target = t_causal * n_band / n_full
        row = dict(shape=name, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, causal=causal,
                   window=list(window), alignment=alignment, path=path, band_us=t_band,
                   dense_us=t_dense, sdpa_mask_us=t_sdpa, causal_us=t_causal, band_pairs=n_band,
                   causal_pairs=n_full, tflops=tflops, vs_causal_fraction=t_band / target,
                   dense_over_band=t_dense / t_band, max_diff_vs_dense=max_diff, **bwd)
        rows.append(row)
        print(f"{name:26} {t_band:9.1f} {t_dense:9.1f} {t_sdpa:9.1f} {t_causal:9.1f} {tflops:6.0f} "
              f"{t_band / target:14.3f} {t_dense / t_band:10.2f}  {path} (|band-dense| {max_diff:.1e})")
        if bwd:
            fb = [bwd[k] for k in ("band_fb_us", "dense_fb_us", "sdpa_mask_fb_us", "causal_fb_us")]
            print(f"{'  fwd+bwd':26} {fb[0]:9.1f} {fb[1]:9.1f} {fb[2]:9.1f} {fb[3]:9.1f} {'':6} "
                  f"{fb[0] / (fb[3] * n_band / n_full):14.3f} {fb[1] / fb[0]:10.2f}", flush=True)
    # Sinks (gpt-oss): the same call with and without one sink logit per head (target <= 5%).
    print(f"# sinks: forward us with / without, and forward + backward")
    for name, B, Hq, Hkv, S, D in (("sinks S=4k D=128 causal", 2, 64, 8, 4096, 128),
                                   ("sinks S=4k D=64 causal", 4, 64, 8, 4096, 64)):
        if args.only or (args.quick and D == 64):
            continue
        q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype)
        k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype)
        v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype)
        sinks = torch.randn(Hq, device="cuda")
        t_sink, t_plain = timer.eager_us([
            (torch.no_grad, lambda: flashcore.attention(q, k, v, is_causal=True, enable_gqa=True, sinks=sinks)),
            (torch.no_grad, lambda: flashcore.attention(q, k, v, is_causal=True, enable_gqa=True))])
        row = dict(shape=name, B=B, Hq=Hq, Hkv=Hkv, Sq=S, Sk=S, D=D, sinks_us=t_sink, plain_us=t_plain,
                   sinks_over_plain=t_sink / t_plain)
        rows.append(row)
        print(f"{name:26} {t_sink:9.1f} {t_plain:9.1f}  x{t_sink / t_plain:.3f}", flush=True)
    rows += softcap_rows(args, timer, dtype)
    sha, dirty = bench.git_info()
    doc = dict(card=card, torch=torch.__version__, git=sha, dirty=dirty, dtype="bf16", pass_="fwd",
               date=_dt.datetime.now().isoformat(timespec="seconds"), rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0


def softcap_rows(args, timer, dtype, softcap=50.0):
    """The sweep's shapes (16k tokens: B = 16384 / S, H = 2048 / D) with and without a softcap:
    forward us, their ratio, TFLOP/s; --bwd forward + backward; --flex FlexAttention's forward
    (and forward + backward) with the softcap as its score_mod."""
    flex = None
    if args.flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            torch._dynamo.config.recompile_limit = 64  # one graph per shape, grad mode and mask
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001 - an older torch: no peer row
            print(f"# flex_attention unavailable: {e}")

    def capped(score, b, h, q_idx, kv_idx):
        return softcap * torch.tanh(score / softcap)

    rows = []
    print(f"# softcap={softcap:g}: us with / without (ratio), TFLOP/s with; flex = FlexAttention;"
          f" band = the band kernel (softcap calls with a window run there) on nearly the same pairs, no softcap")
    shapes = [(4096, 128, False), (4096, 128, True), (1024, 128, True), (4096, 64, False),
              (4096, 64, True), (4096, 256, True)]
    if args.quick:
        shapes = shapes[:2]
    for S, D, causal in shapes:
        B, H = 16384 // S, 2048 // D
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
        kw = dict(is_causal=causal)
        # The band kernel without a softcap: the window (S - 2, 0 or unbounded) leaves out one pair.
        band_kw = dict(is_causal=causal, window_size=(S - 2, 0 if causal else -1))
        calls = [(torch.no_grad, lambda: flashcore.attention(q, k, v, softcap=softcap, **kw)),
                 (torch.no_grad, lambda: flashcore.attention(q, k, v, **kw)),
                 (torch.no_grad, lambda: flashcore.attention(q, k, v, **band_kw))]
        block_mask = None
        if flex is not None:
            block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S) if causal else None
            calls.append((torch.no_grad, lambda: flex(q, k, v, score_mod=capped, block_mask=block_mask)))
        times = timer.eager_us(calls)
        t_band = times.pop(2)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        name = f"softcap S={S} D={D} {'causal' if causal else 'full'}"
        row = dict(shape=name, B=B, Hq=H, Hkv=H, Sq=S, Sk=S, D=D, causal=causal, softcap=softcap,
                   softcap_us=times[0], plain_us=times[1], softcap_over_plain=times[0] / times[1],
                   band_kernel_us=t_band,
                   tflops=flops / times[0] / 1e6,
                   path=flashcore.explain_attention(q, k, v, softcap=softcap, **kw))
        if flex is not None:
            row["flex_us"] = times[2]
        line = (f"{name:26} {times[0]:9.1f} {times[1]:9.1f}  x{times[0] / times[1]:.3f} band {t_band:9.1f} "
                f"{row['tflops']:6.0f} TF/s" + (f"  flex {times[2]:9.1f}" if flex is not None else "")
                + f"  {row['path']}")
        if args.bwd:
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            dout = torch.randn_like(q)

            def train(**extra):
                def run():
                    out = flashcore.attention(qg, kg, vg, **kw, **extra)
                    torch.autograd.grad(out, (qg, kg, vg), dout)
                return run
            fb = [(torch.enable_grad, train(softcap=softcap)), (torch.enable_grad, train())]
            if flex is not None:
                def flex_train():
                    out = flex(qg, kg, vg, score_mod=capped, block_mask=block_mask)
                    torch.autograd.grad(out, (qg, kg, vg), dout)
                fb.append((torch.enable_grad, flex_train))
            tb = timer.eager_us(fb)
            row.update(softcap_fb_us=tb[0], plain_fb_us=tb[1], softcap_fb_over_plain=tb[0] / tb[1])
            if flex is not None:
                row["flex_fb_us"] = tb[2]
            line += (f"\n{'  fwd+bwd':26} {tb[0]:9.1f} {tb[1]:9.1f}  x{tb[0] / tb[1]:.3f}"
                     + (f"  flex {tb[2]:9.1f}" if flex is not None else ""))
        rows.append(row)
        print(line, flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
