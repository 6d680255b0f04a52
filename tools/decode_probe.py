"""The decode kernel (forced: FLASHCORE_FAMILY=decode) on its own, for A/B runs of decode_sm80.cuh.

Run on a GPU after a build (a D=128, fp16 + bf16 build is enough):
    PYTHONPATH=python python3 tools/decode_probe.py            # odd shapes, then times against cuDNN
    PYTHONPATH=python CHECK_ONLY=1 compute-sanitizer --tool racecheck python3 tools/decode_probe.py
Checks: odd key lengths, 1-16 query rows, GQA 1-8, causal, forced split counts, bf16, each
against a float32 reference (max |error| printed, > 1e-2 fails). Times: bench.py's eager timer
(L2 flushed before each call, cuDNN and the decode kernel interleaved call by call), D=128,
Hq=32, one query row; ratio = cuDNN us / decode us.
"""
import contextlib
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore  # noqa: F401  (registers torch.ops.flashcore)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench import Timer  # noqa: E402

os.environ["FLASHCORE_FAMILY"] = "decode"
CHECKS = [  # B, Hq, Hkv, Sq, Sk, causal, dtype, forced splits (None: automatic)
    (1, 32, 32, 1, 1, False, torch.float16, None), (1, 32, 8, 1, 17, False, torch.float16, None),
    (2, 32, 8, 1, 1000, False, torch.bfloat16, None), (1, 32, 4, 3, 4097, True, torch.float16, None),
    (1, 16, 2, 2, 127, False, torch.float16, 5), (3, 8, 8, 16, 300, True, torch.bfloat16, 3),
    (1, 32, 8, 1, 8193, False, torch.float16, 64), (2, 4, 4, 1, 33, False, torch.float16, 2),
]
TIMED = [(1, 32, 32768), (1, 32, 131072), (1, 8, 131072), (1, 8, 32768), (8, 32, 1024), (32, 8, 1024),
         (8, 8, 8192), (8, 32, 8192)]  # B, Hkv, Sk


def check():
    worst = 0.0
    for b, hq, hkv, sq, sk, causal, dtype, splits in CHECKS:
        for d in (64, 128):
            if splits is None:
                os.environ.pop("FLASHCORE_DECODE_SPLITS", None)
            else:
                os.environ["FLASHCORE_DECODE_SPLITS"] = str(splits)
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
            k = torch.randn(b, hkv, sk, d, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            out = torch.ops.flashcore.sdpa(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                 enable_gqa=hq != hkv)
            err = (out.float() - ref).abs().max().item()
            worst = max(worst, err)
            print(f"check B={b} H={hq}/{hkv} {sq}x{sk} D={d} causal={causal} {dtype} splits={splits}: "
                  f"max|err| {err:.1e}", flush=True)
    os.environ.pop("FLASHCORE_DECODE_SPLITS", None)
    if not worst <= 1e-2:
        sys.exit(f"FAILED: max |error| {worst}")


def time_rows():
    timer = Timer(warmup=5, iters=30)
    ratios = []
    for b, hkv, sk in TIMED:
        q = torch.randn(b, 32, 1, 128, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hkv, sk, 128, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        gqa = hkv != 32
        us = timer.eager_us([
            (lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION), lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)),
            (contextlib.nullcontext, lambda: torch.ops.flashcore.sdpa(q, k, v, enable_gqa=gqa))])
        ratios.append(us[0] / us[1])
        print(f"B={b} Hkv={hkv} Sk={sk}: cuDNN {us[0]:.1f} us, decode {us[1]:.1f} us, ratio {ratios[-1]:.3f}", flush=True)
    print("geomean", round(float(torch.tensor(ratios).log().mean().exp()), 4))


if __name__ == "__main__":
    check()
    if not os.environ.get("CHECK_ONLY"):
        time_rows()
