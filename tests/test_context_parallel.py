"""FlashCore under PyTorch's context parallelism (python/flashcore/integrations/context_parallel.py),
on CPU processes: two ranks over gloo, flashcore.patch() applied, then
torch.distributed.tensor.experimental.context_parallel around a call of
F.scaled_dot_product_attention. The sharded call's output and q/k/v gradients, gathered back
(context_parallel_unshard), equal the single-process call's (float64) within the float32 rounding
of the ring's merges, for causal
(PyTorch's load-balanced ring) and non-causal calls, GQA 4:2. On the CPU each ring step runs
FlashCore's CPU paths (sdpa_fwd through aten, the Python backward): this checks the registration
and the ring plumbing; with 2 GPUs and NCCL the same worker runs FlashCore's kernels (bf16, 32:8
heads, D=128, S=8k; it skips elsewhere).
"""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import flashcore
from flashcore.integrations import context_parallel as fc_cp

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()
         and fc_cp.available()) or bool(flashcore.FALLBACK_ONLY),
    reason="needs torch.distributed with gloo, PyTorch's context-parallel internals and "
           "FlashCore's ops library")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Where each case runs: (device, backend, dtype, (B, Hq, Hkv, S, D)). The CPU case checks the
# registration and the ring's plumbing (FlashCore's CPU paths per step: sdpa_fwd through aten,
# the Python backward); the GPU ones, Llama-8B-like heads at 8k and 64k, FlashCore's kernels.
CASES = {
    "cpu": ("cpu", "gloo", torch.float64, (1, 4, 2, 64, 16)),
    "cuda": ("cuda", "nccl", torch.bfloat16, (1, 32, 8, 8192, 128)),
    "cuda-64k": ("cuda", "nccl", torch.bfloat16, (1, 32, 8, 65536, 128)),
    "cpu-other-keys": ("cpu", "gloo", torch.float64, (1, 4, 2, 64, 16)),
}
# Cases whose keys are not as many as their queries (non-causal calls only): the key length.
KEY_LENGTHS = {"cpu-other-keys": 96}


def _worker(rank, world, port, case, causal, local, balance, deterministic, results):
    """One rank: the single-process call (FlashCore's op), then the same call sharded under
    context_parallel with flashcore.patched() and FlashCore's handlers in `local` mode (gather
    or ring); the sharded output, its gradients and the no-grad output gathered back. Reports
    per tensor max|sharded - single| and max|single|; in deterministic mode also whether a second
    sharded training call gives bitwise the same local output and gradients."""
    # The ring through FlashCore's ops, which is what this checks (on the CPU the training route
    # would send the calls to aten).
    os.environ["FLASHCORE_TRAINING"] = "flashcore"
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

    device, backend, dtype, (B, Hq, Hkv, S, D) = CASES[case]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    torch.use_deterministic_algorithms(deterministic)
    try:
        torch.manual_seed(0)
        q = torch.randn(B, Hq, S, D, dtype=dtype, device=device)
        Sk = KEY_LENGTHS.get(case, S)
        k, v = (torch.randn(B, Hkv, Sk, D, dtype=dtype, device=device) for _ in range(2))
        g = torch.randn(B, Hq, S, D, dtype=dtype, device=device)

        ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
        ref_out = flashcore.sdpa(*ref_in, is_causal=causal, enable_gqa=True)
        ref = [ref_out, *torch.autograd.grad(ref_out, ref_in, g)]

        mesh = init_device_mesh(device, (world,))
        fc_cp.enable(local=local)
        # PyTorch's rule: its load-balanced (head-tail) sharding is for causal calls only.
        _cp_options.enable_load_balance = causal and balance
        ways_before = dict(fc_cp.ways)
        cp_q, cp_k, cp_v, cp_g = (t.clone() for t in (q, k, v, g))
        with flashcore.patched():
            with context_parallel(mesh, buffers=[cp_q, cp_k, cp_v, cp_g],
                                  buffer_seq_dims=[2, 2, 2, 2]):
                inputs = [t.detach().requires_grad_() for t in (cp_q, cp_k, cp_v)]
                with torch.enable_grad():
                    out = F.scaled_dot_product_attention(*inputs, is_causal=causal, enable_gqa=True)
                    grads = torch.autograd.grad(out, inputs, cp_g)
                # Without gradients: the op itself (flashcore::sdpa), same output.
                inference = F.scaled_dot_product_attention(cp_q, cp_k, cp_v, is_causal=causal,
                                                           enable_gqa=True)
                ways = {w: n - ways_before[w] for w, n in fc_cp.ways.items() if n > ways_before[w]}
                calls = dict(fc_cp.calls)
                same = None
                if deterministic:
                    again = [t.detach().requires_grad_() for t in (cp_q, cp_k, cp_v)]
                    with torch.enable_grad():
                        out2 = F.scaled_dot_product_attention(*again, is_causal=causal, enable_gqa=True)
                        grads2 = torch.autograd.grad(out2, again, cp_g)
                    same = [torch.equal(a, b) for a, b in zip([out, *grads], [out2, *grads2])]
            full = context_parallel_unshard(mesh, [out.detach(), *grads, inference], [2] * 5)
        results[rank] = ([((a.double() - b.double()).abs().max().item(), b.double().abs().max().item())
                          for a, b in zip(full, [*ref, ref_out])], calls, ways, same)
    finally:
        fc_cp.disable()
        dist.destroy_process_group()


def _run(case, causal, local="gather", world=2, balance=True, deterministic=False):
    """Every rank; per rank the (error, scale) pairs of out, dq, dk, dv, no-grad out."""
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(world, _free_port(), case, causal, local, balance, deterministic,
                            results),
             nprocs=world, join=True)
    got = []
    for rank in range(world):
        errors, calls, ways, same = results[rank]
        # The ring went through FlashCore's ops (its DTensor handlers), forward and backward,
        # each the way asked for.
        assert calls == {"sdpa_fwd": 1, "sdpa": 1, "sdpa_bwd": 1}, calls
        assert ways == {local: 3}, ways
        if deterministic:  # bitwise the same out, dq, dk, dv from a second call
            assert same == [True] * 4, f"rank {rank}: out, dq, dk, dv equal run to run: {same}"
        got.append(errors)
    return got


@pytest.mark.parametrize("causal,balance", [(False, False), (True, True), (True, False)],
                         ids=["full", "causal", "causal-unbalanced"])
@pytest.mark.parametrize("local,world", [("gather", 2), ("gather", 4), ("ring", 2)],
                         ids=["gather-2", "gather-4", "ring-2"])
def test_sharded_equals_single_process(causal, balance, local, world):
    """On CPU processes in float64: "gather" (FlashCore's calls per run of a rank's queries,
    bottom-right causal against the gathered keys; four ranks: head-tail chunks 0-7) and "ring"
    (PyTorch's ring, merged in float32); causal calls with PyTorch's head-tail load balancing
    and without it (one chunk per rank)."""
    for rank, errors in enumerate(_run("cpu", causal, local, world, balance)):
        # The ring merges partial results in float32 (its convert_to_f32 option) whatever the
        # inputs' dtype, and "gather" sums dK / dV in float32: float32 rounding, where a wrong
        # block, run or merge is off by ~0.1.
        assert max(e for e, _ in errors) < 1e-5, (
            f"rank {rank}: (error, max) of out, dq, dk, dv, no-grad out: {errors}")


@pytest.mark.parametrize("local,world", [("gather", 2), ("gather", 4), ("ring", 2)],
                         ids=["gather-2", "gather-4", "ring-2"])
def test_keys_of_another_length(local, world):
    """A non-causal call with 96 keys for 64 queries: each rank's key shard is laid out (and its
    dK / dV scattered back) by the keys' own length."""
    for rank, errors in enumerate(_run("cpu-other-keys", False, local, world, balance=False)):
        assert max(e for e, _ in errors) < 1e-5, f"rank {rank}: {errors}"


def test_deterministic_mode_splits_each_causal_run():
    """In deterministic mode the gathered backward runs each causal run as the keys before it
    (no mask) and its own (causal, square): calls the bitwise-reproducible sm80-class backward
    takes (it has no bottom-right band). Same results on CPU processes."""
    from flashcore.integrations.context_parallel import _key_blocks
    assert _key_blocks(16, 48, True) == ((0, 48, True),)
    assert _key_blocks(16, 48, False) == ((0, 48, False),)
    torch.use_deterministic_algorithms(True)
    try:
        assert _key_blocks(16, 48, True) == ((0, 32, False), (32, 48, True))
        assert _key_blocks(16, 16, True) == ((0, 16, True),)  # (no keys before the run)
    finally:
        torch.use_deterministic_algorithms(False)
    for rank, errors in enumerate(_run("cpu", True, "gather", 2, True, deterministic=True)):
        assert max(e for e, _ in errors) < 1e-5, f"rank {rank}: {errors}"


def test_local_mode_is_checked():
    with pytest.raises(ValueError, match="local must be one of"):
        fc_cp.enable(local="ring-of-our-own")
    assert not fc_cp.enabled()


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                         and torch.distributed.is_nccl_available()),
                    reason="needs 2 CUDA devices and NCCL (a 2-GPU machine: nvidia-h200-x2, nvidia-h100-x2)")
@pytest.mark.parametrize("case", ["cuda", "cuda-64k"], ids=["8k", "64k"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("local", ["gather", "ring"])
def test_two_gpus_sharded_equals_one_gpu(causal, case, local):
    """Two GPUs (ring: 8k and 64k passed on 2x H200, 2026-11-28/29). bf16 results of two
    summation orders (one GPU, and the ring's float32 merges or the gathered calls' float32 dK /
    dV sums): within bf16 rounding of the larger values."""
    for rank, errors in enumerate(_run(case, causal, local)):
        assert max(e / max(1.0, m) for e, m in errors) < 2e-2, f"rank {rank}: {errors}"


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.device_count() >= 2
                         and torch.distributed.is_nccl_available()),
                    reason="needs 2 CUDA devices and NCCL (a 2-GPU machine: nvidia-h200-x2, nvidia-h100-x2)")
def test_two_gpus_deterministic_mode_is_bitwise_reproducible():
    """Two GPUs, 8k causal under torch.use_deterministic_algorithms (FlashCore's backward then
    takes its bitwise-reproducible kernel), "gather" way: two sharded training calls bitwise
    equal (_run checks), and equal to one GPU's within bf16 rounding."""
    for rank, errors in enumerate(_run("cuda", True, "gather", deterministic=True)):
        assert max(e / max(1.0, m) for e, m in errors) < 2e-2, f"rank {rank}: {errors}"


def test_enable_disable_are_symmetric():
    fc_cp.enable()
    assert fc_cp.enabled()
    fc_cp.disable()
    assert not fc_cp.enabled()


# ---- the HuggingFace integration's attention function under context parallelism --------------

def _hf_worker(rank, world, port, results):
    """transformers' "flashcore" attention function on sequence-sharded q, k, v inside
    context_parallel (flashcore.patched(), FlashCore's ring handlers enabled), against the same
    function on the whole sequence in one process. Without going through PyTorch's wrapped
    F.scaled_dot_product_attention it would attend to each rank's shard alone."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

    import flashcore.integrations.hf as fc_hf

    class Causal(torch.nn.Module):  # what transformers' attention functions read of a layer
        is_causal = True
        num_key_value_groups = 2

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        q = torch.randn(1, 4, 64, 16, dtype=torch.float64)
        k, v = (torch.randn(1, 2, 64, 16, dtype=torch.float64) for _ in range(2))
        module = Causal()
        before = dict(fc_cp.calls)
        ref, _ = fc_hf.flashcore_attention_forward(module, q, k, v, None, scaling=0.25)
        assert not fc_cp.active() and fc_cp.calls == before  # (no context: FlashCore's op)
        mesh = init_device_mesh("cpu", (world,))
        fc_cp.enable()
        _cp_options.enable_load_balance = True
        cq, ck, cv = (t.clone() for t in (q, k, v))
        with flashcore.patched():
            with context_parallel(mesh, buffers=[cq, ck, cv], buffer_seq_dims=[2, 2, 2]):
                was_active = fc_cp.active()
                out, _ = fc_hf.flashcore_attention_forward(module, cq, ck, cv, None, scaling=0.25)
            full = context_parallel_unshard(mesh, [out], [1])[0]  # (B, S, H, D): S is dim 1
        results[rank] = (was_active, fc_cp.active(), (full - ref).abs().max().item(),
                         fc_cp.calls["sdpa"] - before["sdpa"])
    finally:
        fc_cp.disable()
        dist.destroy_process_group()


def test_hf_attention_function_goes_through_the_ring():
    pytest.importorskip("transformers")
    world = 2
    results = mp.Manager().dict()
    mp.spawn(_hf_worker, args=(world, _free_port(), results), nprocs=world, join=True)
    for rank in range(world):
        was_active, after, err, ring_calls = results[rank]
        assert was_active and not after
        assert ring_calls == 1  # FlashCore's ring handler ran the call
        # (the ring merges in float32: rounding there; a rank attending its shard alone is off by ~1)
        assert err < 1e-5, f"rank {rank}: max |sharded - one process| = {err}"
