"""PyTorch's causal masks as objects, ``torch.nn.attention.bias.CausalBias`` (made by
``causal_upper_left(Sq, Sk)`` / ``causal_lower_right(Sq, Sk)``), passed as ``attn_mask``.

Such an object is a tensor subclass whose data is not the mask: a kernel (or aten, called through
the dispatcher) that read it as a mask would compute a wrong result without an error. PyTorch's
own ``F.scaled_dot_product_attention`` intercepts it (``CausalBias.__torch_function__`` ->
``CausalBias._dispatch``); FlashCore's entry points do the same here, following ``_dispatch``
rule by rule:

* ``is_causal=True`` with a CausalBias raises PyTorch's ValueError;
* upper-left, or lower-right with the bias's ``seq_len_q == seq_len_kv``: ``is_causal=True`` and
  no mask (FlashCore's top-left causal kernels);
* lower-right otherwise: bottom-right causal, ``flashcore.attention(..., causal_alignment=
  "bottom_right")`` (the Hopper family's and the decode kernels' bands; elsewhere its fallback),
  where no dropout is asked and every query row sees a key (Sq <= Sk); otherwise PyTorch's
  ``CausalBias._dispatch`` itself (dropout, and rows that see no key, whose result PyTorch
  defines).

Callers: ``_entry.sdpa`` (``flashcore.sdpa``, the HuggingFace integration), ``flashcore.patch()``'s
``F.scaled_dot_product_attention`` and ``flashcore.explain``. ``flashcore.attention`` takes the
objects itself (``attention._resolve``).

``torch.ops.flashcore.sdpa`` called with one refuses it (its Autograd kernel raises
CAUSAL_BIAS_IN_OP): PyTorch's subclass protocol (``CausalBias.__torch_function__``, which
intercepts only ``F.scaled_dot_product_attention``) would hand the op's result back as a
CausalBias, a tensor whose every later use is wrong, and an op cannot prevent that.
"""
import torch

try:
    from torch.nn.attention.bias import CausalBias, CausalVariant
except ImportError:  # torch without the bias module: no such objects exist
    CausalBias = CausalVariant = None

__all__ = ["is_causal_bias", "sdpa_with_causal_bias", "explain_causal_bias", "CAUSAL_BIAS_IN_OP"]

CAUSAL_BIAS_IN_OP = (
    "torch.ops.flashcore.sdpa: attn_mask is a CausalBias (causal_upper_left / causal_lower_right), "
    "which the op cannot take: PyTorch would return its result as a CausalBias. Call "
    "flashcore.sdpa(...) or F.scaled_dot_product_attention(...) (with flashcore.patch()) with it, "
    "or pass is_causal=True (upper-left) / flashcore.attention(..., is_causal=True, "
    "causal_alignment='bottom_right') (lower-right)")


def is_causal_bias(attn_mask) -> bool:
    """Whether attn_mask is a CausalBias (a plain tensor or None answers at the first test)."""
    return (attn_mask is not None and type(attn_mask) is not torch.Tensor and CausalBias is not None
            and isinstance(attn_mask, CausalBias))


def _top_left(bias) -> bool:
    return bias.seq_len_q == bias.seq_len_kv or bias.variant == CausalVariant.UPPER_LEFT


def _bottom_right_in_kernels(query, key, dropout_p) -> bool:
    return dropout_p == 0.0 and query.shape[-2] <= key.shape[-2]


def sdpa_with_causal_bias(sdpa, query, key, value, bias, dropout_p, is_causal, scale, enable_gqa):
    """SDPA of a call whose attn_mask is the CausalBias `bias`, by the rules above; `sdpa(query,
    key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)` is the caller's own call for
    the top-left case."""
    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True")  # PyTorch's words
    if _top_left(bias):
        return sdpa(query, key, value, None, dropout_p, True, scale, enable_gqa)
    if _bottom_right_in_kernels(query, key, dropout_p):
        from .attention import attention
        return attention(query, key, value, is_causal=True, causal_alignment="bottom_right",
                         scale=scale, enable_gqa=enable_gqa)
    return CausalBias._dispatch(query, key, value, bias, dropout_p, False, scale, enable_gqa)


def explain_causal_bias(explain, query, key, value, bias, dropout_p, is_causal, scale,
                        enable_gqa) -> str:
    """explain's words for such a call: the path sdpa_with_causal_bias takes."""
    if is_causal:
        raise ValueError("CausalBias should not be used with causal=True")
    if _top_left(bias):
        return explain(query, key, value, None, dropout_p, True, scale, enable_gqa)
    if _bottom_right_in_kernels(query, key, dropout_p):
        from .attention import explain_attention
        return explain_attention(query, key, value, is_causal=True,
                                 causal_alignment="bottom_right", scale=scale,
                                 enable_gqa=enable_gqa)
    return ("fallback: PyTorch's CausalBias (bottom-right causal "
            + ("with dropout)" if dropout_p else "with query rows that see no key)"))
