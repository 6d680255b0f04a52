#!/usr/bin/env python3
"""GPU kernels per call, FlashCore beside cuDNN, from torch.profiler (CUPTI): which kernels a
call launches and how long each runs on the GPU, without the launch gaps or host time that
bench.py's per-call medians include. Run on the GPU machine after a build:

  PYTHONPATH=python python tools/kernel_times.py B HQ HKV SQ SK D [causal] [bwd]   (fp16)

`bwd` times the backward alone (torch.autograd.grad of one forward's output, FlashCore's
training route forced onto FlashCore). Each implementation is called 20 times after a
warm-up, L2 flushed before each call as in bench.py (the flush is the one 256 MB fill kernel,
listed too); printed: per kernel name, calls per implementation call and mean GPU us.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashcore  # noqa: F401  (registers torch.ops.flashcore)


def main():
    b, hq, hkv, sq, sk, d = (int(x) for x in sys.argv[1:7])
    flags = sys.argv[7:]
    causal = any(f in ("1", "causal", "yes") for f in flags)
    bwd = "bwd" in flags
    if bwd:
        os.environ["FLASHCORE_TRAINING"] = "flashcore"
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16, requires_grad=bwd)
    k = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, requires_grad=bwd)
    v = torch.randn(b, hkv, sk, d, device="cuda", dtype=torch.float16, requires_grad=bwd)
    dout = torch.randn(b, hq, sq, d, device="cuda", dtype=torch.float16)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    gqa = hq != hkv

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    def fc():
        return torch.ops.flashcore.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

    def backward_of(forward):
        out = forward()

        def grads():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        return grads

    if bwd:
        cudnn, fc = backward_of(cudnn), backward_of(fc)
    print(f"B={b} Hq={hq} Hkv={hkv} Sq={sq} Sk={sk} D={d} causal={causal} "
          f"{'backward' if bwd else 'forward'} on {torch.cuda.get_device_name()}")
    print(flashcore.explain(q, k, v, is_causal=causal, enable_gqa=gqa))
    calls = 20
    for name, fn in (("cudnn", cudnn), ("flashcore", fc)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        print(f"-- {name}")
        for e in prof.key_averages():
            if e.device_type.name != "CUDA":
                continue
            total_us = getattr(e, "device_time_total", None) or e.cuda_time_total
            print(f"   {e.count / calls:4.1f} x {total_us / e.count:9.2f} us  {e.key[:110]}")


if __name__ == "__main__":
    main()
