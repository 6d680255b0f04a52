"""Decoding-shaped calls (few query rows, long caches) A/B by split count and sm90 configuration.

The automatic route sends one-row D=128 calls over >= 64 (batch, KV head) pairs to the sm90
family unsplit (c_src/dispatch.c, FC_DECODE_SM90_MIN_PAIRS). FLASHCORE_DECODE_SPLITS=s forces s
key ranges per pair there too (fc_sm90_decode_splits), merged as the split decode calls are. This
tool times, interleaved call by call with a cold L2 (bench.py's eager timer): PyTorch's default
backend (whichever `torch._fused_sdp_choice` picks: printed), cuDNN, FlashCore automatic, and
FlashCore with each forced split count; K/V TB/s and the ratio cuDNN time / ours.

--variants adds FlashCore runs under other settings, e.g. `long:FLASHCORE_SM90_SHORT=0,tiny:
FLASHCORE_SM90_SHORT=2` (the D=128 configuration forced); --sq the query rows per call; --rows
the (batch, KV heads, keys) rows instead of the default set, as BxHKVxSK, comma-separated
(32 query heads, D=128). Each row also says what FlashCore's automatic route runs (explain()).

Run on a GPU after a build with D=128 fp16:
    PYTHONPATH=python python3 tools/decode_splits.py [--splits 2,4,8,16,17,33] [--variants ...]
        [--sq 1,16] [--rows 1x32x1024,8x32x8192] [--json out.json]
Each forced setting is checked against the automatic output first (max |diff| printed; > 1e-2 fails).
"""
import argparse
import contextlib
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore  # registers torch.ops.flashcore; explain()

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench import Timer  # noqa: E402

ROWS = [(1, 32, 32768), (1, 32, 131072), (1, 8, 131072), (8, 32, 1024), (8, 32, 8192), (8, 32, 32768),
        (8, 32, 131072), (8, 8, 32768), (8, 8, 131072), (32, 32, 1024), (32, 32, 8192), (32, 32, 32768),
        (32, 8, 8192), (32, 8, 32768), (32, 8, 131072)]  # B, Hkv, Sk


@contextlib.contextmanager
def environment(settings):
    for name, value in settings.items():
        os.environ[name] = value
    try:
        yield
    finally:
        for name in settings:
            os.environ.pop(name, None)


def parse_variants(text, counts):
    """[(name, {variable: value})]: the forced split counts, then --variants' entries."""
    out = [(f"split{s}", {"FLASHCORE_DECODE_SPLITS": str(s)}) for s in counts]
    for entry in filter(None, text.split(",")):
        name, _, settings = entry.partition(":")
        out.append((name, dict(kv.split("=", 1) for kv in settings.split(";") if kv)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", default="2,4,8,16,17,33")
    ap.add_argument("--variants", default="")
    ap.add_argument("--sq", default="1")
    ap.add_argument("--rows", default="", help="BxHKVxSK,... (default: the built-in set)")
    ap.add_argument("--json")
    args = ap.parse_args()
    counts = [int(s) for s in args.splits.split(",") if s]
    rows = [tuple(int(x) for x in r.split("x")) for r in args.rows.split(",") if r] or ROWS
    variants = parse_variants(args.variants, counts)
    timer = Timer(warmup=5, iters=30)
    card = torch.cuda.get_device_name()
    out = {"card": card, "torch": torch.__version__, "rows": []}
    print(card, torch.__version__, flush=True)
    for (b, hkv, sk), sq in ((row, int(sq)) for sq in args.sq.split(",") for row in rows):
        q = torch.randn(b, 32, sq, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        gqa = hkv != 32
        choice = torch._fused_sdp_choice(q, k, v, enable_gqa=gqa)
        try:
            default = SDPBackend(choice).name
        except ValueError:
            default = str(choice)
        auto = torch.ops.flashcore.sdpa(q, k, v, enable_gqa=gqa)
        route = flashcore.explain(q, k, v, enable_gqa=gqa)
        for name, settings in variants:
            with environment(settings):
                diff = (torch.ops.flashcore.sdpa(q, k, v, enable_gqa=gqa).float() - auto.float()).abs().max().item()
            if not diff <= 1e-2:
                sys.exit(f"FAILED: B={b} Hkv={hkv} Sq={sq} Sk={sk} {name}: max |diff| {diff}")
        calls = [(contextlib.nullcontext, lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)),
                 (lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION),
                  lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)),
                 (contextlib.nullcontext, lambda: torch.ops.flashcore.sdpa(q, k, v, enable_gqa=gqa))]
        calls += [(lambda st=st: environment(st), lambda: torch.ops.flashcore.sdpa(q, k, v, enable_gqa=gqa))
                  for _, st in variants]
        us = timer.eager_us(calls)
        tbs = [2 * k.numel() * 2 / (u * 1e-6) / 1e12 for u in us]
        names = ["default", "cudnn", "auto"] + [name for name, _ in variants]
        row = {"B": b, "Hq": 32, "Hkv": hkv, "Sq": sq, "Sk": sk, "default_backend": default, "route": route,
               "us": dict(zip(names, us)), "tb_s": dict(zip(names, tbs))}
        out["rows"].append(row)
        print(f"B={b} Hkv={hkv} Sq={sq} Sk={sk} (default: {default}; flashcore: {route[:40]}): " +
              ", ".join(f"{n} {u:.1f} us {t:.2f} TB/s x{us[1] / u:.3f}" for n, u, t in zip(names, us, tbs)), flush=True)
        del q, k, v, auto
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
