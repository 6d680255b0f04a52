"""FlashCore as a HuggingFace transformers attention implementation: ``"flashcore"``.

Usage::

    import flashcore.integrations.hf  # registers "flashcore" (imports transformers)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashcore")
    model.set_attn_implementation("flashcore")  # or switch an existing model

Importing this module calls :func:`register`, which registers

- :func:`flashcore_attention_forward` with ``transformers.AttentionInterface`` and
- :func:`flashcore_mask` (transformers' own ``sdpa_mask``, less the masks that only say
  "causal + sliding window") with ``transformers.AttentionMaskInterface``,

both under the name ``"flashcore"``. The attention function behaves like transformers'
``integrations/sdpa_attention.py::sdpa_attention_forward`` (the ``"sdpa"`` implementation) with
``torch.nn.functional.scaled_dot_product_attention`` replaced by ``torch.ops.flashcore.sdpa``,
and sliding windows run by ``flashcore.attention``:

- q is (B, Hq, Sq, D), k/v are (B, Hkv, Sk, D) (transposed views are used in place); the
  output is returned as (B, Sq, Hq, D), contiguous, with ``None`` for the attention weights;
- grouped-query attention goes through ``enable_gqa=True`` (K/V are never repeated);
- with no mask (prefill without padding: the mask builder returns ``None``) the call uses
  ``is_causal=True`` when Sq > 1 and the module is causal, like sdpa, so no mask is ever
  materialized; decode steps (Sq == 1) attend to the whole cache; with padding (or a padding
  mask under torch.compile, whose values cannot be read while tracing) the mask builder
  materializes a bool mask (B, 1, Sq, Sk), True meaning attend, which is passed as
  ``attn_mask``;
- sliding windows (the ``sliding_window`` argument transformers passes for Mistral, Qwen2 with
  ``use_sliding_window``, Gemma2/3 local layers, ...): transformers' window of W is W keys, the
  query's own included (``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - W``), i.e.
  ``window_size=(W - 1, 0)``. Where transformers' mask for such a layer would say only that
  (no padding inside any query's window, a recognised ``sliding_window_causal_mask_function``,
  and the last query is the last key: no cache, or a dynamic cache, full or sliding, in prefill,
  chunked prefill or decode), :func:`flashcore_mask` returns ``None`` and the attention
  function, seeing no mask and more keys than W, calls ``flashcore.attention(...,
  is_causal=True, causal_alignment="bottom_right", window_size=(W - 1, 0))`` (the sm90 kernel
  skips the key tiles outside the band; elsewhere the band becomes a mask inside the op). A
  decode step over a sliding cache of W keys needs no mask either. Every other case keeps
  transformers' mask (padding, static caches, offsets given as tensors, or/and mask overlays,
  chunked attention, torch.export, a padding mask under torch.compile, any mask under
  torch.compile before torch 2.14): the window is then in
  the mask, which is used as it is (``flashcore.sdpa`` with that mask);
- packed sequences (padding-free training: ``DataCollatorWithFlattening``, one row holding several
  documents whose ``position_ids`` restart at each, no attention mask, no cache): transformers
  then builds a causal mask that also keeps each document to itself
  (``and_masks(causal_mask_function, packed_sequence_mask_function(ids))``). :func:`flashcore_mask`
  builds that mask as ``sdpa_mask`` does and tags it with the documents' offsets (read once per
  forward); the attention function, given a mask with the tag and no window, softcap or sinks,
  runs ``flashcore.varlen_attn`` over the documents (causal within each, no cross-document
  attention, no masked work) instead of the dense masked call. A mask that lost the tag (a model
  that slices or rebuilds it) is used as it is. Not under torch.compile (the mask is used there).
  Offsets given outright (``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` /
  ``max_length_k``, as ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` passes them)
  with no mask go to ``flashcore.varlen_attn`` as transformers' flash implementations take them;
- a logit softcap (``softcap``, Gemma 2) and attention sinks (``s_aux``, gpt-oss) go to
  ``flashcore.attention(..., softcap=, sinks=)`` with the same mask, causal flag and window as
  above (the Hopper kernels take both without a mask; with a mask the sm80-class kernel applies
  the softcap and the sinks are applied to the output, see ``flashcore.attention``);
- what the FlashCore kernels do not implement is handed to transformers' own
  ``sdpa_attention_forward`` unchanged: ``output_attentions=True``, ``position_bias``,
  ``dropout > 0`` (training), and a window on a non-causal layer with no mask. So is every call
  while PyTorch's context parallelism is active (``context_parallel``: its ring is a wrapper of
  ``F.scaled_dot_product_attention``, which that function calls; with ``flashcore.patch()`` and
  ``flashcore.integrations.context_parallel.enable()`` each ring step runs FlashCore's kernels).
  Where the builder left a window's mask out, the delegated call is given the band as its bool
  mask (transformers' function ignores ``sliding_window``).
  Where the op itself cannot run a kernel (CPU, fp32, other head dims, float32 masks with 16-bit
  inputs), it falls back to PyTorch's SDPA with the same arguments.

Supported transformers versions: 5.x from 5.17 on (``SUPPORTED_TRANSFORMERS``), tested with
5.17.0 (GPU machine) and 5.18.0 (CI). Older 5.x and newer versions register with a warning;
4.x is refused (its attention/mask interfaces differ).

A quirk handled here: transformers 5.17/5.18 treat every attention implementation whose name
contains ``"flash"`` as a FlashAttention build and try to load it (``lazy_import_flash_attention``
-> ``_lazy_imports``), which fails for ``"flashcore"``. :func:`register` wraps
``transformers.modeling_flash_attention_utils._lazy_imports`` so that for ``"flashcore"`` it
loads nothing (FlashCore needs none of the flash-attn functions), and models that list their own
FlashAttention builds (gpt-oss) do not swap ``"flashcore"`` for one of those; every other name goes to
transformers' function untouched. Other consequences of the substring check: with a static
cache and an explicit ``CompileConfig(fullgraph=True)``, ``generate()`` downgrades to
``fullgraph=False`` (with a warning); models that list ``_compatible_flash_implementations``
(gpt_oss, granite_swa, ...) replace ``"flashcore"`` by their flash implementation.

Continuous batching (``generate_batch``, the continuous-batching manager): :func:`register` also
registers ``"paged|flashcore"`` (:func:`flashcore_paged_attention_forward`; transformers switches
``"flashcore"`` to it by itself). It works as transformers' flash implementations do without
their decode fast path (no block table): the cache's update and read-back, then
``flashcore.varlen_attn`` over the requests (bottom-right causal, the layer's window). Not with
attention sinks or a softcap (a clear error).
"""
import copy
import functools
import warnings

import torch
import transformers
from packaging.version import Version
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (AttentionMaskInterface, causal_mask_function,
                                       prepare_padding_mask, sdpa_mask)
from transformers.utils.import_utils import is_torchdynamo_exporting, is_tracing

import flashcore
from flashcore import _band
from flashcore import varlen as _varlen
from flashcore.integrations import context_parallel as _context_parallel

__all__ = ["NAME", "SUPPORTED_TRANSFORMERS", "TESTED_TRANSFORMERS", "register",
           "flashcore_attention_forward", "flashcore_mask"]

NAME = "flashcore"
PAGED_NAME = "paged|flashcore"  # continuous batching (flashcore_paged_attention_forward)
SUPPORTED_TRANSFORMERS = ">=5.17,<6"
TESTED_TRANSFORMERS = ("5.17.0", "5.18.0")
_MIN, _MAX = Version("5.17"), Version("6")
# Whether torch.compile can trace _causal_window_of (seen: 2.14.1 yes, 2.11 no).
DYNAMO_READS_CLOSURES = Version(torch.__version__.split("+")[0]) >= Version("2.14")


_MISSING = object()


def _closure_value(fn, qualname, name):
    """The value the closure ``fn`` holds for ``name`` when ``fn`` is the function transformers'
    ``qualname`` returns, else _MISSING. transformers' mask functions are closures of its mask
    factories, recognised by their qualified names and the values they closed over."""
    if getattr(fn, "__qualname__", "") != qualname:
        return _MISSING
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells[name].cell_contents if name in cells else _MISSING


def _and_mask_parts(mask_function):
    """The two mask functions ``and_masks(a, b)`` combined, or None."""
    parts = _closure_value(mask_function, "and_masks.<locals>.and_mask", "mask_functions")
    return parts if isinstance(parts, tuple) and len(parts) == 2 else None


def _causal_window_of(mask_function, local_size):
    """W when ``mask_function`` is transformers' ``sliding_window_causal_mask_function(W)`` with
    W == ``local_size`` (what ``create_sliding_window_causal_mask`` passes), else None.

    The mask function is a closure (``and_masks(sliding_window_overlay(W), causal_mask_function)``),
    so it is recognised by its parts; anything else (chunked attention, which also passes
    ``local_size``, or/and overlays, bidirectional windows, another transformers layout) gives
    None and transformers' mask. The overlay is also asked about the two keys at the window's
    edge, so a change of its off-by-one in a later transformers shows up as None, not as a
    wrong window."""
    if not isinstance(local_size, int) or isinstance(local_size, bool) or local_size < 1:
        return None
    parts = _and_mask_parts(mask_function)
    if parts is None or parts[1] is not causal_mask_function:
        return None
    overlay = parts[0]
    window = _closure_value(overlay, "sliding_window_overlay.<locals>.inner_mask", "sliding_window")
    if window is _MISSING or window != local_size:
        return None
    # W keys, the query's own included: position q sees q - W + 1 .. q.
    w = local_size
    if not (overlay(0, 0, w, 1) and not overlay(0, 0, w, 0)):
        return None
    return w


def _band_does_the_mask(q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                        local_size):
    """True when transformers' mask for this call is exactly bottom-right causal + a window of W
    keys, with no padding inside any query's window, and the attention function does exactly
    that with no mask: the band (``flashcore.attention``) where the window cuts (kv_length > W);
    otherwise, for Sq == 1 every key (a decode step over a sliding cache of W keys) and for
    Sq == Sk ``is_causal``. (1 < Sq < Sk <= W keeps its mask: without a window the attention
    function takes a missing mask as a top-left static-cache prefill.)"""
    # Recognising the mask function means reading its closure, which dynamo traces from torch
    # 2.14 (2.11's stops at `__closure__`: a graph break under fullgraph=True); before that,
    # compiled code keeps transformers' mask, as for "sdpa".
    if is_torchdynamo_exporting() or (torch.compiler.is_compiling() and not DYNAMO_READS_CLOSURES):
        return False
    window = _causal_window_of(mask_function, local_size)
    if window is None:
        return False
    if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor):
        return False  # static caches: offsets as tensors (reading them would sync / break graphs)
    if not (kv_length > window or q_length == 1 or q_length == kv_length):
        return False
    # Query positions q_offset .. q_offset + Sq - 1, keys kv_offset .. kv_offset + Sk - 1: the band
    # is bottom-right exactly when the last query is the last key (true of dynamic caches, full
    # or sliding, and of no cache; a static cache not yet full has empty slots at the end).
    if q_offset + q_length != kv_offset + kv_length:
        return False
    padding_mask = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding_mask is None:
        return True
    if is_tracing(padding_mask):
        return False  # its values are unknown while tracing
    # Keys before q_offset - W + 1 are outside every query's window: padding there changes nothing.
    first = max(kv_offset, q_offset - window + 1)
    return bool(padding_mask[:, first:kv_offset + kv_length].all())


def _packed_sequence_ids(mask_function):
    """transformers' per-token document ids (B, T) when ``mask_function`` is its causal mask of
    packed sequences, ``and_masks(causal_mask_function, packed_sequence_mask_function(ids))`` (what
    ``create_causal_mask`` builds when ``position_ids`` restart with no attention mask and no
    cache), else None. Recognised by its parts, as :func:`_causal_window_of` does."""
    parts = _and_mask_parts(mask_function)
    if parts is None or parts[0] is not causal_mask_function:
        return None
    ids = _closure_value(parts[1], "packed_sequence_mask_function.<locals>.inner_mask",
                         "packed_sequence_mask")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        return None
    return ids


class _PackedDocuments:
    """The documents of a packed batch as ``flashcore.varlen_attn`` takes them: rows of the
    flattened (B * T) tokens, int32 offsets ``cu_seq`` (a document never spans two batch rows) and
    the longest document. Attached to the mask :func:`flashcore_mask` builds (``_TAG``)."""

    def __init__(self, ids: torch.Tensor):
        batch, length = ids.shape
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        first = starts.reshape(-1).nonzero().flatten()
        end = torch.tensor([batch * length], device=ids.device, dtype=first.dtype)
        self.cu_seq = torch.cat([first, end]).to(torch.int32)
        self.max_len = int(self.cu_seq.diff().max())  # (one read of the device per forward)
        self.batch, self.length = batch, length

    def takes(self, query, key) -> bool:
        return (query.shape[0] == self.batch and query.shape[2] == self.length
                and key.shape[2] == self.length and query.device == self.cu_seq.device)


_TAG = "_flashcore_packed_documents"


def _packed_documents_of(attention_mask):
    """The documents :func:`flashcore_mask` tagged ``attention_mask`` with, or None (no tag, or
    under torch.compile, where the mask itself is used)."""
    if attention_mask is None or torch.compiler.is_compiling():
        return None
    return getattr(attention_mask, _TAG, None)


def _documents_attention(query, key, value, cu_q, cu_k, max_q, max_k, scaling, enable_gqa):
    """Causal attention within the documents that int32 offsets ``cu_q`` / ``cu_k`` mark in the
    flattened (B * T) tokens (bottom-right, as flash_attn_varlen_func's; top-left where a
    document has as many queries as keys): ``flashcore.varlen_attn`` on (B * T, H, D) views of the
    (B, H, T, D) inputs; the output as (B, T, Hq, D)."""
    b, hq, t, _ = query.shape
    q, k, v = (x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3]) for x in (query, key, value))
    out = flashcore.varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0),
                                scale=scaling, enable_gqa=enable_gqa)
    return out.reshape(b, t, hq, value.shape[3])


def flashcore_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                   mask_function=causal_mask_function, attention_mask=None, local_size=None,
                   allow_is_causal_skip=True, **kwargs):
    """The "flashcore" mask builder: transformers' ``sdpa_mask`` (bool (B, 1, Sq, Sk), True =
    attend, or None where ``is_causal`` does the work), except that a sliding-window causal mask
    which is only bottom-right causal + window (no padding in any window) is not built: None,
    and :func:`flashcore_attention_forward` runs the band (``flashcore.attention``)."""
    if allow_is_causal_skip and _band_does_the_mask(q_length, kv_length, q_offset, kv_offset,
                                                    mask_function, attention_mask, local_size):
        return None
    mask = sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    # Packed documents (see the module docstring): the mask, tagged with their offsets.
    if (isinstance(mask, torch.Tensor) and attention_mask is None and local_size is None
            and q_length == kv_length and not isinstance(q_offset, torch.Tensor)
            and not isinstance(kv_offset, torch.Tensor) and q_offset == 0 and kv_offset == 0
            and not torch.compiler.is_compiling() and not is_torchdynamo_exporting()):
        ids = _packed_sequence_ids(mask_function)
        if ids is not None and tuple(ids.shape) == (batch_size, q_length) and not is_tracing(ids):
            setattr(mask, _TAG, _PackedDocuments(ids.to(mask.device)))
    return mask


def _window_band(query, key, sliding_window):
    """The band flashcore_mask left out, as a bool mask (1, 1, Sq, Sk): query i sees keys
    d - W + 1 .. d of its diagonal key d = i + Sk - Sq (transformers' sliding-window causal mask
    when the last query is the last key)."""
    sq, sk = query.shape[2], key.shape[2]
    band = _band.band_bounds(sq, sk, True, sliding_window - 1, 0, True)
    return _band.band_mask(range(sq), sk, band, query.device).view(1, 1, sq, sk)


def _delegate(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def flashcore_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``sdpa_attention_forward`` on FlashCore's ops (see the
    module docstring for the exact behaviour and what is delegated)."""
    q_length = query.shape[2]
    kv_length = key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    sliding_window = kwargs.get("sliding_window")
    # No mask and a window that cuts: the band is this function's to apply (flashcore_mask left it
    # out, or the model passes a window its mask does not carry): bottom-right causal + W keys.
    band = (sliding_window is not None and attention_mask is None and causal
            and kv_length > sliding_window)
    if (
        kwargs.get("output_attentions", False)
        or kwargs.get("position_bias") is not None
        or dropout > 0.0
        # PyTorch's context parallelism wraps F.scaled_dot_product_attention (its ring): through
        # transformers' function, which calls it (FlashCore's kernels per ring step where
        # flashcore.patch() and flashcore.integrations.context_parallel.enable() are in effect)
        or _context_parallel.active()
        # a non-causal layer with a window and no mask (transformers materializes those masks)
        or (sliding_window is not None and attention_mask is None and not causal
            and kv_length > sliding_window)
    ):
        if band:  # transformers' function ignores sliding_window: give it the band as its mask
            attention_mask = _window_band(query, key, sliding_window)
        return _delegate(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                         kwargs)

    enable_gqa = query.shape[1] != key.shape[1]
    # (Gemma 2 passes softcap=None on models without one; gpt-oss's sinks are a parameter.)
    variants = dict(softcap=float(kwargs.get("softcap") or 0.0), sinks=kwargs.get("s_aux"))
    plain = sliding_window is None and not variants["softcap"] and variants["sinks"] is None
    docs = _packed_documents_of(attention_mask)
    if docs is not None and docs.takes(query, key) and plain:
        return _documents_attention(query, key, value, docs.cu_seq, docs.cu_seq, docs.max_len,
                                    docs.max_len, scaling, enable_gqa), None
    # The offsets given outright (DataCollatorWithFlattening(return_flash_attn_kwargs=True)), no
    # mask: the documents, as transformers' flash implementations take them.
    cu_q, cu_k, max_q, max_k = (kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k",
                                                         "max_length_q", "max_length_k"))
    if attention_mask is None and causal and plain and all(x is not None for x in (cu_q, cu_k, max_q, max_k)):
        return _documents_attention(query, key, value, cu_q.to(torch.int32), cu_k.to(torch.int32),
                                    int(max_q), int(max_k), scaling, enable_gqa), None
    if band:
        out = flashcore.attention(query, key, value, is_causal=True,
                                  causal_alignment="bottom_right",
                                  window_size=(sliding_window - 1, 0), scale=scaling,
                                  enable_gqa=enable_gqa, **variants)
        return out.transpose(1, 2).contiguous(), None

    # Same order as transformers (shape first) so torch.compile with dynamic shapes sees a bool.
    is_causal = q_length > 1 and attention_mask is None and causal
    if torch.jit.is_tracing() and isinstance(is_causal, torch.Tensor):
        is_causal = is_causal.item()

    # Prefill into an empty static cache: keys past the queries are masked by the top-left causal
    # mask anyway; drop them instead of streaming them through the kernel (as sdpa does).
    if is_causal and attention_mask is None and q_length > 1 and kv_length > q_length:
        key = key[:, :, :q_length, :]
        value = value[:, :, :q_length, :]

    if variants["softcap"] or variants["sinks"] is not None:
        attn_output = flashcore.attention(query, key, value, attention_mask, is_causal,
                                          scale=scaling, enable_gqa=enable_gqa, **variants)
    else:
        attn_output = flashcore._entry.sdpa(query, key, value, attention_mask, 0.0, is_causal,
                                            scaling, enable_gqa)
    return attn_output.transpose(1, 2).contiguous(), None


@torch.compiler.disable  # (as transformers' paged functions: the cache update writes in place)
def flashcore_paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cache=None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | dict | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | dict | None = None,
    block_table: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``"paged|flashcore"``: continuous batching (``generate_batch``, the continuous-batching
    manager). transformers packs the batch's new tokens of every request into one row of queries
    and hands over the paged cache; as its flash implementations do, the new keys and values go
    into the cache and each request's keys are read back (``cache.update`` with the read and write
    indices), then ``flashcore.varlen_attn`` attends each request's queries to its keys, causal
    aligned bottom-right (a request's last query sees its last key), with the layer's sliding
    window; on CUDA, steps FlashCore would run as a loop over the requests (decode steps, chunked
    prefill) go to PyTorch's varlen_attn instead (:func:`_paged_goes_to_torch`). Returns (total
    queries, Hq, D)."""
    if cache is None:
        raise ValueError("`paged|flashcore` was called without a paged attention cache: it expects the packed "
                         "inputs continuous batching prepares (use \"flashcore\" for a standard forward)")
    if block_table is not None:  # (the decode fast path is the flash implementations' only)
        raise NotImplementedError("`paged|flashcore` does not take a block table (continuous batching's decode "
                                  "fast path): set ContinuousBatchingConfig(max_blocks_per_request=0)")
    if kwargs.get("s_aux") is not None or kwargs.get("softcap"):
        raise NotImplementedError("`paged|flashcore` does not take attention sinks or a logit softcap")
    # (Mistral-style models pass the window as an argument; others set it on the layer.)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    window_size = (window - 1, 0) if window else (-1, 0)
    if isinstance(cu_seq_lens_k, dict):  # per layer type where the model mixes them
        layer_type = "sliding_attention" if window else "full_attention"
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[layer_type], max_seqlen_k[layer_type]
    key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                              read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    q = query.transpose(1, 2).squeeze(0)  # (1, Hq, T, D) -> (T, Hq, D)
    cu_q, cu_k = cu_seq_lens_q.to(torch.int32), cu_seq_lens_k.to(torch.int32)
    max_q, max_k = int(max_seqlen_q), int(max_seqlen_k)
    scale = scaling if scaling is not None else getattr(module, "scaling", None)
    gqa = q.shape[1] != key.shape[1]
    if _paged_goes_to_torch(q, key, value, cu_q, cu_k, max_q, max_k, scale, window_size):
        return _varlen._torch_varlen(q, key, value, cu_q, cu_k, max_q, max_k, scale, window_size, gqa), None
    return flashcore.varlen_attn(q, key, value, cu_q, cu_k, max_q, max_k, window_size=window_size,
                                 scale=scale, enable_gqa=gqa), None


def _paged_goes_to_torch(q, key, value, cu_q, cu_k, max_q, max_k, scale, window_size) -> bool:
    """Whether a continuous-batching step runs in PyTorch's varlen_attn: where FlashCore would
    loop over the requests (one SDPA call each: decode steps and chunked prefill, whose causal
    diagonal is not the packed kernel's) and PyTorch's function, one launch, takes the call (on
    CUDA). A forced FLASHCORE_FAMILY keeps FlashCore's kernels. Where the batching config asks
    for CUDA graphs, a captured step's offsets cannot be read, so a causal step goes to PyTorch's
    function whatever its lengths (varlen._forward_path)."""
    if not q.is_cuda or flashcore.FALLBACK_ONLY:
        return False
    from flashcore import _ops  # (needs the op library: not imported where there is none)
    if _ops._forced_family() or not _varlen._torch_takes(q, value, None, scale, window_size, None, None):
        return False
    kind, _, _ = _varlen._forward_path(q, key, value, cu_q, cu_k, max_q, max_k, scale, window_size, None, None)
    return kind in ("loop", "torch")


def _check_version() -> Version:
    version = Version(transformers.__version__)
    if version.major < 5:
        raise ImportError(
            f"flashcore.integrations.hf needs transformers {SUPPORTED_TRANSFORMERS} (the 5.x "
            f"attention and mask interfaces); found {transformers.__version__}")
    if not (_MIN <= Version(version.base_version) < _MAX):
        warnings.warn(
            f"flashcore.integrations.hf supports transformers {SUPPORTED_TRANSFORMERS} (tested: "
            f"{', '.join(TESTED_TRANSFORMERS)}); found {transformers.__version__}, registering "
            "anyway", stacklevel=3)
    return version


def _wrap_once(module, attr: str, make) -> None:
    """module.attr becomes make(original), marked so that a second registration leaves it be;
    nothing where this transformers has no such attribute."""
    original = getattr(module, attr, None)
    if original is None or getattr(original, "__flashcore_shim__", False):
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper.__flashcore_shim__ = True
    setattr(module, attr, wrapper)


def _install_cb_graphs_default() -> None:
    """Continuous batching with ``"paged|flashcore"`` (or ``"flashcore"``) and no CUDA-graph
    choice of the user's (``use_cuda_graph`` and the padding intervals unset) runs without CUDA
    graphs. transformers' default gives graphs to names holding "flash"; inside a captured step
    FlashCore's causal attention is PyTorch's varlen_attn (no offset can be read there) and every
    ``generate_batch`` pays the captures: 0.41x ``"paged|sdpa"``'s tokens/s against 4.3x without
    graphs (H200, bench/bench_hf_cb.py; docs/experiments/varlen.md). An explicit
    ``use_cuda_graph`` is left as given."""
    try:
        from transformers.generation.continuous_batching import continuous_api
    except ImportError:  # pragma: no cover - a transformers without continuous batching
        return

    def make(original):
        def resolve_continuous_batching_config(config, cb_config, *args, **kwargs):
            name = getattr(config, "_attn_implementation", None)
            unset = (getattr(cb_config, "use_cuda_graph", False) is None
                     and not getattr(cb_config, "q_padding_interval_size", 0)
                     and not getattr(cb_config, "kv_padding_interval_size", 0))
            if isinstance(name, str) and name.split("|")[-1] == NAME and unset:
                cb_config = copy.copy(cb_config)
                cb_config.use_cuda_graph = False
            return original(config, cb_config, *args, **kwargs)
        return resolve_continuous_batching_config

    _wrap_once(continuous_api, "resolve_continuous_batching_config", make)


def _install_flash_name_shim() -> None:
    """Stop transformers from trying to load "flashcore" as a FlashAttention build (its
    implementation names are matched with ``"flash" in name``; see the module docstring)."""
    try:
        import transformers.modeling_flash_attention_utils as fa_utils
        import transformers.modeling_utils as modeling_utils
        from transformers.utils.generic import split_attention_implementation
    except ImportError:  # pragma: no cover - layout of another transformers version
        return

    def make_lazy_imports(original):
        def _lazy_imports(implementation, *args, **kwargs):
            if split_attention_implementation(implementation)[1] == NAME:
                # flash_fn, varlen_fn, with_kvcache_fn, pad_fn, unpad_fn: FlashCore uses none.
                return None, None, None, fa_utils._pad_input, fa_utils._unpad_input
            return original(implementation, *args, **kwargs)
        return _lazy_imports

    _wrap_once(fa_utils, "_lazy_imports", make_lazy_imports)

    # Models that list their own FlashAttention builds (gpt-oss: _compatible_flash_implementations)
    # swap any other "flash" name for the first of those when the model picks its implementation
    # (PreTrainedModel._check_and_adjust_attn_implementation): there "flashcore" is not one.
    def make_is_flash(is_fa):
        def is_flash_attention_requested(config=None, requested_attention_implementation=None, **kwargs):
            name = config._attn_implementation if config is not None else requested_attention_implementation
            if isinstance(name, str) and split_attention_implementation(name)[1] == NAME:
                return False
            return is_fa(config=config, requested_attention_implementation=requested_attention_implementation,
                         **kwargs)
        return is_flash_attention_requested

    _wrap_once(modeling_utils, "is_flash_attention_requested", make_is_flash)


def register() -> None:
    """Register ``"flashcore"`` with transformers' AttentionInterface and AttentionMaskInterface.
    Idempotent; called when this module is imported."""
    _check_version()
    _install_flash_name_shim()
    _install_cb_graphs_default()
    AttentionInterface.register(NAME, flashcore_attention_forward)
    AttentionInterface.register(PAGED_NAME, flashcore_paged_attention_forward)
    AttentionMaskInterface.register(NAME, flashcore_mask)


register()
