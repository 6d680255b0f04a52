"""``flashcore.varlen_attn``: PyTorch's variable-length attention API on FlashCore.

Same signature, arguments and results as ``torch.nn.attention.varlen.varlen_attn`` (torch 2.14):
sequences packed along dim 0 of query (T_q, H_q, D) and key / value (T_k, H_kv, D), sequence i
being rows ``cu_seq_q[i]:cu_seq_q[i+1]`` of query and ``cu_seq_k[i]:cu_seq_k[i+1]`` of key and
value. Nothing is padded.

Fused for paged decoding (issue 35): a CUDA call with ``block_table`` and ``seqused_k`` where
every sequence has one query row (``cu_seq_q`` is 0, 1, ..., N and query has N rows), fp16 or
bf16, head dim 64 or 128 (value's too), pages of a multiple of 16 tokens, at most 32 query heads
per KV head, no left window (a one-row sequence's bottom-right window of any right side, causal
included, sees all its keys), runs as one launch of the decode kernels
(``torch.ops.flashcore._paged_decode``, torch_op/paged_op.cpp; _fused_paged_decode below),
``max_q`` being 1. The offsets, seqused_k and the block table are checked first on the host, read
with one wait for the device (where a value is wrong, the errors below); under CUDA graph capture,
where nothing can be read, they are not checked: the kernels clamp every page index into the
pools and read at most the table's width, so a bad value gives wrong rows, never a read outside
the tensors. Its backward is the per-sequence one.

Fused on Hopper for packed sequences: a CUDA call on an sm_90 GPU with ``cu_seq_k`` (no
``seqused_k`` or ``block_table``), fp16 or bf16, head dim 64, 128 or 256 (value's too), no window
or causal (``window_size=(-1, 0)``, where every sequence has as many queries as keys, or none),
16-byte aligned rows, runs as one launch of the Hopper forward over every sequence
(``torch.ops.flashcore._varlen_fwd``, torch_op/varlen_op.cpp; _fused_varlen_fwd below): a first
kernel lists the sequences' 128-row query blocks, the forward's persistent CTAs take them. The
offsets are read on the host first (the checks below; one wait for the device). Under CUDA graph
capture (transformers' continuous batching captures its steps) nothing can be read and a replay
sees new offsets: the plan comes from max_q / max_k, a non-causal call runs the packed kernel
unchecked (it clamps every offset into the tensors), a causal one (exact in the kernel only
where every sequence has as many queries as keys) goes to PyTorch's varlen_attn, and a call
neither takes raises a RuntimeError naming the capture. Its backward, at head dims 64, 128 and
256 outside deterministic mode, is one launch of the Hopper backward over every sequence
(``torch.ops.flashcore._varlen_bwd``; _fused_varlen_bwd below; a first kernel lists the
sequences' 128-key blocks), under capture too. Other backwards are the per-sequence loop; so a
training call the fused backward does not take and PyTorch's varlen_attn does runs there
instead, both passes (_training_goes_to_torch; FLASHCORE_TRAINING=flashcore keeps it here).

Otherwise the op loops over the sequences on the host and runs
FlashCore's SDPA op (``torch.ops.flashcore.sdpa_fwd``, its backward ``sdpa_bwd``) once per
sequence on (1, H, S, D) views, so each sequence gets a FlashCore kernel on a GPU where one covers
it (PyTorch's SDPA otherwise, e.g. on CPU). A window or a causal Sq != Sk sequence goes to the
kernels as its band (bottom-right aligned) where one takes it (explain says so; the Hopper
family, the decode kernels), else as one bool mask. Correct, but not fast for many short
sequences: one launch per sequence, and the offsets are read on the host (a device sync per
call). Fused kernels for windows, seqused_k and the sm80-class family are next.

Semantics, following PyTorch's varlen_attn (its flash-attention backend) point by point:

* No ``is_causal`` argument: ``window_size=(-1, 0)`` is causal. Windows (left, right) are
  flash-attention's, aligned to the bottom right of each sequence: query row i of a sequence with
  Sq queries and Sk keys sees key j when ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``, a
  negative bound meaning no limit on that side. So causal is bottom-right aligned (the last query
  sees every key); for Sq == Sk it is the usual causal mask. As flash-attention does, a bound
  ``>= max_k`` means no limit. A query row that sees no key gives zeros and LSE ``+inf``
  (flash-attention's convention, unlike SDPA's ``-inf``); so do rows of query past
  ``cu_seq_q[-1]``.
* ``return_aux=AuxRequest(lse=True)`` also returns the log-sum-exp of the scaled scores, shape
  (H_q, T_q), float32 (float64 for float64 inputs, so gradcheck sees float64 end to end).
* ``enable_gqa``: H_q a multiple of H_kv, each KV head serving a group of query heads; without
  it the head counts must be equal (``ValueError``, as PyTorch).
* ``seqused_k``: only the first ``seqused_k[i]`` keys of sequence i take part (the window is
  aligned to that length).
* ``block_table`` (with ``seqused_k``, as PyTorch requires): key and value are pools of pages
  (num_pages, page_size, H_kv, D); key token t of sequence i is slot ``t % page_size`` of page
  ``block_table[i, t // page_size]``; ``cu_seq_k`` may then be None.
* ``num_splits`` is accepted and changes nothing: each sequence is computed alone, so results
  are the same whatever else is in the batch (the batch invariance ``num_splits=1`` asks for).

Beyond PyTorch: gradients flow to query, key and value also with ``seqused_k`` and
``block_table`` (PyTorch's raise there), and through the LSE (PyTorch's backward drops the LSE's
gradient); value may have another head dim than query (output (T_q, H_q, D_v)); CPU works.

Registered as the custom op ``flashcore::varlen_attn`` (fake implementation, autograd through
``flashcore::varlen_attn_backward``), so ``torch.compile(fullgraph=True)`` traces a call as one
opaque node; an eager training call runs the same two ops below Autograd (_VarlenTraining),
without the Python of torch.library's autograd wrapper. Arguments are checked where they are given (shapes and dtypes in this function,
the offsets' values in the op, which reads them): a ``ValueError`` naming the argument.
"""
import math
import operator
import weakref
from typing import NamedTuple, Optional, Tuple

import torch

from ._scale import sdpa_scale

__all__ = ["varlen_attn", "explain_varlen", "AuxRequest"]

try:  # PyTorch's own request type where it has one, so either can be passed
    from torch.nn.attention.varlen import AuxRequest
except ImportError:  # torch < 2.9
    class AuxRequest(NamedTuple):
        """Which auxiliary outputs varlen_attn returns (``lse``: the log-sum-exp)."""
        lse: bool = False

# FlashCore's SDPA forward that also returns the LSE, and its backward; absent where the package
# runs without its compiled library (FALLBACK_ONLY), where the plain math below stands in.
try:
    _SDPA_FWD = torch.ops.flashcore.sdpa_fwd.default
    _SDPA_BWD = torch.ops.flashcore.sdpa_bwd.default
    _EXPLAIN = torch.ops.flashcore.explain.default
except AttributeError:
    _SDPA_FWD = _SDPA_BWD = _EXPLAIN = None
# The fused paged decode (torch_op/paged_op.cpp); absent without the compiled library, or with an
# op library built before it.
try:
    _PAGED_DECODE = torch.ops.flashcore._paged_decode.default
except AttributeError:
    _PAGED_DECODE = None
# The fused packed forward (torch_op/varlen_op.cpp); absent as _PAGED_DECODE can be.
try:
    _VARLEN_FWD = torch.ops.flashcore._varlen_fwd.default
except AttributeError:
    _VARLEN_FWD = None
# The fused packed backward (torch_op/varlen_op.cpp); absent as _PAGED_DECODE can be.
try:
    _VARLEN_BWD = torch.ops.flashcore._varlen_bwd.default
except AttributeError:
    _VARLEN_BWD = None

_NAME = "flashcore.varlen_attn"


def _fail(message: str):
    raise ValueError(f"{_NAME}: {message}")


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- checks of what is known without reading tensor data (traceable) ----------------------------

def _check_offsets_meta(name, t, device, batch=None):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a tensor of int32 offsets, got {type(t).__name__}")
    if t.dtype != torch.int32:
        _fail(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1:
        _fail(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if t.device != device:
        _fail(f"{name} must be on query's device ({device}), got {t.device}")
    if batch is None and t.numel() < 1:
        _fail(f"{name} must have N + 1 >= 1 entries (offsets starting at 0), got none")
    if batch is not None and t.numel() != batch:
        what = ("as many offsets as cu_seq_q" if name.startswith("cu_seq") else
                "one per sequence, as cu_seq_q says")
        _fail(f"{name} must have {batch} {'entry' if batch == 1 else 'entries'} ({what}), "
              f"got {t.numel()}")


def _check_arguments(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale,
                     window_size, enable_gqa, seqused_k, block_table, num_splits):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a tensor, got {type(t).__name__}")
    if query.dim() != 3:
        _fail(f"query must be 3-D (total_q, heads, head_dim), got shape {tuple(query.shape)}")
    kv_dims = 4 if block_table is not None else 3
    layout = ("(num_pages, page_size, heads, head_dim) with block_table" if kv_dims == 4
              else "(total_k, heads, head_dim)")
    for name, t in (("key", key), ("value", value)):
        if t.dim() != kv_dims:
            _fail(f"{name} must be {kv_dims}-D {layout}, got shape {tuple(t.shape)}")
        if not t.dtype.is_floating_point or t.dtype != query.dtype:
            _fail(f"{name} must have query's floating dtype ({query.dtype}), got {t.dtype}")
        if t.device != query.device:
            _fail(f"{name} must be on query's device ({query.device}), got {t.device}")
    if not query.dtype.is_floating_point:
        _fail(f"query must have a floating dtype, got {query.dtype}")
    if key.shape[:-1] != value.shape[:-1]:
        _fail(f"key and value must have the same sizes but the last, got {tuple(key.shape)} "
              f"and {tuple(value.shape)}")
    if key.shape[-1] != query.shape[-1]:
        _fail(f"key's head dim ({key.shape[-1]}) must equal query's ({query.shape[-1]})")
    hq, hkv = query.shape[1], key.shape[-2]
    if not enable_gqa and hq != hkv:
        _fail(f"query and key/value must have the same number of heads, got Hq={hq} and "
              f"Hkv={hkv}; set enable_gqa=True for grouped-query attention")
    if enable_gqa and (hkv == 0 or hq % hkv != 0):
        _fail(f"with enable_gqa, query's heads must be a multiple of key/value's, got Hq={hq} "
              f"and Hkv={hkv}")

    _check_offsets_meta("cu_seq_q", cu_seq_q, query.device)
    n_offsets = cu_seq_q.numel()
    if cu_seq_k is None:
        if block_table is None:
            _fail("cu_seq_k may be None only with block_table (paged key/value)")
    else:
        _check_offsets_meta("cu_seq_k", cu_seq_k, query.device, n_offsets)
    if seqused_k is not None:
        _check_offsets_meta("seqused_k", seqused_k, query.device, n_offsets - 1)
    if block_table is not None:
        if seqused_k is None:
            _fail("block_table needs seqused_k (the number of valid keys of each sequence)")
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            _fail("block_table must be an int32 tensor, got "
                  + (str(block_table.dtype) if isinstance(block_table, torch.Tensor) else type(block_table).__name__))
        if block_table.dim() != 2 or block_table.shape[0] != n_offsets - 1:
            _fail(f"block_table must be 2-D (N={n_offsets - 1}, max_pages_per_seq), got shape "
                  f"{tuple(block_table.shape)}")
        if block_table.device != query.device:
            _fail(f"block_table must be on query's device ({query.device}), got "
                  f"{block_table.device}")

    for name, n in (("max_q", max_q), ("max_k", max_k)):
        if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)):
            _fail(f"{name} must be an int, got {type(n).__name__}")
        if n < 0:
            _fail(f"{name} must be >= 0, got {n}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        _fail(f"window_size must be two ints (left, right), got {window_size!r}")
    if window_size[0] < -1 or window_size[1] < -1:
        _fail(f"window_size entries must be >= -1 (-1: no limit), got {tuple(window_size)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        _fail(f"scale must be a float or None, got {type(scale).__name__}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 0):
        _fail(f"num_splits must be None or an int >= 0, got {num_splits!r}")
    if return_aux is not None and not hasattr(return_aux, "lse"):
        _fail(f"return_aux must be None or an AuxRequest, got {type(return_aux).__name__}")


# ---- the plan: offsets read and checked on the host ---------------------------------------------

class _Seq(NamedTuple):
    q0: int          # query rows q0 : q0 + sq
    sq: int
    sk: int          # keys taking part
    k0: int          # unpaged: key rows k0 : k0 + sk
    pages: Optional[torch.Tensor]  # paged: the page indices (on the device) holding the sk keys


def _check_offsets(name, offsets, total, total_name):
    if offsets[0] != 0:
        _fail(f"{name} must start at 0, got {offsets[0]}")
    for i in range(len(offsets) - 1):
        if offsets[i + 1] < offsets[i]:
            _fail(f"{name} must be non-decreasing, got {name}[{i}]={offsets[i]} > "
                  f"{name}[{i + 1}]={offsets[i + 1]}")
    if offsets[-1] > total:
        _fail(f"{name} ends at {offsets[-1]}, past {total_name} ({total} rows)")


def _plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, seqused_k, block_table):
    """One _Seq per sequence, after checking the offsets' values (read on the host)."""
    cu_q = cu_seq_q.tolist()
    _check_offsets("cu_seq_q", cu_q, query.shape[0], "query")
    n = len(cu_q) - 1
    used = None if seqused_k is None else seqused_k.tolist()
    if used is not None and any(u < 0 for u in used):
        _fail(f"seqused_k must be >= 0, got {min(used)}")
    seqs = []
    if block_table is None:
        cu_k = cu_seq_k.tolist()
        _check_offsets("cu_seq_k", cu_k, key.shape[0], "key")
        for i in range(n):
            room = cu_k[i + 1] - cu_k[i]
            sk = room if used is None else used[i]
            if sk > room:
                _fail(f"seqused_k[{i}]={sk} exceeds sequence {i}'s keys in cu_seq_k ({room})")
            seqs.append(_Seq(cu_q[i], cu_q[i + 1] - cu_q[i], sk, cu_k[i], None))
    else:
        if cu_seq_k is not None:  # not used with pages (seqused_k gives the lengths); still sane
            _check_offsets("cu_seq_k", cu_seq_k.tolist(), math.inf, "key")
        num_pages, page_size = key.shape[0], key.shape[1]
        table = block_table.tolist()
        width = block_table.shape[1]
        for i in range(n):
            need = -(-used[i] // page_size) if page_size > 0 else (0 if used[i] == 0 else None)
            if need is None or need > width:
                _fail(f"seqused_k[{i}]={used[i]} needs more pages than block_table has per "
                      f"sequence ({width} pages of {page_size} keys)")
            bad = [p for p in table[i][:need] if not 0 <= p < num_pages]
            if bad:
                _fail(f"block_table[{i}] refers to page {bad[0]}, out of range for key/value's "
                      f"{num_pages} pages")
            seqs.append(_Seq(cu_q[i], cu_q[i + 1] - cu_q[i], used[i], 0,
                             block_table[i, :need].long()))
    longest_q = max((s.sq for s in seqs), default=0)
    longest_k = max((s.sk for s in seqs), default=0)
    if longest_q > max_q:
        _fail(f"max_q={max_q} is less than the longest query sequence in cu_seq_q ({longest_q})")
    if longest_k > max_k:
        _fail(f"max_k={max_k} is less than the longest key sequence "
              f"({'seqused_k' if seqused_k is not None else 'cu_seq_k'}: {longest_k})")
    return seqs


def _keys(t, s: _Seq):
    """Sequence s's rows of key or value, (sk, H, D): a view, or gathered from the pages."""
    if s.pages is None:
        return t[s.k0:s.k0 + s.sk]
    return t.index_select(0, s.pages).flatten(0, 1)[:s.sk]


def _heads_first(t):
    """(S, H, D) -> (1, H, S, D), a view."""
    return t.transpose(0, 1).unsqueeze(0)


def _window(left, right, max_k):
    # flash-attention's normalization: a bound that reaches max_k keys is no bound.
    return (-1 if left >= max_k else left), (-1 if right >= max_k else right)


def _mask(sq, sk, left, right, device):
    """(is_causal, bool mask or None) for SDPA on one sequence: flash-attention's window,
    bottom-right aligned. SDPA's is_causal is top-left aligned, the same mask only for Sq == Sk."""
    if left < 0 and right < 0:
        return False, None
    if left < 0 and right == 0 and sq == sk:
        return True, None
    rows = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
    cols = torch.arange(sk, device=device).unsqueeze(0)
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= cols >= rows - left
    if right >= 0:
        keep &= cols <= rows + right
    return False, keep


def _band_or_mask(q4, k4, v4, left, right, scale, enable_gqa):
    """(is_causal, mask, band) for one sequence's sdpa_fwd / sdpa_bwd: the window as the kernels'
    band (window_left, window_right, bottom_right) where a kernel takes it, else _mask's."""
    sq, sk = q4.shape[-2], k4.shape[-2]
    plain = (left < 0 and right < 0) or (left < 0 and right == 0 and sq == sk)
    if not plain and _EXPLAIN is not None and q4.is_cuda:
        band = (left, right, True)
        if _EXPLAIN(q4, k4, v4, None, 0.0, False, scale=scale, enable_gqa=enable_gqa,
                    window_left=left, window_right=right, bottom_right=True)[1] == 0:
            return False, None, band
    causal, mask = _mask(sq, sk, left, right, q4.device)
    return causal, mask, ()


# ---- plain math, where the package runs without its compiled library ----------------------------

def _math_probs(q, k, mask, is_causal, scale, gqa):
    ct = _lse_dtype(q.dtype)
    kf = k.to(ct)
    if gqa:
        kf = kf.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    s = torch.matmul(q.to(ct), kf.transpose(-2, -1)) * scale
    if is_causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), 0).unsqueeze(-1))
    return p, lse, kf


def _math_fwd(q, k, v, mask, is_causal, scale, gqa):
    p, lse, _ = _math_probs(q, k, mask, is_causal, scale, gqa)
    vf = v.to(p.dtype)
    if gqa:
        vf = vf.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return torch.matmul(p, vf).to(q.dtype), lse


def _math_bwd(dout, q, k, v, out, glse, mask, is_causal, scale, gqa):
    p, _, kf = _math_probs(q, k, mask, is_causal, scale, gqa)
    group = q.shape[1] // k.shape[1] if gqa else 1
    vf = v.to(p.dtype).repeat_interleave(group, dim=1)
    do = dout.to(p.dtype)
    delta = (do * out.to(p.dtype)).sum(-1)
    if glse is not None:
        delta = delta - glse.to(p.dtype)
    ds = p * (torch.matmul(do, vf.transpose(-2, -1)) - delta.unsqueeze(-1))
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-2, -1), q.to(p.dtype)) * scale
    dv = torch.matmul(p.transpose(-2, -1), do)
    if group > 1:
        dk = dk.unflatten(1, (k.shape[1], group)).sum(2)
        dv = dv.unflatten(1, (v.shape[1], group)).sum(2)
    return dq, dk, dv


# ---- the fused paged decode ------------------------------------------------------------------------

_FUSED_DTYPES = (torch.float16, torch.bfloat16)
_FUSED_HEAD_DIMS = (64, 128)
_FUSED_MAX_GROUP = 32  # query heads per KV head: the decode kernels' rows per CTA (one query each)


def _rows_aligned(t):
    """Last dim contiguous, 16-byte base and strides (the C layer's rules; dims of size 1 aside)."""
    if t.stride(-1) != 1 or t.data_ptr() % 16 != 0:
        return False
    per16 = 16 // t.element_size()
    return all(t.stride(i) % per16 == 0 for i in range(t.dim() - 1) if t.shape[i] > 1)


def _paged_decode_declines(query, key, value, seqused_k, block_table, max_q, window_left):
    """Why _fused_paged_decode does not take this call, or None when it may (then
    _paged_decode_plan reads the values). Metadata only (window_left as _window normalized it)."""
    if block_table is None or seqused_k is None:
        return "not paged (no block_table and seqused_k)"
    if _PAGED_DECODE is None:
        return "the op library has no _paged_decode"
    if query.dtype not in _FUSED_DTYPES:
        return f"dtype {query.dtype} (the decode kernels: float16, bfloat16)"
    if query.shape[-1] not in _FUSED_HEAD_DIMS or value.shape[-1] != query.shape[-1]:
        return "head dim (the decode kernels: 64 and 128, value's equal to query's)"
    if key.shape[1] % 16 != 0:
        return f"page size {key.shape[1]} (the decode kernels: a multiple of 16)"
    if window_left >= 0:
        return "a left window"
    if key.shape[2] == 0 or query.shape[1] // key.shape[2] > _FUSED_MAX_GROUP:
        return f"more than {_FUSED_MAX_GROUP} query heads per KV head"
    if max_q != 1 or query.shape[0] != block_table.shape[0]:
        return "not one query row per sequence (max_q != 1, or query's rows != block_table's)"
    if not query.is_cuda:  # (late: the reasons above can be checked on any device)
        return "not on CUDA"
    if not all(_rows_aligned(t) for t in (query, key, value)):
        return "a layout the kernels do not read (last dim strided, or not 16-byte aligned)"
    if (block_table.shape[1] > 1 and block_table.stride(1) != 1) or (
            seqused_k.shape[0] > 1 and seqused_k.stride(0) != 1):
        return "block_table's rows or seqused_k not contiguous"
    return None


class _PagedPlan(NamedTuple):
    width: int        # table columns the kernel may read (ceil(longest / page_size))
    any_empty: bool   # some sequence has no key (its LSE turns from -inf to +inf)


def _paged_decode_plan(query, key, cu_seq_q, cu_seq_k, max_k, seqused_k, block_table):
    """The fused paged decode's plan when the values allow it (each sequence one query row,
    cu_seq_k sane if given, 0 <= seqused_k <= max_k, enough table columns, the pages each sequence
    reads inside the pools), or None: the caller then runs _plan, which raises the error that
    names the argument or plans the per-sequence loop. The values come to the host by copies
    (one wait for the device); the table is checked by its min and max where every entry is a
    page, entry by entry (vectorized) where some are not (unused entries padded with -1).
    Under CUDA graph capture nothing can be read: the values are not checked (the kernels clamp
    every page index into the pools and read at most the table's width of pages, so a bad value
    gives wrong rows, never a read outside the tensors), and the width comes from max_k."""
    page_size, num_pages = key.shape[1], key.shape[0]
    n, width = block_table.shape
    if query.is_cuda and torch.cuda.is_current_stream_capturing():
        return _PagedPlan(min(width, -(-max_k // page_size)), True)
    if cu_seq_q.shape[0] != n + 1 or seqused_k.shape[0] != n:
        return None
    # Copies, not a kernel (a torch.cat would be a launch beside the decode kernel's): the first
    # waits for the device, the others find it idle.
    cu_q, used = cu_seq_q.cpu().tolist(), seqused_k.cpu().tolist()
    table = block_table.cpu()
    cu_k = [] if cu_seq_k is None else cu_seq_k.cpu().tolist()
    if cu_q != list(range(n + 1)):
        return None
    if cu_k and (cu_k[0] != 0 or any(b < a for a, b in zip(cu_k, cu_k[1:]))):
        return None
    if n == 0:
        return _PagedPlan(0, False)
    if min(used) < 0 or max(used) > max_k:
        return None
    pages = [-(-u // page_size) for u in used]
    longest = max(pages)
    if longest > width:
        return None
    if longest:
        lo, hi = torch.aminmax(table[:, :longest])
        if lo < 0 or hi >= num_pages:  # only entries a sequence reads must be pages (-1 pads rows)
            read = torch.arange(longest).unsqueeze(0) < torch.tensor(pages).unsqueeze(1)
            bad = (table[:, :longest] < 0) | (table[:, :longest] >= num_pages)
            if bool((bad & read).any()):
                return None
    return _PagedPlan(longest, 0 in used)


def _fused_paged_decode(query, key, value, seqused_k, block_table, plan, scale):
    """(out (N, H_q, D), lse (H_q, N)) of a call _paged_decode_declines takes, planned by
    _paged_decode_plan: one launch of the decode kernels over the pages
    (flashcore::_paged_decode). Sequences with no key: zeros and LSE +inf (varlen's convention;
    the kernel gives SDPA's -inf)."""
    if plan.width == 0:  # no key anywhere
        return (query.new_zeros((query.shape[0], query.shape[1], value.shape[-1])),
                torch.full((query.shape[1], query.shape[0]), float("inf"), dtype=torch.float32,
                           device=query.device))
    # Only the table's first `width` columns can be read (a view: the split heuristic then sees
    # the longest sequence, not the table's width).
    out, lse = _PAGED_DECODE(query, key, value, block_table[:, :plan.width], seqused_k, scale)
    if plan.any_empty:
        lse = lse.masked_fill_(lse == float("-inf"), float("inf"))
    return out, lse


# The Hopper forward's head dims (the fused packed forward runs there alone).
_VARLEN_HEAD_DIMS = (64, 128, 256)
def _is_hopper(device) -> bool:
    from . import _ops  # (imported here: _ops imports this module's package)
    return _ops._device_capability(device) == (9, 0)


def _varlen_fwd_declines(query, key, value, cu_seq_k, seqused_k, block_table, left, right, scale,
                         check_pointers=True):
    """Why _fused_varlen_fwd does not take this call, or None when it may (the offsets' values
    then decide: _varlen_fwd_plan). Metadata only (left and right as _window normalized them);
    check_pointers False leaves out the rows' alignment (data pointers: not while tracing)."""
    if _VARLEN_FWD is None:
        return "the op library has no _varlen_fwd"
    if block_table is not None or seqused_k is not None or cu_seq_k is None:
        return "paged key/value or seqused_k (the packed forward reads cu_seq_k's rows)"
    if query.dtype not in _FUSED_DTYPES:
        return f"dtype {query.dtype} (the Hopper forward: float16, bfloat16)"
    if query.shape[-1] not in _VARLEN_HEAD_DIMS or value.shape[-1] != query.shape[-1]:
        return "head dim (the Hopper forward: 64, 128 and 256, value's equal to query's)"
    if left >= 0 or right not in (-1, 0):
        return "a window (the packed forward: none, or causal)"
    if not scale > 0:
        return "a scale <= 0"
    if query.shape[0] == 0 or key.shape[0] == 0 or cu_seq_k.shape[0] < 2:
        return "no rows"
    if not query.is_cuda:  # (late: the reasons above can be checked on any device)
        return "not on CUDA"
    if not _is_hopper(query.device):
        return "not a Hopper GPU (the packed forward is the sm_90 family's)"
    if check_pointers and not all(_rows_aligned(t) for t in (query, key, value)):
        return "a layout the kernels do not read (last dim strided, or not 16-byte aligned)"
    return None


class _VarlenPlan(NamedTuple):
    longest_q: int   # the longest query / key sequence (the C layer's seqlen_q / seqlen_k)
    longest_k: int
    end: Optional[int]  # cu_seq_q[-1]: rows from here on belong to no sequence (None: unknown)
    any_no_key: bool  # a sequence with queries and no key (its LSE turns from -inf to +inf)
    end_k: Optional[int] = None  # cu_seq_k[-1], as end for the keys (their gradients' rows)


def _varlen_fwd_plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, causal):
    """The fused packed forward's plan when the offsets' values allow it, or None: the caller
    then runs _plan, which raises the error naming the argument, or plans the per-sequence loop.
    Allowed: offsets from 0, non-decreasing, ending within query / key; lengths within max_q /
    max_k; some query; causal only where each sequence has as many queries as keys (the kernel's
    causal is top-left in each sequence, varlen_attn's bottom-right). The values come to the
    host as lists (one wait for the device) and are checked mostly by C loops (map, min, max,
    list equality): _plan's Python loop took ~0.7 ms for 897 sequences on the CPU machine."""
    cu_q, cu_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    if len(cu_q) < 2 or len(cu_k) != len(cu_q) or cu_q[0] != 0 or cu_k[0] != 0:
        return None
    sq = list(map(operator.sub, cu_q[1:], cu_q[:-1]))  # (map and the min / max: C loops)
    sk = list(map(operator.sub, cu_k[1:], cu_k[:-1]))
    if min(sq) < 0 or min(sk) < 0 or cu_q[-1] > query.shape[0] or cu_k[-1] > key.shape[0]:
        return None
    longest_q, longest_k = max(sq), max(sk)
    if longest_q > max_q or longest_k > max_k or longest_q == 0:
        return None
    if causal and sq != sk and not all(a == 0 or a == b for a, b in zip(sq, sk)):
        return None
    any_no_key = 0 in sk and any(a > 0 and b == 0 for a, b in zip(sq, sk))
    return _VarlenPlan(longest_q, max(longest_k, 1), cu_q[-1], any_no_key, cu_k[-1])


def _capture_varlen_fwd_plan(query, key, max_q, max_k):
    """The packed forward's plan under CUDA graph capture, from the shapes alone: max_q / max_k
    (clamped to the rows) stand for the longest sequences, and the rows past cu_seq_q[-1] and the
    sequences with no key are fixed on the device (end None: _rows_outside_on_device). Unchecked offsets
    give wrong rows, never an access outside the tensors (the list kernel clamps them)."""
    return _VarlenPlan(max(1, min(max_q, query.shape[0])), max(1, min(max_k, key.shape[0])), None, False)


# The last plan made (_cached_varlen_fwd_plan): (its inputs' key, weak references to its offset
# tensors, the plan). One slot, replaced whole (a tuple), so threads see a consistent one.
_last_varlen_plan = None


def _offsets_stamp(t):
    """(id, version counter) of an offsets tensor, or None where PyTorch tracks no writes to it
    (an inference tensor has no version counter)."""
    try:
        return id(t), t._version
    except RuntimeError:
        return None


def _cached_varlen_fwd_plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, causal):
    """_varlen_fwd_plan, reusing the last call's plan when its offsets are the same tensor objects,
    not written since (their version counters, which every PyTorch write bumps), and the rest of
    what the plan reads is equal. Each read of the offsets waits for the device (the GPU idles
    while the host checks and launches); a model passes one batch's offsets to every layer, so
    only its first layer pays. (Offsets written behind PyTorch's back, through a raw pointer,
    would keep a stale plan: the kernels clamp every offset into the tensors, so rows may come
    out wrong, but nothing is read or written outside them.)"""
    global _last_varlen_plan
    stamps = (_offsets_stamp(cu_seq_q), _offsets_stamp(cu_seq_k))
    key_ = None
    if None not in stamps:
        key_ = (stamps, query.shape[0], key.shape[0], max_q, max_k, causal, query.device)
        last = _last_varlen_plan
        if last is not None and last[0] == key_ and last[1][0]() is cu_seq_q and last[1][1]() is cu_seq_k:
            return last[2]
    plan = _varlen_fwd_plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, causal)
    if key_ is not None and plan is not None:
        _last_varlen_plan = (key_, (weakref.ref(cu_seq_q), weakref.ref(cu_seq_k)), plan)
    return plan


def _fused_varlen_fwd(query, key, value, cu_seq_q, cu_seq_k, plan, causal, scale):
    """(out (T_q, H_q, D), lse (H_q, T_q)) of a call _varlen_fwd_declines lets through and
    _varlen_fwd_plan planned: one launch of the Hopper forward over every sequence
    (flashcore::_varlen_fwd). Rows past the last sequence and sequences with no key: zeros and
    LSE +inf (varlen's convention; the kernel gives SDPA's -inf and leaves the tail unwritten)."""
    out, lse = _VARLEN_FWD(query, key, value, cu_seq_q.contiguous(), cu_seq_k.contiguous(), plan.longest_q,
                           plan.longest_k, causal, scale)
    if plan.end is None:  # (CUDA graph capture: the offsets stay on the device)
        return _rows_outside_on_device(out, lse, cu_seq_q)
    if plan.end < query.shape[0]:
        out[plan.end:] = 0
        lse[:, plan.end:] = float("inf")
    if plan.any_no_key:
        lse = lse.masked_fill_(lse == float("-inf"), float("inf"))
    return out, lse


# The Hopper backward's head dims (the fused packed backward runs there alone).
_VARLEN_BWD_HEAD_DIMS = (64, 128, 256)


def _fused_bwd_may_take(query, key, value, cu_seq_k, max_k, scale, window_size, seqused_k,
                        block_table, check_pointers=True) -> bool:
    """Whether the fused packed backward may take the call, from metadata alone (the offsets'
    values then decide, as for the packed forward): the packed forward's calls at head dims 64,
    128 and 256, outside deterministic mode (check_pointers: as _varlen_fwd_declines')."""
    if _VARLEN_BWD is None or query.shape[-1] not in _VARLEN_BWD_HEAD_DIMS:
        return False
    if torch.are_deterministic_algorithms_enabled():
        return False
    left, right = _window(int(window_size[0]), int(window_size[1]), max_k)
    sc = sdpa_scale(None if scale is None else float(scale), query.shape[-1])
    return _varlen_fwd_declines(query, key, value, cu_seq_k, seqused_k, block_table, left, right,
                                sc, check_pointers) is None


def _varlen_bwd_plan(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size,
                     seqused_k, block_table):
    """The packed forward's plan when the fused packed backward takes the call (the Hopper
    backward over every sequence in one launch: what the packed forward takes, at head dims 64,
    128 and 256, outside deterministic mode: its dq is summed in any order), else None (the per-sequence
    loop). Reads the offsets through the forward's plan cache (not under capture)."""
    if not _fused_bwd_may_take(query, key, value, cu_seq_k, max_k, scale, window_size, seqused_k,
                               block_table):
        return None
    kind, _, plan = _forward_path(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                                  window_size, seqused_k, block_table)
    return plan if kind == "packed" else None


def _fused_varlen_bwd(grad_out, grad_lse, query, key, value, out, lse, cu_seq_q, cu_seq_k, plan,
                      causal, scale):
    """(dq, dk, dv) of a call _varlen_bwd_plan planned: one launch of the Hopper backward over
    every sequence (flashcore::_varlen_bwd). Key rows past the last sequence (which no kernel
    writes) get zero gradients; query rows outside every sequence get zeros from the kernel."""
    dq, dk, dv = _VARLEN_BWD(grad_out.contiguous(), query, key, value, out.contiguous(), lse,
                             None if grad_lse is None else grad_lse.contiguous(), cu_seq_q.contiguous(),
                             cu_seq_k.contiguous(), plan.longest_q, plan.longest_k, causal, scale)
    if plan.end_k is None:  # (CUDA graph capture: the offsets stay on the device)
        tail = (torch.arange(key.shape[0], device=key.device) >= cu_seq_k[-1])[:, None, None]
        return dq, dk.masked_fill_(tail, 0), dv.masked_fill_(tail, 0)
    if plan.end_k < key.shape[0]:
        dk[plan.end_k:] = 0
        dv[plan.end_k:] = 0
    return dq, dk, dv


def _rows_outside_on_device(out, lse, cu_seq_q):
    """Rows past cu_seq_q[-1] (which no kernel writes) to zeros and LSE +inf, and an LSE of -inf
    (a row that saw no key) to +inf, without reading the offsets on the host (graph capture)."""
    tail = torch.arange(out.shape[0], device=out.device) >= cu_seq_q[-1]
    out.masked_fill_(tail[:, None, None], 0)
    lse.masked_fill_(tail | (lse == float("-inf")), float("inf"))
    return out, lse


# ---- the ops -------------------------------------------------------------------------------------

@torch.library.custom_op("flashcore::varlen_attn", mutates_args=())
def _varlen_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               cu_seq_q: torch.Tensor, cu_seq_k: Optional[torch.Tensor], max_q: int, max_k: int,
               window_left: int, window_right: int, scale: Optional[float], enable_gqa: bool,
               seqused_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor]
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out (T_q, H_q, D_v), lse (H_q, T_q)): per sequence, FlashCore's SDPA forward; paged
    decoding in one launch (_fused_paged_decode), and on Hopper every sequence in one launch
    (_fused_varlen_fwd)."""
    left, right = _window(window_left, window_right, max_k)
    sc = sdpa_scale(scale, query.shape[-1])
    kind, why, plan = _forward_path(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                                    (window_left, window_right), seqused_k, block_table)
    if kind == "paged decode":
        return _fused_paged_decode(query, key, value, seqused_k, block_table, plan, sc)
    if kind == "packed":
        return _fused_varlen_fwd(query, key, value, cu_seq_q, cu_seq_k, plan, left < 0 and right == 0, sc)
    if kind == "torch":
        out, lse = _torch_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                                 (window_left, window_right), enable_gqa, lse=True)
        return _rows_outside_on_device(out, lse, cu_seq_q)
    if kind == "capture":
        raise RuntimeError(f"{_NAME} cannot run this call inside CUDA graph capture: neither fused "
                           f"path takes it ({why}), and the per-sequence loop reads the offsets on "
                           "the host; run it outside the graph")
    seqs = _plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, seqused_k, block_table)
    total, hq = query.shape[0], query.shape[1]
    out = query.new_zeros((total, hq, value.shape[-1]))
    lse = torch.full((hq, total), float("inf"), dtype=_lse_dtype(query.dtype),
                     device=query.device)
    for s in seqs:
        if s.sq == 0 or s.sk == 0:  # nothing to attend: zeros and +inf, as already there
            continue
        q4 = _heads_first(query[s.q0:s.q0 + s.sq])
        k4, v4 = _heads_first(_keys(key, s)), _heads_first(_keys(value, s))
        causal, mask, band = _band_or_mask(q4, k4, v4, left, right, sc, enable_gqa)
        if _SDPA_FWD is not None:
            kw = dict(zip(("window_left", "window_right", "bottom_right"), band))
            o4, l3 = _SDPA_FWD(q4, k4, v4, mask, 0.0, causal, scale=sc, enable_gqa=enable_gqa, **kw)
        else:
            o4, l3 = _math_fwd(q4, k4, v4, mask, causal, sc, enable_gqa)
        empty = l3 == float("-inf")  # rows that saw no key: zeros, LSE +inf
        out[s.q0:s.q0 + s.sq] = o4[0].masked_fill(empty[0].unsqueeze(-1), 0).transpose(0, 1)
        lse[:, s.q0:s.q0 + s.sq] = l3[0].masked_fill(empty[0], float("inf"))
    return out, lse


@_varlen_op.register_fake
def _varlen_fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_left,
                 window_right, scale, enable_gqa, seqused_k, block_table):
    total, hq = query.shape[0], query.shape[1]
    return (query.new_empty((total, hq, value.shape[-1])),
            query.new_empty((hq, total), dtype=_lse_dtype(query.dtype)))


@torch.library.custom_op("flashcore::varlen_attn_backward", mutates_args=())
def _varlen_backward_op(grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor],
                        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, cu_seq_q: torch.Tensor,
                        cu_seq_k: Optional[torch.Tensor], max_q: int, max_k: int,
                        window_left: int, window_right: int, scale: Optional[float],
                        enable_gqa: bool, seqused_k: Optional[torch.Tensor],
                        block_table: Optional[torch.Tensor]
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in the inputs' shapes: on Hopper every sequence in one launch where the
    fused packed backward takes the call (_varlen_bwd_plan), else per sequence, FlashCore's SDPA
    backward. Paged keys' gradients are summed into their pages (pages shared by several
    sequences get the sum)."""
    left, right = _window(window_left, window_right, max_k)
    sc = sdpa_scale(scale, query.shape[-1])
    plan = _varlen_bwd_plan(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                            (window_left, window_right), seqused_k, block_table)
    if plan is not None:
        return _fused_varlen_bwd(grad_out, grad_lse, query, key, value, out, lse, cu_seq_q, cu_seq_k,
                                 plan, left < 0 and right == 0, sc)
    if _capturing(query):
        raise RuntimeError(f"{_NAME}'s backward cannot run this call inside CUDA graph capture: the "
                           "fused packed backward does not take it, and the per-sequence loop reads "
                           "the offsets on the host; run it outside the graph")
    seqs = _plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, seqused_k, block_table)
    dq = torch.zeros(query.shape, dtype=query.dtype, device=query.device)
    dk = torch.zeros(key.shape, dtype=key.dtype, device=key.device)
    dv = torch.zeros(value.shape, dtype=value.dtype, device=value.device)
    if block_table is not None:
        page_size = key.shape[1]
        dk_rows, dv_rows = dk.flatten(0, 1), dv.flatten(0, 1)  # views of the zeros above
    for s in seqs:
        if s.sq == 0 or s.sk == 0:
            continue
        rows = slice(s.q0, s.q0 + s.sq)
        q4 = _heads_first(query[rows])
        k4, v4 = _heads_first(_keys(key, s)), _heads_first(_keys(value, s))
        o4, do4 = _heads_first(out[rows]), _heads_first(grad_out[rows])
        gl3 = None if grad_lse is None else grad_lse[:, rows].unsqueeze(0).contiguous()
        causal, mask, band = _band_or_mask(q4, k4, v4, left, right, sc, enable_gqa)
        if _SDPA_BWD is not None:
            # The LSE as sdpa_fwd gave it: -inf where a row saw no key (+inf in varlen's output).
            l3 = lse[:, rows].unsqueeze(0)
            l3 = l3.masked_fill(l3 == float("inf"), float("-inf")).contiguous()
            dq4, dk4, dv4, _ = _SDPA_BWD(do4, q4, k4, v4, o4, l3, gl3, mask, causal, sc,
                                         enable_gqa, False, *band)
        else:
            dq4, dk4, dv4 = _math_bwd(do4, q4, k4, v4, o4, gl3, mask, causal, sc, enable_gqa)
        dq[rows] = dq4[0].transpose(0, 1)
        if block_table is None:
            dk[s.k0:s.k0 + s.sk] = dk4[0].transpose(0, 1)
            dv[s.k0:s.k0 + s.sk] = dv4[0].transpose(0, 1)
        else:
            slots = torch.arange(page_size, device=key.device)
            index = (s.pages.unsqueeze(1) * page_size + slots).flatten()[:s.sk]
            dk_rows.index_add_(0, index, dk4[0].transpose(0, 1).to(dk.dtype))
            dv_rows.index_add_(0, index, dv4[0].transpose(0, 1).to(dv.dtype))
    return dq, dk, dv


@_varlen_backward_op.register_fake
def _varlen_backward_fake(grad_out, grad_lse, query, key, value, out, lse, cu_seq_q, cu_seq_k,
                          max_q, max_k, window_left, window_right, scale, enable_gqa, seqused_k,
                          block_table):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


_NOT_DIFFERENTIABLE = 10  # cu_seq_q ... block_table


def _setup_context(ctx, inputs, output):
    (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_left, window_right, scale,
     enable_gqa, seqused_k, block_table) = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, cu_seq_q, cu_seq_k, seqused_k,
                          block_table)
    ctx.args = (max_q, max_k, window_left, window_right, scale, enable_gqa)
    # An output whose gradient is not asked for arrives as None, not as zeros: no grad_lse for
    # the (usual) caller that never looks at the LSE keeps the backward kernel's fast path.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse, cu_seq_q, cu_seq_k, seqused_k, block_table = ctx.saved_tensors
    max_q, max_k, window_left, window_right, scale, enable_gqa = ctx.args
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = _varlen_backward_op(grad_out, grad_lse, query, key, value, out, lse, cu_seq_q,
                                     cu_seq_k, max_q, max_k, window_left, window_right, scale,
                                     enable_gqa, seqused_k, block_table)
    return (dq, dk, dv) + (None,) * _NOT_DIFFERENTIABLE


_varlen_op.register_autograd(_backward, setup_context=_setup_context)


class _VarlenTraining(torch.autograd.Function):
    """An eager training call of varlen_attn: the two custom ops called below Autograd, without
    the Python torch.library's autograd wrapper runs on each call (its argument handling, a
    redispatch, the backward's second wrapper). Same forward, backward and saved tensors as the
    registered autograd above, which torch.compile traces instead; under create_graph the
    backward goes through the backward op's dispatcher entry, which refuses a double backward
    as before."""

    @staticmethod
    def forward(ctx, *inputs):
        with torch._C._AutoDispatchBelowAutograd():
            output = _varlen_op(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if torch.is_grad_enabled():  # create_graph: through the op's Autograd kernel
            return _backward(ctx, grad_out, grad_lse)
        with torch._C._AutoDispatchBelowAutograd():
            return _backward(ctx, grad_out, grad_lse)


# ---- the public function -------------------------------------------------------------------------

def varlen_attn(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                cu_seq_q: torch.Tensor, cu_seq_k: Optional[torch.Tensor], max_q: int, max_k: int,
                *, return_aux: Optional[AuxRequest] = None, scale: Optional[float] = None,
                window_size: Tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                seqused_k: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, num_splits: Optional[int] = None):
    r"""Attention over sequences packed along dim 0: ``torch.nn.attention.varlen.varlen_attn``'s
    signature and results, computed by FlashCore (see the module docstring for the semantics).

    Args:
        query: (T_q, H_q, D). key, value: (T_k, H_kv, D), or (num_pages, page_size, H_kv, D)
            with ``block_table``.
        cu_seq_q, cu_seq_k: int32 offsets (N + 1,) on query's device, starting at 0,
            non-decreasing, ending within query / key. ``cu_seq_k`` may be None with
            ``block_table``.
        max_q, max_k: at least the longest query / key sequence (keys: as ``seqused_k`` says
            where given).
        return_aux: ``AuxRequest(lse=True)`` also returns the LSE, (H_q, T_q).
        scale: None means 1 / sqrt(D).
        window_size: (left, right), -1 for no limit; (-1, 0) is causal (bottom-right aligned).
        enable_gqa: H_q a multiple of H_kv.
        seqused_k: int32 (N,): keys of each sequence that take part (the first ones).
        block_table: int32 (N, max_pages_per_seq): pages of key/value per sequence; needs
            ``seqused_k``.
        num_splits: accepted for PyTorch's signature; changes nothing here.

    Returns ``out`` (T_q, H_q, D_v) in query's dtype, or ``(out, lse)``.

    Fused on Hopper (see the module docstring): the forward, and the backward at head dims 64
    and 128; otherwise one FlashCore SDPA call per sequence (a host loop). A training call
    (gradients wanted) that the fused backward does not take and PyTorch's varlen_attn does runs
    there, both passes (_training_goes_to_torch); ``FLASHCORE_TRAINING=flashcore`` keeps it here.
    """
    _check_arguments(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale,
                     window_size, enable_gqa, seqused_k, block_table, num_splits)
    if _training_goes_to_torch(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux,
                               scale, window_size, enable_gqa, seqused_k, block_table):
        return _torch_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                             window_size, enable_gqa)
    args = (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, int(window_size[0]),
            int(window_size[1]), None if scale is None else float(scale), bool(enable_gqa),
            seqused_k, block_table)
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                            or value.requires_grad)
    if training and not torch.compiler.is_compiling():
        out, lse = _VarlenTraining.apply(*args)
    else:
        out, lse = _varlen_op(*args)
    if return_aux is not None and return_aux.lse:
        return out, lse
    return out


def explain_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   cu_seq_q: torch.Tensor, cu_seq_k: Optional[torch.Tensor], max_q: int, max_k: int,
                   *, return_aux: Optional[AuxRequest] = None, scale: Optional[float] = None,
                   window_size: Tuple[int, int] = (-1, -1), enable_gqa: bool = False,
                   seqused_k: Optional[torch.Tensor] = None,
                   block_table: Optional[torch.Tensor] = None, num_splits: Optional[int] = None) -> str:
    """Which path :func:`varlen_attn` takes for these arguments (the same ones), in words:

    * ``"torch varlen_attn: ..."``: a training call PyTorch's function takes (both passes there);
    * ``"fused paged decode ..."`` / ``"fused packed forward ..."``: one launch of the decode
      kernels / of the Hopper forward;
    * ``"per-sequence loop: <why>"``: one FlashCore SDPA call per sequence.

    For a call whose inputs require grad (with autograd on) that stays on FlashCore, the answer
    ends with ``"; backward: fused packed backward ..."`` or ``"; backward: per-sequence loop"``. Reads the offsets as varlen_attn does (one wait
    for the device) and raises for the same bad arguments."""
    _check_arguments(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale,
                     window_size, enable_gqa, seqused_k, block_table, num_splits)
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if _training_goes_to_torch(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux,
                               scale, window_size, enable_gqa, seqused_k, block_table):
        return ("torch varlen_attn: a training call the fused packed backward does not take, and "
                "FlashCore's per-sequence backward loop is slower (FLASHCORE_TRAINING=flashcore keeps it here)")
    backward = ""
    if training:
        fused = _varlen_bwd_plan(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                                 window_size, seqused_k, block_table) is not None
        backward = ("; backward: fused packed backward (one launch of the sm90 backward)" if fused
                    else "; backward: per-sequence loop")
    kind, why, _ = _forward_path(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale,
                                 window_size, seqused_k, block_table)
    if kind == "paged decode":
        return "fused paged decode (one launch of the decode kernels)" + backward
    if kind == "packed":
        return "fused packed forward (one launch of the sm90 forward)" + backward
    if kind == "torch":
        return f"torch varlen_attn: {why}" + backward
    if kind == "capture":
        return f"cannot run inside CUDA graph capture: {why}"
    return f"per-sequence loop: {why}" + backward


def _forward_path(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size,
                  seqused_k, block_table):
    """(kind, why, plan) of the forward for checked arguments, the one decision _varlen_op runs
    and explain_varlen reports: ("paged decode", "", its _PagedPlan), ("packed", "", its
    _VarlenPlan) or ("loop", why the one-launch paths decline, None). Reads the offsets (the
    packed plan through its cache). Under CUDA graph capture nothing can be read (and a replay
    sees new offsets), so the plans come from the shapes and max_q / max_k alone, and where
    neither fused path is exact whatever the offsets, the call goes to PyTorch's varlen_attn
    (("torch", why, None), where it takes the call) or cannot run (("capture", why, None))."""
    left, right = _window(int(window_size[0]), int(window_size[1]), max_k)
    sc = sdpa_scale(None if scale is None else float(scale), query.shape[-1])
    capturing = _capturing(query)
    why = _paged_decode_declines(query, key, value, seqused_k, block_table, max_q, left)
    if why is None:
        plan = _paged_decode_plan(query, key, cu_seq_q, cu_seq_k, max_k, seqused_k, block_table)
        if plan is not None:
            return "paged decode", "", plan
        why = "the offsets, seqused_k or block_table's values (not one query row per sequence, or pages out of range)"
    if block_table is None:
        why = _varlen_fwd_declines(query, key, value, cu_seq_k, seqused_k, block_table, left, right, sc)
        if why is None:
            causal = left < 0 and right == 0
            if capturing and causal:
                why = ("CUDA graph capture: causal is exact in the packed kernel only where every "
                       "sequence has as many queries as keys, which the host cannot read while capturing")
            else:
                plan = (_capture_varlen_fwd_plan(query, key, max_q, max_k) if capturing else
                        _cached_varlen_fwd_plan(query, key, cu_seq_q, cu_seq_k, max_q, max_k, causal))
                if plan is not None:
                    return "packed", "", plan
                why = ("the offsets' values (causal with a sequence of more or fewer queries than keys, "
                       "no query at all, or offsets the checks reject)")
    if capturing:  # (the per-sequence loop reads the offsets)
        if "return_aux" in _TORCH_NAMES and _torch_takes(query, value, None, scale, window_size,
                                                          seqused_k, block_table):
            return "torch", f"CUDA graph capture, where the per-sequence loop cannot run, and {why}", None
        return "capture", why, None
    return "loop", why, None


def _capturing(query) -> bool:
    """Whether query's CUDA stream is capturing a graph (no value can come to the host)."""
    return query.is_cuda and torch.cuda.is_current_stream_capturing()


# ---- torch.nn.attention.varlen.varlen_attn routed here by flashcore.patch() ----------------------

try:
    from torch.nn.attention import varlen as _TORCH_MODULE
except ImportError:  # torch < 2.9: nothing to patch
    _TORCH_MODULE = None
_TORCH_ORIGINAL = getattr(_TORCH_MODULE, "varlen_attn", None)
if getattr(_TORCH_ORIGINAL, "__flashcore_patch__", False):  # module reloaded while patched
    _TORCH_ORIGINAL = _TORCH_ORIGINAL.__wrapped__


def _torch_parameters():
    """(every parameter name of the original, the names of its positional parameters after
    max_k, e.g. ("is_causal", "return_aux") in torch 2.9 and () in 2.14), read once: releases
    differ in what they take."""
    import inspect
    if _TORCH_ORIGINAL is None:
        return frozenset(), ()
    params = list(inspect.signature(_TORCH_ORIGINAL).parameters.values())
    return (frozenset(p.name for p in params),
            tuple(p.name for p in params[7:] if p.kind == p.POSITIONAL_OR_KEYWORD))


_TORCH_NAMES, _TORCH_POSITIONAL = _torch_parameters()


def _training_goes_to_torch(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale,
                            window_size, enable_gqa, seqused_k, block_table) -> bool:
    """Whether a training call (autograd on, an input that requires grad) runs in PyTorch's
    varlen_attn, both passes. Calls the fused packed backward takes (_varlen_bwd_plan: Hopper, D 64
    and 128, the packed forward's calls) stay on FlashCore, ahead of PyTorch's in forward +
    backward (docs/experiments/varlen.md). Elsewhere FlashCore's varlen backward is a loop over the
    sequences: forward + backward at 0.06-1.16x PyTorch's on an H200 (docs/USAGE.md), so the
    principle "never slower than PyTorch's default" sends such calls there wherever PyTorch's
    function takes them: CUDA,
    fp16/bf16, head dims up to 256 (multiples of 8, value's equal to query's), no seqused_k or
    block_table, no LSE asked (PyTorch's backward drops the LSE's gradient, FlashCore's keeps it),
    and only the window and scale arguments its release knows. (GQA: releases without
    enable_gqa, torch 2.11 among them, take Hq a multiple of Hkv as it is: measured by
    bench/bench_varlen.py's torch-varlen rows.) FLASHCORE_TRAINING=flashcore
    (or a forced FLASHCORE_FAMILY) keeps them on FlashCore, as for SDPA (flashcore._ops)."""
    if _TORCH_ORIGINAL is None or not torch.is_grad_enabled():
        return False
    if not any(t.requires_grad for t in (query, key, value)):
        return False
    if not _torch_takes(query, value, return_aux, scale, window_size, seqused_k, block_table):
        return False
    from . import _ops  # (imported here: _ops imports this module's package)
    if _ops._training_mode()[0] == "flashcore":
        return False
    if torch.compiler.is_compiling():  # (the offsets' values, data pointers: not while tracing)
        return not _fused_bwd_may_take(query, key, value, cu_seq_k, max_k, scale, window_size,
                                       seqused_k, block_table, check_pointers=False)
    return _varlen_bwd_plan(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size,
                            seqused_k, block_table) is None


def _torch_takes(query, value, return_aux, scale, window_size, seqused_k, block_table) -> bool:
    """Whether this release's PyTorch varlen_attn takes the call (see _training_goes_to_torch)."""
    if _TORCH_ORIGINAL is None or not query.is_cuda or query.dtype not in _FUSED_DTYPES:
        return False
    d = query.shape[-1]
    if d > 256 or d % 8 != 0 or value.shape[-1] != d:
        return False
    if seqused_k is not None or block_table is not None or (return_aux is not None and return_aux.lse):
        return False
    window = tuple(window_size)
    if window != (-1, -1) and "window_size" not in _TORCH_NAMES and not (
            window == (-1, 0) and "is_causal" in _TORCH_NAMES):
        return False
    if scale is not None and "scale" not in _TORCH_NAMES:
        return False
    return True


def _torch_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size,
                  enable_gqa, lse=False):
    """PyTorch's varlen_attn on a call _torch_takes takes: its output, or (out, lse) with lse."""
    kw = {"return_aux": AuxRequest(lse=True)} if lse else {}
    window = tuple(window_size)
    if window != (-1, -1):
        kw.update({"window_size": window} if "window_size" in _TORCH_NAMES else {"is_causal": True})
    if enable_gqa and "enable_gqa" in _TORCH_NAMES:
        kw["enable_gqa"] = True
    if scale is not None:
        kw["scale"] = scale
    return _TORCH_ORIGINAL(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kw)
_OUR_KEYWORDS = frozenset(("return_aux", "scale", "window_size", "enable_gqa", "seqused_k",
                           "block_table", "num_splits"))


def torch_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *args, **kwargs):
    """Stands in for ``torch.nn.attention.varlen.varlen_attn`` while ``flashcore.patch()`` is on:
    accepts what this PyTorch's function accepts (older releases' positional ``is_causal``,
    bottom-right causal as there, becomes ``window_size=(left, 0)``) and calls
    :func:`varlen_attn`; arguments it does not know (another release's KV-cache arguments),
    tensor subclasses and devices other than CPU/CUDA go to PyTorch's function unchanged."""
    tensors = (query, key, value)
    mine = dict(kwargs)
    mine.update(zip(_TORCH_POSITIONAL, args))
    is_causal = mine.pop("is_causal", False)
    routable = (len(args) <= len(_TORCH_POSITIONAL)
                and all(name in _OUR_KEYWORDS for name in mine)
                and not torch.overrides.has_torch_function(tensors)
                and query.device.type in ("cpu", "cuda"))
    if not routable:
        return _TORCH_ORIGINAL(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *args,
                               **kwargs)
    if is_causal:
        mine["window_size"] = (tuple(mine.get("window_size", (-1, -1)))[0], 0)
    return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **mine)


torch_varlen_attn.__flashcore_patch__ = True
torch_varlen_attn.__wrapped__ = _TORCH_ORIGINAL


def _route_torch(on: bool) -> None:
    """Install (on) or remove the stand-in; leaves a function someone else installed alone.
    Called by flashcore.patch() / unpatch() under their lock."""
    if _TORCH_MODULE is None or _TORCH_ORIGINAL is None:
        return
    if on and _TORCH_MODULE.varlen_attn is _TORCH_ORIGINAL:
        _TORCH_MODULE.varlen_attn = torch_varlen_attn
    elif not on and _TORCH_MODULE.varlen_attn is torch_varlen_attn:
        _TORCH_MODULE.varlen_attn = _TORCH_ORIGINAL
