"""Drop-in integrations of FlashCore.

- :mod:`flashcore.integrations.patch`: ``patch()`` / ``unpatch()`` / ``patched()`` route
  ``torch.nn.functional.scaled_dot_product_attention`` to ``torch.ops.flashcore.sdpa``.
- :mod:`flashcore.integrations.hf`: registers ``"flashcore"`` with transformers'
  ``AttentionInterface`` and ``AttentionMaskInterface`` (imports transformers; import it only
  when you use transformers).
"""
from .patch import is_patched, patch, patched, unpatch

__all__ = ["patch", "unpatch", "patched", "is_patched"]
