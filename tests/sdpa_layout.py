"""The output layout flashcore.sdpa promises (python/flashcore/_layout.py), written out
independently here so that a test of it can fail: a 4-D output (B, H, S, D) lies in storage
ordered as the query's (its batch, head and sequence dims by stride, largest first, ties in the
order B, H, S; head_dim innermost), with exactly torch.empty's strides in that order; other ranks
are contiguous. PyTorch's cuDNN backend allocates its output the same way."""
import torch


def sdpa_layout_strides(shape, query: torch.Tensor):
    """torch.empty's strides for `shape` in the query's storage order, seen as (B, H, S, D)."""
    keyed = [(-query.stride(i), i) for i in range(3)]  # ties: the lower dim first
    order = [i for _, i in sorted(keyed)] + [3]
    storage = torch.empty([shape[i] for i in order], device="meta")
    return storage.permute([order.index(i) for i in range(4)]).stride()


def has_sdpa_layout(t: torch.Tensor, query: torch.Tensor) -> bool:
    if t.dim() != 4:
        return t.is_contiguous()
    return t.stride() == sdpa_layout_strides(t.shape, query)
