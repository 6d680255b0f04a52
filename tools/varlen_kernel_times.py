#!/usr/bin/env python3
"""Where a packed forward's time goes (issue 35): bench_varlen.py's mixes, causal bf16, each call
three ways beside FlashCore's dense forward at about the same FLOPs, with the GPU time of every
kernel each call launches (torch.profiler, CUPTI) next to the call's CUDA-event time:

  varlen_attn   flashcore.varlen_attn (no autograd): the offsets read and checked on the host
                (the GPU waits), then the block-list kernel and the forward
  op            torch.ops.flashcore._varlen_fwd with the plan made beforehand: the two kernels
                without the host's checks
  dense         flashcore.sdpa on one (1, H, S, D) sequence, S = sqrt(sum L^2) (bench_varlen)

Printed per mix and heads: each way's event ms (median of --iters, L2 flushed before each call),
the GPU us of each kernel per call, and TFLOP/s over the forward kernel's time alone (the
packed FLOPs count each document's causal pairs; dense: its own). "kernel vs dense" is the
forward kernel's TFLOP/s over the dense kernel's: below 1 the kernel itself is slower per FLOP;
the rest of the event time is the host and the list kernel.

  PYTHONPATH=python python3 tools/varlen_kernel_times.py [--tokens 16k,64k] [--iters 10]
"""
import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from bench_varlen import (HEAD_CONFIGS, MIXES, causal_pairs, cu_seq_offsets, dense_length,  # noqa: E402
                          document_lengths, forward_flops, parse_tokens)

import flashcore  # noqa: E402
from flashcore import varlen as fc_varlen  # noqa: E402

FLUSH = None


def event_ms(fn, iters):
    times = []
    for _ in range(iters):
        FLUSH.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_us(fn, iters):
    """{kernel name: mean GPU us per call} of fn's kernels (the L2 flush's fill excluded)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
    totals = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "fill" in e.name.lower() or "memset" in e.name.lower():
            continue
        totals[e.name] = totals.get(e.name, 0.0) + e.device_time / iters
    return totals


def short(name):
    for key in ("varlen_blocks_kernel", "fwd_kernel", "combine_kernel"):
        if key in name:
            return key + ("<varlen>" if key == "fwd_kernel" and name.rstrip(")").endswith("true") else "")
    return name[:40]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=parse_tokens, default=[16384, 65536])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("varlen_kernel_times: needs CUDA; nothing run")
        return 0
    global FLUSH
    FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"packed forward: where the time goes, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    dtype = torch.bfloat16
    for total in args.tokens:
        for mix in MIXES:
            lengths = document_lengths(mix, total, args.seed)
            s = dense_length(lengths)
            for d, hq, hkv in HEAD_CONFIGS:
                g = torch.Generator(device="cuda").manual_seed(args.seed)
                q, k, v = (torch.randn((total, h, d), generator=g, device="cuda", dtype=dtype)
                           for h in (hq, hkv, hkv))
                dq, dk, dv = (torch.randn((1, s, h, d), generator=g, device="cuda", dtype=dtype).transpose(1, 2)
                              for h in (hq, hkv, hkv))
                cu = cu_seq_offsets(lengths, "cuda")
                longest = max(lengths)
                gqa = hq != hkv
                plan = fc_varlen._varlen_fwd_plan(q, k, cu, cu, longest, longest, True)
                scale = d ** -0.5
                ways = {
                    "varlen_attn": lambda: flashcore.varlen_attn(q, k, v, cu, cu, longest, longest,
                                                                 window_size=(-1, 0), enable_gqa=gqa),
                    "op": lambda: torch.ops.flashcore._varlen_fwd(q, k, v, cu, cu, plan.longest_q,
                                                                 plan.longest_k, True, scale),
                    "dense": lambda: flashcore.sdpa(dq, dk, dv, is_causal=True, enable_gqa=gqa),
                }
                flops = {"packed": forward_flops(lengths, d, hq), "dense": 4 * causal_pairs(s) * d * hq}
                print(f"\n{mix} {total} tokens ({len(lengths)} docs, longest {longest}), D={d} {hq}:{hkv}, dense S={s}")
                fwd_tflops = {}
                with torch.no_grad():
                    for name, fn in ways.items():
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        ms = event_ms(fn, args.iters)
                        kernels = kernel_us(fn, args.iters)
                        side = "dense" if name == "dense" else "packed"
                        fwd = sum(us for k_, us in kernels.items() if "fwd_kernel" in k_)
                        fwd_tflops[name] = flops[side] / (fwd * 1e-6) / 1e12 if fwd else None
                        parts = ", ".join(f"{short(k_)} {us:.1f}" for k_, us in
                                          sorted(kernels.items(), key=lambda kv: -kv[1]))
                        tf = fwd_tflops[name]
                        print(f"  {name:<12} event {ms * 1e3:8.1f} us | kernels (us/call): {parts} | "
                              f"fwd kernel {tf:.0f} TFLOP/s" if tf else f"  {name:<12} event {ms * 1e3:8.1f} us | {parts}")
                if fwd_tflops.get("op") and fwd_tflops.get("dense"):
                    print(f"  kernel vs dense: {fwd_tflops['op'] / fwd_tflops['dense']:.2f}")
                del q, k, v, dq, dk, dv
    return 0


if __name__ == "__main__":
    sys.exit(main())
