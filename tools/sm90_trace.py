"""Where a consumer warpgroup of the sm90 forward spends its cycles, from a trace build.

Build with the trace compiled in (it is off by default, and then the kernels are unchanged):
    cmake -S . -B build -G Ninja -DFLASHCORE_CUDA_ARCHS=90a -DCMAKE_CUDA_FLAGS=-DFLASHCORE_SM90_TRACE=1
    cmake --build build
    PYTHONPATH=python python3 tools/sm90_trace.py ["D64 causal 512" ...]   # name filters, optional

Thread 0 of every consumer warpgroup records the SM's clock at fixed points of its loop (tile
start, Q landed, its GEMM turn waited for and taken, GEMMs issued, S ready, P V done, softmax
done, P converted, epilogue start and end) into a device buffer (g_trace in
kernels/sm90/fwd_kernel.cuh); this script runs one call per shape, reads the buffer through
fc_sm90_trace_hdim<D>_fp16 and prints, per pair of consecutive events, how often it occurred and
its mean length in cycles, then the first events of CTA 0's first two warpgroups. The recording
itself slows the kernel by 20-30%: compare shares and orders of magnitude, not absolute times.
cuDNN's time (untraced) is printed beside ours (traced) for scale."""
import ctypes
import collections
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore

PER_WG, CTAS = 4096, 160  # kTracePerWg, kTraceCtas in kernels/sm90/fwd_kernel.cuh
NAMES = {1: "tile", 2: "q_ready", 3: "turn_wait", 4: "turn_got", 5: "issued", 6: "S_ready", 8: "PV_done",
         11: "softmax_done", 7: "convert_done", 9: "epi_start", 10: "epi_end", 12: "cta_end",
         13: "pair_left", 14: "pair_met", 15: "pair_merged"}
SHAPES = [  # name, B, H, S, D, causal
    ("D64 causal 512", 32, 32, 512, 64, True), ("D64 nc 512", 32, 32, 512, 64, False),
    ("D64 causal 2k", 8, 32, 2048, 64, True), ("D128 nc 512", 32, 16, 512, 128, False),
    ("D128 nc 2k", 8, 16, 2048, 128, False), ("D64 small", 1, 8, 512, 64, False),
    ("D64 small causal", 1, 8, 512, 64, True)]


def time_us(fn, iters=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def main(filters):
    lib = ctypes.CDLL(os.path.join(os.path.dirname(flashcore.__file__), "libflashcore.so"))
    for name, b, h, s, d, causal in SHAPES:
        if filters and not any(f in name for f in filters):
            continue
        try:
            read_trace = getattr(lib, f"fc_sm90_trace_hdim{d}_fp16")
        except AttributeError:
            sys.exit("no trace in this build: configure with -DCMAKE_CUDA_FLAGS=-DFLASHCORE_SM90_TRACE=1")
        q = torch.randn(b, h, s, d, device="cuda", dtype=torch.float16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        ours = time_us(lambda: torch.ops.flashcore.sdpa(q, k, v, is_causal=causal))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            cudnn = time_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        read_trace(None, 1)  # clear
        torch.ops.flashcore.sdpa(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
        buf = np.zeros(CTAS * 4 * PER_WG, dtype=np.uint64)
        read_trace(buf.ctypes.data_as(ctypes.c_void_p), 0)
        buf = buf.reshape(CTAS, 4, PER_WG)
        print(f"\n=== {name}: B={b} H={h} S={s} D={d} causal={causal}; ours {ours:.1f} us traced, cuDNN {cudnn:.1f} us")
        print(flashcore.explain(q, k, v, is_causal=causal))
        pairs = collections.defaultdict(lambda: [0, 0])
        spans, tiles, key_tiles, timelines = [], 0, 0, []
        for cta in range(CTAS):
            bounds = []
            for wg in range(1, 4):
                row = buf[cta, wg]
                n = int(np.count_nonzero(row))
                if n == 0:
                    continue
                ev = (row[:n] >> np.uint64(56)).astype(int)
                arg = ((row[:n] >> np.uint64(48)) & np.uint64(0xFF)).astype(int)
                clk = (row[:n] & np.uint64((1 << 48) - 1)).astype(np.int64)
                bounds.append((clk[0], clk[-1]))
                for i in range(1, n):
                    pair = pairs[(ev[i - 1], ev[i])]
                    pair[0] += 1
                    pair[1] += int(clk[i] - clk[i - 1])
                tiles += int(np.sum(ev == 1))
                key_tiles += int(arg[ev == 1].sum())
                if cta == 0 and wg in (1, 2):
                    timelines.append((wg, list(zip(ev[:60], arg[:60], clk[:60] - clk[0]))))
            if bounds:
                spans.append(max(e for _, e in bounds) - min(b0 for b0, _ in bounds))
        total = sum(p[1] for p in pairs.values())
        print(f"CTAs {len(spans)}, span cycles mean {np.mean(spans):.0f} max {np.max(spans):.0f}; "
              f"warpgroup-tiles {tiles}, key tiles per tile {key_tiles / max(tiles, 1):.2f}")
        print(f"{'from -> to':34s} {'count':>7s} {'share':>6s} {'mean cyc':>9s}")
        for (a, c), (count, cycles) in sorted(pairs.items(), key=lambda kv: -kv[1][1])[:18]:
            print(f"{NAMES.get(a, a):>14s} -> {NAMES.get(c, c):<16s} {count:7d} {100 * cycles / total:5.1f}% "
                  f"{cycles / count:9.0f}")
        for wg, timeline in timelines:
            print(f"CTA 0 WG{wg}: " + " ".join(f"{NAMES.get(e, e)}({a})@{c}" for e, a, c in timeline))


if __name__ == "__main__":
    main(sys.argv[1:])
