"""Every D=64 configuration of the Hopper family side by side, for choosing or checking the rules of
fc_sm90_d64_config (c_src/dispatch.c): per shape, cuDNN, FlashCore's automatic choice, and each
forced configuration (FLASHCORE_SM90_SHORT: 0 three warpgroups, 1 two, 2 one, 3 the pair), in
microseconds per call inside a CUDA graph (bench/bench.py's Timer.graph_us), fp16.

Run on an sm_90 machine after a build (a D=64-only build is enough):
    PYTHONPATH=python python3 tools/d64_configs.py                      # the built-in shapes
    PYTHONPATH=python python3 tools/d64_configs.py 1,8,8,2048,2048,1 ... # B,Hq,Hkv,Sq,Sk,causal each
A result off the float32 reference by more than 5e-3 is marked ERR.
"""
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore  # noqa: F401  (registers torch.ops.flashcore)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from bench import Timer  # noqa: E402  (the bench's own CUDA-graph timing)

SHAPES = [  # (B, Hq, Hkv, Sq, Sk, causal): small grids around the rules' boundaries
    (1, 8, 8, 512, 512, False), (1, 8, 8, 512, 512, True), (1, 8, 8, 256, 1024, False),
    (1, 8, 8, 1024, 1024, True), (2, 8, 8, 512, 512, False), (1, 32, 8, 256, 2048, False),
    (1, 32, 8, 512, 2048, False), (1, 4, 4, 2048, 8192, False), (1, 8, 8, 1536, 1536, False),
    (1, 8, 8, 2048, 2048, True), (1, 4, 4, 4096, 4096, True), (1, 2, 2, 8192, 8192, True),
    (4, 8, 8, 512, 512, True),
]
CONFIGS = [("three", "0"), ("two", "1"), ("one", "2"), ("pair", "3")]


def set_config(value):
    if value is None:
        os.environ.pop("FLASHCORE_SM90_SHORT", None)
    else:
        os.environ["FLASHCORE_SM90_SHORT"] = value


def main(argv):
    shapes = [tuple(int(x) for x in a.split(",")) for a in argv] or SHAPES
    graph_us = Timer(warmup=3, iters=30).graph_us
    print(torch.cuda.get_device_name(), "- us per call in a CUDA graph, fp16, D=64")
    print(f"{'shape':<30}{'cuDNN':>8}{'auto':>8}" + "".join(f"{name:>8}" for name, _ in CONFIGS))
    for b, hq, hkv, sq, sk, causal in shapes:
        causal = bool(causal)
        q = torch.randn(b, hq, sq, 64, device="cuda", dtype=torch.float16)
        k = torch.randn(b, hkv, sk, 64, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        gqa = hq != hkv
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            row = [graph_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa))]
        marks = [""]
        for value in [None] + [v_ for _, v_ in CONFIGS]:
            set_config(value)
            call = lambda: torch.ops.flashcore.sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)  # noqa: E731
            err = (call().float() - ref).abs().max().item()
            row.append(graph_us(call))
            marks.append(" ERR" if err > 5e-3 else "")
        set_config(None)
        label = f"B={b} H={hq}/{hkv} {sq}x{sk}{' causal' if causal else ''}"
        print(f"{label:<30}" + "".join(f"{t:>8.2f}{m}" for t, m in zip(row, marks)), flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        sys.exit("tools/d64_configs.py needs an sm_90 (Hopper) GPU")
    main(sys.argv[1:])
