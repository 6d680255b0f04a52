"""The layering rules of docs/ARCHITECTURE.md that a grep can check (CPU, no build needed):

- kernels never include the dispatcher's header (c_src/dispatch.h): the launchers read the
  launch heuristics from c_src/launch_rules.h and the device facts from c_src/runtime.h, so
  control never flows from a kernel back up into the family choice;
- the environment is read in one place, c_src/config.c (fc_config_read, through `environ`): no
  getenv or environ elsewhere in the C layer, the kernels or the op library.
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("*.c", "*.h", "*.cu", "*.cuh", "*.cpp")


def files_under(folder):
    return sorted(p for pattern in SOURCES for p in (ROOT / folder).rglob(pattern))


def code_lines(path):
    """Lines with // and /* */ comments removed (a comment may name what it does not call)."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return [re.sub(r"//.*", "", line) for line in text.splitlines()]


def test_kernels_never_include_the_dispatcher():
    kernels = files_under("kernels")
    assert len(kernels) > 20  # the scan sees the tree
    offenders = [f"{p.relative_to(ROOT)}:{i + 1}" for p in kernels
                 for i, line in enumerate(code_lines(p)) if re.search(r'#\s*include\s+"dispatch\.h"', line)]
    assert offenders == [], offenders


def test_environment_read_only_in_config_c():
    allowed = {ROOT / "c_src" / "config.c"}
    files = [p for folder in ("c_src", "kernels", "torch_op") for p in files_under(folder)]
    assert allowed <= set(files)
    reads_env = re.compile(r"\b(getenv|secure_getenv)\s*\(|\benviron\b")
    readers = {p for p in files for line in code_lines(p) if reads_env.search(line)}
    assert readers == allowed, sorted(str(p.relative_to(ROOT)) for p in readers)
