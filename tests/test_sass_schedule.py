"""ci/sass_schedule.py on a hand-written SASS listing (no GPU, no nvcc, no cuobjdump).

The listing has the shape of a kernel's main loop: a tensor-core instruction, a masking block
skipped by a forward branch, a fast and a longer exponent path, a conditional back edge, and a
barrier-retry stub after the kernel whose unconditional jump back must not count as a loop.
Each instruction's stall count sits in bits 41-44 of its upper word, as cuobjdump prints it.
"""
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("sass_schedule", os.path.join(ROOT, "ci", "sass_schedule.py"))
sass_schedule = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_schedule)

# (address, instruction, stall cycles)
LOOP = [
    (0x0000, "MOV R1, c[0x0][0x28]", 1),
    (0x0010, "HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ, !UPT", 1),  # loop head
    (0x0020, "@P0 BRA 0x50", 5),                                       # skip the masking
    (0x0030, "FSEL R24, R24, -INF , !P1", 2),
    (0x0040, "FSEL R25, R25, -INF , !P2", 2),
    (0x0050, "@P1 BRA 0xa0", 5),                                       # exact path, rarely
    (0x0060, "MUFU.EX2 R24, R24", 8),                                  # fast exponent block
    (0x0070, "MUFU.EX2 R25, R25", 1),
    (0x0080, "FADD.FTZ R14, R24, R25", 4),
    (0x0090, "BRA 0xf0", 6),
    (0x00a0, "MUFU.EX2 R24, R24", 8),                                  # exact path: as many
    (0x00b0, "MUFU.EX2 R25, R25", 1),                                  # MUFU, more instructions
    (0x00c0, "FADD.FTZ R14, R24, R25", 4),
    (0x00d0, "FMUL.FTZ R14, R14, R3", 1),
    (0x00e0, "FMUL.FTZ R15, R15, R3", 1),
    (0x00f0, "F2FP.F16.F32.PACK_AB R24, R25, R24", 1),                 # tail
    (0x0100, "@!P2 BRA 0x10", 6),                                      # back edge
    (0x0110, "EXIT", 5),
    (0x0120, "@!P3 BRA 0x120", 5),                                     # retry stub
    (0x0130, "BRA 0x10", 5),                                           # ... and its way back
]


def listing(function="_ZN9flashcore4sm9010fwd_kernelItest"):
    lines = [f"\t\tFunction : {function}"]
    for address, text, stall in LOOP:
        lines.append(f"        /*{address:04x}*/                   {text} ;   /* 0x000fe40000000f00 */")
        lines.append(f"                                                          /* 0x{stall << 41:016x} */")
    return "\n".join(lines) + "\n"


def test_parse_reads_stall_counts_and_filters_functions():
    parsed = sass_schedule.parse_listing(listing(), "fwd_kernel")
    (body,) = parsed.values()
    assert [(a, s) for a, _, s in body] == [(a, s) for a, _, s in LOOP]
    assert sass_schedule.parse_listing(listing(), "no_such_kernel") == {}


def test_loop_is_closed_by_the_conditional_back_edge_only():
    body = sass_schedule.parse_listing(listing(), "fwd")["_ZN9flashcore4sm9010fwd_kernelItest"]
    # The stub's unconditional BRA 0x10 from 0x130 would make a larger "loop"; the stub's own
    # self-loop holds no tensor-core instruction.
    assert sass_schedule.tensor_loops(body) == [(0x10, 0x100)]


def test_common_path_skips_masking_and_takes_the_fast_exponent_block():
    body = sass_schedule.parse_listing(listing(), "fwd")["_ZN9flashcore4sm9010fwd_kernelItest"]
    loop = [x for x in body if 0x10 <= x[0] <= 0x100]
    # head (HGMMA, branch: 1 + 5), the exact-path branch (5), the fast block (8 + 1 + 4 + 6),
    # the tail (1 + 6): 9 instructions, 37 cycles.
    assert sass_schedule.common_path(loop) == (9, 37)
    cycles, by_op, count = sass_schedule.summary(loop)
    assert cycles == sum(s for a, _, s in LOOP if 0x10 <= a <= 0x100)
    assert count["MUFU"] == 4 and by_op["MUFU"] == 18


@pytest.mark.parametrize("text,expected", [("@!P0 BRA 0x5920", "BRA"), ("HGMMA.64x176x16.F32 R24", "HGMMA"),
                                           ("@P1 SYNCS.ARRIVE.TRANS64.A1T0 RZ", "SYNCS")])
def test_opcode_ignores_predicates_and_modifiers(text, expected):
    assert sass_schedule.opcode(text) == expected
