#!/usr/bin/env python3
"""Host time per attention call: how long the CPU spends issuing one call, FlashCore's op layer
by layer beside PyTorch's backends, on shapes whose kernels are shorter than that (decoding, the
small prefill). Run on the GPU machine after a build:

  PYTHONPATH=python python tools/host_time.py [--calls N] [--json PATH]

Each entry issues N calls back to back under torch.no_grad() with no synchronization between
them and reports wall time / N (the kernels take less GPU time than their calls take host time,
so the queue never fills and wall time is host time; the GPU time per call, from CUDA events, is
printed beside it to show that). Best of 5 rounds, after a warm-up. Entries, most to least of
FlashCore's stack:
  flashcore.sdpa()   the Python entry point: without gradients, flashcore::_sdpa_inference
                     (no Autograd kernel; _entry.py), as patch() and the HF integration call
  ops.flashcore.sdpa torch.ops.flashcore.sdpa: the dispatcher, the Python Autograd kernel
                     (_ops._sdpa_autograd), then the C++ CUDA kernel below
  below autograd     the C++ CUDA kernel alone (redispatched with the Autograd keys removed)
  explain            decide() alone: checks, the C plan, no allocation, no launch
and PyTorch's: F.scaled_dot_product_attention by default and with each backend forced
(sdpa_kernel), and two calibrations: torch.empty_like(q) (one allocation through the caching
allocator) and q.neg() (one allocation and one kernel launch).
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore  # noqa: F401  (registers torch.ops.flashcore)

SHAPES = [  # (label, B, Hq, Hkv, Sq, Sk, D, mask): mask None or "additive" ((B, 1, Sq, Sk), bf16)
    ("decode B=1 32/8 1k D=128", 1, 32, 8, 1, 1024, 128, None),
    ("decode B=8 32/8 1k D=128", 8, 32, 8, 1, 1024, 128, None),
    ("decode B=1 32/32 1k D=128", 1, 32, 32, 1, 1024, 128, None),
    ("small B=1 H=8 512 D=64", 1, 8, 8, 512, 512, 64, None),
    # an additive mask: the op sends it to aten on Hopper, so this is the fallback's host time
    ("additive B=1 H=8 512 D=64", 1, 8, 8, 512, 512, 64, "additive"),
]


def host_us(fn, calls):
    """Best of 5 rounds of `calls` calls: (host us per call, GPU us per call)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start_ev.record()
        for _ in range(calls):
            fn()
        end_ev.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host = (t1 - t0) / calls * 1e6
        gpu = start_ev.elapsed_time(end_ev) * 1e3 / calls
        if best is None or host < best[0]:
            best = (host, gpu)
    return best


def entries(q, k, v, gqa, mask):
    op = torch.ops.flashcore.sdpa.default
    handle = op._handle
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    kw = dict(enable_gqa=True) if gqa else {}
    out = {
        "flashcore.sdpa()": lambda: flashcore.sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa),
        "ops.flashcore.sdpa": lambda: op(q, k, v, mask, **kw),
        "below autograd": lambda: handle.redispatch_boxed(keyset, q, k, v, mask, 0.0, False, **kw),
        "explain": lambda: torch.ops.flashcore.explain(q, k, v, mask, 0.0, False, **kw),
        "F.sdpa default": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa),
        "empty_like": lambda: torch.empty_like(q),
        "neg": lambda: q.neg(),
    }
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def forced(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        try:
            forced()
            out[f"F.sdpa {name}"] = forced
        except RuntimeError:
            pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; host us per call "
          f"(best of 5 rounds of {args.calls}), GPU us per call beside it")
    rows = []
    with torch.no_grad():
        for label, b, hq, hkv, sq, sk, d, mask_kind in SHAPES:
            q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.bfloat16)
            mask = None
            if mask_kind == "additive":
                keep = torch.ones(sq, sk, device="cuda", dtype=torch.bool).tril(sk - sq)
                mask = torch.zeros(b, 1, sq, sk, device="cuda", dtype=torch.bfloat16).masked_fill(~keep, -1e4)
            path = flashcore.explain(q, k, v, attn_mask=mask, enable_gqa=hq != hkv)
            print(f"\n{label}  (flashcore: {path})")
            for name, fn in entries(q, k, v, hq != hkv, mask).items():
                host, gpu = host_us(fn, args.calls)
                print(f"  {name:20s} host {host:7.2f} us   gpu {gpu:7.2f} us")
                rows.append(dict(shape=label, entry=name, host_us=host, gpu_us=gpu))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
