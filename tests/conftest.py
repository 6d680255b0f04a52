"""pytest setup shared by every test module: which flashcore the tests import.

A working tree built with CMake (`cmake --build build`, whose libraries land in
python/flashcore/) is tested in place, ahead of any installed copy: otherwise an older
`pip install .` in site-packages would be tested instead of the code being edited. Without an
in-tree build (e.g. CI, which runs `pip install .` first), the installed copy is tested. The
report header names the copy under test.

At the end of a run, a summary counts the GPU tests that were collected but skipped here (no
CUDA device, or not the one they need), per file: the GPU modules collect every case and skip
each (tests/gpu_gate.py), so the count is of tests, not modules.
"""
import collections
import importlib.util
import os
import re
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
_REPO_PYTHON = os.path.join(os.path.dirname(_TESTS), "python")
_IN_TREE_BUILD = os.path.exists(os.path.join(_REPO_PYTHON, "flashcore", "libflashcore_op.so"))

if _IN_TREE_BUILD and _REPO_PYTHON not in sys.path:
    sys.path.insert(0, _REPO_PYTHON)
if _TESTS not in sys.path:  # helper modules beside the tests (attention_block, build_record)
    sys.path.insert(0, _TESTS)


def pytest_report_header(config):
    spec = importlib.util.find_spec("flashcore")
    where = os.path.dirname(spec.origin) if spec and spec.origin else "not importable"
    kind = "working tree" if _IN_TREE_BUILD else "installed copy"
    built = ""
    if spec and spec.origin:  # the compilers the build recorded (CMakeLists.txt, _build_config.py)
        path = os.path.join(where, "_build_config.py")
        if os.path.exists(path):
            record_spec = importlib.util.spec_from_file_location("_flashcore_build_record", path)
            record = importlib.util.module_from_spec(record_spec)
            record_spec.loader.exec_module(record)
            if getattr(record, "TOOLCHAIN", None):
                built = ", built with " + ", ".join(record.TOOLCHAIN)
    return f"flashcore under test: {where} ({kind}{built})"


# Skip reasons that mean "this machine lacks the GPU the test needs": gpu_gate.py's module
# reasons and the per-test marks ("no CUDA device: ...", "needs 2 CUDA devices", "no sm_90
# device: ...", "... free GPU memory", "no FlashCore kernel on this GPU").
_GPU_SKIP = re.compile(r"CUDA device|sm_90 device|GPU")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: after -r's short summary
def pytest_terminal_summary(terminalreporter):
    yield
    reasons = collections.defaultdict(collections.Counter)  # file -> reason -> tests
    for report in terminalreporter.stats.get("skipped", []):
        if not isinstance(report.longrepr, tuple):
            continue
        reason = report.longrepr[2].removeprefix("Skipped: ")
        if _GPU_SKIP.search(reason):
            reasons[report.nodeid.split("::")[0]][reason] += 1
    total = sum(sum(c.values()) for c in reasons.values())
    if not total:
        return
    import torch
    where = "a CUDA device is present" if torch.cuda.is_available() else "no CUDA device here"
    terminalreporter.write_sep(
        "=", f"{total} GPU tests collected but not run ({where}; "
             f"{terminalreporter._numcollected} tests collected in all)")
    for path, counter in sorted(reasons.items()):
        reason, _ = counter.most_common(1)[0]
        more = f"; {len(counter) - 1} other reason(s)" if len(counter) > 1 else ""
        terminalreporter.write_line(f"{sum(counter.values()):6d}  {path}  ({reason}{more})")
    terminalreporter.write_line("They run on a machine with a GPU: bash ci/gpu.sh (README).")
