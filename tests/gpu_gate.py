"""The gate of the GPU-only test modules (test_gpu_*.py, test_streams_devices.py).

Where the module's device is missing, its tests are still collected and each one skips with the
module's reason: pytest's counts and the summary tests/conftest.py prints then say how many GPU
tests did not run, instead of one skipped item per module hiding hundreds of cases. Everything
such a module does at import must therefore work without a GPU (ask the device only behind the
flag this returns). FLASHCORE_REQUIRE_GPU=1 (set by the GPU machine's scripts) makes a missing
CUDA device an error instead.
"""
import os

import pytest
import torch


def gpu_gate(reason, capability=None):
    """(have, mark): ``have`` is True where the module's tests can run (a CUDA device, of
    ``capability`` if given); ``mark`` skips every test of the module otherwise (assign it to
    ``pytestmark``)."""
    have = torch.cuda.is_available()
    if not have and os.environ.get("FLASHCORE_REQUIRE_GPU") == "1":
        raise RuntimeError("FLASHCORE_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
    if have and capability is not None:
        have = torch.cuda.get_device_capability() == capability
    return have, pytest.mark.skipif(not have, reason=reason)
