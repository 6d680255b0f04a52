"""Which CUDA kernels a call launched, read from PyTorch's profiler (Kineto records each kernel's
demangled name and grid). The GPU tests use it to check that an environment switch picked the
kernel it names (tests/test_gpu_sdpa.py, tests/test_gpu_masks.py)."""
import json
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
    last template argument, FwdTraits' kNarrow (kernels/fwd_sm80.cuh). Fails on a name that ends
    otherwise, so a change of the kernel's signature cannot pass unnoticed."""
    tail = name.replace(" ", "")
    if tail.endswith(("true>(fc_params)", "(bool)1>(fc_params)")):
        return True
    if tail.endswith(("false>(fc_params)", "(bool)0>(fc_params)")):
        return False
    raise AssertionError(f"not an sm80 forward kernel's name: {name}")
