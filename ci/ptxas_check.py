#!/usr/bin/env python3
"""Compiler launcher that fails a CUDA compile whose ptxas report shows a spill, a stack frame,
an ignored setmaxnreg or serialized wgmma instructions.

CMake runs every nvcc command through this script (CMAKE_CUDA_COMPILER_LAUNCHER), so the
check happens where the report is produced: `-Xptxas -v` prints, per kernel,
    ptxas info    : Compiling entry function '<mangled>' for 'sm_90a'
    ptxas info    : Function properties for <mangled>
        N bytes stack frame, N bytes spill stores, N bytes spill loads
and, for a kernel whose wgmma pipeline it could not prove safe (C7510-C7520: "wgmma.mma_async
instructions are serialized due to ..."), a line that waits after every wgmma: the kernel then
runs, correct and a fraction as fast. The compile's own output is passed through unchanged. Set FLASHCORE_ALLOW_SPILLS=1 to report
without failing (for experiments only).

Usage: ptxas_check.py <compiler> <args...>
"""
import os
import re
import subprocess
import sys

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
IGNORED_SETMAXNREG = "C7508"  # ptxas ignored setmaxnreg: the register budget silently did not apply
WGMMA_SERIALIZED = "wgmma.mma_async instructions are serialized"


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    proc = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        return proc.returncode

    problems = []
    kernel = "?"
    for line in proc.stdout.splitlines():
        m = ENTRY.search(line)
        if m:
            kernel = f"{m.group(1)} ({m.group(2)})"
            continue
        m = FRAME.search(line)
        if m and any(int(x) for x in m.groups()):
            problems.append(f"{kernel}: {line.strip()}")
        if IGNORED_SETMAXNREG in line:
            problems.append(f"{kernel}: setmaxnreg ignored: {line.strip()}")
        if WGMMA_SERIALIZED in line:
            problems.append(f"{kernel}: {line.strip()}")
    if problems:
        print("ptxas_check: kernels with register spills, a stack frame, ignored setmaxnreg or "
              "serialized wgmma:",
              file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        if os.environ.get("FLASHCORE_ALLOW_SPILLS") != "1":
            remove_output(sys.argv[1:])
            return 1
    return 0


def remove_output(cmd):
    """Delete the object a rejected compile wrote: left in place, it is newer than its sources,
    and the next build would take it as up to date and link the spilling kernel."""
    for flag, value in zip(cmd, cmd[1:]):
        if flag == "-o" and os.path.exists(value):
            os.remove(value)


if __name__ == "__main__":
    sys.exit(main())
