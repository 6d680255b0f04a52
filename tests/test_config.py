"""One config surface (c_src/config.h, config.c): the run-time overrides of the C layer, the
kernels' launchers and the op library are read from the environment in one file only, each
one is documented in docs/TUNING.md (and ARCHITECTURE.md's table of variables), and the retired
ones are read, set and tested by nothing (a test that set one would silently test nothing).
Their parsing is tests/c/test_config.c (ctest); FLASHCORE_FAMILY's error through the op:
test_op_cpu.py (test_bad_family_env). CPU only: reads the sources."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG_C = ROOT / "c_src" / "config.c"
SOURCE_DIRS = ("c_src", "kernels", "torch_op")
SOURCE_SUFFIXES = {".c", ".h", ".cu", ".cuh", ".cpp", ".hpp"}
# Knobs whose A/B question is settled: their switches are gone (docs/TUNING.md, "Retired knobs").
RETIRED = ("FLASHCORE_SM90_TMA_STORE", "FLASHCORE_SM90_PAIR_ORDER", "FLASHCORE_SM90_BALANCED",
           "FLASHCORE_SM80_D64_KEYS", "FLASHCORE_SM80_D128_KEYS", "FLASHCORE_SM80_MASK_ROWS")


def _code(path):
    """The file's text without its comments (a mention of getenv in a comment is fine)."""
    text = path.read_text(errors="replace")
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def _sources():
    for d in SOURCE_DIRS:
        for path in sorted((ROOT / d).rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and path.is_file():
                yield path


def _config_variables():
    """FLASHCORE_* names config.c reads (its kNames table, after the common prefix)."""
    text = CONFIG_C.read_text()
    prefix = re.search(r'#define FC_CONFIG_PREFIX "([A-Z_]+)"', text).group(1)
    table = re.search(r"kNames\[KNOBS\] = \{(.*?)\};", text, flags=re.S).group(1)
    return [prefix + name for name in re.findall(r'= "([A-Z0-9_]+)"', table)]


def test_no_environment_reads_outside_config_c():
    offenders = []
    for path in _sources():
        if path == CONFIG_C:
            continue
        for n, line in enumerate(_code(path).splitlines(), 1):
            if re.search(r"\b(secure_getenv|getenv|environ)\b", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "read the environment through c_src/config.h instead:\n" + "\n".join(offenders)


def test_config_c_reads_every_kept_variable():
    names = _config_variables()
    assert names == ["FLASHCORE_FAMILY", "FLASHCORE_DECODE_SPLITS", "FLASHCORE_KV_SPLITS",
                     "FLASHCORE_SM90_SHORT", "FLASHCORE_SM80_TILES", "FLASHCORE_PDL",
                     "FLASHCORE_BWD_PERSISTENT"]
    assert "getenv" not in _code(CONFIG_C), "config.c reads the environment in one pass (environ)"


@pytest.mark.parametrize("doc", ["docs/TUNING.md", "docs/ARCHITECTURE.md"])
def test_every_variable_documented_once(doc):
    text = (ROOT / doc).read_text()
    for name in _config_variables():
        rows = re.findall(rf"^\| `{name}` \|", text, flags=re.M)
        assert len(rows) == 1, f"{doc}: {name} needs exactly one row in its table, has {len(rows)}"


def test_retired_knobs_are_gone():
    """No code reads or sets a retired variable: C/C++/CUDA code (comments aside) names none,
    and no Python or shell file sets one ("NAME" as a string, NAME=value)."""
    tuning = (ROOT / "docs" / "TUNING.md").read_text()
    retired_section = tuning.split("## Retired knobs", 1)[1]
    # This file, and the C test that checks that they are ignored.
    exempt = {pathlib.Path(__file__).resolve(), ROOT / "tests" / "c" / "test_config.c"}
    users = []
    for d in SOURCE_DIRS + ("tests", "tools", "bench", "ci", "python"):
        for path in sorted((ROOT / d).rglob("*")):
            if not path.is_file() or path in exempt or path.suffix not in SOURCE_SUFFIXES | {".py", ".sh"}:
                continue
            if path.suffix in SOURCE_SUFFIXES:
                code, pattern = _code(path), r"\b{}\b"
            else:
                code, pattern = path.read_text(errors="replace"), r"[\"']{}[\"'=]|\b{}="
            users += [f"{path.relative_to(ROOT)}: {name}" for name in RETIRED
                      if re.search(pattern.format(name, name), code)]
    assert not users, "retired variables (they do nothing now):\n" + "\n".join(users)
    for name in RETIRED:
        assert name in retired_section, f"docs/TUNING.md's retired list lacks {name}"
