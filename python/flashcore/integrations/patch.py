"""Route ``torch.nn.functional.scaled_dot_product_attention`` to FlashCore.

``flashcore.patch()`` replaces the attribute ``torch.nn.functional.scaled_dot_product_attention``
with :func:`scaled_dot_product_attention` below (same signature as PyTorch's, keyword-only
``scale`` and ``enable_gqa`` included), ``flashcore.unpatch()`` puts PyTorch's function back,
and ``with flashcore.patched(): ...`` does both around a block. Where this PyTorch has
``torch.nn.attention.varlen.varlen_attn``, the same calls route it to ``flashcore.varlen_attn``
and back (``flashcore.varlen.torch_varlen_attn``: arguments it does not know go to PyTorch's).
Both are idempotent: patching twice patches once, unpatching an unpatched torch does nothing,
and ``patched()`` restores whatever state it found (so nested blocks are fine).

What is routed where:

- plain (non-subclass, non-nested) tensors on CPU or CUDA go to ``torch.ops.flashcore.sdpa``,
  which runs a FlashCore kernel where one covers the call and PyTorch's own SDPA otherwise
  (a call that records no gradient to its twin without an Autograd kernel,
  ``flashcore::_sdpa_inference``: ``flashcore._entry``);
- DTensors sharded along the sequence go to the op too where FlashCore's context-parallel
  handlers are enabled (``flashcore.integrations.context_parallel``);
- everything the op cannot take goes to PyTorch's original function unchanged: nested
  tensors, tensor subclasses or ``__torch_function__`` overrides (DTensor, ...), devices other
  than CPU/CUDA (meta, MPS, XPU, ...), and calls that need autograd (an input requires grad
  while grad mode is on) when the op has no autograd formula registered.

Only lookups through the module attribute see the patch (``F.scaled_dot_product_attention(...)``
and ``torch.nn.functional.scaled_dot_product_attention(...)``, which is how PyTorch modules and
transformers call it); a name bound earlier with ``from torch.nn.functional import
scaled_dot_product_attention`` keeps PyTorch's function.

Under ``torch.compile`` the replacement is plain Python that Dynamo inlines: a function that
calls ``F.scaled_dot_product_attention`` after ``patch()`` compiles to a graph containing
``flashcore.sdpa`` with no graph break (this needs the op's fake implementation, which
``import flashcore`` registers). Code compiled before ``patch()``/``unpatch()`` keeps what it
traced until it recompiles (``torch._dynamo.reset()``).
"""
import contextlib
import threading

import torch
import torch.nn.functional as F

from .. import _entry
from .._causal_bias import is_causal_bias, sdpa_with_causal_bias

__all__ = ["patch", "unpatch", "patched", "is_patched", "scaled_dot_product_attention"]

# PyTorch's own function, captured at import (before anything of ours could replace it).
_ORIGINAL = F.scaled_dot_product_attention
if getattr(_ORIGINAL, "__flashcore_patch__", False):  # module reloaded while patched
    _ORIGINAL = _ORIGINAL.__wrapped__
_LOCK = threading.Lock()
_DEVICES = ("cpu", "cuda")


def _op_has_autograd() -> bool:
    """Whether flashcore::sdpa has an autograd kernel (registered by `import flashcore`)."""
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key("flashcore::sdpa", "Autograd"))
    except Exception:  # pragma: no cover - op not loaded
        return False


# Read once per patch() (registration happens at `import flashcore`, before any patch());
# a module global is a constant to Dynamo, so the check below costs nothing in a graph.
_OP_AUTOGRAD = _op_has_autograd()


def _context_parallel_takes(query, key, value, attn_mask) -> bool:
    """DTensors under PyTorch's context parallelism, where FlashCore's ring handlers are
    registered (flashcore.integrations.context_parallel.enable()): they go to FlashCore's op,
    whose DTensor handlers run PyTorch's ring with FlashCore's kernels per step."""
    if attn_mask is not None or type(query).__name__ != "DTensor":
        return False
    from . import context_parallel
    return context_parallel.enabled() and context_parallel.takes(query, key, value)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention`` computed by FlashCore where it can
    be; see the module docstring for what goes to PyTorch's original function."""
    if attn_mask is not None and type(attn_mask) is not torch.Tensor and is_causal_bias(attn_mask):
        # PyTorch's CausalBias intercepts only the function named F.scaled_dot_product_attention,
        # which is this one now: the bias becomes the call it stands for here (_causal_bias.py),
        # whose top-left case comes back through this function without a mask.
        return sdpa_with_causal_bias(_call_self, query, key, value, attn_mask, dropout_p,
                                     is_causal, scale, enable_gqa)
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    use_op = (
        not torch.overrides.has_torch_function(tensors)
        and not (query.is_nested or key.is_nested or value.is_nested)
        and query.device.type in _DEVICES
        and (_OP_AUTOGRAD or not _entry.records_grad(query, key, value, attn_mask))
    )
    if use_op:
        return _entry.sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if _context_parallel_takes(query, key, value, attn_mask):  # (the ring's handlers are sdpa's)
        return torch.ops.flashcore.sdpa(query, key, value, attn_mask, dropout_p, is_causal,
                                        scale=scale, enable_gqa=enable_gqa)
    return _ORIGINAL(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                     enable_gqa=enable_gqa)


def _call_self(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                        scale=scale, enable_gqa=enable_gqa)


scaled_dot_product_attention.__flashcore_patch__ = True
scaled_dot_product_attention.__wrapped__ = _ORIGINAL


def is_patched() -> bool:
    """Whether ``torch.nn.functional.scaled_dot_product_attention`` is FlashCore's."""
    return F.scaled_dot_product_attention is scaled_dot_product_attention


def patch() -> None:
    """Route ``torch.nn.functional.scaled_dot_product_attention`` to FlashCore. Idempotent."""
    global _OP_AUTOGRAD
    with _LOCK:
        _OP_AUTOGRAD = _op_has_autograd()
        if F.scaled_dot_product_attention is scaled_dot_product_attention:
            _route_varlen(True)
            return
        if F.scaled_dot_product_attention is not _ORIGINAL:
            raise RuntimeError(
                "flashcore.patch(): torch.nn.functional.scaled_dot_product_attention was already "
                f"replaced by {F.scaled_dot_product_attention!r}; refusing to stack on top of it")
        F.scaled_dot_product_attention = scaled_dot_product_attention
        _route_varlen(True)


def unpatch() -> None:
    """Restore PyTorch's ``torch.nn.functional.scaled_dot_product_attention``. Idempotent; leaves
    a function someone else installed after ``patch()`` alone."""
    with _LOCK:
        if F.scaled_dot_product_attention is scaled_dot_product_attention:
            F.scaled_dot_product_attention = _ORIGINAL
        _route_varlen(False)


def _route_varlen(on: bool) -> None:
    """torch.nn.attention.varlen.varlen_attn to flashcore.varlen_attn (on) or back."""
    from .. import varlen  # imported here: flashcore imports this module before varlen
    varlen._route_torch(on)


@contextlib.contextmanager
def patched():
    """``with flashcore.patched(): ...`` routes F.scaled_dot_product_attention to FlashCore inside
    the block and restores the state it found on exit (also on an exception)."""
    was_patched = is_patched()
    patch()
    try:
        yield
    finally:
        if not was_patched:
            unpatch()
