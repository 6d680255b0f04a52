"""torch.compile and autograd support for the FlashCore ops (imported by ``flashcore``).

Ops in the ``flashcore`` namespace:

* ``sdpa(q, k, v, attn_mask=None, dropout_p=0., is_causal=False, *, scale=None,
  enable_gqa=False) -> Tensor`` (C++, aten's exact schema). Its Autograd kernel (here) sends
  calls that need gradients to ``sdpa_fwd`` and ``sdpa_bwd``, both called below Autograd by one
  autograd.Function (_SdpaTraining: torch.library's autograd wrapper cost ~0.4 ms of host time
  per call), or to aten's differentiable SDPA (dropout_p > 0: aten owns the dropout RNG; or the
  training route); calls without gradients go straight to the C++ kernels.
* ``_sdpa_inference(<sdpa's arguments>) -> Tensor`` (C++): sdpa's kernels without an Autograd
  kernel, for calls that record no gradient; private: flashcore.sdpa, patch() and the
  transformers integration route such calls to it (_entry.py), sparing sdpa's Python Autograd
  kernel.
* ``sdpa_fwd(<sdpa's arguments>) -> (Tensor out, Tensor lse)`` (C++): the forward that also
  returns the log-sum-exp autograd saves. ``register_autograd`` gives it its backward (for
  direct calls: flashcore.attention, varlen, context parallelism).
* ``sdpa_bwd(grad_out, q, k, v, out, lse, grad_lse, attn_mask, is_causal, scale, enable_gqa,
  grad_mask) -> (dq, dk, dv, dmask)`` (defined here; Python implementation for CPU and CUDA).
  One opaque op, so a compiled graph neither specializes on its chunk loop nor changes when a
  fused backward kernel replaces the implementation. No double backward.
* ``explain(...) -> (int, int)`` (C++): which path sdpa takes (``lse=True``: sdpa_fwd, which
  wants the LSE, as training and flashcore.attention do).
* ``sdpa_bwd_kernel(grad_out, q, k, v, out, lse, grad_lse, is_causal, scale, enable_gqa,
  deterministic=False) -> (dq, dk, dv)`` (C++, torch_op/flashcore_bwd_op.cpp): the fused
  backward kernel (CUDA; on CPU the Python reference below, so opcheck runs everywhere), and
  ``explain_bwd(<same>) -> (int family, int reason)`` (explain's order): family 1 (sm80-class)
  or 2 (sm90) for the kernel that runs, 0 when none; reason 0 when a kernel covers the call,
  else why not.
  ``deterministic`` asks for bitwise reproducible gradients (the sm80-class family; the sm90 one
  sums dq with fp32 reductions in any order). sdpa_bwd's implementation asks explain_bwd and runs the kernel
  when it can (no mask, fp16/bf16, head dim built, ...), its Python code otherwise, passing
  torch.are_deterministic_algorithms_enabled(); the choice is made at run time, inside the
  opaque op.

Training route: ``sdpa``'s Autograd kernel decides once per call, before the forward, whether
a call that records gradients runs FlashCore (sdpa_fwd, then sdpa_bwd) or aten's differentiable
SDPA for both passes: aten where FlashCore's backward for the call would be slower than
PyTorch's on this device (TRAINING_TABLE below, FLASHCORE_TRAINING to override).

Every op has a fake (meta) implementation here giving the real op's sizes, strides and dtypes:
sdpa's and sdpa_fwd's 4-D output lies in storage ordered as the query's (_layout.py, from every
path, fallbacks included), and sdpa_bwd's and sdpa_bwd_kernel's dq, dk, dv each in its input's
order; every other tensor output is contiguous.

The LSE is float32, except for float64 inputs where it is float64 (so gradcheck in float64 sees
float64 math end to end). Shape: the output's shape without its last dim.
"""
import math
import os
import weakref
from typing import NamedTuple, Optional, Tuple

import torch

from . import _band
from ._causal_bias import CAUSAL_BIAS_IN_OP, is_causal_bias
from . import _reason_code  # reasons.h, through libflashcore_op.so (flashcore/__init__.py)
from ._layout import contiguous_strides, in_output_layout, new_output, output_strides
from ._scale import sdpa_scale

_lib = torch.library.Library("flashcore", "FRAGMENT")  # kept alive: owns the registrations

_SDPA = torch.ops.flashcore.sdpa.default
_SDPA_HANDLE = _SDPA._handle  # the C++ operator handle: redispatch_boxed without a Python frame
_SDPA_FWD = torch.ops.flashcore.sdpa_fwd.default
EXPLAIN = torch.ops.flashcore.explain.default

# Scores materialized at once by the backward (per chunk of query rows), in elements.
_BWD_CHUNK_ELEMS = 1 << 25


# ---- shapes ------------------------------------------------------------------------------------

def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gqa(q, k, enable_gqa):
    """True when enable_gqa changes anything: key/value heads (dim -3) serve groups of query heads."""
    return bool(enable_gqa) and q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3]


def _out_shape(q, k, v, enable_gqa):
    """aten SDPA's output shape: broadcast batch dims of q, k, v (k/v heads taken as q's under
    GQA), then (Sq, Dv)."""
    qb, kb, vb = list(q.shape[:-2]), list(k.shape[:-2]), list(v.shape[:-2])
    if _gqa(q, k, enable_gqa):
        kb[-1] = qb[-1]
        if len(vb) >= 1:
            vb[-1] = qb[-1]
    batch = torch.broadcast_shapes(tuple(qb), tuple(kb), tuple(vb))
    return (*batch, q.shape[-2], v.shape[-1])


# ---- fakes -------------------------------------------------------------------------------------

def _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Raise what the real op raises for bad inputs. A fake is also the op's Meta kernel, which
    a call mixing meta and other devices reaches, and the training route asks this once per
    layout: plain tensors (real or meta) go through the C++ checks (explain's kernel reads only
    metadata); any subclass (fake or functional tensors while tracing, DTensor) gets the
    dtype/device checks."""
    tensors = (query, key, value, attn_mask)
    if all(t is None or type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors):
        EXPLAIN.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *tensors,
                           dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return
    for name, t in (("key", key), ("value", value)):
        torch._check(t.dtype == query.dtype, lambda: (
            f"flashcore.sdpa: {name} must have the same dtype as query (query: {query.dtype}, "
            f"{name}: {t.dtype})"))
        torch._check(t.device == query.device, lambda: (
            f"flashcore.sdpa: {name} must be on the same device as query (query: "
            f"{query.device}, {name}: {t.device})"))


@torch.library.register_fake("flashcore::sdpa", lib=_lib)
def _sdpa_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
               enable_gqa=False):
    _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return new_output(query, _out_shape(query, key, value, enable_gqa))


# sdpa for calls that record no gradient (python/flashcore/_entry.py): same kernels, same fake, no
# Autograd kernel.
torch.library.register_fake("flashcore::_sdpa_inference", _sdpa_fake, lib=_lib)


@torch.library.register_fake("flashcore::sdpa_fwd", lib=_lib)
def _sdpa_fwd_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                   scale=None, enable_gqa=False, window_left=-1, window_right=-1,
                   bottom_right=False, softcap=0.0):
    _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    torch._check(dropout_p == 0.0, lambda: "flashcore.sdpa_fwd: dropout_p must be 0")
    shape = _out_shape(query, key, value, enable_gqa)
    return (new_output(query, shape),
            query.new_empty(shape[:-1], dtype=_lse_dtype(query.dtype)))


@torch.library.register_fake("flashcore::sdpa_fwd_sinks", lib=_lib)
def _sdpa_fwd_sinks_fake(query, key, value, sinks, attn_mask=None, is_causal=False, *, scale=None,
                         enable_gqa=False, window_left=-1, window_right=-1, bottom_right=False,
                         softcap=0.0):
    return _sdpa_fwd_fake(query, key, value, attn_mask, 0.0, is_causal, scale=scale,
                          enable_gqa=enable_gqa)


def _shadow(t):
    """A real tensor on t's device with t's sizes, strides, dtype and 512-byte-relative pointer
    alignment (what explain's decision reads; the data is never read)."""
    if not isinstance(t, torch.Tensor):
        return t
    size = [int(s) for s in t.shape]
    stride = [int(s) for s in t.stride()]
    offset = int(t.storage_offset())
    need = 0 if 0 in size else 1 + sum((s - 1) * st for s, st in zip(size, stride))
    base = torch.empty(offset + need, dtype=t.dtype, device=t.device)
    return base.as_strided(size, stride, offset)


@torch.library.register_fake("flashcore::explain", lib=_lib)
def _explain_fake(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                  scale=None, enable_gqa=False, window_left=-1, window_right=-1,
                  bottom_right=False, sinks=None, softcap=0.0, lse=False):
    # explain reads metadata only, but on the real device (the CUDA path asks the device and the
    # pointers' alignment): answer with real tensors of the same layout. Sizes are specialized.
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    tensors = (query, key, value, attn_mask)
    band = dict(window_left=window_left, window_right=window_right, bottom_right=bottom_right,
                softcap=softcap, lse=lse)
    if not any(isinstance(t, FakeTensor) for t in tensors + (sinks,)):
        # Real meta tensors (this fake is also the Meta kernel): run the C++ kernel itself, which
        # reads only metadata; it sits in every backend's slot (CompositeExplicitAutograd).
        return EXPLAIN.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *tensors,
                                  dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa,
                                  sinks=sinks, **band)
    with unset_fake_temporarily():
        return EXPLAIN(*(_shadow(t) for t in tensors), dropout_p, is_causal, scale=scale,
                       enable_gqa=enable_gqa, sinks=_shadow(sinks), **band)


# ---- the backward op ---------------------------------------------------------------------------

_lib.define(
    "sdpa_bwd(Tensor grad_out, Tensor query, Tensor key, Tensor value, Tensor out, Tensor lse, "
    "Tensor? grad_lse, Tensor? attn_mask, bool is_causal, float? scale, bool enable_gqa, "
    "bool grad_mask, int window_left=-1, int window_right=-1, bool bottom_right=False, "
    "float softcap=0.) -> (Tensor, Tensor, Tensor, Tensor)")


def _grads_like(query, key, value):
    """Uninitialised dq, dk, dv, each laid out as its input (_layout.py's rule; the C++ backward's
    new_output), in the query's dtype."""
    return (new_output(query, query.shape), new_output(key, key.shape).to(query.dtype),
            new_output(value, value.shape).to(query.dtype))


def _dmask_like(attn_mask, grad_mask, query):
    if grad_mask:
        return torch.empty(attn_mask.shape, dtype=attn_mask.dtype, device=attn_mask.device)
    return query.new_empty((0,))


@torch.library.register_fake("flashcore::sdpa_bwd", lib=_lib)
def _sdpa_bwd_fake(grad_out, query, key, value, out, lse, grad_lse, attn_mask, is_causal, scale,
                   enable_gqa, grad_mask, window_left=-1, window_right=-1, bottom_right=False,
                   softcap=0.0):
    return (*_grads_like(query, key, value), _dmask_like(attn_mask, grad_mask, query))


_BWD_KERNEL = torch.ops.flashcore.sdpa_bwd_kernel.default
_EXPLAIN_BWD = torch.ops.flashcore.explain_bwd.default


@torch.library.register_fake("flashcore::sdpa_bwd_kernel", lib=_lib)
def _sdpa_bwd_kernel_fake(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
                          enable_gqa, deterministic=False, attn_mask=None, window_left=-1,
                          window_right=-1, bottom_right=False, softcap=0.0):
    return _grads_like(query, key, value)


# flashcore::_paged_decode (torch_op/paged_op.cpp; flashcore.varlen_attn's fused paged decode):
# out (N, Hq, D) contiguous in q's dtype, LSE (Hq, N) float32. (Absent from an op library built
# before it: then varlen_attn never calls it.)
if hasattr(torch.ops.flashcore, "_paged_decode"):
    @torch.library.register_fake("flashcore::_paged_decode", lib=_lib)
    def _paged_decode_fake(q, key_pages, value_pages, block_table, seqused_k, scale):
        torch._check(q.dim() == 3, lambda: "flashcore._paged_decode: q must be 3-D (N, Hq, D)")
        torch._check(key_pages.dim() == 4 and value_pages.dim() == 4, lambda: (
            "flashcore._paged_decode: key_pages and value_pages must be 4-D "
            "(num_pages, page_size, Hkv, D)"))
        return (q.new_empty(q.shape),
                q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


# flashcore::_varlen_fwd (torch_op/varlen_op.cpp; flashcore.varlen_attn's fused packed forward):
# out (T_q, Hq, D) contiguous in q's dtype, LSE (Hq, T_q) float32. (Absent from an op library
# built before it: then varlen_attn never calls it.)
if hasattr(torch.ops.flashcore, "_varlen_fwd"):
    @torch.library.register_fake("flashcore::_varlen_fwd", lib=_lib)
    def _varlen_fwd_fake(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale):
        torch._check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
                     lambda: "flashcore._varlen_fwd: q, k and v must be 3-D (rows, heads, head dim)")
        return (q.new_empty(q.shape),
                q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


@torch.library.register_fake("flashcore::explain_bwd", lib=_lib)
def _explain_bwd_fake(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
                      enable_gqa, deterministic=False, attn_mask=None, window_left=-1,
                      window_right=-1, bottom_right=False, softcap=0.0):
    # As _explain_fake: metadata only, answered with real tensors of the same layout. Returns
    # (family, reason), as the C++ kernel does.
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    tensors = (grad_out, query, key, value, out, lse, grad_lse)
    if not any(isinstance(t, FakeTensor) for t in tensors + (attn_mask,)):
        return _EXPLAIN_BWD.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU),
                                       *tensors, is_causal, scale, enable_gqa, deterministic,
                                       attn_mask, window_left, window_right, bottom_right,
                                       softcap)
    with unset_fake_temporarily():
        return _EXPLAIN_BWD(*(_shadow(t) for t in tensors), is_causal, scale, enable_gqa,
                            deterministic, _shadow(attn_mask), window_left, window_right,
                            bottom_right, softcap)


@torch.library.impl("flashcore::sdpa_bwd_kernel", "cpu", lib=_lib)
def _sdpa_bwd_kernel_cpu(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
                         enable_gqa, deterministic=False, attn_mask=None, window_left=-1,
                         window_right=-1, bottom_right=False, softcap=0.0):
    """No kernel on the CPU: the same gradients from the Python reference (deterministic as far
    as PyTorch's CPU matmuls are, so `deterministic` changes nothing here)."""
    dq, dk, dv, _ = _sdpa_bwd_python(grad_out, query, key, value, out, lse, grad_lse, attn_mask,
                                     is_causal, scale, enable_gqa, False, window_left,
                                     window_right, bottom_right, softcap)
    return dq, dk, dv


def _kernel_bwd_covers(grad_out, query, key, value, out, lse, grad_lse, attn_mask, is_causal,
                       scale, enable_gqa, deterministic, grad_mask, band=(-1, -1, False, 0.0)):
    """True when sdpa_bwd_kernel runs a CUDA kernel for these tensors (cheap checks first). A
    mask that needs its own gradient goes to the Python backward (the kernels give none)."""
    return (not grad_mask and query.is_cuda
            and query.dtype in (torch.float16, torch.bfloat16)
            and _EXPLAIN_BWD(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
                             enable_gqa, deterministic, attn_mask, *band)[1] == 0)


# The last mask _mask_inside_causal read: ((id, version, shape, strides, address), a weak
# reference to it, the answer).
_last_causal_mask_check = None


def _mask_may_lie_inside_causal(mask, seqlen_q, seqlen_k) -> bool:
    """What _mask_inside_causal can answer without reading the mask: a bool mask with a row per
    query and a column per key of the call. One broadcast over the queries (key padding: row 0
    keeps keys past 0, or no key at all) or over the keys (a kept row keeps every key) is taken
    as not inside: always safe, the call then runs as written. Cheap: the callers ask it before
    anything that costs host time."""
    return (mask.dtype == torch.bool and mask.dim() >= 2 and mask.shape[-2] == seqlen_q
            and mask.shape[-1] == seqlen_k)


def _mask_inside_causal(mask, seqlen_q, seqlen_k):
    """True when a bool mask, broadcast to (..., seqlen_q, seqlen_k) (the call's lengths), keeps no
    (query, key) pair above the top-left diagonal (key > query), so that attention with it equals
    attention with it and causal together: the Hopper kernels then run their causal masked
    variants, which skip the key blocks above the diagonal (c_src/dispatch.c
    fc_sm90_bool_mask_tiles_, for both passes), with the same results. HuggingFace's padded causal masks are
    such masks.
    One device reduction and one host sync per mask tensor: the answer is kept for the same tensor
    object, not written since (its version counter), as varlen_attn's plan is (a model passes one
    mask to every layer). False while a CUDA graph is being captured (no sync there)."""
    global _last_causal_mask_check
    if not _mask_may_lie_inside_causal(mask, seqlen_q, seqlen_k) or (
            mask.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    try:
        stamp = (id(mask), mask._version, tuple(mask.shape), tuple(mask.stride()), mask.data_ptr())
    except RuntimeError:  # an inference tensor: no version counter, so nothing kept
        stamp = None
    last = _last_causal_mask_check
    if stamp is not None and last is not None and last[0] == stamp and last[1]() is mask:
        return last[2]
    above = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=mask.device).triu_(1)
    inside = not bool((mask & above).any())
    if stamp is not None:
        _last_causal_mask_check = (stamp, weakref.ref(mask), inside)
    return inside


# Forward calls shorter than this many query rows do not ask whether their mask lies inside the
# causal triangle: with one or two query blocks there are few key blocks to skip, and the check
# waits for the device once per mask tensor (decoding passes a new mask at every step).
_MASK_AS_CAUSAL_MIN_ROWS = 256


def _forward_mask_as_causal(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    """True when a forward with this bool attn_mask (and no is_causal) may run as top-left causal
    with the mask: a kernel takes that call (the Hopper family's mask tiles, c_src/dispatch.c's
    fc_sm90_bool_mask_tiles_, which alone says which head dims),
    and the mask keeps no pair above the diagonal (_mask_inside_causal), so that the result is
    the same while the key blocks above the diagonal are skipped. Eager CUDA tensors only: under
    torch.compile's tracing (fake or functional tensors) and CUDA-graph capture the call runs as
    written. (explain's plan with the LSE: _forward_as_causal calls sdpa_fwd.)"""
    if (attn_mask is None or is_causal or torch.compiler.is_compiling() or attn_mask.dtype != torch.bool
            or not query.is_cuda or type(query) is not torch.Tensor or type(attn_mask) is not torch.Tensor
            or query.dim() != 4 or query.shape[-2] < _MASK_AS_CAUSAL_MIN_ROWS
            or not _mask_may_lie_inside_causal(attn_mask, query.shape[-2], key.shape[-2])):
        return False
    # explain's answer, kept by everything it reads (its call costs host time that short training
    # steps wait for; a model asks the same layouts at every layer and step).
    plan_key = (_layout_key(query), _layout_key(key), _layout_key(value), _layout_key(attn_mask), scale,
                enable_gqa, os.environ.get("FLASHCORE_FAMILY"))
    runs = _FWD_AS_CAUSAL_RUNS.get(plan_key)
    if runs is None:
        if len(_FWD_AS_CAUSAL_RUNS) >= _ROUTES_MAX:
            _FWD_AS_CAUSAL_RUNS.clear()
        runs = _FWD_AS_CAUSAL_RUNS[plan_key] = EXPLAIN(
            query, key, value, attn_mask, 0.0, False, scale=scale, enable_gqa=enable_gqa, window_left=-1,
            window_right=0, lse=True) == (2, 0)
    return runs and _mask_inside_causal(attn_mask, query.shape[-2], key.shape[-2])


# _forward_mask_as_causal's explain answers (bounded as _ROUTES).
_FWD_AS_CAUSAL_RUNS = {}


def _forward_as_causal(query, key, value, attn_mask, scale, enable_gqa):
    """sdpa_fwd's (out, LSE) of a call _forward_mask_as_causal allows: the mask with a top-left
    causal band (window (-1, 0)), which the C layer resolves to causal."""
    return _SDPA_FWD(query, key, value, attn_mask, 0.0, False, scale=scale, enable_gqa=enable_gqa,
                     window_left=-1, window_right=0)


@torch.library.impl("flashcore::sdpa_bwd", ("cpu", "cuda"), lib=_lib)
def _sdpa_bwd_impl(grad_out, query, key, value, out, lse, grad_lse, attn_mask, is_causal, scale,
                   enable_gqa, grad_mask, window_left=-1, window_right=-1, bottom_right=False,
                   softcap=0.0):
    """The fused backward kernel where it covers the call (see _kernel_bwd_covers), else the
    Python backward. Both give dq, dk, dv laid out as query, key and value (_layout.py: each
    one's storage order, densely packed; what PyTorch's cuDNN and flash backwards give), in the
    inputs' dtypes.

    Determinism follows torch.use_deterministic_algorithms, read here, when the backward runs
    (this op is opaque to torch.compile, so compiled code reads it at run time too): when it is
    on, the C layer picks the bitwise-reproducible sm80-class kernel over the sm90 one."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    if query.is_cuda and grad_out.dim() >= 1 and grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()  # e.g. an expanded gradient; the kernel needs rows
    band = (window_left, window_right, bottom_right, softcap)
    # A bool mask inside the causal triangle (HuggingFace's padded causal masks) runs as causal
    # with it where a kernel takes that: asked first, since the mask's check waits for the device.
    as_causal = (attn_mask is not None and not is_causal
                 and _mask_may_lie_inside_causal(attn_mask, query.shape[-2], key.shape[-2])
                 and band == (-1, -1, False, 0.0)
                 and _kernel_bwd_covers(grad_out, query, key, value, out, lse, grad_lse, attn_mask, True,
                                        scale, enable_gqa, deterministic, grad_mask, band)
                 and _mask_inside_causal(attn_mask, query.shape[-2], key.shape[-2]))
    if as_causal:
        is_causal = True
    if as_causal or _kernel_bwd_covers(grad_out, query, key, value, out, lse, grad_lse, attn_mask, is_causal,
                                       scale, enable_gqa, deterministic, grad_mask, band):
        dq, dk, dv = _BWD_KERNEL(grad_out, query, key, value, out, lse, grad_lse, is_causal,
                                 scale, enable_gqa, deterministic, attn_mask, *band)
        return dq, dk, dv, _dmask_like(attn_mask, grad_mask, query)
    return _sdpa_bwd_python(grad_out, query, key, value, out, lse, grad_lse, attn_mask,
                            is_causal, scale, enable_gqa, grad_mask, *band)


def _sdpa_bwd_python(grad_out, query, key, value, out, lse, grad_lse, attn_mask, is_causal,
                     scale, enable_gqa, grad_mask, window_left=-1, window_right=-1,
                     bottom_right=False, softcap=0.0):
    """Recomputes P per chunk of query rows from q, k and the saved LSE, in float32 (float64 for
    float64 inputs):  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O) [+ dLSE]),
    dQ = scale dS K,  dK = scale dS^T Q,  dMask = dS (summed over broadcast dims). GQA: K/V are
    repeated over each group of query heads and dK/dV summed back over the group. Causal and
    flashcore.attention's window / alignment apply as their band (_band.py). A softcap c makes
    the scaled scores c tanh(s / c) and multiplies dS by their derivative, 1 - tanh^2."""
    ct = _lse_dtype(query.dtype)
    sq, sk, d = query.shape[-2], key.shape[-2], query.shape[-1]
    sc = sdpa_scale(scale, d)
    gqa = _gqa(query, key, enable_gqa)
    group = query.shape[-3] // key.shape[-3] if gqa else 1
    qf = query.to(ct)
    kf, vf = key.to(ct), value.to(ct)
    if gqa:
        kf = kf.repeat_interleave(group, dim=-3)
        vf = vf.repeat_interleave(group, dim=-3)
    dof = grad_out.to(ct)
    # rowsum(dO * O): the softmax backward's correction term, (..., Sq).
    delta = (dof * out.to(ct)).sum(-1)
    if grad_lse is not None:
        delta = delta - grad_lse.to(ct)
    # Fully masked rows have lse = -inf and P = 0 there (aten's safe softmax): +inf makes exp 0.
    lsef = lse.to(ct)
    lsef = torch.where(lsef == float("-inf"), torch.full_like(lsef, float("inf")), lsef)

    add_mask = None
    mask_rows = False
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            add_mask = torch.zeros(attn_mask.shape, dtype=ct, device=attn_mask.device)
            add_mask = add_mask.masked_fill(~attn_mask, float("-inf"))
        else:
            add_mask = attn_mask.to(ct)
        mask_rows = add_mask.dim() >= 2 and add_mask.shape[-2] != 1

    band = (_band.band_bounds(sq, sk, is_causal, window_left, window_right, bottom_right)
            if sq > 0 and sk > 0 else _band.Band(_band.ALL, 0, 0))
    batch_elems = math.prod(out.shape[:-2])
    chunk = max(1, _BWD_CHUNK_ELEMS // max(1, batch_elems * max(sk, 1)))
    kt, vt = kf.transpose(-2, -1), vf.transpose(-2, -1)
    dq_chunks, dk, dv, dmask_chunks, dmask = [], None, None, [], None
    for i0 in range(0, sq, chunk):
        n = min(chunk, sq - i0)
        qc = qf.narrow(-2, i0, n)
        doc = dof.narrow(-2, i0, n)
        s = torch.matmul(qc, kt) * sc
        if softcap:
            t = torch.tanh(s / softcap)
            s = t * softcap
        if add_mask is not None:
            s = s + (add_mask.narrow(-2, i0, n) if mask_rows else add_mask)
        if band.kind != _band.ALL:
            s = s.masked_fill(~_band.band_mask(range(i0, i0 + n), sk, band, s.device),
                              float("-inf"))
        p = torch.exp(s - lsef.narrow(-1, i0, n).unsqueeze(-1))
        dv_c = torch.matmul(p.transpose(-2, -1), doc)
        dp = torch.matmul(doc, vt)
        ds = p * (dp - delta.narrow(-1, i0, n).unsqueeze(-1))
        ds_mask = ds  # the mask is added after the softcap: its gradient is dS itself
        if softcap:
            ds = ds * (1 - t * t)
        dq_chunks.append(torch.matmul(ds, kf) * sc)
        dk_c = torch.matmul(ds.transpose(-2, -1), qc) * sc
        dk = dk_c if dk is None else dk + dk_c
        dv = dv_c if dv is None else dv + dv_c
        if grad_mask:
            if mask_rows:
                shape = list(attn_mask.shape)
                shape[-2] = n
                dmask_chunks.append(ds_mask.sum_to_size(shape))
            else:
                dm = ds_mask.sum_to_size(attn_mask.shape)
                dmask = dm if dmask is None else dmask + dm

    if sq == 0:  # nothing attended: all gradients are zero
        dq = torch.zeros(query.shape, dtype=ct, device=query.device)
        dk = torch.zeros(kf.shape, dtype=ct, device=query.device)
        dv = torch.zeros(vf.shape, dtype=ct, device=query.device)
    else:
        dq = torch.cat(dq_chunks, dim=-2)
    if gqa:  # sum over the query heads of each group
        dk = dk.unflatten(-3, (key.shape[-3], group)).sum(-3)
        dv = dv.unflatten(-3, (value.shape[-3], group)).sum(-3)
    dq = in_output_layout(dq.sum_to_size(query.shape).to(query.dtype), query)
    dk = in_output_layout(dk.sum_to_size(key.shape).to(key.dtype), key)
    dv = in_output_layout(dv.sum_to_size(value.shape).to(value.dtype), value)
    if not grad_mask:
        dmask = query.new_empty((0,))
    elif sq == 0:
        dmask = torch.zeros(attn_mask.shape, dtype=attn_mask.dtype, device=attn_mask.device)
    elif mask_rows:
        dmask = torch.cat(dmask_chunks, dim=-2).to(attn_mask.dtype).contiguous()
    else:
        dmask = dmask.to(attn_mask.dtype).contiguous()
    return dq, dk, dv, dmask


def _sdpa_bwd_backward(ctx, *grads):
    raise RuntimeError("flashcore.sdpa: double backward (gradients of gradients) is not "
                       "supported")


torch.library.register_autograd("flashcore::sdpa_bwd", _sdpa_bwd_backward, lib=_lib)
torch.library.register_autograd("flashcore::sdpa_bwd_kernel", _sdpa_bwd_backward, lib=_lib)


# ---- autograd ----------------------------------------------------------------------------------

def _fwd_setup_context(ctx, inputs, keyword_only_inputs, output):
    query, key, value, attn_mask, _dropout_p, is_causal = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, attn_mask)
    ctx.is_causal = is_causal
    ctx.scale = keyword_only_inputs.get("scale")
    ctx.enable_gqa = keyword_only_inputs.get("enable_gqa", False)
    ctx.band = (keyword_only_inputs.get("window_left", -1), keyword_only_inputs.get("window_right", -1),
                keyword_only_inputs.get("bottom_right", False), keyword_only_inputs.get("softcap", 0.0))
    ctx.set_materialize_grads(False)  # an unused lse gets no zero gradient to work through


_SDPA_BWD = torch.ops.flashcore.sdpa_bwd.default


def _sdpa_grads(ctx, grad_out, grad_lse, band=()):
    """(dq, dk, dv, dmask) of a forward that saved (query, key, value, out, lse, attn_mask) and
    is_causal, scale, enable_gqa in ctx, each None where ctx.needs_input_grad says so: sdpa_bwd,
    called below Autograd (what its Autograd kernel would do without create_graph, less its
    Python), or through that kernel under create_graph, which refuses a double backward."""
    query, key, value, out, lse, attn_mask = ctx.saved_tensors
    if grad_out is None and grad_lse is None:
        return None, None, None, None
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    needs = ctx.needs_input_grad
    grad_mask = attn_mask is not None and bool(needs[3]) and attn_mask.is_floating_point()
    args = (grad_out, query, key, value, out, lse, grad_lse, attn_mask, ctx.is_causal, ctx.scale,
            ctx.enable_gqa, grad_mask, *band)
    if torch.is_grad_enabled():
        dq, dk, dv, dmask = _SDPA_BWD(*args)
    else:
        with torch._C._AutoDispatchBelowAutograd():
            dq, dk, dv, dmask = _SDPA_BWD(*args)
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None,
            dmask if grad_mask else None)


def _fwd_backward(ctx, grad_out, grad_lse):
    return (*_sdpa_grads(ctx, grad_out, grad_lse, ctx.band), None, None)


torch.library.register_autograd("flashcore::sdpa_fwd", _fwd_backward,
                                setup_context=_fwd_setup_context, lib=_lib)


# ---- the training route ------------------------------------------------------------------------
#
# The project's rule: a call FlashCore takes is never slower than PyTorch's default, forward or
# training. FlashCore's forward is the faster one on the cards it has kernels for; its backward
# is not everywhere. So a call that records gradients goes, as a whole, either to FlashCore
# (sdpa_fwd, then sdpa_bwd) or to aten's differentiable SDPA for both passes (aten's backward
# needs what aten's own forward saved). The choice is made once per call, before the forward,
# from the device and the backward path FlashCore would take for the call.

# (compute capability, backward path) -> (FlashCore takes the call?, note for explain_training).
# The backward path is the one FlashCore's backward would run for the call:
#   "sm90"    the Hopper backward kernel family (TMA + wgmma; dq summed with fp32 reductions in any order);
#   "sm80"    the sm80-class kernel family (also on Hopper under
#             torch.use_deterministic_algorithms(True), which rules the sm90 family out);
#   "sm90-masked"  the same with a bool attn_mask (not one that needs its own gradient): its
#             own entry, since aten's masked backward is another kernel;
#   "sm90-masked-additive"  the same with an additive mask (its forward in the sm80-class family);
#   "sm80-masked"  the sm80-class family with a mask (bool or additive) that needs no gradient;
#   "python"  the fp32 Python backward (_sdpa_bwd_python): a mask that needs a gradient, fp32,
#             head dims or layouts no backward kernel takes.
# A (cc, path, head_dim) key, where present, wins over (cc, path) for that head dim, e.g.
#   ((9, 0), "sm90", 256): (False, "..."),
# A device with no entry keeps FlashCore's own backward: nothing has been measured there.
# The measurements behind every entry live in docs/experiments/backward.md: change an entry together with the
# numbers there that justify it.
TRAINING_TABLE = {
    # Each entry: (FlashCore?, note[, fewest keys]): with a third element, FlashCore only for
    # calls of at least that many keys (seqlen_k), aten below. (Under torch.compile with dynamic
    # shapes the route is decided once, by the length the graph was traced with: both routes
    # compute the same gradients, and the rule is about a percent of speed.)
    # H100 / H200 (bench/results/nvidia-h100-80gb-hbm3_2026-11-27_1112_bwd.json, docs/experiments/backward.md).
    # sm90 D=128: the backward 0.96-0.97x cuDNN's at S = 1k, 0.97-0.99x at 2k, 1.02-1.04x from 4k;
    # with the forward's 1.07-1.16x (docs/PERFORMANCE.md "How fast") fwd + bwd is ~1% slower than
    # cuDNN's at 1k and ~1% faster at 2k: FlashCore from 2048 keys. D=64 (K and V held in
    # registers; bench/results/nvidia-h100-80gb-hbm3_2026-11-27_2000_bwd.json): the backward
    # 1.03-1.07x cuDNN's (non-causal) and 1.00-1.05x (causal) at S = 1k-16k, the forward ahead
    # too, and 1b-like training steps 1.012-1.019x sdpa's
    # (bench/results/train_nvidia-h100-80gb-hbm3_2026-11-27_2000_1b.json): FlashCore from 1024
    # keys (the small shape, S = 512, ran at 0.66x). sm80:
    # "Fused backward v1" in docs/experiments/backward.md. python: fp32 recomputation in unfused
    # PyTorch ops, against aten's fused backward kernels.
    ((9, 0), "sm90"): (True, "", 2048),
    ((9, 0), "sm90", 64): (True, "", 1024),
    # D=256 (the sm90 family's own kernel, kernels/sm90/bwd_d256.cuh): since the fiftieth session
    # (its dQ reduced 16 rows to a bulk reduction) the backward 1.09-1.34x cuDNN's on the H200 over
    # 1k-16k keys (bench/results/bwd_d256_nvidia-h200_2026-11-29_2258_reduce16.json); the training
    # step (tools/masked_step_vs_aten.py, bf16, 16k tokens, PyTorch's time / FlashCore's pair)
    # non-causal 1.06 / 1.11 / 1.12x at 1k / 2k / 4k keys, causal 0.87 / 0.99 / 1.08x
    # (..._2258_reduce16_steps.json): FlashCore from 4096 keys.
    ((9, 0), "sm90", 256): (True, "", 4096),
    # sm80 also holds the head dims only that family has, 32 / 80 / 96 (its backward since the
    # forty-sixth session): on the H200 0.46-1.12x cuDNN's backward and 0.46-0.73x PyTorch's
    # training step, unmasked or with HuggingFace's padding mask
    # (bench/results/nvidia-h200_2026-11-29_1457_bwd_other_dims.json,
    # masked_steps_nvidia-h200_2026-11-29_1433_other_dims.json).
    ((9, 0), "sm80"): (False, "0.39-0.74x cuDNN's backward on the H100, docs/experiments/backward.md"),
    ((9, 0), "sm80", 32): (False, "D=32's sm80-class backward ran at 0.84-1.12x cuDNN's on the H200 "
                                  "(its forward goes to cuDNN), docs/experiments/backward.md"),
    ((9, 0), "sm80", 80): (False, "D=80's sm80-class backward ran at 0.54-0.72x cuDNN's on the H200, "
                                  "docs/experiments/backward.md"),
    ((9, 0), "sm80", 96): (False, "D=96's sm80-class backward ran at 0.46-0.63x cuDNN's on the H200, "
                                  "docs/experiments/backward.md"),
    ((9, 0), "sm80-masked", 80): (False, "the padding-masked training step at D=80 ran at 0.52-0.64x "
                                         "PyTorch's on the H200, docs/experiments/backward.md"),
    ((9, 0), "sm80-masked", 96): (False, "the padding-masked training step at D=96 ran at 0.46-0.66x "
                                         "PyTorch's on the H200, docs/experiments/backward.md"),
    # Masked (aten runs cuDNN with the mask). Training steps, forward + backward, bf16, 16k
    # tokens, D=64/128 (tools/masked_step_vs_aten.py, results/masked_step_*_2026-11-2*.json;
    # PyTorch's time / FlashCore's pair): bool masks, both passes reading the mask in TMA tiles
    # (from the op's copy where its layout has none): HuggingFace's left-padded causal mask
    # 1.20-1.37x at 1024 keys and 1.55-1.72x at 4096, a dense random (B, 1, S, S) mask
    # 1.36-1.68x at 1024-4096, a key-padding mask (B, 1, 1, S) 1.04-1.18x at 1024 and
    # 1.35-1.36x at 4096 (0.84-1.05x before the backward's copy). At 512 keys (H200, fifty-second
    # session, results/masked_step_short_nvidia-h200_2026-11-30_0318_q{1,8}.json): the pair
    # 1.24-1.76x (D=64) and 1.13-1.26x (D=128) PyTorch's with 8 steps queued, 0.96-1.34x call by
    # call, where the aten route ran 0.86-0.92x (its output's layout copy): from 512 keys.
    # Shorter (fifty-third session, ..._2026-11-30_*short*.json): at 256 keys the pair 0.82-1.30x
    # (D=64/128; 0.82-1.0x with (B, S, H, D) views): PyTorch's. D=256 (both passes in the sm90
    # family since the forty-ninth session): HuggingFace's padded causal mask 2.07x at 1024 keys
    # and 3.85x at 4096, a key-padding mask 1.02-1.07x at 1024-4096
    # (masked_step_d256*_nvidia-h200_2026-11-29_2043.json, ..._2026-11-30_0300.json); at 512 keys
    # 1.94x / 1.36x (HF / key padding) with contiguous inputs, 1.48x / 1.05x with (B, S, H, D)
    # views, at 256 keys 0.86-1.47x: the same entry. Additive masks (forward in the sm80-class
    # family, backward element by element): 0.52-0.87x.
    ((9, 0), "sm90-masked"): (True, "", 512),
    ((9, 0), "sm90-masked-additive"): (False, "0.52-0.87x PyTorch's training step with an additive "
                                              "mask on the H100, docs/experiments/forward-masks.md"),
    # D=256 with an additive mask (forward in the sm80-class family, backward the D=256 kernel):
    # the same run as the unmasked D=256 entry, HuggingFace's padded causal mask 1.08 / 1.12 /
    # 1.13x at 1k / 2k / 4k keys, a key-padding mask 1.01 / 1.00 / 1.08x: from 1024 keys.
    ((9, 0), "sm90-masked-additive", 256): (True, "", 1024),
    ((9, 0), "python"): (False, "an unfused fp32 recomputation"),
    # Ada (sm_89): no Ada card has been lent. Its kernels, run on an H200 (FLASHCORE_FAMILY=sm80)
    # against PyTorch's flash backend (FlashAttention-2, what PyTorch trains with on Ada), same
    # run (bench/results/nvidia-h200_2026-11-29_0850_bwd_ab_sm80_step_counter_pass*.json): the
    # backward 0.89-1.18x FA2's at D=64 and 0.68-1.02x at D=128 over 1k-16k keys; with the
    # forward's 1.01-1.11x (H100, ..._2026-11-27_2016.json), fwd + bwd ~0.93-1.07x at D=64 (below
    # 1.0 from 4096 keys) and ~0.74-0.91x at D=128: PyTorch's until a measurement on Ada says otherwise.
    # (The proxy favours FA2: with the H200's 227 KB of shared memory it runs larger tiles than it
    # can on Ada's 99 KB, where FlashCore's kernels already run theirs.) D=32 / 80 / 96, same
    # proxy (forty-sixth session): 0.96-1.32x / 0.99-1.36x / 0.78-1.11x FA2's backward, and
    # 2.0-3.4x the efficient backend's (Ada's masked backward in PyTorch).
    ((8, 9), "sm80"): (False, "the sm80-class backward ran at 0.68-1.18x FlashAttention-2's (PyTorch's "
                              "flash backward) on an H200 running Ada's kernels, fwd + bwd below "
                              "PyTorch's from 4096 keys; not measured on Ada, docs/experiments/backward.md"),
    # The sm80-class masked backward (element-by-element mask reads) has not been measured on a
    # card where it is the default (Ada, where aten's masked backward is the efficient kernel):
    # aten until it is, as before that kernel existed (such calls then took the Python
    # backward's entry). FLASHCORE_TRAINING=flashcore runs it. Its times on the H200 against
    # aten's masked backwards: docs/experiments/backward.md.
    (None, "sm80-masked"): (False, "the sm80-class masked backward: not measured against aten's on "
                                   "this card, docs/experiments/backward.md"),
    # Any other card: the Python backward is an unfused fp32 recomputation, slower than aten's
    # fused backwards wherever they run (masks: efficient; other head dims: flash/efficient).
    (None, "python"): (False, "an unfused fp32 recomputation"),
}


def training_table_entry(cc, path, head_dim):
    """TRAINING_TABLE's entry for a backward path on a device: the head dim's own, else the
    path's on that device, else the path's on any device; None if there is none."""
    return (TRAINING_TABLE.get((cc, path, head_dim)) or TRAINING_TABLE.get((cc, path))
            or TRAINING_TABLE.get((None, path)))


# explain_bwd's family codes (fc_family) as backward paths; 0 (no kernel) is "python".
_FAMILY_PATHS = {1: "sm80", 2: "sm90"}
# Reason codes the route gives without asking explain_bwd, by their names in torch_op/reasons.h
# (kMaskRequiresGrad is the route's own, never the C++ ops': a mask that requires grad, whose
# gradient only the Python backward gives).
_REASON_NOT_CUDA, _REASON_NOT_4D, _REASON_SHAPES, _REASON_BWD_MASK = (
    _reason_code(name) for name in ("kNotCuda", "kNot4D", "kShapeBroadcast", "kMaskRequiresGrad"))


class TrainingRoute(NamedTuple):
    """Where FLASHCORE_TRAINING=auto sends a training call, and why (see TRAINING_TABLE)."""
    to_aten: bool  # both passes in aten's differentiable SDPA
    path: str      # the backward FlashCore would run: "sm90", "sm80", "python" or a masked one (_masked_path)
    reason: int    # explain_bwd's reason (0: a kernel runs), or one of the _REASON_* above
    family: int    # explain_bwd's family (1 sm80-class, 2 sm90; 0 when no kernel)
    note: str      # the table's note, or why no table entry applied ("" for none)


def _training_mode() -> Tuple[str, str]:
    """("auto" | "flashcore" | "aten", why) from the environment, read at each call (in compiled
    code: when the graph is traced). FLASHCORE_TRAINING forces a route. A forced forward family
    (FLASHCORE_FAMILY, for testing and timing the kernels) keeps training calls on FlashCore's
    own kernels too: sending them to aten would drop the forcing without a word."""
    mode = os.environ.get("FLASHCORE_TRAINING") or "auto"
    if mode not in ("auto", "flashcore", "aten"):
        raise ValueError("flashcore: environment variable FLASHCORE_TRAINING must be one of "
                         f"'auto', 'flashcore', 'aten' (got {mode!r})")
    if mode != "auto":
        return mode, f"FLASHCORE_TRAINING={mode}"
    family = _forced_family()
    if family:
        return "flashcore", f"FLASHCORE_FAMILY={family} forces FlashCore's kernels"
    return "auto", ""


def _forced_family() -> str:
    """FLASHCORE_FAMILY's value where it forces a kernel family, else "" (auto or unset)."""
    family = os.environ.get("FLASHCORE_FAMILY") or "auto"
    return "" if family == "auto" else family


def _training_goes_to_aten(query, key, value, attn_mask, is_causal, scale, enable_gqa) -> bool:
    """The route of one training call (dropout aside, which always goes to aten). Runs on every
    training call: as _training_mode, with FLASHCORE_FAMILY read only where it can matter."""
    mode = os.environ.get("FLASHCORE_TRAINING") or "auto"
    if mode != "auto":
        return _training_mode()[0] == "aten"  # validates the value
    route = training_route(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    return route.to_aten and not _forced_family()


# Routes already decided, by everything the decision reads (_layout_key of q, k, v and the
# flags): this runs on every training call, and a miss costs a few stand-in tensors and a C++
# call. Bounded, for runs whose lengths change at every step.
_ROUTES = {}
_ROUTES_MAX = 4096


def training_route(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                   deterministic: Optional[bool] = None) -> TrainingRoute:
    """TRAINING_TABLE's decision for these arguments (FLASHCORE_TRAINING=auto). Reads metadata
    only, so it works on fake tensors while torch.compile traces. ``deterministic`` defaults to
    torch.are_deterministic_algorithms_enabled(), as the backward itself reads it."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if scale is not None and type(scale) is not float:
        scale = float(scale)  # e.g. a symbolic float while tracing: keys must be hashable
    mask_key = None if attn_mask is None else (_layout_key(attn_mask), attn_mask.requires_grad)
    cache_key = (_layout_key(query), _layout_key(key), _layout_key(value), mask_key,
                 bool(is_causal), scale, bool(enable_gqa), bool(deterministic))
    route = _ROUTES.get(cache_key)
    if route is None:
        # The op's own checks first, once per layout (a bad call raises before it is cached): a
        # call sent to aten would otherwise get aten's messages, which do not name the argument.
        _check_inputs(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
        if len(_ROUTES) >= _ROUTES_MAX:
            _ROUTES.clear()
        route = _ROUTES[cache_key] = _decide_route(*cache_key)
    return route


def _layout_key(t):
    """What explain_bwd reads of a tensor: sizes, strides, dtype, device and where its data
    starts modulo 16 bytes (the kernels need 16-byte-aligned operands), as plain values."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)
    # A fake or functional tensor while torch.compile traces: no data pointer (storages start
    # aligned, so the storage offset tells the alignment), and with dynamic shapes the sizes are
    # symbolic: read as the values the trace started with, without adding a guard. The route is
    # a speed choice (both routes compute the same gradients), and what it depends on (head dim,
    # dtype, layout) does not change with a sequence length, so the graph need not recompile.
    return (tuple(_size_hint(n) for n in t.shape), tuple(_size_hint(n) for n in t.stride()),
            t.dtype, t.device, (_size_hint(t.storage_offset()) * t.dtype.itemsize) % 16)


def _size_hint(n) -> int:
    if type(n) is int:
        return n
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:  # older torch: the SymNode's own hint
        hint = n.node.hint
        return 4096 if hint is None else int(hint)
    return optimization_hint(n, fallback=4096)  # 4096: a size with no example value (unbacked)


_CAPABILITY = {}


def _device_capability(device: torch.device) -> Optional[Tuple[int, int]]:
    """(major, minor) of a CUDA device; None for other devices, or where CUDA cannot be asked
    (fake CUDA tensors on a machine without a GPU)."""
    if device.type != "cuda":
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CAPABILITY:
        try:
            _CAPABILITY[index] = tuple(torch.cuda.get_device_capability(index))
        except (RuntimeError, AssertionError):
            return None
    return _CAPABILITY[index]


def _decide_route(q_layout, k_layout, v_layout, mask_key, is_causal, scale, enable_gqa,
                  deterministic) -> TrainingRoute:
    """The table's decision from a cache key (nothing else: a cached answer is always right).
    mask_key: None, or (the mask's _layout_key, whether it requires grad)."""
    cc = _device_capability(q_layout[3])
    if cc is None:  # CPU and other devices: no kernel, so the Python backward's entry (aten)
        flashcore, note = training_table_entry(None, "python", 0)
        return TrainingRoute(not flashcore, "python", _REASON_NOT_CUDA, 0, note)
    if mask_key is not None and mask_key[1]:
        reason, family = _REASON_BWD_MASK, 0
    else:
        reason, family = _explain_bwd_ahead(q_layout, k_layout, v_layout, is_causal, scale,
                                            enable_gqa, deterministic,
                                            None if mask_key is None else mask_key[0])
    path = _FAMILY_PATHS.get(family, "python") if reason == 0 else "python"
    if mask_key is not None and path in ("sm90", "sm80"):
        path = _masked_path(path, mask_key[0])
    sizes = q_layout[0]
    head_dim = sizes[-1] if len(sizes) else 0
    entry = training_table_entry(cc, path, head_dim)
    if entry is None:
        flashcore, note = True, (f"no measurement on compute capability {cc[0]}.{cc[1]}: "
                                 "FlashCore's own backward, as before")
    else:
        flashcore, note = entry[0], entry[1]
        keys = k_layout[0][-2] if len(k_layout[0]) >= 2 else 0
        if flashcore and len(entry) > 2 and keys < entry[2]:
            flashcore, note = False, (f"fewer than {entry[2]} keys: fwd + bwd not measured faster "
                                      "than aten's there, docs/experiments/backward.md")
    return TrainingRoute(not flashcore, path, reason, family, note)


def _masked_path(path, mask_layout) -> str:
    """A backward path's own path for a mask that needs no gradient: "sm80-masked" for the
    sm80-class family (either kind of mask, read element by element); for the sm90 family
    "sm90-masked-additive" for an additive mask (its forward runs in the sm80-class family),
    else "sm90-masked" (a bool mask: both passes read it in TMA tiles, from the op's copy where
    its layout has none)."""
    if path == "sm80":
        return "sm80-masked"
    return "sm90-masked" if mask_layout[2] == torch.bool else "sm90-masked-additive"


# Where stand-ins "start": as the caching allocator's blocks, 512-byte aligned. Never read.
_STAND_IN_ADDRESS = 512


def _stand_in(sizes, strides, dtype, device, misalign=0):
    """A tensor with these sizes, strides, dtype and device, and data at a made-up address.
    explain_bwd reads metadata and the pointer's alignment, never data; a stand-in for a training
    call's out or grad_out would otherwise cost their size in memory (gigabytes for long
    sequences) just to be looked at. Nothing may read or write it."""
    sizes, strides = list(sizes), list(strides)
    extent = 0 if 0 in sizes else 1 + sum((n - 1) * st for n, st in zip(sizes, strides))
    storage = torch._C._construct_storage_from_data_pointer(
        _STAND_IN_ADDRESS + misalign, device, extent * dtype.itemsize)
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, sizes, strides)


def _explain_bwd_ahead(q_layout, k_layout, v_layout, is_causal, scale, enable_gqa,
                       deterministic, mask_layout=None) -> Tuple[int, int]:
    """(reason, family) from explain_bwd for a call whose forward has not run yet: stand-ins with
    the layouts of q, k, v, and for out, lse and grad_out what the forward and autograd will
    give (out in sdpa_fwd's layout, _layout.py; lse contiguous; grad_out usually out's layout)."""
    from torch.utils._python_dispatch import _disable_current_modes
    if any(len(layout[0]) != 4 for layout in (q_layout, k_layout, v_layout)):
        return _REASON_NOT_4D, 0
    # Real tensors, out of reach of any dispatch mode: while torch.compile traces, the fake and
    # proxy modes would otherwise turn these into graph nodes.
    with _disable_current_modes():
        q, k, v = (_stand_in(sizes, strides, dtype, device, misalign)
                   for sizes, strides, dtype, device, misalign in (q_layout, k_layout, v_layout))
        try:
            out_sizes = _out_shape(q, k, v, enable_gqa)
        except RuntimeError:  # sizes that do not broadcast: the call itself will say so
            return _REASON_SHAPES, 0
        out = _stand_in(out_sizes, output_strides(out_sizes, q), q.dtype, q.device)
        lse_sizes = out_sizes[:-1]
        lse = _stand_in(lse_sizes, contiguous_strides(lse_sizes), _lse_dtype(q.dtype), q.device)
        mask = None if mask_layout is None else _stand_in(*mask_layout)
        family, reason = _EXPLAIN_BWD(out, q, k, v, out, lse, None, is_causal, scale, enable_gqa,
                                      deterministic, mask)  # grad_out: out's layout
    return int(reason), int(family)


class _SdpaTraining(torch.autograd.Function):
    """sdpa's training call on FlashCore's kernels: out of sdpa_fwd, its backward sdpa_bwd
    (_sdpa_grads, as sdpa_fwd's registered autograd), both called below Autograd: without the
    Python that torch.library's autograd wrapper runs on every call (filling in the schema's
    defaults, a second redispatch, the Autograd kernels of sdpa_fwd, sdpa_bwd and
    sdpa_bwd_kernel): ~0.45 ms of host time per
    forward + backward on the H200's host (docs/experiments/backward.md, thirty-ninth session),
    which a small training step waits for."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        kw = {} if scale is None and not enable_gqa else dict(scale=scale, enable_gqa=enable_gqa)
        with torch._C._AutoDispatchBelowAutograd():
            if _forward_mask_as_causal(query, key, value, attn_mask, is_causal, scale, enable_gqa):
                out, lse = _forward_as_causal(query, key, value, attn_mask, scale, enable_gqa)
            else:
                out, lse = _SDPA_FWD(query, key, value, attn_mask, 0.0, is_causal, **kw)
        ctx.save_for_backward(query, key, value, out, lse, attn_mask)
        ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, scale, enable_gqa
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return (*_sdpa_grads(ctx, grad_out, None), None, None, None)


def _sdpa_autograd(keyset, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                   scale=None, enable_gqa=False):
    """flashcore::sdpa's Autograd kernel: with gradients, sdpa = sdpa_fwd(...)[0] with the LSE
    saved for sdpa_bwd (_SdpaTraining), unless the training route sends the call to aten
    (dropout, or FlashCore's backward slower than PyTorch's here: see TRAINING_TABLE); without
    gradients, the C++ kernels run directly (no LSE computed). A CausalBias attn_mask is refused (_causal_bias.py)."""
    if attn_mask is not None and type(attn_mask) is not torch.Tensor and is_causal_bias(attn_mask):
        raise ValueError(CAUSAL_BIAS_IN_OP)
    if torch.is_grad_enabled() and torch._C._any_requires_grad(query, key, value, attn_mask):
        if dropout_p != 0.0:  # the op's checks (the route's cache does them for the others)
            _check_inputs(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if dropout_p > 0.0 or _training_goes_to_aten(query, key, value, attn_mask, is_causal,
                                                     scale, enable_gqa):
            # aten's differentiable SDPA for both passes (with dropout: aten owns the dropout
            # RNG and its backward); the result in sdpa's layout (_layout.py: the query's, as
            # aten's cuDNN and flash backends give it, so usually as it is).
            return in_output_layout(torch.ops.aten.scaled_dot_product_attention(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                enable_gqa=enable_gqa), query)
        return _SdpaTraining.apply(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    # No gradient to record: straight to the kernels below Autograd. This runs on every
    # inference call, so it avoids what costs Python time and is not needed here (CPU, per
    # call): OpOverload.redispatch's extra frame, keyword arguments left at their defaults, and
    # an _AutoDispatchBelowAutograd guard (with no input requiring grad, or grad mode off, the
    # kernels' nested aten calls record nothing anyway).
    kw = {} if scale is None and not enable_gqa else dict(scale=scale, enable_gqa=enable_gqa)
    return _SDPA_HANDLE.redispatch_boxed(keyset & torch._C._after_autograd_keyset, query, key,
                                         value, attn_mask, dropout_p, is_causal, **kw)


_lib.impl("sdpa", _sdpa_autograd, "Autograd", with_keyset=True)
