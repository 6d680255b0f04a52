"""FlashCore: a fused scaled-dot-product attention op for PyTorch.

Importing this package loads ``libflashcore_op.so`` (built beside this file) and registers
``torch.ops.flashcore.sdpa``, a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
with the same schema. On CUDA devices FlashCore has kernels for, it runs a FlashCore kernel on
the current stream (attn_mask included: bool or additive of query's dtype; on Hopper a bool mask
whose tiles TMA reads, at head dim 64 or 128, runs in the sm90 family, every other mask in the
sm80-class family); everything else (CPU tensors, dropout, float32 masks with 16-bit inputs,
other dtypes / head dims / devices) goes to PyTorch's own SDPA.

Usage::

    import torch, flashcore
    q = k = v = torch.randn(2, 8, 1024, 64, device="cuda", dtype=torch.float16)
    out = flashcore.sdpa(q, k, v, is_causal=True)        # or torch.ops.flashcore.sdpa(...)
    print(flashcore.explain(q, k, v, is_causal=True))     # "kernel sm80" / "fallback: <why>"

The environment variable ``FLASHCORE_FAMILY`` (``auto`` | ``sm80`` | ``sm90`` | ``decode``, read at each
call) forces a kernel family; forcing one that cannot run on the device raises.

Training: a call that records gradients runs FlashCore's forward and backward, or, where the
bench did not measure FlashCore's pair faster than PyTorch's on the device (on an H100: the
sm80-class and Python backwards, D=64, and sequences shorter than the sm90 entries' thresholds in
_ops.TRAINING_TABLE), aten's SDPA for both passes. ``explain_training(q, k, v, ...)``
says which and why; ``FLASHCORE_TRAINING`` (``auto`` | ``flashcore`` | ``aten``, read at each
call) forces one route. ``torch.use_deterministic_algorithms(True)`` selects the bitwise
reproducible sm80-class backward kernel.

Installs without kernels: where the package was installed without its compiled library (a
source build on a machine without nvcc skips CUDA, saying so; see setup.py) or PyTorch is built
without CUDA, ``import flashcore`` still works and ``torch.ops.flashcore.sdpa`` is PyTorch's own
SDPA (``_fallback.py``). ``flashcore.FALLBACK_ONLY`` then says why (it is ``""`` when the
library is loaded), ``explain`` answers ``"fallback: <why>"``, and the first call on a CUDA
tensor warns once.
"""

import ctypes
import os

import torch

__version__ = "0.1.0"
__all__ = ["sdpa", "explain", "__version__", "FALLBACK_ONLY"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_OP_LIB = os.path.join(_HERE, "libflashcore_op.so")
_C_LIB = os.path.join(_HERE, "libflashcore.so")

# Why this install cannot run FlashCore's kernels ("" when its library is loaded). Both cases
# below are installs that work as designed, so they fall back instead of failing the import:
# a CPU-only machine's CI can import FlashCore and run the code that calls it.
FALLBACK_ONLY = ""
if not os.path.exists(_OP_LIB):
    # setup.py skipped the CUDA build (no nvcc), or an in-tree checkout was never built.
    FALLBACK_ONLY = ("this flashcore install has no compiled library (installed where nvcc was "
                     "not found; reinstall with CUDA 13's nvcc on PATH for the kernels)")
elif torch.version.cuda is None:
    # The library links libtorch_cuda.so, which a CPU-only PyTorch does not have.
    FALLBACK_ONLY = (f"this PyTorch ({torch.__version__}) is built without CUDA, which "
                     "FlashCore's library needs")
else:
    try:
        torch.ops.load_library(_OP_LIB)
    except OSError as e:  # present but broken: an error, not a silent fallback
        raise ImportError(f"flashcore: cannot load {_OP_LIB}: {e}. Rebuild it against this "
                          "PyTorch (it needs torch >= 2.11 with CUDA).") from e

# Reason codes of torch.ops.flashcore.explain / explain_bwd and of the training route (_ops.py),
# their sentences, the bases that carry an fc_status, and the kernel families' names have one
# definition, torch_op/reasons.h: read here from libflashcore_op.so's plain C exports through
# ctypes, opened on first use (never under FALLBACK_ONLY). fc_status sentences: libflashcore.so.
_clib = None
_oplib = None


def _status_string(status: int) -> str:
    """fc_status_string() from libflashcore.so (the C API), through ctypes."""
    global _clib
    if _clib is None:
        _clib = ctypes.CDLL(_C_LIB)
        _clib.fc_status_string.restype = ctypes.c_char_p
        _clib.fc_status_string.argtypes = [ctypes.c_int]
    return _clib.fc_status_string(status).decode()


def _op_lib():
    """libflashcore_op.so's exports of reasons.h (end of torch_op/flashcore_op.cpp), through
    ctypes: the library torch.ops.load_library already loaded, so the same handle."""
    global _oplib
    if _oplib is None:
        lib = ctypes.CDLL(_OP_LIB)
        signatures = {"fc_op_reason_string": (ctypes.c_char_p, [ctypes.c_int, ctypes.c_int]),
                      "fc_op_reason_given_by": (ctypes.c_int, [ctypes.c_int]),
                      "fc_op_reason_code": (ctypes.c_int, [ctypes.c_char_p]),
                      "fc_op_reason_status_base": (ctypes.c_int, []),
                      "fc_op_reason_note_base": (ctypes.c_int, []),
                      "fc_op_family_name": (ctypes.c_char_p, [ctypes.c_int])}
        try:
            for name, (restype, argtypes) in signatures.items():
                getattr(lib, name).restype = restype
                getattr(lib, name).argtypes = argtypes
        except AttributeError as e:
            raise ImportError(f"flashcore: {_OP_LIB} is older than this package ({e}); "
                              "rebuild it") from e
        _oplib = lib
    return _oplib


def _reason_code(name: str) -> int:
    """The code of the reason torch_op/reasons.h names `name` (e.g. ``"kMaskRequiresGrad"``)."""
    code = _op_lib().fc_op_reason_code(name.encode())
    if code < 0:
        raise LookupError(f"flashcore: {_OP_LIB} has no reason {name!r} (torch_op/reasons.h)")
    return code


def _reason_string(reason: int, backward: bool = False) -> str:
    """An op-level reason's sentence, in explain's wording or (backward) explain_bwd's."""
    words = _op_lib().fc_op_reason_string(reason, int(backward))
    return words.decode() if words is not None else f"reason {reason}"


def _status_base() -> int:
    """reason = this + fc_status: a fallback because the C layer gave that status."""
    return _op_lib().fc_op_reason_status_base()


def _note_base() -> int:
    """reason = this + fc_status: a kernel in the sm80 family; the sm90 family gave that status."""
    return _op_lib().fc_op_reason_note_base()


def _family_name(family: int) -> str:
    """An fc_family's name: "auto", "sm80", "sm90", "decode" (the number for another value)."""
    name = _op_lib().fc_op_family_name(family)
    return name.decode() if name is not None else str(family)


if FALLBACK_ONLY:
    # torch.ops.flashcore.sdpa as PyTorch's SDPA, same schema (nothing else is registered).
    from . import _fallback  # noqa: E402
    _fallback.reason = FALLBACK_ONLY
else:
    # Fakes (torch.compile), the backward op and autograd for the ops just loaded.
    from . import _ops  # noqa: E402,F401
from . import _causal_bias  # noqa: E402
from . import _entry  # noqa: E402  (after the ops it calls are registered)

def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """Same arguments and result as ``torch.nn.functional.scaled_dot_product_attention``
    (``torch.ops.flashcore.sdpa``'s; a call that records no gradient skips its Python Autograd
    kernel: _entry.py)."""
    return _entry.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _built_for(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether this build compiled forward kernels for ``head_dim`` and ``dtype``.

    FLASHCORE_HEAD_DIMS and FLASHCORE_DTYPES can trim a build (docs/TUNING.md, "Build options");
    CMake records what it kept in ``_build_config.py`` beside the libraries. The GPU tests use
    this to skip the cases a trimmed build left out instead of failing on them. A build made
    before that record existed counts as the full set."""
    if FALLBACK_ONLY:
        return False
    try:
        from . import _build_config
    except ImportError:
        return True
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
    return head_dim in _build_config.HEAD_DIMS and name in _build_config.DTYPES


@torch.compiler.disable  # a diagnostic on real tensors: runs eagerly inside compiled code
def explain(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False, **band) -> str:
    """Which path ``sdpa`` takes for these arguments: ``"kernel sm80"``, ``"kernel sm90"``,
    ``"kernel sm80 (not sm90: <why>)"`` (on Hopper, e.g. a bool ``attn_mask`` at head dim 96)
    or ``"fallback: <reason>"`` (on Hopper also a mask that only the sm80-class family would
    run where PyTorch's SDPA is faster, e.g. an additive one; ``lse=True`` answers for the
    forward that also returns the LSE, which still runs it). Raises for the same bad
    inputs ``sdpa`` raises for (an install without FlashCore's library checks nothing: ``"fallback: <why>"``
    for every call). A CausalBias ``attn_mask`` (``causal_upper_left`` / ``causal_lower_right``)
    is answered for the call it stands for (_causal_bias.py). A bool mask that keeps no pair above
    the diagonal (HuggingFace's padded causal mask), which sdpa runs as causal with the mask, is
    read to say so (once per mask tensor, a wait for the device; _ops._forward_mask_as_causal)."""
    if not band and _causal_bias.is_causal_bias(attn_mask):
        return _causal_bias.explain_causal_bias(_explain_words, query, key, value, attn_mask,
                                                dropout_p, is_causal, scale, enable_gqa)
    words = _explain_words(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                           **band)
    if (not band and words == "kernel sm90" and dropout_p == 0.0 and not FALLBACK_ONLY
            and _ops._forward_mask_as_causal(query, key, value, attn_mask, is_causal, scale, enable_gqa)):
        return ("kernel sm90 (as causal: this bool mask keeps no pair above the diagonal, so the key "
                "blocks above it are skipped)")
    return words


def _explain_words(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, **band) -> str:
    """explain's words for torch.ops.flashcore.explain's answer. band: window_left /
    window_right / bottom_right / softcap / sinks (flashcore.explain_attention), and lse=True for
    the forward that also returns the LSE (training, flashcore.attention): a mask PyTorch's SDPA
    runs faster in inference still runs in a kernel there, whose LSE the backward reads."""
    if FALLBACK_ONLY:
        return f"fallback: {FALLBACK_ONLY}"
    family, reason = torch.ops.flashcore.explain(query, key, value, attn_mask, dropout_p,
                                                 is_causal, scale=scale, enable_gqa=enable_gqa,
                                                 **band)
    if reason == 0:
        return f"kernel {_family_name(family)}"
    if reason >= _note_base():
        return f"kernel {_family_name(family)} (not sm90: {_status_string(reason - _note_base())})"
    if reason >= _status_base():
        return f"fallback: {_status_string(reason - _status_base())}"
    return f"fallback: {_reason_string(reason)}"


def _bwd_reason_string(reason: int) -> str:
    if reason >= _status_base():
        return _status_string(reason - _status_base())
    return _reason_string(reason, backward=True)


def _backward_string(reason: int, family: int, by_determinism: bool) -> str:
    """explain_bwd's (reason, family) in words: "kernel sm90", "kernel sm80",
    "kernel sm80 (deterministic)" (determinism ruled out the sm90 kernel) or "python: <why>"."""
    if reason != 0:
        return f"python: {_bwd_reason_string(reason)}"
    words = f"kernel {_family_name(family)}"
    return f"{words} (deterministic)" if by_determinism else words


@torch.compiler.disable
def explain_backward(grad_out, query, key, value, out, lse, grad_lse=None, is_causal=False,
                     scale=None, enable_gqa=False, deterministic=None, attn_mask=None) -> str:
    """Which path FlashCore's backward takes for these tensors (out, lse from
    ``torch.ops.flashcore.sdpa_fwd``): ``"kernel sm90"`` or ``"kernel sm80"`` (a fused backward
    kernel family), ``"kernel sm80 (deterministic)"`` (the sm90 kernel would run, but
    determinism is asked for), or ``"python: <reason>"`` (the Python backward in _ops.py).
    ``attn_mask`` as given to the forward (both kernel families take bool and additive masks
    without ``is_causal``; one that requires grad goes to python, see ``explain_training``). ``deterministic`` defaults to
    ``torch.are_deterministic_algorithms_enabled()``, which the backward reads when it runs.
    Whether a training call reaches FlashCore's backward at all: ``explain_training``."""
    if FALLBACK_ONLY:  # no library: autograd runs through PyTorch's SDPA
        return f"aten: {FALLBACK_ONLY}"
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    args = (grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, enable_gqa)
    family, reason = _ops._EXPLAIN_BWD(*args, bool(deterministic), attn_mask)  # explain_bwd
    by_determinism = (reason == 0 and bool(deterministic) and family == 1
                      and _ops._EXPLAIN_BWD(*args, False, attn_mask)[0] == 2)
    return _backward_string(reason, family, by_determinism)


# What explain_training says of each backward path that a table entry sends to aten.
_PATH_WORDS = {"sm90": "the sm90 kernel", "sm90-masked": "the sm90 kernel with a mask",
               "sm90-masked-additive": "the sm90 kernel with an additive mask",
               "sm80": "the sm80-class kernel"}


@torch.compiler.disable
def explain_training(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False) -> str:
    """Where a training call (one whose inputs require grad) of ``sdpa`` with these arguments
    goes, and why:

    * ``"flashcore: forward <path>, backward <path>"``, e.g. ``"flashcore: forward kernel sm90,
      backward kernel sm90"`` (the paths as ``explain`` and ``explain_backward`` name them), with
      a note in parentheses where one applies (no measurement on this device, an override);
    * ``"aten: <why>"``: both passes in PyTorch's SDPA, e.g. ``"aten: FlashCore's backward here
      would be the sm80-class kernel, not faster than PyTorch's on this device (...)"``, dropout,
      or ``FLASHCORE_TRAINING=aten``.

    Raises for the same bad inputs ``sdpa`` raises for."""
    if FALLBACK_ONLY:
        return f"aten: {FALLBACK_ONLY}"
    forward = _explain_words(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                             lse=True)
    if dropout_p > 0.0:
        return "aten: dropout_p > 0 (aten owns the dropout RNG and its backward)"
    mode, why = _ops._training_mode()
    if mode == "aten":
        return f"aten: {why}"
    deterministic = torch.are_deterministic_algorithms_enabled()
    args = (query, key, value, attn_mask, is_causal, scale, enable_gqa)
    route = _ops.training_route(*args, deterministic=deterministic)
    by_determinism = (route.reason == 0 and deterministic and route.family == 1
                      and _ops.training_route(*args, deterministic=False).family == 2)
    backward = _backward_string(route.reason, route.family, by_determinism)
    if mode == "flashcore":
        return f"flashcore: forward {forward}, backward {backward} ({why})"
    if route.to_aten:
        if route.path == "python":
            words = f"the Python backward ({_bwd_reason_string(route.reason)})"
        else:
            words = _PATH_WORDS[route.path] + (" (deterministic)" if by_determinism else "")
        return (f"aten: FlashCore's backward here would be {words}, not faster than PyTorch's on "
                f"this device ({route.note or 'docs/experiments/README.md'})")
    note = f" ({route.note})" if route.note else ""
    return f"flashcore: forward {forward}, backward {backward}{note}"


__all__ += ["explain_backward", "explain_training"]


# Drop-in use (docs/USAGE.md "Drop-in use"): flashcore.patch() / unpatch() / patched() route
# torch.nn.functional.scaled_dot_product_attention to FlashCore. The transformers integration
# is imported only on request: `import flashcore.integrations.hf` registers "flashcore".
from .integrations.patch import is_patched, patch, patched, unpatch  # noqa: E402

__all__ += ["patch", "unpatch", "patched", "is_patched"]

# SDPA plus a sliding window and bottom-right causal alignment (attention.py).
from .attention import attention, explain_attention  # noqa: E402

__all__ += ["attention", "explain_attention"]

# Packed variable-length sequences, PyTorch's varlen API and which path a call takes (varlen.py).
from .varlen import explain_varlen, varlen_attn  # noqa: E402,F401
