"""The output layout flashcore.sdpa promises (python/flashcore/_layout.py), written out
independently here so that a test of it can fail: a 4-D output (B, H, S, D) lies in storage
ordered (B, S, H, D), with exactly torch.empty's strides; other ranks are contiguous."""
import torch


def has_sdpa_layout(t: torch.Tensor) -> bool:
    if t.dim() != 4:
        return t.is_contiguous()
    b, h, s, d = t.shape
    return t.stride() == torch.empty(b, s, h, d, device="meta").transpose(1, 2).stride()
