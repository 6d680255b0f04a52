"""FlashCore as a HuggingFace transformers attention implementation: ``"flashcore"``.

Usage::

    import flashcore.integrations.hf  # registers "flashcore" (imports transformers)
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flashcore")
    model.set_attn_implementation("flashcore")  # or switch an existing model

Importing this module calls :func:`register`, which registers

- :func:`flashcore_attention_forward` with ``transformers.AttentionInterface`` and
- transformers' own ``sdpa_mask`` with ``transformers.AttentionMaskInterface``,

both under the name ``"flashcore"``. The attention function behaves like transformers'
``integrations/sdpa_attention.py::sdpa_attention_forward`` (the ``"sdpa"`` implementation) with
``torch.nn.functional.scaled_dot_product_attention`` replaced by ``torch.ops.flashcore.sdpa``:

- q is (B, Hq, Sq, D), k/v are (B, Hkv, Sk, D) (transposed views are used in place); the
  output is returned as (B, Sq, Hq, D), contiguous, with ``None`` for the attention weights;
- grouped-query attention goes through ``enable_gqa=True`` (K/V are never repeated);
- with no mask (prefill without padding: the mask builder returns ``None``) the call uses
  ``is_causal=True`` when Sq > 1 and the module is causal, like sdpa, so no mask is ever
  materialized; decode steps (Sq == 1) attend to the whole cache; with padding (or a sliding
  window that cuts, or under torch.compile) the mask builder materializes a bool mask
  (B, 1, Sq, Sk), True meaning attend, which is passed as ``attn_mask``;
- what the FlashCore kernels do not implement is handed to transformers' own
  ``sdpa_attention_forward`` unchanged: ``output_attentions=True``, ``softcap``, ``s_aux``
  (attention sinks), ``position_bias``, ``dropout > 0`` (training), and a ``sliding_window``
  that is not already expressed by the mask (no mask and more keys than the window).
  Where the op itself cannot run a kernel (CPU, fp32, other head dims, masks today), it falls
  back to PyTorch's SDPA with the same arguments.

Supported transformers versions: 5.x from 5.17 on (``SUPPORTED_TRANSFORMERS``), tested with
5.17.0 (GPU machine) and 5.18.0 (CI). Older 5.x and newer versions register with a warning;
4.x is refused (its attention/mask interfaces differ).

A quirk handled here: transformers 5.17/5.18 treat every attention implementation whose name
contains ``"flash"`` as a FlashAttention build and try to load it (``lazy_import_flash_attention``
-> ``_lazy_imports``), which fails for ``"flashcore"``. :func:`register` wraps
``transformers.modeling_flash_attention_utils._lazy_imports`` so that for ``"flashcore"`` it
loads nothing (FlashCore needs none of the flash-attn functions); every other name goes to
transformers' function untouched. Other consequences of the substring check: with a static
cache and an explicit ``CompileConfig(fullgraph=True)``, ``generate()`` downgrades to
``fullgraph=False`` (with a warning); models that list ``_compatible_flash_implementations``
(gpt_oss, granite_swa, ...) replace ``"flashcore"`` by their flash implementation;
``"paged|flashcore"`` (continuous batching) is not supported.
"""
import functools
import warnings

import torch
import transformers
from packaging.version import Version
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["NAME", "SUPPORTED_TRANSFORMERS", "TESTED_TRANSFORMERS", "register",
           "flashcore_attention_forward", "flashcore_mask"]

NAME = "flashcore"
SUPPORTED_TRANSFORMERS = ">=5.17,<6"
TESTED_TRANSFORMERS = ("5.17.0", "5.18.0")
_MIN, _MAX = Version("5.17"), Version("6")

# The mask builder: transformers' own sdpa one (bool mask, True = attend, or None where
# is_causal can do the work), so masks are exactly what the "sdpa" implementation sees.
flashcore_mask = sdpa_mask


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
    """transformers attention function: ``sdpa_attention_forward`` on ``torch.ops.flashcore.sdpa``
    (see the module docstring for the exact behaviour and what is delegated)."""
    sliding_window = kwargs.get("sliding_window")
    if (
        kwargs.get("output_attentions", False)
        or kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
        or kwargs.get("position_bias") is not None
        or dropout > 0.0
        # a window the mask does not already carry (with a mask, the window is in it)
        or (sliding_window is not None and attention_mask is None
            and key.shape[2] > sliding_window)
    ):
        return _delegate(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                         kwargs)

    q_length = query.shape[2]
    kv_length = key.shape[2]
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # Same order as transformers (shape first) so torch.compile with dynamic shapes sees a bool.
    is_causal = q_length > 1 and attention_mask is None and is_causal
    if torch.jit.is_tracing() and isinstance(is_causal, torch.Tensor):
        is_causal = is_causal.item()

    # Prefill into an empty static cache: keys past the queries are masked by the top-left causal
    # mask anyway; drop them instead of streaming them through the kernel (as sdpa does).
    if is_causal and attention_mask is None and q_length > 1 and kv_length > q_length:
        key = key[:, :, :q_length, :]
        value = value[:, :, :q_length, :]

    attn_output = torch.ops.flashcore.sdpa(
        query, key, value, attention_mask, 0.0, is_causal,
        scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return attn_output.transpose(1, 2).contiguous(), None


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


def _install_flash_name_shim() -> None:
    """Stop transformers from trying to load "flashcore" as a FlashAttention build (its
    implementation names are matched with ``"flash" in name``; see the module docstring)."""
    try:
        import transformers.modeling_flash_attention_utils as fa_utils
        from transformers.utils.generic import split_attention_implementation
    except ImportError:  # pragma: no cover - layout of another transformers version
        return
    original = getattr(fa_utils, "_lazy_imports", None)
    if original is None or getattr(original, "__flashcore_shim__", False):
        return

    @functools.wraps(original)
    def _lazy_imports(implementation, *args, **kwargs):
        if split_attention_implementation(implementation)[1] == NAME:
            # flash_fn, varlen_fn, with_kvcache_fn, pad_fn, unpad_fn: FlashCore uses none.
            return None, None, None, fa_utils._pad_input, fa_utils._unpad_input
        return original(implementation, *args, **kwargs)

    _lazy_imports.__flashcore_shim__ = True
    fa_utils._lazy_imports = _lazy_imports


def register() -> None:
    """Register ``"flashcore"`` with transformers' AttentionInterface and AttentionMaskInterface.
    Idempotent; called when this module is imported."""
    _check_version()
    _install_flash_name_shim()
    AttentionInterface.register(NAME, flashcore_attention_forward)
    AttentionMaskInterface.register(NAME, flashcore_mask)


register()
