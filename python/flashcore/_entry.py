"""The Python entry points' call into the op: ``flashcore.sdpa``, ``flashcore.patch()``'s
``scaled_dot_product_attention`` and the transformers integration all call ``sdpa`` here.

A call that records a gradient (grad mode on and an input that requires grad) goes to
``torch.ops.flashcore.sdpa``, whose Autograd kernel (``_ops._sdpa_autograd``) picks the training
route. Any other call, every inference call included, goes to ``flashcore::_sdpa_inference``:
the same C++ kernels under an op with no Autograd kernel, so the dispatcher does not stop in
Python on the way (sdpa's Autograd kernel is a Python function: about 7 us of host time per
call on the H100's host, more than a decoding kernel's GPU time;
docs/experiments/forward-masks.md, "Thirty-second session").

The check is one Python expression, which torch.compile traces (it guards on grad mode and on
the inputs' requires_grad, as for any function). Without the compiled library (FALLBACK_ONLY)
there is no ``_sdpa_inference``, and every call goes to ``torch.ops.flashcore.sdpa``.
"""
import torch

from ._causal_bias import is_causal_bias, sdpa_with_causal_bias

__all__ = ["sdpa"]

try:
    _INFERENCE = torch.ops.flashcore._sdpa_inference.default
except (AttributeError, RuntimeError):  # the package runs without its compiled library
    _INFERENCE = None
else:
    from ._ops import _forward_as_causal, _forward_mask_as_causal


def records_grad(query, key, value, attn_mask=None) -> bool:
    """Whether autograd records this call: grad mode on and an input that requires grad."""
    return torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
        or (attn_mask is not None and attn_mask.requires_grad))


def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False):
    """torch.ops.flashcore.sdpa's result, through _sdpa_inference where nothing records a
    gradient (keyword arguments passed only when not at their defaults: each costs host time).
    A CausalBias attn_mask is not a mask to read: _causal_bias turns it into the call it means."""
    if attn_mask is not None and type(attn_mask) is not torch.Tensor and is_causal_bias(attn_mask):
        return sdpa_with_causal_bias(sdpa, query, key, value, attn_mask, dropout_p, is_causal,
                                     scale, enable_gqa)
    if _INFERENCE is None or records_grad(query, key, value, attn_mask):
        return torch.ops.flashcore.sdpa(query, key, value, attn_mask, dropout_p, is_causal,
                                        scale=scale, enable_gqa=enable_gqa)
    # A bool mask inside the causal triangle (HuggingFace's padded causal masks): the kernel's
    # causal configuration with the mask, its key blocks above the diagonal skipped (_ops).
    if (attn_mask is not None and attn_mask.dtype == torch.bool and dropout_p == 0.0
            and _forward_mask_as_causal(query, key, value, attn_mask, is_causal, scale, enable_gqa)):
        return _forward_as_causal(query, key, value, attn_mask, scale, enable_gqa)[0]
    if scale is None and not enable_gqa:
        return _INFERENCE(query, key, value, attn_mask, dropout_p, is_causal)
    return _INFERENCE(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                      enable_gqa=enable_gqa)
