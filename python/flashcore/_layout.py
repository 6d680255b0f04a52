"""The layout of flashcore.sdpa's output, defined once for the Python side (the C++ op's is
new_output / in_output_layout in torch_op/flashcore_op.cpp).

A 4-D output (B, H, S, D) lies in storage ordered (B, S, H, D), as aten's fused CUDA backends
return it: a caller's usual next step, ``out.transpose(1, 2).reshape(B, S, H * D)``, is then a
view instead of a copy, and a call sent to aten keeps aten's output without copying it. Other
ranks are contiguous, and so is sdpa_fwd's LSE (B, H, S). The fakes promise exactly these
strides, so every path must give them; the stride helpers below are the one place the Python side
spells them out.
"""
import torch


def output_strides(shape):
    """The strides of a 4-D output of this shape (torch.empty's, which count an empty dim as 1).
    Sizes may be symbolic (torch.compile): sym_max guards on nothing, where int() would
    specialise the graph to one length."""
    b, h, s, d = shape
    if type(b) is int and type(h) is int and type(s) is int and type(d) is int:  # eager: no SymInt
        h, s, d = max(h, 1), max(s, 1), max(d, 1)
    else:
        b, h, s, d = (torch.sym_max(n, 1) for n in shape)
    return (s * h * d, d, h * d, 1)


def contiguous_strides(sizes):
    """Row-major strides of `sizes` as torch.empty gives them (an empty dim counts as 1): the
    LSE's layout, and every output of a rank other than 4. Plain ints: the stand-ins that read it
    (_ops._explain_bwd_ahead) are real tensors of size hints, never symbolic."""
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def new_output(like: torch.Tensor, shape) -> torch.Tensor:
    """An uninitialised output of `shape` in this layout, with `like`'s dtype and device."""
    if len(shape) != 4:
        return like.new_empty(shape)
    b, h, s, d = shape
    return like.new_empty((b, s, h, d)).transpose(1, 2)


def in_output_layout(out: torch.Tensor) -> torch.Tensor:
    """aten's SDPA output in this layout: as it is where its strides already are these, else
    copied (differentiably)."""
    if out.dim() != 4:
        return out.contiguous()
    if tuple(out.stride()) == output_strides(out.shape):
        return out
    return out.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
