#!/usr/bin/env python3
"""Times PyTorch's cuDNN and flash SDPA backwards on tools/bwd_probe.c's sweep (fp16, 16k tokens,
hidden 2048), in the same format, so a probe run prints FlashCore's and the peers' numbers from
one machine and one session. Median of 20 CUDA-event-timed calls of
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), after 3 warm-up calls, queued one
after another with no synchronization between them. (Each call once waited for the previous
one, as bwd_probe.c's do: the GPU then sat idle while the host set up the next call. For the C
API that is a few microseconds; for an autograd call into cuDNN it was 10-20% of a D=64 backward
at 1k-4k keys, counted as cuDNN's time, so the probe's cuDNN numbers before the twenty-eighth
session read low by about that much; docs/experiments/backward.md.)

    python3 tools/bwd_peers.py [S ...]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_bwd(backend, S, D, causal):
    B, H = 16384 // S, 2048 // D
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float16, device="cuda", requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, H, S, D, dtype=torch.float16, device="cuda")
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for _ in range(3):
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
    for start, stop in events:
        start.record()
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) * 1e-3 for start, stop in events)
    med = times[len(times) // 2]
    flops = 2.5 * 4.0 * B * H * S * S * D / (2.0 if causal else 1.0)
    return med, flops / med * 1e-12


def main():
    lens = [int(a) for a in sys.argv[1:]] or [1024, 4096, 16384]
    for D in (64, 128):
        for causal in (False, True):
            for S in lens:
                for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                    med, tflops = time_bwd(backend, S, D, causal)
                    print(f"bwd {name} D={D:<3} {'causal' if causal else 'full':6} S={S:<6} "
                          f"{med * 1e6:9.1f} us {tflops:7.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
