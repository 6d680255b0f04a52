"""flashcore.attention: SDPA plus the variants SDPA's schema cannot express.

    out = flashcore.attention(q, k, v, is_causal=True, causal_alignment="bottom_right",
                              window_size=(4096, 0))

Arguments beyond ``F.scaled_dot_product_attention``'s (no dropout here):

* ``window_size=(left, right)``: a sliding window, as FlashAttention and PyTorch's
  ``varlen_attn`` name it: query i sees keys ``d - left .. d + right`` of its diagonal key d,
  ``-1`` meaning unbounded on that side. With ``is_causal`` nothing past d either.
* ``causal_alignment``: where the diagonal lies when Sq != Sk: ``"top_left"`` (PyTorch's
  ``is_causal``, ``causal_upper_left``: d = i) or ``"bottom_right"`` (FlashAttention's,
  ``causal_lower_right``: d = i + Sk - Sq, the last query sees the last key; decoding and chunked
  prefill against a cache). It applies to the window too.
* ``attn_mask`` may also be PyTorch's ``CausalBias`` (``torch.nn.attention.bias.causal_upper_left``
  / ``causal_lower_right``), taken as ``is_causal`` with that alignment.
* ``sinks``: attention sinks (gpt-oss's ``s_aux``), one logit per query head, shape (Hq,): each
  row's softmax denominator gets ``exp(sinks[h])`` added, a key with no value; the returned LSE
  includes it. The Hopper forward kernel adds them in its epilogue; elsewhere they are applied
  to the output exactly, ``out * sigmoid(lse - sink)``. Gradients: q, k, v through FlashCore's
  backward (whose P uses the LSE with the sink), the sinks ``-sum P_sink * (rowsum(dO * O) -
  dLSE)``.
* ``softcap``: a logit softcap (Gemma 2's ``attn_logit_softcapping``, FlashAttention's
  ``softcap``): every scaled score s becomes ``softcap * tanh(s / softcap)`` before the mask and
  the softmax; 0 (the default) means none. The Hopper kernels (forward and backward: D = 64,
  128, 256; the D=256 backward with a bool mask too) apply it without a mask, the sm80-class
  family (forward every head dim, backward D = 32-128) with or without one; elsewhere (sinks with a mask, head dims no
  kernel takes, the CPU) the call is computed in PyTorch in float32, rows in chunks, at unfused
  cost.
* ``return_lse=True`` also returns the natural-log log-sum-exp of each query row (float32;
  -inf for a row that sees no key).

A row that sees no key (bottom-right causal with Sq > Sk, a window past the keys) gives zeros.

Where it runs: a band other than plain top-left causal runs in the Hopper family's forward
kernel (``kernels/sm90/fwd_kernel.cuh``, kBand: the key loop starts and ends at the band's edges) where
that family runs the call; everywhere else (other GPUs and head dims, with an ``attn_mask``, on the
CPU) the band becomes an explicit mask for FlashCore's or PyTorch's masked path, which gives the
same result at dense cost. ``flashcore.explain_attention(...)`` says which. Gradients flow to q, k
and v (and a float ``attn_mask``) through FlashCore's backward: the Hopper family's backward
kernels take the band (D = 64, 128, 256) and skip the key blocks outside it; elsewhere the
backward reads the band's explicit mask, as the forward did.

All of it is one op, ``torch.ops.flashcore.attention_fwd``, opaque to torch.compile (no graph
break), with a fake and autograd registered here.
"""
import functools
import math
from typing import Optional, Tuple

import torch

from . import _band
from ._scale import sdpa_scale

_ALIGNMENTS = ("top_left", "bottom_right")


def _causal_bias(attn_mask):
    """(is bias, bottom_right) for PyTorch's CausalBias attn_mask objects."""
    try:
        from torch.nn.attention.bias import CausalBias, CausalVariant
    except ImportError:  # pragma: no cover - torch without the bias module
        return False, False
    if not isinstance(attn_mask, CausalBias):
        return False, False
    return True, attn_mask.variant == CausalVariant.LOWER_RIGHT


def _check_args(query, key, is_causal, causal_alignment, window_size):
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"flashcore.attention: causal_alignment must be 'top_left' or "
                         f"'bottom_right', got {causal_alignment!r}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        raise ValueError(f"flashcore.attention: window_size must be a pair of ints (left, right), "
                         f"got {window_size!r}")
    if window_size[0] < -1 or window_size[1] < -1:
        raise ValueError(f"flashcore.attention: window_size must be (left, right) with each side "
                         f"-1 (unbounded) or >= 0, got {tuple(window_size)}")
    if query.dim() < 2 or key.dim() < 2:
        raise ValueError("flashcore.attention: query and key must have at least 2 dimensions "
                         "(..., seq_len, head_dim)")


def _band_of(query, key, is_causal, window_left, window_right, bottom_right):
    sq, sk = query.shape[-2], key.shape[-2]
    if sq == 0 or sk == 0:
        return _band.Band(_band.ALL, 0, 0)
    return _band.band_bounds(sq, sk, is_causal, window_left, window_right, bottom_right)


def _with_band(attn_mask, band, query, key):
    """attn_mask with the band applied (bool: and; additive: -inf outside the band), or the
    band alone as a bool mask, (Sq, Sk) broadcast against the mask."""
    keep = _band.band_mask(range(query.shape[-2]), key.shape[-2], band, query.device)
    if attn_mask is None:
        return keep
    if attn_mask.dtype == torch.bool:
        return attn_mask & keep
    return attn_mask.masked_fill(~keep, float("-inf"))


def _check_inputs(query, key, value, attn_mask, scale, enable_gqa):
    """The op's checks of the tensors (shapes, heads, dtypes, the mask's broadcast), for the paths
    where PyTorch computes with them before any FlashCore op would: bad inputs then get the op's
    messages, which name the argument. (The library's module, imported here: without the library
    flashcore.attention is PyTorch's SDPA and never comes here.)"""
    from ._ops import _check_inputs as check
    check(query, key, value, attn_mask, 0.0, False, scale, enable_gqa)


def _kernel_runs(explained) -> bool:
    """Whether torch.ops.flashcore.explain's (family, reason) means a kernel runs the call: reason
    0, or a kernel with a note (a masked call in the sm80 family, and why sm90 did not take it)."""
    from . import _note_base
    return explained[1] == 0 or explained[1] >= _note_base()


def _plan(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left, window_right,
          bottom_right, sinks=None, softcap=0.0):
    """The sdpa_fwd call that computes the attention: (attn_mask, is_causal, kwargs). The band
    goes to the kernel where one takes it (explain says so), else into the mask; the sinks
    (kwargs["sinks"]) to the kernel where one takes them (else attention_fwd adds them); the
    softcap (kwargs["softcap"]) likewise (else attention_fwd computes the call in PyTorch)."""
    # (explain of the sdpa_fwd call, which wants the LSE)
    explain = functools.partial(torch.ops.flashcore.explain, lse=True)
    softcap_kwargs = dict(softcap=softcap) if softcap else {}
    band = _band_of(query, key, is_causal, window_left, window_right, bottom_right)
    # The usual case first, in one question: one kernel takes the band, the softcap and the sinks
    # as they are (no mask, or a band that needs none).
    band_kwargs = dict(window_left=window_left, window_right=window_right, bottom_right=bottom_right)
    whole = (attn_mask, False, {}) if band.kind == _band.ALL else \
        (None, True, {}) if band.kind == _band.TOP_LEFT_CAUSAL and attn_mask is None else \
        (None, is_causal, band_kwargs) if attn_mask is None else None
    if whole is not None and query.is_cuda and (whole[2] or softcap or sinks is not None):
        kwargs = dict(whole[2], **softcap_kwargs)
        if sinks is not None:
            kwargs["sinks"] = sinks.float().contiguous()
        if _kernel_runs(explain(query, key, value, whole[0], 0.0, whole[1], scale=scale,
                                enable_gqa=enable_gqa, **kwargs)):
            return whole[0], whole[1], kwargs
    if band.kind == _band.ALL:
        mask, causal, kwargs = attn_mask, False, {}
    elif band.kind == _band.TOP_LEFT_CAUSAL and attn_mask is None:
        mask, causal, kwargs = None, True, {}
    else:
        if attn_mask is None and query.is_cuda and _kernel_runs(explain(
                query, key, value, None, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa,
                **band_kwargs, **softcap_kwargs)):
            mask, causal, kwargs = None, is_causal, band_kwargs
        else:  # (built only here: an Sq x Sk mask costs more than many a kernel)
            if attn_mask is not None:  # the op's checks first: the mask meets the band here
                _check_inputs(query, key, value, attn_mask, scale, enable_gqa)
            mask, causal, kwargs = _with_band(attn_mask, band, query, key), False, {}
    if softcap and query.is_cuda and _kernel_runs(explain(
            query, key, value, mask, 0.0, causal, scale=scale, enable_gqa=enable_gqa,
            softcap=softcap, **kwargs)):
        kwargs = dict(kwargs, softcap=softcap)
    if sinks is not None and query.is_cuda and (not softcap or "softcap" in kwargs):
        sinks = sinks.float().contiguous()
        if _kernel_runs(explain(query, key, value, mask, 0.0, causal, scale=scale,
                                enable_gqa=enable_gqa, sinks=sinks, **kwargs)):
            kwargs = dict(kwargs, sinks=sinks)
    return mask, causal, kwargs


_REFERENCE_CHUNK_ELEMS = 1 << 26  # scores per chunk of rows in _softcap_reference


def _softcap_reference(query, key, value, attn_mask, is_causal, scale, enable_gqa, softcap):
    """(out, lse) with a softcap where no kernel takes it, in float32 (float64 for float64
    inputs), rows in chunks: s = softcap tanh(scale q.k / softcap), then the mask (bool or
    additive) and top-left causal, softmax, P V. A row that sees no key gives zeros, LSE -inf."""
    from ._ops import _gqa, _lse_dtype
    ct = _lse_dtype(query.dtype)
    sq, sk, d = query.shape[-2], key.shape[-2], query.shape[-1]
    sc = sdpa_scale(scale, d)
    kf, vf = key.to(ct), value.to(ct)
    if _gqa(query, key, enable_gqa):
        group = query.shape[-3] // key.shape[-3]
        kf, vf = kf.repeat_interleave(group, dim=-3), vf.repeat_interleave(group, dim=-3)
    add = None
    if attn_mask is not None:
        add = (torch.zeros(attn_mask.shape, dtype=ct, device=query.device)
               .masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
               else attn_mask.to(ct))
    rows = add is not None and add.dim() >= 2 and add.shape[-2] != 1
    batch = math.prod(torch.broadcast_shapes(query.shape[:-2], kf.shape[:-2]))
    chunk = max(1, _REFERENCE_CHUNK_ELEMS // max(1, batch * sk))
    outs, lses = [], []
    for i0 in range(0, sq, chunk):
        n = min(chunk, sq - i0)
        s = torch.matmul(query.narrow(-2, i0, n).to(ct), kf.transpose(-2, -1)) * sc
        s = softcap * torch.tanh(s / softcap)
        if add is not None:
            s = s + (add.narrow(-2, i0, n) if rows else add)
        if is_causal:
            keep = torch.arange(i0, i0 + n, device=s.device).unsqueeze(-1) >= torch.arange(
                sk, device=s.device)
            s = s.masked_fill(~keep, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.masked_fill(torch.isneginf(lse), 0.0).unsqueeze(-1))
        outs.append(torch.matmul(p, vf))
        lses.append(lse)
    out_shape = torch.broadcast_shapes(query.shape[:-1], vf.shape[:-2] + (sq,)) + (vf.shape[-1],)
    if sq == 0:
        return query.new_zeros(out_shape), torch.zeros(out_shape[:-1], dtype=ct, device=query.device)
    out = torch.cat(outs, dim=-2).expand(out_shape).to(query.dtype).contiguous()
    return out, torch.cat(lses, dim=-1).expand(out_shape[:-1]).contiguous()



@torch.library.custom_op("flashcore::attention_fwd", mutates_args=())
def attention_fwd(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                  enable_gqa: bool, window_left: int, window_right: int, bottom_right: bool,
                  sinks: Optional[torch.Tensor], softcap: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of flashcore.attention (see the module docstring); lse as sdpa_fwd's, with
    the sinks in it when there are sinks."""
    mask, causal, kwargs = _plan(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                 window_left, window_right, bottom_right, sinks, softcap)
    if softcap and "softcap" not in kwargs:  # no kernel takes it: the band is in the mask
        # (PyTorch computes it: the op's checks first, so that bad inputs get its messages)
        _check_inputs(query, key, value, mask, scale, enable_gqa)
        out, lse = _softcap_reference(query, key, value, mask, causal, scale, enable_gqa, softcap)
        return _with_sinks(out, lse, sinks) if sinks is not None else (out, lse)
    kernel_sinks = kwargs.pop("sinks", None)
    if kernel_sinks is not None:  # the kernel adds them
        return torch.ops.flashcore.sdpa_fwd_sinks(query, key, value, kernel_sinks, mask, causal,
                                                  scale=scale, enable_gqa=enable_gqa, **kwargs)
    out, lse = torch.ops.flashcore.sdpa_fwd(query, key, value, mask, 0.0, causal, scale=scale,
                                            enable_gqa=enable_gqa, **kwargs)
    if sinks is not None:
        out, lse = _with_sinks(out, lse, sinks)
    return out, lse


@attention_fwd.register_fake
def _attention_fwd_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, window_left,
                        window_right, bottom_right, sinks, softcap):
    _check_inputs(query, key, value, attn_mask, scale, enable_gqa)
    return torch.ops.flashcore.sdpa_fwd(query, key, value, None, 0.0, False, scale=scale,
                                        enable_gqa=enable_gqa)


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, is_causal, scale, enable_gqa, wl, wr, br, sinks, softcap = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, sinks)
    ctx.args = (is_causal, scale, enable_gqa, wl, wr, br, softcap)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse, attn_mask, sinks = ctx.saved_tensors
    is_causal, scale, enable_gqa, wl, wr, br, softcap = ctx.args
    if grad_out is None and grad_lse is None:
        return (None,) * 12
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    needs = ctx.needs_input_grad
    grad_mask = attn_mask is not None and bool(needs[3]) and attn_mask.is_floating_point()
    band = _band_of(query, key, is_causal, wl, wr, br)
    if attn_mask is None:  # the band as such: the backward kernel or the Python backward
        mask, band_args = None, (wl, wr, br)
    else:  # the band inside the mask, as the forward had it
        mask, is_causal, band_args = (attn_mask if band.kind == _band.ALL
                                      else _with_band(attn_mask, band, query, key)), False, ()
    dq, dk, dv, dmask = torch.ops.flashcore.sdpa_bwd(
        grad_out, query, key, value, out, lse, grad_lse, mask, is_causal, scale, enable_gqa,
        grad_mask, *band_args, softcap=softcap)
    if grad_mask:  # outside the band P = 0, so dS = 0 there: the mask's gradient as it is
        dmask = dmask.sum_to_size(attn_mask.shape)
    dsinks = None
    if sinks is not None and needs[10]:
        # The sink is a key with score `sink` and value 0: dS_sink = P_sink (0 - delta), delta
        # = rowsum(dO * O) - dLSE, summed over every row of its head.
        delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1)
        if grad_lse is not None:
            delta = delta - grad_lse
        p_sink = torch.exp(sinks.to(lse.dtype).unsqueeze(-1) - lse.masked_fill(torch.isneginf(lse), float("inf")))
        dsinks = -(p_sink * delta).flatten(0, -3).sum((0, 2)).to(sinks.dtype)
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
            dmask if grad_mask else None) + (None,) * 6 + (dsinks, None)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _resolve(query, key, attn_mask, is_causal, causal_alignment, window_size):
    """The call's (attn_mask, is_causal, window_left, window_right, bottom_right), a CausalBias
    mask taken as is_causal with its alignment."""
    _check_args(query, key, is_causal, causal_alignment, window_size)
    bottom_right = causal_alignment == "bottom_right"
    is_bias, bias_lower_right = _causal_bias(attn_mask)
    if is_bias:
        if is_causal:
            raise ValueError("flashcore.attention: attn_mask is a CausalBias, so is_causal must "
                             "be False (the bias already says causal and its alignment)")
        if causal_alignment != "top_left" and not bias_lower_right:
            raise ValueError("flashcore.attention: a causal_upper_left CausalBias contradicts "
                             "causal_alignment='bottom_right'")
        attn_mask, is_causal, bottom_right = None, True, bias_lower_right
    elif attn_mask is not None and is_causal:
        # (SDPA refuses both; here they combine: the causal band inside the mask.)
        pass
    return attn_mask, bool(is_causal), int(window_size[0]), int(window_size[1]), bottom_right


def _check_sinks(sinks, query):
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor) or sinks.dim() != 1 or query.dim() < 3 \
            or sinks.shape[0] != query.shape[-3]:
        raise ValueError("flashcore.attention: sinks must be a 1-D tensor of one logit per query "
                         f"head ({query.shape[-3] if query.dim() >= 3 else '?'}), got "
                         f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")
    if not sinks.is_floating_point() or sinks.device != query.device:
        raise ValueError(f"flashcore.attention: sinks must be a floating-point tensor on query's "
                         f"device ({query.device}), got {sinks.dtype} on {sinks.device}")


def _check_softcap(softcap):
    """softcap as a float: 0 (none) or finite and > 0."""
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise ValueError(f"flashcore.attention: softcap must be a number (0 = none), got "
                         f"{type(softcap).__name__}")
    softcap = float(softcap)
    if not (softcap >= 0.0 and math.isfinite(softcap)):
        raise ValueError(f"flashcore.attention: softcap must be 0 (none) or a finite value > 0, "
                         f"got {softcap}")
    return softcap


def _with_sinks(out, lse, sinks):
    """out and lse with a sink logit per query head in every row's denominator: the weight of
    the keys becomes sigmoid(lse - sink) (0 for a row that saw no key), the LSE
    logaddexp(lse, sink). In the LSE's precision (float32), out rounded once more."""
    sink = sinks.to(lse.dtype).unsqueeze(-1).expand_as(lse)  # (Hq, 1) against lse (..., Hq, Sq)
    # A row with no key and a -inf sink has nothing at all: zeros, LSE -inf. Its terms are taken
    # at 0 instead, so that no -inf - -inf (NaN) reaches the values or the gradients.
    dead = torch.isneginf(lse) & torch.isneginf(sink)
    lse_s, sink_s = lse.masked_fill(dead, 0.0), sink.masked_fill(dead, 0.0)
    weight = torch.sigmoid(lse_s - sink_s).masked_fill(dead, 0.0)
    lse_out = torch.logaddexp(lse_s, sink_s).masked_fill(dead, float("-inf"))
    return (out.to(lse.dtype) * weight.unsqueeze(-1)).to(out.dtype), lse_out


def attention(query, key, value, attn_mask=None, is_causal=False, *,
              causal_alignment="top_left", window_size=(-1, -1), scale=None, enable_gqa=False,
              softcap=0.0, sinks=None, return_lse=False):
    """Attention with SDPA's semantics plus a sliding window, the causal alignment, a logit
    softcap and attention sinks (module docstring). Returns out, or (out, lse) with return_lse."""
    from . import FALLBACK_ONLY
    attn_mask, is_causal, wl, wr, br = _resolve(query, key, attn_mask, is_causal,
                                                causal_alignment, window_size)
    _check_sinks(sinks, query)
    softcap = _check_softcap(softcap)
    if FALLBACK_ONLY:  # no FlashCore library: PyTorch's SDPA with the band as a mask
        band = _band_of(query, key, is_causal, wl, wr, br)
        mask = attn_mask if band.kind == _band.ALL else _with_band(attn_mask, band, query, key)
        if return_lse or sinks is not None or softcap:
            raise NotImplementedError("flashcore.attention: return_lse, sinks and softcap need "
                                      f"FlashCore's library ({FALLBACK_ONLY})")
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, mask, scale=scale, enable_gqa=enable_gqa)
    out, lse = attention_fwd(query, key, value, attn_mask, is_causal, scale, enable_gqa, wl, wr, br,
                             sinks, softcap)
    return (out, lse) if return_lse else out


@torch.compiler.disable
def explain_attention(query, key, value, attn_mask=None, is_causal=False, *,
                      causal_alignment="top_left", window_size=(-1, -1), scale=None,
                      enable_gqa=False, softcap=0.0, sinks=None) -> str:
    """Which path flashcore.attention takes: ``explain``'s words for the sdpa_fwd call it
    makes, with ``"(band as a mask)"`` where the window / alignment became an explicit mask."""
    from . import FALLBACK_ONLY
    from . import _explain_words as explain
    attn_mask, is_causal, wl, wr, br = _resolve(query, key, attn_mask, is_causal,
                                                causal_alignment, window_size)
    if FALLBACK_ONLY:
        return f"fallback: {FALLBACK_ONLY}"
    softcap = _check_softcap(softcap)
    mask, causal, kwargs = _plan(query, key, value, attn_mask, is_causal, scale, enable_gqa, wl,
                                 wr, br, sinks, softcap)
    if softcap and "softcap" not in kwargs:
        why = explain(query, key, value, mask, 0.0, causal, scale, enable_gqa,
                      **dict(kwargs, softcap=softcap), lse=True)
        return f"PyTorch (float32, unfused): no kernel takes the softcap here ({why})"
    words = explain(query, key, value, mask, 0.0, causal, scale, enable_gqa, **kwargs, lse=True)
    notes = ["band as a mask"] if mask is not None and mask is not attn_mask else []
    if sinks is not None and "sinks" not in kwargs:
        notes.append("sinks applied to the output")
    return f"{words} ({', '.join(notes)})" if notes else words
