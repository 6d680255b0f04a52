"""The layout of flashcore.sdpa's output and of its backward's gradients, defined once for the
Python side (the C++ op's is output_order / new_output / in_output_layout in torch_op/layout.h).

A 4-D output (B, H, S, D) lies in storage ordered as the query's: its batch, head and sequence
dims in the order of the query's strides (largest first; equal strides keep the order B, H, S),
head_dim innermost, densely packed. That is the layout PyTorch's cuDNN and flash backends
return (cuDNN's `alloc_with_matching_layout`), so a call sent to aten keeps aten's output
without copying it, and a caller gets what PyTorch's SDPA would give: HuggingFace's transposed
(B, S, H, D) views get (B, S, H, D) storage (`out.transpose(1, 2).reshape(B, S, H * D)` is a
view), contiguous queries a contiguous output. Other ranks are contiguous, and so is sdpa_fwd's
LSE (B, H, S). The backward's dq, dk and dv follow the same rule, each after its own input
(dq as the query, dk as the key, dv as the value), as PyTorch's cuDNN and flash backwards give
them: a transposed view's gradient then reaches its projection without a copy. The fakes
promise exactly these strides, so every path must give them; the helpers below are the one
place the Python side spells them out.
"""
import torch


def output_order(query):
    """The query's batch, head and sequence dims (0, 1, 2), outermost first: a stable sort by
    stride, largest first (a query of another rank beside 4-D key and value: that order).
    Strides may be symbolic (torch.compile): the comparisons then guard on the order, which the
    query's layout fixes."""
    if query.dim() != 4:
        return [0, 1, 2]
    strides = query.stride()
    return sorted(range(3), key=lambda i: strides[i], reverse=True)


def output_strides(shape, query):
    """The strides of a 4-D output of this shape for this query (torch.empty's, which count an
    empty dim as 1). Sizes may be symbolic: sym_max guards on nothing, where int() would
    specialise the graph to one length."""
    if all(type(n) is int for n in shape):  # eager: no SymInt
        sizes = [max(n, 1) for n in shape]
    else:
        sizes = [torch.sym_max(n, 1) for n in shape]
    strides = [0, 0, 0, 1]
    step = sizes[3]
    for dim in reversed(output_order(query)):
        strides[dim] = step
        step = step * sizes[dim]
    return tuple(strides)


def contiguous_strides(sizes):
    """Row-major strides of `sizes` as torch.empty gives them (an empty dim counts as 1): the
    LSE's layout, and every output of a rank other than 4. Plain ints: the stand-ins that read it
    (_ops._explain_bwd_ahead) are real tensors of size hints, never symbolic."""
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= max(n, 1)
    return strides[::-1]


def new_output(query: torch.Tensor, shape) -> torch.Tensor:
    """An uninitialised output of `shape` in this layout, with the query's dtype and device."""
    if len(shape) != 4:
        return query.new_empty(shape)
    order = output_order(query) + [3]
    storage = query.new_empty([shape[i] for i in order])
    return storage.permute([order.index(i) for i in range(4)])


def in_output_layout(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """aten's SDPA output in this layout: as it is where its strides already are these (cuDNN's
    and flash's outputs, but for some sizes of 1), else copied (differentiably: a clone in the
    permuted order, seen back through the inverse permutation)."""
    if out.dim() != 4:
        return out.contiguous()
    if tuple(out.stride()) == output_strides(out.shape, query):
        return out
    order = output_order(query) + [3]
    inverse = [order.index(i) for i in range(4)]
    return out.permute(order).clone(memory_format=torch.contiguous_format).permute(inverse)
