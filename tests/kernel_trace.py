"""Which CUDA kernels a call launched, read from PyTorch's profiler (Kineto records each kernel's
demangled name and grid). The GPU tests use it to check that an environment switch picked the
kernel it names (tests/test_gpu_sdpa.py, tests/test_gpu_masks.py)."""
import json
import re
import tempfile

import pytest
import torch
from torch.profiler import ProfilerActivity, profile


def launched_kernels(call):
    """(name, grid) of every CUDA kernel launched during call(); skips the test (saying why) when
    the profiler records none, so that a check built on it cannot pass without looking."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    kernels = [(e["name"], tuple(e["args"]["grid"])) for e in events if e.get("cat") == "kernel"]
    if not kernels:
        pytest.skip("the profiler recorded no CUDA kernels here (CUPTI unavailable?)")
    return kernels


def launched_narrow(name):
    """Whether a launched sm80 forward kernel (its demangled name) is a narrow-tile variant: its
    fifth template argument, FwdTraits' kNarrow (kernels/fwd_sm80.cuh:
    fwd_kernel<Elem, kHeadDim, kCausal, kMask, kNarrow, kSoftcap>). Fails on a name of another
    shape, so a change of the kernel's signature cannot pass unnoticed."""
    flat = name.replace(" ", "")
    match = re.search(r"sm80::fwd_kernel<([^<>]*)>\(fc_params\)", flat)
    args = match.group(1).split(",") if match else []
    if len(args) != 6:
        raise AssertionError(f"not an sm80 forward kernel's name: {name}")
    if args[4] in ("true", "(bool)1"):
        return True
    if args[4] in ("false", "(bool)0"):
        return False
    raise AssertionError(f"kNarrow is not a bool in {name}")
