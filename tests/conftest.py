"""pytest setup shared by every test module: which flashcore the tests import.

A working tree built with CMake (`cmake --build build`, whose libraries land in
python/flashcore/) is tested in place, ahead of any installed copy: otherwise an older
`pip install .` in site-packages would be tested instead of the code being edited. Without an
in-tree build (e.g. CI, which runs `pip install .` first), the installed copy is tested. The
report header names the copy under test.
"""
import importlib.util
import os
import sys

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
    return f"flashcore under test: {where} ({kind})"
