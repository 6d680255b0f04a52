"""The band of keys each query row sees under causal masking, a sliding window and the causal
alignment (flashcore.attention's ``is_causal``, ``window_size``, ``causal_alignment``).

Row i sees keys ``i + lo .. i + hi``, clipped to ``0 .. Sk - 1``. This is the C layer's
``fc_band_bounds`` (c_src/flashcore.c), the definition the kernels run, restated for the Python
paths that build the band as a mask (the fallback forward and the Python backward);
tests/test_attention.py checks the two agree. Unbounded sides come out as lo = -(Sq - 1) and
hi = Sk - 1, so every way of asking for the same band gives the same numbers.
"""
from typing import NamedTuple

import torch

ALL, TOP_LEFT_CAUSAL, OTHER = 0, 1, 2  # fc_band_bounds's return values (FC_BAND_*)


class Band(NamedTuple):
    kind: int  # ALL (every key), TOP_LEFT_CAUSAL (PyTorch's is_causal) or OTHER
    lo: int
    hi: int


def band_bounds(seqlen_q: int, seqlen_k: int, is_causal: bool, window_left: int = -1,
                window_right: int = -1, bottom_right: bool = False) -> Band:
    """The band for Sq queries and Sk keys (both >= 1). The diagonal key of row i is i, or
    i + Sk - Sq with bottom_right; the window keeps keys diagonal - window_left .. diagonal +
    window_right (-1: unbounded); causal keeps nothing past the diagonal."""
    diag = seqlen_k - seqlen_q if bottom_right else 0
    all_lo, all_hi = -(seqlen_q - 1), seqlen_k - 1
    lo, hi = all_lo, all_hi
    if 0 <= window_left < diag - all_lo:
        lo = diag - window_left
    if 0 <= window_right < all_hi - diag:
        hi = diag + window_right
    if is_causal and diag < hi:
        hi = diag
    if lo == all_lo and hi == all_hi:
        return Band(ALL, lo, hi)
    return Band(TOP_LEFT_CAUSAL if lo == all_lo and hi == 0 else OTHER, lo, hi)


def band_mask(rows: range, seqlen_k: int, band: Band, device) -> torch.Tensor:
    """Bool (len(rows), Sk): True where query row r (of `rows`) sees key j under `band`."""
    r = torch.arange(rows.start, rows.stop, device=device).unsqueeze(-1)
    offset = torch.arange(seqlen_k, device=device) - r  # key - row
    return (offset >= band.lo) & (offset <= band.hi)
