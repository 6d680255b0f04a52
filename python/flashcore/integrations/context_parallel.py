"""FlashCore as the attention inside PyTorch's context parallelism.

PyTorch's context parallelism (``torch.distributed.tensor.experimental.context_parallel``) wraps
``torch.nn.functional.scaled_dot_product_attention`` while its context is open: q, k and v become
DTensors sharded along the sequence, and DTensor hands the aten SDPA ops it meets to a ring
attention (forward: each rank's queries against every rank's keys and values in turn, the partial
results merged through their log-sum-exp; backward: the same ring, dK and dV travelling back).
It does so through a table of DTensor custom-op handlers that its context installs and removes
(``_context_parallel/_attention.py``: ``custom_ops``).

``enable()`` adds FlashCore's ops to that table:

* ``flashcore::sdpa_fwd`` (training calls): the rank's output and LSE, by FlashCore's forward;
* ``flashcore::sdpa`` (calls without gradients): the same, output only;
* ``flashcore::sdpa_bwd``: the rank's dq, dk, dv, by FlashCore's backward with the output and
  LSE of the whole sequence's keys.

So with ``flashcore.patch()`` applied before the context opens, the patched SDPA (FlashCore's)
is the one context parallelism wraps, and its calls reach FlashCore's kernels. The sharding, the
load balancing of causal calls (head-tail), the process group and DTensor are PyTorch's.

How a rank computes its shard's attention, ``enable(local=...)``:

* ``"gather"`` (the default): the ranks all-gather K and V once (the communication of PyTorch's
  default all-gather rotation), each rank lays them out in sequence order and runs FlashCore's
  forward once per contiguous run of its queries (two under head-tail balancing) against the keys
  up to the run's end, causal aligned bottom-right: no partial results to merge. The backward
  runs FlashCore's backward on the same calls, sums the runs' dK and dV in float32 and
  reduce-scatters them to the ranks that hold those keys.
* ``"ring"``: PyTorch's ring attention (``_templated_ring_attention`` and its backward), each of
  its steps one FlashCore call, the steps' outputs merged by PyTorch through their LSE in float32.

Measured on 2 H200s (docs/experiments/context-parallel.md), one Llama-8B-like layer: "gather"
ran the causal training pass 1.5-2% faster than "ring" at 64k and 128k tokens (the backward's
per-step float32 accumulations and dK / dV send-receives become one reduce-scatter), the
forward as fast at 64k and 1-2.5% faster at 128k.

Taken: q, k, v sharded along dim 2 on a one-dimensional mesh, no attn_mask, no dropout, no
gradient of the LSE; causal only with equal query and key lengths (the ring's own rule). Any
other call raises a clear error rather than computing something else. These are private
PyTorch APIs: ``available()`` says whether this torch has them.
"""
from __future__ import annotations

import sys

import torch

__all__ = ["available", "enable", "disable", "enabled", "active", "takes", "calls", "ways",
           "local_mode"]

# How many times each handler ran in this process (tests read it to see the ring went through
# FlashCore's ops, not PyTorch's).
calls = {"sdpa_fwd": 0, "sdpa": 0, "sdpa_bwd": 0}
# And which way each handler call computed its shard (enable(local=...)).
ways = {"gather": 0, "ring": 0}

_SEQ_DIM = 2
_LOCAL_MODES = ("gather", "ring")
_local = "gather"  # how a rank computes its shard (enable(local=...))


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


def local_mode() -> str:
    """How a rank computes its shard while enabled: "gather" or "ring" (module docstring)."""
    return _local


def enable(local: str = "gather") -> None:
    """Register FlashCore's ops with context parallelism (active while its context is open).
    ``local``: "gather" (K and V all-gathered, one FlashCore call per run of the rank's queries,
    no merges) or "ring" (PyTorch's ring attention, one FlashCore call per ring step)."""
    global _local
    if local not in _LOCAL_MODES:
        raise ValueError(f"flashcore.integrations.context_parallel.enable: local must be one of "
                         f"{', '.join(map(repr, _LOCAL_MODES))}, got {local!r}")
    cp = _cp_module()
    if cp is None or not torch.distributed.is_available():
        raise RuntimeError("flashcore.integrations.context_parallel: this torch has no context "
                           "parallelism internals to hook into (torch.distributed.tensor."
                           "experimental._context_parallel)")
    _local = local
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


def _sharded_forward(got):
    ways[_local] += 1
    if _local == "ring":
        return _ring_forward(got)
    mesh, (q, k, v) = _local_qkv("sdpa", got["query"], got["key"], got["value"])
    causal = _check_causal_lengths(bool(got["is_causal"]), q, k)
    out, lse = _gathered_forward(mesh.get_group(), q, k, v, causal, got.get("scale"),
                                 bool(got.get("enable_gqa", False)))
    return mesh, out, lse


def _sdpa_fwd_handler(op_call, args, kwargs):
    calls["sdpa_fwd"] += 1
    mesh, out, lse = _sharded_forward(_forward_args(args, kwargs))
    return _wrap(mesh, out, lse)


def _sdpa_handler(op_call, args, kwargs):
    calls["sdpa"] += 1
    mesh, out, _ = _sharded_forward(_forward_args(args, kwargs))
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
    ways[_local] += 1
    if _local == "gather":
        causal = _check_causal_lengths(bool(got["is_causal"]), q, k)
        dq, dk, dv = _gathered_backward(mesh.get_group(), grad_out, q, k, v, out, lse, causal,
                                        scale, gqa)
        dq, dk, dv = _wrap(mesh, dq, dk, dv)
        return dq, dk, dv, torch.empty(0, dtype=q.dtype, device=q.device)

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


# ---- the gathered way ("gather") ---------------------------------------------------------------

def _check_causal_lengths(causal, q, k):
    if causal and q.shape[_SEQ_DIM] != k.shape[_SEQ_DIM]:
        raise NotImplementedError("flashcore under context parallelism: is_causal requires equal "
                                  "query and key lengths (as PyTorch's ring attention)")
    return causal


def _collective(name):
    """torch.distributed's all-gather / reduce-scatter into one tensor, under this torch's name."""
    import torch.distributed as dist
    new, old = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
                "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}[name]
    return getattr(dist, new, None) or getattr(dist, old)


def _runs(rank, world, rows, causal):
    """Where a rank's `rows` local rows sit in the whole sequence: (local start, global start,
    length) per contiguous run. Causal calls under PyTorch's load balancing hold two chunks of
    the sequence cut in 2 x world, chunk `rank` and chunk 2 world - 1 - rank (head-tail, the
    layout PyTorch's sharding and its ring attention use); any other call one chunk, `rank`.
    Non-causal calls take their keys in any order, so any bijection serves them: the plain one,
    used both ways (gathering K and V, scattering dK and dV back)."""
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options
    if causal and _cp_options.enable_load_balance:
        half = rows // 2
        return ((0, rank * half, half), (half, (2 * world - 1 - rank) * half, half))
    return ((0, rank * rows, rows),)


def _layout(group, rows, causal):
    import torch.distributed as dist
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    every = [_runs(r, world, rows, causal) for r in range(world)]
    return world, rank, every


def _whole_kv(group, k, v, every):
    """K and V of the whole sequence, in sequence order: every rank's shards all-gathered (one
    collective for both), then laid out by the ranks' runs. (B, Hkv, S, D) each."""
    world = len(every)
    kv = torch.stack((k, v))  # (2, B, Hkv, rows, D)
    got = kv.new_empty((world * 2,) + tuple(kv.shape[1:]))  # (the ranks' tensors end to end)
    _collective("all_gather")(got, kv, group=group)
    got = got.view((world,) + tuple(kv.shape))
    pieces = sorted((start, r, local, n) for r, runs in enumerate(every) for local, start, n in runs)
    whole = torch.cat([got[r, ..., local:local + n, :] for _, r, local, n in pieces], dim=-2)
    return whole[0], whole[1]


def _calls(q, every, rank, causal, seq):
    """The FlashCore calls of this rank: (query rows [a, b), keys [0, end)) per run, or all rows
    against every key for non-causal calls."""
    if not causal:
        return (((0, q.shape[_SEQ_DIM]), seq),)
    return tuple(((local, local + n), start + n) for local, start, n in every[rank])


def _gathered_forward(group, q, k, v, causal, scale, gqa):
    """(out, lse) of this rank's queries against the whole sequence's keys, no merges."""
    # (The keys' layout: the queries' too for causal calls, whose lengths are equal; a non-causal
    # call's queries are one run whatever their length.)
    _, rank, every = _layout(group, k.shape[_SEQ_DIM], causal)
    key, value = _whole_kv(group, k, v, every)
    outs, lses = [], []
    for (a, b), end in _calls(q, every, rank, causal, key.shape[_SEQ_DIM]):
        # Causal aligned bottom-right: the run's last query sees keys up to its own position.
        out, lse = torch.ops.flashcore.attention_fwd(
            q[..., a:b, :], key[..., :end, :], value[..., :end, :], None, causal, scale, gqa,
            -1, -1, True, None, 0.0)
        outs.append(out)
        lses.append(lse)
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs, dim=_SEQ_DIM), torch.cat(lses, dim=-1)


def _key_blocks(rows, end, causal):
    """The backward calls of one run of `rows` queries against keys [0, end): (first key, end,
    causal). One call, causal aligned bottom-right; but in deterministic mode, where only the
    sm80-class backward is bitwise reproducible and it takes no bottom-right band, two: the keys
    before the run (no mask) and the run's own (causal, square). Given the forward's LSE the
    backward of disjoint key blocks adds up to the whole (as in PyTorch's ring backward)."""
    if not causal or not torch.are_deterministic_algorithms_enabled() or end == rows:
        return ((0, end, causal),)
    return ((0, end - rows, False), (end - rows, end, True))


def _add_to_shards(send, every, first, grads):
    """Add the gradient of keys [first, first + n) of the sequence (grads: (B, Hkv, n, D)) to
    `send` ((world, B, Hkv, rows, D), float32): each key's row where its rank holds it, so no
    whole-sequence copy of dK or dV is made."""
    last = first + grads.shape[-2]
    for r, runs in enumerate(every):
        for local, start, n in runs:
            a, b = max(first, start), min(last, start + n)
            if a < b:
                send[r, ..., local + a - start:local + b - start, :] += grads[..., a - first:b - first, :]


def _gathered_backward(group, grad_out, q, k, v, out, lse, causal, scale, gqa):
    """dq, dk, dv of this rank's shards: FlashCore's backward on the forward's calls, dK and dV
    summed over the calls and the ranks in float32 (a reduce-scatter to the keys' ranks)."""
    # (The keys' layout: the queries' too for causal calls, whose lengths are equal; a non-causal
    # call's queries are one run whatever their length.)
    world, rank, every = _layout(group, k.shape[_SEQ_DIM], causal)
    # Gathered again rather than kept from the forward: a layer's whole-sequence K / V would
    # otherwise stay alive on every rank until its backward (PyTorch's ring communicates again too).
    key, value = _whole_kv(group, k, v, every)
    seq = key.shape[_SEQ_DIM]
    # Each rank's rows of dK and dV, in its shard's order, rank after rank: the reduce-scatter's
    # input; the sum over the ranks lands on the rank that holds the keys.
    send = torch.zeros((world, 2) + tuple(k.shape), dtype=torch.float32, device=k.device)
    dqs = []
    for (a, b), end in _calls(q, every, rank, causal, seq):
        dq_run = None
        for first, last, masked in _key_blocks(b - a, end, causal):
            dq, dk, dv, _ = torch.ops.flashcore.sdpa_bwd(
                grad_out[..., a:b, :], q[..., a:b, :], key[..., first:last, :],
                value[..., first:last, :], out[..., a:b, :], lse[..., a:b], None, None, masked,
                scale, gqa, False, -1, -1, masked, 0.0)
            dq_run = dq if dq_run is None else (dq_run.float() + dq).to(dq.dtype)
            _add_to_shards(send[:, 0], every, first, dk)
            _add_to_shards(send[:, 1], every, first, dv)
        dqs.append(dq_run)
    send = send.view((world * 2,) + tuple(k.shape))
    mine = send.new_empty((2,) + tuple(k.shape))
    _collective("reduce_scatter")(mine, send, group=group)
    dq = dqs[0] if len(dqs) == 1 else torch.cat(dqs, dim=_SEQ_DIM)
    return dq, mine[0].to(k.dtype), mine[1].to(v.dtype)
