"""The layering rules of docs/ARCHITECTURE.md that a grep can check (CPU, no build needed), and
that the document names only files that exist:

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


# Files docs/ARCHITECTURE.md names that are not in the repository by design: build and run
# outputs, and the team's notes outside it (the document says so where it names them).
NOT_IN_REPO = {"kernel_list.h", "_build_config.py", "bench.json", "GPU_NOTES.md"}
SKIP_DIRS = {".git", "build", "__pycache__"}


def tracked_files():
    """The repository's files as a fresh clone has them (git ls-files; without git, the tree
    minus build outputs): a file only a local build writes must not satisfy the check here and
    fail it in CI."""
    import subprocess
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
        return out.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)]


def test_architecture_names_only_files_that_exist():
    """Every file docs/ARCHITECTURE.md names in backquotes exists in the repository: its path,
    full or the tail of one (`sm90/fwd_kernel.cuh`, `patch.py`), matches a file in the tree, so a
    moved or renamed file fails here."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`([A-Za-z0-9_./-]+\.(?:cuh|cu|c|h|cpp|py|sh|md|txt|json|cmake))`", text))
    in_tree = ["/" + path for path in tracked_files()]
    missing = sorted(n for n in named if pathlib.PurePath(n).name not in NOT_IN_REPO
                     and not any(path.endswith("/" + n.lstrip("./")) for path in in_tree))
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
