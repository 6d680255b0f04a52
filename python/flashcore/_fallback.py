"""``torch.ops.flashcore.sdpa`` for an install that has no usable FlashCore library.

``flashcore/__init__.py`` imports this module instead of loading ``libflashcore_op.so`` when
that library is absent (the package was built where nvcc was not found, so setup.py skipped
the CUDA build: see setup.py) or cannot work here (a PyTorch built without CUDA). It defines
the op with the C++ op's exact schema, so code written for FlashCore runs unchanged
(``torch.ops.flashcore.sdpa``, ``flashcore.sdpa``, ``flashcore.patch()``, the transformers
integration): every call is PyTorch's own ``scaled_dot_product_attention``.

The op is CompositeImplicitAutograd: autograd, torch.compile and meta tensors see aten's SDPA
itself, so gradients and traced graphs are PyTorch's. The output is put in the C++ op's
layout (_layout.py).
"""
import warnings

import torch

from ._layout import in_output_layout

# Kept alive for the whole process: the library object owns the registrations.
_lib = torch.library.Library("flashcore", "DEF")
_lib.define(
    "sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, float dropout_p=0., "
    "bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor")

# Why there are no kernels (set by flashcore/__init__.py before any call).
reason = "no FlashCore library"
_warned = False


def _warn_once_on_cuda():
    """A CUDA tensor reaching this op means a GPU machine runs without FlashCore's kernels, which
    is rarely what its user wants: say so once. CPU calls stay quiet (a full build sends CPU
    tensors to PyTorch too)."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"flashcore: {reason}; CUDA calls run PyTorch's SDPA", stacklevel=3)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    if query.is_cuda:
        _warn_once_on_cuda()
    return in_output_layout(torch.ops.aten.scaled_dot_product_attention(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
        enable_gqa=enable_gqa), query)


_lib.impl("sdpa", _sdpa, "CompositeImplicitAutograd")
