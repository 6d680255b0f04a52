"""FlashCore as the attention inside PyTorch's context parallelism.

PyTorch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``) wraps
``torch.nn.functional.scaled_dot_product_attention`` while its context is open: q, k and v become
DTensors sharded along the sequence, and DTensor hands the aten SDPA ops it meets to a ring
attention (forward: each rank's queries against every rank's keys and values in turn, the partial
results merged through their log-sum-exp; backward: the same ring, dK and dV travelling back).
It does so through a table of DTensor custom-op handlers that its context installs and removes
(``_context_parallel/_attention.py``: ``custom_ops``).

``enable()`` adds FlashCore's ops to that table:

* ``flashcore::sdpa_fwd`` (training calls): PyTorch's ring forward, each step FlashCore's forward,
  which returns the LSE the ring merges with;
* ``flashcore::sdpa`` (calls without gradients): the same, output only;
* ``flashcore::sdpa_bwd``: PyTorch's ring backward, each step FlashCore's backward with the
  merged output and LSE.

So with ``flashcore.patch()`` applied before the context opens, the patched SDPA (FlashCore's)
is the one context parallelism wraps, and its calls reach FlashCore's kernels per ring step.
The ring, its process group, the rotation (all-gather or all-to-all) and the load balancing of
causal calls are PyTorch's, unchanged.

Taken: q, k, v sharded along dim 2 on a one-dimensional mesh, no attn_mask, no dropout, no
gradient of the LSE; causal only with equal query and key lengths (the ring's own rule). Any
other call raises a clear error rather than computing something else. These are private
PyTorch APIs: ``available()`` says whether this torch has them.
"""
from __future__ import annotations

import sys

import torch

__all__ = ["available", "enable", "disable", "enabled", "active", "takes", "calls"]

# How many times each handler ran in this process (tests read it to see the ring went through
# FlashCore's ops, not PyTorch's).
calls = {"sdpa_fwd": 0, "sdpa": 0, "sdpa_bwd": 0}

_SEQ_DIM = 2


def _cp_module():
    """PyTorch's context-parallel attention module, or None where this torch has none."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError:
        try:  # older layout (torch < 2.8)
            from torch.distributed.tensor.experimental import _attention
        except ImportError:
            return None
    needed = ("custom_ops", "_templated_ring_attention", "_templated_ring_attention_backward")
    return _attention if all(hasattr(_attention, n) for n in needed) else None


def available() -> bool:
    """Whether this torch has the context-parallel internals FlashCore hooks into."""
    return torch.distributed.is_available() and _cp_module() is not None


@torch.compiler.assume_constant_result
def active() -> bool:
    """Whether a ``context_parallel`` context (in its default, monkey-patching mode) has wrapped
    ``torch.nn.functional.scaled_dot_product_attention`` right now. Code that computes attention
    without calling that function (the HuggingFace integration's ``"flashcore"``) must then go
    through it, or each rank would attend to its own shard only. Reads only modules already
    imported (nothing imported, no context). Under torch.compile it runs once while tracing and
    the graph keeps its answer (dynamo need not trace the module lookup)."""
    for name in ("torch.distributed.tensor.experimental._context_parallel._attention",
                 "torch.distributed.tensor.experimental._attention"):
        replaced = getattr(sys.modules.get(name), "_replaced_functions", None)
        if replaced:
            return torch.nn.functional.scaled_dot_product_attention in replaced
    return False


def _ops():
    """FlashCore's ops with ring handlers: sdpa_fwd, sdpa (and its twin for calls that record no
    gradient, _sdpa_inference: flashcore/_entry.py), sdpa_bwd."""
    return (torch.ops.flashcore.sdpa_fwd.default, torch.ops.flashcore.sdpa.default,
            torch.ops.flashcore._sdpa_inference.default, torch.ops.flashcore.sdpa_bwd.default)


def enabled() -> bool:
    cp = _cp_module()
    return cp is not None and all(op in cp.custom_ops for op in _ops())


def enable() -> None:
    """Register FlashCore's ops with context parallelism (active while its context is open)."""
    cp = _cp_module()
    if cp is None or not torch.distributed.is_available():
        raise RuntimeError("flashcore.integrations.context_parallel: this torch has no context "
                           "parallelism internals to hook into (torch.distributed.tensor."
                           "experimental._context_parallel)")
    fwd, sdpa, inference, bwd = _ops()
    cp.custom_ops[fwd] = _sdpa_fwd_handler
    cp.custom_ops[sdpa] = _sdpa_handler
    cp.custom_ops[inference] = _sdpa_handler
    cp.custom_ops[bwd] = _sdpa_bwd_handler


def disable() -> None:
    cp = _cp_module()
    if cp is not None:
        for op in _ops():
            cp.custom_ops.pop(op, None)


def takes(query, key, value) -> bool:
    """Whether q, k, v are DTensors these handlers take (sharded along dim 2 on one 1-D mesh)."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:
        return False
    tensors = (query, key, value)
    if not all(isinstance(t, DTensor) for t in tensors):
        return False
    mesh = query.device_mesh
    return mesh.ndim == 1 and all(t.device_mesh == mesh and tuple(t.placements) == (Shard(_SEQ_DIM),)
                                  for t in tensors)


# ---- the handlers ------------------------------------------------------------------------------

def _local_qkv(name, query, key, value):
    """The local shards and the mesh of DTensors sharded along the sequence, or a clear error."""
    if not takes(query, key, value):
        raise RuntimeError(f"flashcore {name} under context parallelism: query, key and value "
                           f"must be DTensors sharded along dim {_SEQ_DIM} on one 1-D mesh")
    return query.device_mesh, tuple(t.to_local() for t in (query, key, value))


def _wrap(mesh, *tensors):
    from torch.distributed.tensor import DTensor, Shard
    return tuple(DTensor.from_local(t, mesh, (Shard(_SEQ_DIM),), run_check=False) for t in tensors)


def _forward_args(args, kwargs):
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    defaults = (None, None, None, None, 0.0, False)
    got = dict(zip(names, defaults))
    got.update(zip(names, args))
    got.update(kwargs)
    if got["attn_mask"] is not None:
        raise NotImplementedError("flashcore under context parallelism: attn_mask is not "
                                  "supported (PyTorch's ring attention takes none either)")
    if got["dropout_p"]:
        raise NotImplementedError("flashcore under context parallelism: dropout_p must be 0")
    return got


def _ring_forward(got):
    cp = _cp_module()
    mesh, (q, k, v) = _local_qkv("sdpa", got["query"], got["key"], got["value"])
    scale, gqa = got.get("scale"), bool(got.get("enable_gqa", False))

    def step(q, k, v, is_causal, **_):
        return torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, bool(is_causal), scale=scale,
                                            enable_gqa=gqa)

    out, lse = cp._templated_ring_attention(mesh.get_group(), _SEQ_DIM, step, q, k, v,
                                            is_causal=bool(got["is_causal"]))[:2]
    return mesh, out.contiguous(), lse.contiguous()


def _sdpa_fwd_handler(op_call, args, kwargs):
    calls["sdpa_fwd"] += 1
    mesh, out, lse = _ring_forward(_forward_args(args, kwargs))
    return _wrap(mesh, out, lse)


def _sdpa_handler(op_call, args, kwargs):
    calls["sdpa"] += 1
    mesh, out, _ = _ring_forward(_forward_args(args, kwargs))
    return _wrap(mesh, out)[0]


def _sdpa_bwd_handler(op_call, args, kwargs):
    calls["sdpa_bwd"] += 1
    cp = _cp_module()
    names = ("grad_out", "query", "key", "value", "out", "lse", "grad_lse", "attn_mask",
             "is_causal", "scale", "enable_gqa", "grad_mask")
    got = dict(zip(names, args))
    got.update(kwargs)
    if got["grad_lse"] is not None:
        raise NotImplementedError("flashcore under context parallelism: a gradient of the LSE "
                                  "is not supported")
    if got["attn_mask"] is not None:
        raise NotImplementedError("flashcore under context parallelism: attn_mask is not "
                                  "supported")
    mesh, (q, k, v) = _local_qkv("sdpa backward", got["query"], got["key"], got["value"])
    grad_out, out, lse = (t.to_local() for t in (got["grad_out"], got["out"], got["lse"]))
    scale, gqa = got["scale"], bool(got["enable_gqa"])

    def step(*, query, key, value, out, logsumexp, is_causal, grad_out, **_):
        dq, dk, dv, _ = torch.ops.flashcore.sdpa_bwd(
            grad_out, query, key, value, out, logsumexp, None, None, bool(is_causal), scale, gqa,
            False)
        return dq, dk, dv

    dq, dk, dv = cp._templated_ring_attention_backward(
        mesh.get_group(), _SEQ_DIM, step, grad_out=grad_out, grad_out_name="grad_out", query=q,
        key=k, value=v, out=out, logsumexp=lse, is_causal=bool(got["is_causal"]))[:3]
    dq, dk, dv = _wrap(mesh, dq, dk, dv)
    return dq, dk, dv, torch.empty(0, dtype=q.dtype, device=q.device)
