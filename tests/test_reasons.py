"""The op layer's reason codes have one definition, torch_op/reasons.h (issue 33).

explain / explain_bwd return (family, reason); the Python package turns reasons and families
into words. Checked here, on the CPU: every code the C++ ops can give has a sentence, the Python
package's words are the library's (read through its plain C exports, not a copy), and the
numbering is the one the ops return and callers compare against.
"""
import ctypes
import os
import re
import types

import pytest
import torch

import flashcore

pytestmark = pytest.mark.skipif(bool(flashcore.FALLBACK_ONLY),
                                reason="no compiled libflashcore_op.so in this install")

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_OP = os.path.join(_REPO, "torch_op")
# reasons.h's FC_OP_REASON_* bits: who gives a code.
FWD, BWD, ROUTE = 1, 2, 4
# The numbering callers and tests compare against: never renumbered.
PINNED = {"kNotCuda": 1, "kNot4D": 2, "kShapeBroadcast": 3, "kValueHeadDim": 4, "kHeadsNoGqa": 5,
          "kDropout": 6, "kDtype": 7, "kMaskDtype": 8, "kMaskShape": 9, "kMaskDevice": 10,
          "kBwdOperands": 11, "kMaskRequiresGrad": 12, "kSinksLayout": 13, "kCudnnDecodes": 14}


@pytest.fixture(scope="module")
def lib():
    """libflashcore_op.so's exports through a ctypes handle of this test's own."""
    handle = ctypes.CDLL(flashcore._OP_LIB)
    handle.fc_op_reason_string.restype = ctypes.c_char_p
    handle.fc_op_reason_string.argtypes = [ctypes.c_int, ctypes.c_int]
    handle.fc_op_reason_given_by.argtypes = [ctypes.c_int]
    handle.fc_op_reason_code.argtypes = [ctypes.c_char_p]
    handle.fc_op_family_name.restype = ctypes.c_char_p
    handle.fc_op_family_name.argtypes = [ctypes.c_int]
    return handle


def listed(lib):
    """{code: given_by} of every op-level reason reasons.h lists."""
    base = lib.fc_op_reason_status_base()
    return {c: lib.fc_op_reason_given_by(c) for c in range(1, base) if lib.fc_op_reason_given_by(c)}


def test_every_listed_reason_has_its_sentences(lib):
    codes = listed(lib)
    assert sorted(codes) == sorted(PINNED.values())
    for code, given_by in codes.items():
        assert given_by & (FWD | BWD | ROUTE) == given_by != 0, code
        forward, backward = lib.fc_op_reason_string(code, 0), lib.fc_op_reason_string(code, 1)
        assert forward and backward, code  # each code reads in explain's and explain_bwd's words
    # Only reason 7 words the backward differently: its kernels have no float32.
    differ = [c for c in codes if lib.fc_op_reason_string(c, 0) != lib.fc_op_reason_string(c, 1)]
    assert differ == [7]
    assert lib.fc_op_reason_string(7, 0) == b"dtype is not float16, bfloat16 or float32"
    assert lib.fc_op_reason_string(7, 1) == b"dtype is not float16 or bfloat16"
    # Nothing outside the list, nor at the bases (those codes carry an fc_status instead).
    for code in (-1, 0, 15, 99, 100, 104, 1000, 1004):
        assert lib.fc_op_reason_string(code, 0) is None and lib.fc_op_reason_given_by(code) == 0
    assert (lib.fc_op_reason_status_base(), lib.fc_op_reason_note_base()) == (100, 1000)


def test_numbering_is_pinned(lib):
    for name, code in PINNED.items():
        assert lib.fc_op_reason_code(name.encode()) == code, name
    assert lib.fc_op_reason_code(b"kKernel") == lib.fc_op_reason_code(b"no such reason") == -1
    # Reason 12 is the training route's own (a mask that requires grad): the C++ ops never give it.
    assert lib.fc_op_reason_given_by(12) == ROUTE
    ops = flashcore._ops
    assert (ops._REASON_NOT_CUDA, ops._REASON_NOT_4D, ops._REASON_SHAPES,
            ops._REASON_BWD_MASK) == (1, 2, 3, 12)
    assert [lib.fc_op_family_name(f) for f in range(5)] == [b"auto", b"sm80", b"sm90", b"decode",
                                                             None]


def _code(path):
    """A C++ source without its comments and string literals."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


@pytest.mark.skipif(not os.path.isdir(_TORCH_OP), reason="no torch_op/ sources beside the tests")
def test_ops_return_only_listed_reasons(lib):
    """Each reason the forward (flashcore_op.cpp), the backward (flashcore_bwd_op.cpp) or both
    (op_common.h's set_mask) name is listed as given by them, and each listed one is named."""
    codes = listed(lib)
    sources = {"flashcore_op.cpp": FWD, "flashcore_bwd_op.cpp": BWD, "op_common.h": FWD | BWD}
    named = {FWD: set(), BWD: set()}
    for name, side in sources.items():
        text = _code(os.path.join(_TORCH_OP, name))
        # A fallback always names its reason: a code (reasons.h), a status, or set_mask's answer.
        for arg in re.findall(r"\bfallback\(([^()]*(?:\([^()]*\))?[^()]*)\)", text):
            assert re.fullmatch(r"\s*(k[A-Z]\w*|kStatusBase \+ \w+|why)\s*", arg), (name, arg)
        for token in set(re.findall(r"\bk[A-Z]\w*", text)):
            code = lib.fc_op_reason_code(token.encode())
            if code < 0:
                continue  # not a reason: kKernel, kStatusBase, ...
            assert codes[code] & side == side, (name, token)
            for bit in (FWD, BWD):
                if side & bit:
                    named[bit].add(code)
    for bit in (FWD, BWD):
        assert named[bit] == {c for c, by in codes.items() if by & bit}


def test_python_words_come_from_the_library(lib, monkeypatch):
    for code in listed(lib):
        assert flashcore._reason_string(code) == lib.fc_op_reason_string(code, 0).decode()
        assert flashcore._bwd_reason_string(code) == lib.fc_op_reason_string(code, 1).decode()
    assert flashcore._reason_string(99) == "reason 99"  # a code the library does not know
    assert [flashcore._family_name(f) for f in range(5)] == ["auto", "sm80", "sm90", "decode", "4"]
    assert (flashcore._status_base(), flashcore._note_base()) == (100, 1000)
    # With the library's answers replaced, the package's words change: no copy stands behind them.
    real = flashcore._op_lib()
    names = ("fc_op_reason_given_by", "fc_op_reason_code", "fc_op_reason_status_base",
             "fc_op_reason_note_base", "fc_op_family_name")
    stub = types.SimpleNamespace(**{n: getattr(real, n) for n in names},
                                 fc_op_reason_string=lambda code, backward: b"from the stub")
    monkeypatch.setattr(flashcore, "_oplib", stub)
    q = torch.randn(1, 2, 4, 8)
    assert flashcore.explain(q, q, q) == "fallback: from the stub"
    out, lse = torch.ops.flashcore.sdpa_fwd(q, q, q)
    assert flashcore.explain_backward(torch.randn_like(out), q, q, q, out, lse) == \
        "python: from the stub"


def test_cpu_and_meta_calls_give_reason_1(lib):
    """The ops' codes for the cases a machine without a GPU reaches: not CUDA."""
    not_cuda = lib.fc_op_reason_code(b"kNotCuda")
    q = torch.randn(1, 2, 4, 8)
    assert torch.ops.flashcore.explain(q, q, q) == (0, not_cuda)
    assert torch.ops.flashcore.explain(*(t.to("meta") for t in (q, q, q))) == (0, not_cuda)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, q, q)
    g = torch.randn_like(out)
    assert torch.ops.flashcore.explain_bwd(g, q, q, q, out, lse, None, False, None, False) == \
        (0, not_cuda)
    expected = "fallback: " + lib.fc_op_reason_string(not_cuda, 0).decode()
    assert flashcore.explain(q, q, q) == expected == "fallback: a tensor is not on a CUDA device"
