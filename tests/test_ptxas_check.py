"""ci/ptxas_check.py, the compiler launcher every CUDA compile goes through: it must fail a compile
whose ptxas report shows a spill, a stack frame, an ignored setmaxnreg or serialized wgmma, pass a
clean one, and pass the compiler's own failure through. The "compiler" here is a Python one-liner
that prints a ptxas report and exits."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / "ci" / "ptxas_check.py"
ENTRY = "ptxas info    : Compiling entry function '_Z6kernelv' for 'sm_90a'"
CLEAN = "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"


def run_check(report_lines, exit_code=0, env=None, tmp_path=None):
    """ptxas_check.py around a fake compiler that prints `report_lines`, writes the `-o` object
    and exits with `exit_code`. Returns (returncode, stderr, whether the object is left)."""
    obj = tmp_path / "kernel.o"
    script = (f"import sys; open({str(obj)!r}, 'w').write('obj'); "
              f"print({chr(10).join(report_lines)!r}); sys.exit({exit_code})")
    proc = subprocess.run([sys.executable, str(CHECK), sys.executable, "-c", script, "-o", str(obj)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})
    return proc.returncode, proc.stderr, obj.exists()


def test_clean_report_passes(tmp_path):
    rc, err, kept = run_check([ENTRY, CLEAN], tmp_path=tmp_path)
    assert (rc, err, kept) == (0, "", True)


@pytest.mark.parametrize("line, what", [
    ("    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads", "spill"),
    ("ptxas info    : (C7508) Potential Performance Loss: setmaxnreg ignored; ...", "setmaxnreg ignored"),
    ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized "
     "due to non wgmma instructions reading accumulator registers of a wgmma between start and end "
     "of the pipeline stage in the function '_Z6kernelv'", "serialized"),
    ("ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized "
     "due to non wgmma instructions defining accumulator registers of a wgmma between start and end "
     "of the pipeline stage in the function '_Z6kernelv'", "serialized"),
])
def test_bad_report_fails_and_removes_the_object(tmp_path, line, what):
    rc, err, kept = run_check([ENTRY, CLEAN, line], tmp_path=tmp_path)
    assert rc == 1 and what in err and "_Z6kernelv" in err
    assert not kept  # else the next build would take the rejected object as up to date


def test_allow_spills_only_reports(tmp_path):
    line = "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads"
    rc, err, kept = run_check([ENTRY, line], env={"FLASHCORE_ALLOW_SPILLS": "1"}, tmp_path=tmp_path)
    assert rc == 0 and "spill" in err and kept


def test_compiler_failure_passes_through(tmp_path):
    rc, _, _ = run_check([ENTRY, CLEAN], exit_code=3, tmp_path=tmp_path)
    assert rc == 3
