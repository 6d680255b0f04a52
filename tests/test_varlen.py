"""flashcore.varlen_attn: PyTorch's varlen API (packed sequences) on FlashCore's SDPA op.

Everything is checked against a float64 reference written here from the definitions (per
sequence: scores, flash-attention's bottom-right window, softmax; no FlashCore code): outputs,
LSE and gradients, for empty and length-1 sequences, equal lengths, one long and many short,
GQA, causal, windows, Sq != Sk, seqused_k, paged key/value, non-contiguous inputs. Also: errors
naming the argument, torch.compile(fullgraph=True), torch.library.opcheck, the math path of an
install without the compiled library, and flashcore.patch() routing PyTorch's function.

CPU cases run anywhere (FlashCore's op falls back to aten there); the CUDA cases (FlashCore's
kernels per sequence, and equality with torch.nn.attention.varlen.varlen_attn, whose flash
backend needs CUDA) skip without a CUDA device.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import varlen as varlen_mod
from flashcore.varlen import AuxRequest, explain_varlen, varlen_attn
from gpu_gate import gpu_gate
from op_recorder import OpRecorder

HAVE_CUDA, cuda_only = gpu_gate("no CUDA device: FlashCore's kernels and PyTorch's varlen_attn "
                                "(flash backend) need one")
try:
    from torch.nn.attention import varlen as torch_varlen
except ImportError:  # torch < 2.9
    torch_varlen = None
needs_torch_varlen = pytest.mark.skipif(
    torch_varlen is None or not hasattr(torch_varlen, "varlen_attn"),
    reason="this PyTorch has no torch.nn.attention.varlen.varlen_attn")
LSE = AuxRequest(lse=True)
I32 = torch.int32


# ---- the float64 reference -------------------------------------------------------------------

def offsets(lengths, device="cpu"):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def allowed(sq, sk, window, max_k):
    """(sq, sk) bool: query row i sees key j when i + sk - sq - left <= j <= i + sk - sq + right
    (flash-attention's window, bottom-right aligned; a negative bound is no bound, and so is
    one >= max_k, as flash-attention normalizes it)."""
    left, right = window
    left = -1 if left >= max_k else left
    right = -1 if right >= max_k else right
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= i + sk - sq - left
    if right >= 0:
        ok &= j <= i + sk - sq + right
    return ok


def reference(q, k, v, q_lens, k_lens, window=(-1, -1), scale=None, k_starts=None, max_k=None):
    """(out (Tq, Hq, Dv), lse (Hq, Tq)) in float64, differentiable in q, k, v. Sequence i: query
    rows from sum(q_lens[:i]), keys k_starts[i] : k_starts[i] + k_lens[i]. Rows that see no key:
    zeros and LSE +inf; query rows past the last sequence too."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    tq, hq, d = q.shape
    group = hq // k.shape[1]
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    max_k = max(k_lens, default=0) if max_k is None else max_k
    if k_starts is None:
        k_starts = [sum(k_lens[:i]) for i in range(len(k_lens))]
    outs, lses, q0 = [], [], 0
    for sq, sk, k0 in zip(q_lens, k_lens, k_starts):
        qi = q64[q0:q0 + sq]
        ki = k64[k0:k0 + sk].repeat_interleave(group, dim=1)
        vi = v64[k0:k0 + sk].repeat_interleave(group, dim=1)
        ok = allowed(sq, sk, window, max_k).to(q.device)
        has = ok.any(-1)
        s = torch.einsum("qhd,khd->hqk", qi, ki) * sc
        s = torch.where(ok, s, float("-inf"))
        s = torch.where(has.unsqueeze(-1), s, 0.0)  # keeps empty rows finite (their p is zeroed)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1)) * (ok & has.unsqueeze(-1))
        outs.append(torch.einsum("hqk,khd->qhd", p, vi))
        lses.append(torch.where(has, lse, float("inf")))
        q0 += sq
    outs.append(q64.new_zeros((tq - q0, hq, v.shape[-1])))
    lses.append(torch.full((hq, tq - q0), float("inf"), dtype=torch.float64, device=q.device))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def packed(q_lens, k_lens=None, hq=4, hkv=4, d=16, dv=None, dtype=torch.float32, device="cpu",
           extra_q=0, seed=0):
    k_lens = q_lens if k_lens is None else k_lens
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens) + extra_q, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(sum(k_lens), hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(sum(k_lens), hkv, dv or d, generator=g, dtype=torch.float64)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def run(q, k, v, q_lens, k_lens, **kw):
    return varlen_attn(q, k, v, offsets(q_lens, q.device), offsets(k_lens, q.device),
                       max(q_lens, default=0), max(k_lens, default=0), **kw)


def close(actual, expected, atol=2e-5, rtol=2e-5):
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


LAYOUTS = {  # name: (query lengths, key lengths)
    "no-sequences": ([], []),
    "one-empty": ([0], [0]),
    "length-1": ([1], [1]),
    "empties-between": ([0, 3, 0, 2, 0], [0, 3, 0, 2, 0]),
    "all-equal": ([6, 6, 6, 6], [6, 6, 6, 6]),
    "one-long-many-short": ([40, 1, 2, 1, 3, 1, 1], [40, 1, 2, 1, 3, 1, 1]),
    "sq-ne-sk": ([3, 7, 1, 5, 0, 4], [5, 2, 6, 5, 3, 0]),
}
WINDOWS = [(-1, -1), (-1, 0), (2, 0), (0, 0), (3, 1), (1, -1), (-1, 2), (0, 2)]


# ---- forward ------------------------------------------------------------------------------------

@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_matches_reference(layout, window):
    q_lens, k_lens = LAYOUTS[layout]
    q, k, v = packed(q_lens, k_lens)
    out, lse = run(q, k, v, q_lens, k_lens, window_size=window, return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    close(out, ref)
    close(lse, ref_lse)


@pytest.mark.parametrize("hq,hkv", [(1, 1), (2, 1), (4, 2), (6, 3), (8, 1), (8, 2), (8, 8)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1)], ids=str)
def test_gqa(hq, hkv, window):
    q_lens, k_lens = [5, 1, 9, 0], [7, 3, 9, 2]
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv)
    out, lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=True, return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
    close(out, ref)
    close(lse, ref_lse)


def test_causal_is_bottom_right():
    """PyTorch's varlen causal (window (-1, 0), flash-attention's) is bottom-right aligned: with
    Sq < Sk every query sees the first keys, unlike SDPA's top-left is_causal."""
    q_lens, k_lens = [2, 3], [6, 8]
    q, k, v = packed(q_lens, k_lens)
    out = run(q, k, v, q_lens, k_lens, window_size=(-1, 0))
    close(out, reference(q, k, v, q_lens, k_lens, (-1, 0))[0])
    top_left = F.scaled_dot_product_attention(
        q[:2].transpose(0, 1), k[:6].transpose(0, 1), v[:6].transpose(0, 1),
        is_causal=True).transpose(0, 1)
    assert not torch.allclose(out[:2], top_left, atol=1e-3)
    # Sq > Sk: the first Sq - Sk rows see no key: zeros and LSE +inf (flash-attention's).
    out, lse = run(q, k, v, [5], [2], window_size=(-1, 0), return_aux=LSE)
    assert torch.equal(out[:3], torch.zeros_like(out[:3]))
    assert torch.isposinf(lse[:, :3]).all() and torch.isfinite(lse[:, 3:5]).all()


def test_float64_exact():
    q_lens, k_lens = [4, 0, 6], [5, 3, 6]
    q, k, v = packed(q_lens, k_lens, dtype=torch.float64)
    out, lse = run(q, k, v, q_lens, k_lens, window_size=(1, 0), return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, (1, 0))
    assert lse.dtype == torch.float64
    close(out, ref, atol=1e-12, rtol=1e-12)
    close(lse, ref_lse, atol=1e-12, rtol=1e-12)


def test_scale_and_value_head_dim():
    q_lens = [3, 5]
    q, k, v = packed(q_lens, dv=24)
    out = run(q, k, v, q_lens, q_lens, scale=0.3, window_size=(-1, 0))
    assert out.shape == (8, 4, 24)
    close(out, reference(q, k, v, q_lens, q_lens, (-1, 0), scale=0.3)[0])


def test_rows_past_last_sequence_are_zero():
    q_lens = [3, 2]
    q, k, v = packed(q_lens, extra_q=4)
    out, lse = run(q, k, v, q_lens, q_lens, return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, q_lens)
    close(out, ref)
    close(lse, ref_lse)
    assert torch.equal(out[5:], torch.zeros_like(out[5:]))


def test_window_at_least_max_k_is_no_limit():
    """flash-attention (PyTorch's backend) turns a bound >= max_k into no bound, which changes a
    row that would see no key: here rows 0-2 of a 10-query, 2-key sequence with right=3."""
    q, k, v = packed([10], [2])
    out = run(q, k, v, [10], [2], window_size=(-1, 3))
    full = run(q, k, v, [10], [2])
    close(out, full)
    assert not torch.equal(out[0], torch.zeros_like(out[0]))


def test_seqused_k():
    q_lens, k_lens, used = [3, 4, 2, 0], [6, 4, 5, 3], [4, 0, 5, 1]
    q, k, v = packed(q_lens, k_lens)
    cu_k = offsets(k_lens)
    out, lse = varlen_attn(q, k, v, offsets(q_lens), cu_k, 4, 5, window_size=(-1, 0),
                           seqused_k=torch.tensor(used, dtype=torch.int32), return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, used, (-1, 0), k_starts=cu_k[:-1].tolist())
    close(out, ref)
    close(lse, ref_lse)
    assert torch.equal(out[3:7], torch.zeros_like(out[3:7]))  # seqused_k 0: no key


def paged(k, v, k_lens, page_size, seed=1):
    """k, v as pools of pages in a shuffled order (plus two unused pages), with a block table
    (entries past a sequence's pages are -1: never read) and seqused_k."""
    g = torch.Generator().manual_seed(seed)
    starts = [0]
    for n in k_lens:
        starts.append(starts[-1] + n)
    pages_per_seq = [-(-n // page_size) for n in k_lens]
    total = sum(pages_per_seq) + 2
    order = torch.randperm(total, generator=g).tolist()
    pool_k = torch.randn(total, page_size, *k.shape[1:], generator=g, dtype=k.dtype)
    pool_v = torch.randn(total, page_size, *v.shape[1:], generator=g, dtype=v.dtype)
    width = max(pages_per_seq) + 1
    table = torch.full((len(k_lens), width), -1, dtype=torch.int32)
    nxt = 0
    for i, n in enumerate(k_lens):
        for p in range(pages_per_seq[i]):
            page = order[nxt]
            nxt += 1
            table[i, p] = page
            rows = slice(starts[i] + p * page_size, min(starts[i] + (p + 1) * page_size,
                                                        starts[i + 1]))
            m = rows.stop - rows.start
            pool_k[page, :m] = k[rows]
            pool_v[page, :m] = v[rows]
    return pool_k, pool_v, table, torch.tensor(k_lens, dtype=torch.int32)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_block_table(page_size):
    q_lens, k_lens = [3, 1, 6, 0, 2], [9, 4, 6, 3, 0]
    q, k, v = packed(q_lens, k_lens, hq=4, hkv=2)
    pool_k, pool_v, table, used = paged(k, v, k_lens, page_size)
    out, lse = varlen_attn(q, pool_k, pool_v, offsets(q_lens), None, 6, 9, window_size=(-1, 0),
                           enable_gqa=True, seqused_k=used, block_table=table, return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, (-1, 0))
    close(out, ref)
    close(lse, ref_lse)


def test_non_contiguous_inputs():
    q_lens, k_lens = [4, 7, 1], [6, 7, 3]
    q, k, v = packed(q_lens, k_lens, hq=4, hkv=2, d=16)
    # Heads-first storage seen token-first, a last dim with stride 2, a sliced batch of rows.
    qn = q.transpose(0, 1).contiguous().transpose(0, 1)
    kn = torch.stack([k, torch.zeros_like(k)], dim=-1)[..., 0]
    vn = torch.cat([torch.zeros(3, *v.shape[1:]), v], 0)[3:]
    assert not qn.is_contiguous() and not kn.is_contiguous() and vn.data_ptr() != v.data_ptr()
    out = run(qn, kn, vn, q_lens, k_lens, window_size=(2, 0), enable_gqa=True)
    close(out, reference(q, k, v, q_lens, k_lens, (2, 0))[0])


def test_num_splits_changes_nothing():
    q_lens = [5, 3]
    q, k, v = packed(q_lens)
    assert torch.equal(run(q, k, v, q_lens, q_lens, num_splits=1), run(q, k, v, q_lens, q_lens))


def test_batch_invariance():
    """A sequence's result does not depend on what else is in the batch."""
    q, k, v = packed([5, 7, 3])
    alone = run(q[5:12], k[5:12], v[5:12], [7], [7], window_size=(-1, 0))
    batch = run(q, k, v, [5, 7, 3], [5, 7, 3], window_size=(-1, 0))
    assert torch.equal(alone, batch[5:12])


# ---- gradients ----------------------------------------------------------------------------------

def grads(fn, q, k, v, wo, wl):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    finite = torch.isfinite(lse)
    loss = (out * wo).sum() + (lse.masked_fill(~finite, 0) * wl).sum()
    return torch.autograd.grad(loss, (q, k, v))


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1), (6, 2)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 1), (1, 0)], ids=str)
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out+lse"])
def test_gradients(hq, hkv, window, with_lse):
    q_lens, k_lens = [5, 0, 1, 8, 3], [7, 2, 1, 8, 0]
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv)
    g = torch.Generator().manual_seed(3)
    wo = torch.randn(q.shape, generator=g)
    wl = torch.randn(hq, q.shape[0], generator=g) if with_lse else torch.zeros(hq, q.shape[0])
    gqa = hq != hkv

    def ours(q, k, v):
        out, lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=gqa,
                       return_aux=LSE)
        return out, (lse if with_lse else lse.detach())

    def ref(q, k, v):
        return reference(q, k, v, q_lens, k_lens, window)

    for got, want in zip(grads(ours, q, k, v, wo, wl), grads(ref, q, k, v, wo, wl)):
        close(got, want, atol=5e-5, rtol=5e-5)


def test_gradcheck_float64():
    q_lens, k_lens = [3, 0, 2], [4, 1, 2]
    q, k, v = packed(q_lens, k_lens, hq=2, hkv=1, d=4, dtype=torch.float64)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)

    def fn(q, k, v):
        out, lse = varlen_attn(q, k, v, cu_q, cu_k, 3, 4, window_size=(1, 0), enable_gqa=True,
                               return_aux=LSE)
        return out, lse.masked_fill(torch.isinf(lse), 0)

    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(fn, inputs)


def test_eager_training_call_skips_the_autograd_wrapper():
    """An eager training call runs _VarlenTraining (the custom ops below Autograd): the same
    output, LSE and gradients, bit for bit, as the custom op's registered autograd that
    torch.compile traces; a double backward is still refused."""
    from flashcore import varlen as V
    q_lens, k_lens = [5, 0, 3, 8], [7, 2, 3, 8]
    q, k, v = packed(q_lens, k_lens, hq=4, hkv=2)
    args = (offsets(q_lens), offsets(k_lens), 8, 8, -1, 0, None, True, None, None)
    g = torch.Generator().manual_seed(5)
    wo, wl = torch.randn(q.shape, generator=g), torch.randn(4, q.shape[0], generator=g)

    def loss_and_grads(fn):
        inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
        out, lse = fn(*inputs)
        loss = (out * wo).sum() + (lse.masked_fill(torch.isinf(lse), 0) * wl).sum()
        return (out, lse, *torch.autograd.grad(loss, inputs)), type(out.grad_fn).__name__

    got, node = loss_and_grads(lambda a, b, c: varlen_attn(a, b, c, *args[:4], window_size=(-1, 0),
                                                           enable_gqa=True, return_aux=LSE))
    want, _ = loss_and_grads(lambda a, b, c: V._varlen_op(a, b, c, *args))
    assert node == "_VarlenTrainingBackward"
    for x, y in zip(got, want):
        assert torch.equal(x, y)
    inputs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    out = varlen_attn(*inputs, *args[:4], window_size=(-1, 0), enable_gqa=True)
    (gq,) = torch.autograd.grad(out.sum(), inputs[0], create_graph=True)
    with pytest.raises(RuntimeError, match="no autograd formula"):
        gq.sum().backward()


def test_gradients_seqused_and_paged():
    q_lens, k_lens = [3, 4, 2], [6, 5, 4]
    used = [4, 5, 1]
    q, k, v = packed(q_lens, k_lens, hq=2, hkv=2)
    cu_k = offsets(k_lens)
    wo = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    wl = torch.zeros(2, q.shape[0])
    used_t = torch.tensor(used, dtype=torch.int32)

    def ours(q, k, v):
        return varlen_attn(q, k, v, offsets(q_lens), cu_k, 4, 5, window_size=(-1, 0),
                           seqused_k=used_t, return_aux=LSE)

    def ref(q, k, v):
        return reference(q, k, v, q_lens, used, (-1, 0), k_starts=cu_k[:-1].tolist())

    dq, dk, dv = grads(ours, q, k, v, wo, wl)
    for got, want in zip((dq, dk, dv), grads(ref, q, k, v, wo, wl)):
        close(got, want, atol=5e-5, rtol=5e-5)
    assert torch.equal(dk[4:6], torch.zeros_like(dk[4:6]))  # keys past seqused_k: no gradient

    # The same keys as pages: the pool's gradient is the packed one, page by page.
    kk = torch.cat([k[0:4], k[6:11], k[11:12]])
    vv = torch.cat([v[0:4], v[6:11], v[11:12]])
    pool_k, pool_v, table, used_p = paged(kk, vv, used, page_size=2)

    def ours_paged(q, pk, pv):
        return varlen_attn(q, pk, pv, offsets(q_lens), None, 4, 5, window_size=(-1, 0),
                           seqused_k=used_p, block_table=table, return_aux=LSE)

    pq, pk, pv = grads(ours_paged, q, pool_k, pool_v, wo, wl)
    close(pq, dq, atol=5e-5, rtol=5e-5)
    for pool_grad, packed_grad in ((pk, dk), (pv, dv)):
        rows = []
        for i, n in enumerate(used):
            flat = torch.cat([pool_grad[p] for p in table[i, :-(-n // 2)].tolist()])[:n]
            rows.append(flat)
        close(torch.cat(rows), torch.cat([packed_grad[0:4], packed_grad[6:11],
                                          packed_grad[11:12]]), atol=5e-5, rtol=5e-5)


def test_gradients_shared_pages():
    """Two sequences sharing their first page (a common prefix): its gradient is the sum."""
    g = torch.Generator().manual_seed(12)
    pool_k, pool_v = (torch.randn(3, 2, 2, 8, generator=g, dtype=torch.float64) for _ in "kv")
    q = torch.randn(5, 2, 8, generator=g, dtype=torch.float64)
    table = torch.tensor([[0, 1], [0, 2]], dtype=I32)
    used = torch.tensor([4, 3], dtype=I32)
    wo = torch.randn(q.shape, generator=g, dtype=torch.float64)
    wl = torch.zeros(2, 5, dtype=torch.float64)

    def ours(q, pk, pv):
        return varlen_attn(q, pk, pv, offsets([2, 3]), None, 3, 4, window_size=(-1, 0),
                           seqused_k=used, block_table=table, return_aux=LSE)

    def ref(q, pk, pv):
        k = torch.cat([pk[0], pk[1], pk[0], pk[2][:1]])
        v = torch.cat([pv[0], pv[1], pv[0], pv[2][:1]])
        return reference(q, k, v, [2, 3], [4, 3], (-1, 0))

    for got, want in zip(grads(ours, q, pool_k, pool_v, wo, wl),
                         grads(ref, q, pool_k, pool_v, wo, wl)):
        close(got, want, atol=1e-10, rtol=1e-10)


def test_math_path_without_library(monkeypatch):
    """An install without the compiled library has no sdpa_fwd / sdpa_bwd: plain math instead."""
    monkeypatch.setattr(varlen_mod, "_SDPA_FWD", None)
    monkeypatch.setattr(varlen_mod, "_SDPA_BWD", None)
    q_lens, k_lens = [3, 6, 0, 1], [5, 6, 2, 1]
    q, k, v = packed(q_lens, k_lens, hq=4, hkv=2)
    for window in [(-1, -1), (-1, 0), (2, 1)]:
        out, lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=True,
                       return_aux=LSE)
        ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
        close(out, ref)
        close(lse, ref_lse)
    wo = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    wl = torch.randn(4, q.shape[0], generator=torch.Generator().manual_seed(8))

    def ours(q, k, v):
        return run(q, k, v, q_lens, k_lens, window_size=(-1, 0), enable_gqa=True, return_aux=LSE)

    def ref(q, k, v):
        return reference(q, k, v, q_lens, k_lens, (-1, 0))

    for got, want in zip(grads(ours, q, k, v, wo, wl), grads(ref, q, k, v, wo, wl)):
        close(got, want, atol=5e-5, rtol=5e-5)


def test_install_without_library(tmp_path):
    """A copy of the package with no compiled library (a CPU-only install, see test_fallback.py)
    imports varlen_attn and computes with plain math: forward, gradients, torch.compile."""
    import os
    import shutil
    import subprocess
    import sys
    package = os.path.dirname(flashcore.__file__)
    shutil.copytree(package, tmp_path / "flashcore",
                    ignore=shutil.ignore_patterns("*.so", "_build_config.py", "__pycache__"))
    code = """
import torch, flashcore
from flashcore import varlen
assert flashcore.FALLBACK_ONLY and varlen._SDPA_FWD is None
q = torch.randn(9, 4, 8, requires_grad=True)
k = torch.randn(9, 2, 8, requires_grad=True)
v = torch.randn(9, 2, 8, requires_grad=True)
cu = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
out = flashcore.varlen_attn(q, k, v, cu, cu, 5, 5, window_size=(-1, 0), enable_gqa=True)
ref = torch.cat([torch.nn.functional.scaled_dot_product_attention(
    q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True,
    enable_gqa=True).transpose(0, 1) for a, b in ((0, 4), (4, 9))])
assert torch.allclose(out, ref, atol=1e-5), (out - ref).abs().max()
got = torch.autograd.grad(out.sum(), (q, k, v))
want = torch.autograd.grad(ref.sum(), (q, k, v))
assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
f = torch.compile(lambda q, k, v: flashcore.varlen_attn(q, k, v, cu, cu, 5, 5, enable_gqa=True),
                  fullgraph=True, backend="aot_eager")
assert torch.allclose(f(q, k, v), flashcore.varlen_attn(q, k, v, cu, cu, 5, 5, enable_gqa=True))
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


# ---- errors -------------------------------------------------------------------------------------

def _args(**over):
    q, k, v = packed([3, 2], hq=4, hkv=2)
    args = dict(query=q, key=k, value=v, cu_seq_q=offsets([3, 2]), cu_seq_k=offsets([3, 2]),
                max_q=3, max_k=3, enable_gqa=True)
    args.update(over)
    return args


def _call(**over):
    a = _args(**over)
    return varlen_attn(a.pop("query"), a.pop("key"), a.pop("value"), a.pop("cu_seq_q"),
                       a.pop("cu_seq_k"), a.pop("max_q"), a.pop("max_k"), **a)


@pytest.mark.parametrize("over,match", [
    (dict(cu_seq_q=torch.tensor([0, 3, 5])), r"cu_seq_q must be int32"),
    (dict(cu_seq_q=torch.tensor([[0, 3, 5]], dtype=I32)), r"cu_seq_q must be 1-D"),
    (dict(cu_seq_q=torch.tensor([1, 3, 5], dtype=I32)), r"cu_seq_q must start at 0"),
    (dict(cu_seq_q=torch.tensor([0, 4, 3], dtype=I32)), r"cu_seq_q must be non-decreasing"),
    (dict(cu_seq_q=torch.tensor([0, 3, 6], dtype=I32)), r"cu_seq_q ends at 6, past query"),
    (dict(cu_seq_k=torch.tensor([0, 3, 6], dtype=I32)), r"cu_seq_k ends at 6, past key"),
    (dict(cu_seq_k=torch.tensor([0, 5], dtype=I32)), r"cu_seq_k must have 3 entries"),
    (dict(cu_seq_k=torch.tensor([0, 3, 5], dtype=torch.int64)), r"cu_seq_k must be int32"),
    (dict(cu_seq_k=None), r"cu_seq_k may be None only with block_table"),
    (dict(max_q=2), r"max_q=2 is less than the longest query sequence"),
    (dict(max_k=1), r"max_k=1 is less than the longest key sequence"),
    (dict(max_q=-1), r"max_q must be >= 0"),
    (dict(enable_gqa=False), r"same number of heads.*enable_gqa"),
    (dict(key=torch.randn(5, 3, 16), value=torch.randn(5, 3, 16)), r"multiple of key/value's"),
    (dict(key=torch.randn(5, 2, 16, dtype=torch.float64)), r"key must have query's"),
    (dict(value=torch.randn(5, 2, 8, 16)), r"value must be 3-D"),
    (dict(key=torch.randn(5, 2, 8), value=torch.randn(5, 2, 8)), r"key's head dim"),
    (dict(window_size=(-2, 0)), r"window_size entries must be >= -1"),
    (dict(window_size=(1,)), r"window_size must be two ints"),
    (dict(seqused_k=torch.tensor([3], dtype=I32)), r"seqused_k must have 2 entries"),
    (dict(seqused_k=torch.tensor([4, 1], dtype=I32)), r"seqused_k\[0\]=4 exceeds"),
    (dict(seqused_k=torch.tensor([-1, 1], dtype=I32)), r"seqused_k must be >= 0"),
    (dict(num_splits=-1), r"num_splits"),
    (dict(return_aux=True), r"return_aux"),
])
def test_bad_arguments(over, match):
    with pytest.raises(ValueError, match=match):
        _call(**over)


@pytest.mark.parametrize("table,used,match", [
    ([[0, 1], [2, -1]], None, r"block_table needs seqused_k"),
    ([[0, 1], [9, -1]], [3, 2], r"block_table\[1\] refers to page 9, out of range"),
    ([[0, -1], [2, -1]], [3, 2], r"block_table\[0\] refers to page -1"),
    ([[0], [2]], [3, 2], r"seqused_k\[0\]=3 needs more pages than block_table has"),
    ([[0, 1]], [3, 2], r"block_table must be 2-D \(N=2"),
])
def test_bad_block_table(table, used, match):
    pool = torch.randn(4, 2, 2, 16)
    with pytest.raises(ValueError, match=match):
        _call(key=pool, value=pool.clone(), cu_seq_k=None,
              block_table=torch.tensor(table, dtype=I32),
              seqused_k=None if used is None else torch.tensor(used, dtype=I32))


def test_block_table_needs_4d_key():
    with pytest.raises(ValueError, match=r"key must be 4-D \(num_pages, page_size"):
        _call(block_table=torch.zeros(2, 2, dtype=I32), seqused_k=torch.tensor([3, 2], dtype=I32))


# ---- torch.compile, opcheck ---------------------------------------------------------------------

def test_compile_fullgraph_forward_and_backward():
    q_lens, k_lens = [4, 0, 7, 1], [5, 2, 7, 3]
    q, k, v = packed(q_lens, k_lens, hq=4, hkv=2)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)

    def fn(q, k, v, cu_q, cu_k):
        out, lse = varlen_attn(q, k, v, cu_q, cu_k, 7, 7, window_size=(2, 0), enable_gqa=True,
                               return_aux=LSE)
        return out * 2, lse

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = compiled(*inputs, cu_q, cu_k)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, (2, 0))
    close(out, 2 * ref)
    close(lse, ref_lse)
    wo = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad((out * wo).sum(), inputs)

    def ref_fn(q, k, v):
        o, l = reference(q, k, v, q_lens, k_lens, (2, 0))
        return 2 * o, l

    want = grads(ref_fn, q, k, v, wo, torch.zeros(4, q.shape[0]))
    for a, b in zip(got, want):
        close(a, b, atol=5e-5, rtol=5e-5)


def test_compile_inductor_smoke():
    q_lens = [3, 5]
    q, k, v = packed(q_lens)
    cu = offsets(q_lens)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, cu: varlen_attn(q, k, v, cu, cu, 5, 5,
                                                             window_size=(-1, 0)).sum(-1),
                             fullgraph=True)
    close(compiled(q, k, v, cu), reference(q, k, v, q_lens, q_lens, (-1, 0))[0].sum(-1))


def test_opcheck():
    q_lens, k_lens = [3, 0, 4], [2, 1, 4]
    q, k, v = packed(q_lens, k_lens, hq=2, hkv=1)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    args = (q, k, v, offsets(q_lens), offsets(k_lens), 4, 4, -1, 0, None, True, None, None)
    torch.library.opcheck(torch.ops.flashcore.varlen_attn.default, args)


# ---- flashcore.patch() --------------------------------------------------------------------------

@pytest.fixture
def unpatched():
    flashcore.unpatch()
    yield
    flashcore.unpatch()


@needs_torch_varlen
def test_patch_routes_torch_varlen(unpatched):
    original = torch_varlen.varlen_attn
    assert original is varlen_mod._TORCH_ORIGINAL
    q_lens = [3, 5]
    q, k, v = packed(q_lens)
    cu = offsets(q_lens)
    flashcore.patch()
    flashcore.patch()  # idempotent
    assert torch_varlen.varlen_attn is varlen_mod.torch_varlen_attn
    with OpRecorder() as rec:
        out = torch_varlen.varlen_attn(q, k, v, cu, cu, 5, 5, window_size=(-1, 0))
    assert torch.ops.flashcore.varlen_attn.default in rec.ops
    close(out, reference(q, k, v, q_lens, q_lens, (-1, 0))[0])
    flashcore.unpatch()
    assert torch_varlen.varlen_attn is original
    with flashcore.patched():
        assert torch_varlen.varlen_attn is varlen_mod.torch_varlen_attn
    assert torch_varlen.varlen_attn is original


@needs_torch_varlen
def test_patch_compiles_without_graph_break(unpatched):
    q_lens = [3, 5]
    q, k, v = packed(q_lens)
    cu = offsets(q_lens)
    torch._dynamo.reset()
    with flashcore.patched():
        compiled = torch.compile(
            lambda q, k, v, cu: torch_varlen.varlen_attn(q, k, v, cu, cu, 5, 5), fullgraph=True,
            backend="aot_eager")
        close(compiled(q, k, v, cu), reference(q, k, v, q_lens, q_lens)[0])
    torch._dynamo.reset()


@needs_torch_varlen
def test_patch_older_signatures(unpatched, monkeypatch):
    """Releases before the window argument took a positional is_causal (bottom-right, as flash
    attention's): the stand-in maps it; arguments it does not know go to PyTorch's function."""
    calls = []

    def fake_original(*args, **kwargs):
        calls.append(kwargs)
        return "original"

    monkeypatch.setattr(varlen_mod, "_TORCH_POSITIONAL", ("is_causal", "return_aux"))
    monkeypatch.setattr(varlen_mod, "_TORCH_ORIGINAL", fake_original)
    q_lens, k_lens = [2, 4], [5, 4]
    q, k, v = packed(q_lens, k_lens)
    cu_q, cu_k = offsets(q_lens), offsets(k_lens)
    stand_in = varlen_mod.torch_varlen_attn
    out, lse = stand_in(q, k, v, cu_q, cu_k, 4, 5, True, LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, (-1, 0))
    close(out, ref)
    close(lse, ref_lse)
    assert stand_in(q, k, v, cu_q, cu_k, 4, 5, k_cache=k) == "original"
    assert calls == [dict(k_cache=k)]


# ---- CUDA: FlashCore's kernels per sequence, PyTorch's varlen_attn ------------------------------

def _low_precision_yardstick(q, k, v, q_lens, k_lens, window, **kw):
    """max |ref_lowprec - ref64|: the same reference computed from inputs rounded to the dtype,
    in the dtype's precision for the probabilities (flash-attention's test yardstick)."""
    ref, _ = reference(q, k, v, q_lens, k_lens, window, **kw)
    low, _ = reference(q.float(), k.float(), v.float(), q_lens, k_lens, window, **kw)
    return (low.to(q.dtype).double() - ref).abs().max().item()


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (64, 0), (16, 16)], ids=str)
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
def test_cuda_matches_reference(dtype, window, hq, hkv):
    q_lens, k_lens = [300, 1, 0, 17, 128, 5], [300, 40, 3, 17, 200, 5]
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv, d=64, dtype=dtype, device="cuda")
    out, lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=hq != hkv,
                   return_aux=LSE)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
    tol = 2 * _low_precision_yardstick(q, k, v, q_lens, k_lens, window) + 1e-3
    assert (out.double() - ref).abs().max().item() <= tol
    close(lse, ref_lse, atol=2e-3, rtol=2e-3)


@cuda_only
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (32, 0)], ids=str)
def test_cuda_gradients(window):
    q_lens, k_lens = [130, 1, 64, 0], [130, 9, 100, 4]
    q, k, v = packed(q_lens, k_lens, hq=8, hkv=2, d=64, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(11)
    wo = torch.randn(q.shape, generator=g).to("cuda", torch.bfloat16)
    wl = torch.zeros(8, q.shape[0], device="cuda")

    def ours(q, k, v):
        return run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=True, return_aux=LSE)

    def ref(q, k, v):
        return reference(q, k, v, q_lens, k_lens, window)

    for got, want in zip(grads(ours, q, k, v, wo, wl), grads(ref, q, k, v, wo, wl)):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= 2e-2 * max(scale, 1.0)


@cuda_only
@needs_torch_varlen
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (32, 0)], ids=str)
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2)])
def test_cuda_equals_pytorch_varlen(window, hq, hkv, unpatched):
    import inspect
    params = inspect.signature(torch_varlen.varlen_attn).parameters
    if hq != hkv and "enable_gqa" not in params:
        pytest.skip("this PyTorch's varlen_attn has no enable_gqa")
    q_lens, k_lens = [200, 1, 64, 33], [200, 1, 64, 33]
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv, d=64, dtype=torch.bfloat16, device="cuda")
    cu = offsets(q_lens, "cuda")
    kw = dict(return_aux=LSE)
    if "window_size" in params:
        kw["window_size"] = window
    elif window == (-1, 0):
        kw = dict(is_causal=True, return_aux=LSE)
    elif window != (-1, -1):
        pytest.skip("this PyTorch's varlen_attn has no window_size")
    if hq != hkv:
        kw["enable_gqa"] = True
    theirs, their_lse = torch_varlen.varlen_attn(q, k, v, cu, cu, 200, 200, **kw)
    ours, our_lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=hq != hkv,
                        return_aux=LSE)
    torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)
    if their_lse.shape != our_lse.shape:  # a release documenting (T_q, H) instead of (H, T_q)
        their_lse = their_lse.reshape(our_lse.shape[::-1]).t()
    torch.testing.assert_close(our_lse, their_lse, atol=2e-3, rtol=2e-3)


@cuda_only
def test_cuda_window_goes_to_the_kernels_as_a_band():
    """On Hopper a window (or causal with Sq != Sk) reaches the sm90 kernels as its band, no mask
    built; elsewhere _mask's bool mask (the results are checked against the reference above)."""
    from flashcore import varlen as fc_varlen
    q4, k4, v4 = (torch.randn(1, 8, n, 64, device="cuda", dtype=torch.bfloat16) for n in (300, 400, 400))
    causal, mask, band = fc_varlen._band_or_mask(q4, k4, v4, 64, 0, 0.125, False)
    if torch.cuda.get_device_capability() == (9, 0):
        assert (causal, mask, band) == (False, None, (64, 0, True))
    else:
        assert band == () and mask is not None
    # no window, or plain causal with Sq == Sk: SDPA's own call
    assert fc_varlen._band_or_mask(q4, k4, v4, -1, -1, 0.125, False)[2] == ()
    assert fc_varlen._band_or_mask(k4, k4, v4, -1, 0, 0.125, False)[:2] == (True, None)


# ---- the fused paged decode (torch.ops.flashcore._paged_decode, one launch) ----------------------

PAGED_DECODE = getattr(torch.ops.flashcore, "_paged_decode", None)
needs_paged_op = pytest.mark.skipif(PAGED_DECODE is None,
                                    reason="this op library has no flashcore::_paged_decode")


def decode_batch(used, page_size, hq=8, hkv=2, d=64, dtype=torch.float16, device="cpu", seed=4):
    """One query row per sequence against a paged cache: (q, pool_k, pool_v, table, seqused_k,
    and the unpaged k, v, key lengths) for reference()."""
    n = len(used)
    q, k, v = packed([1] * n, used, hq=hq, hkv=hkv, d=d, seed=seed)
    pool_k, pool_v, table, used_t = paged(k, v, used, page_size, seed=seed)
    dev = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    return (dev(q), dev(pool_k), dev(pool_v), dev(table), dev(used_t)), (q.to(dtype), k.to(dtype),
                                                                         v.to(dtype))


def run_paged(q, pool_k, pool_v, table, used_t, used, **kw):
    return varlen_attn(q, pool_k, pool_v, offsets([1] * len(used), q.device), None, 1,
                       max(used, default=0), seqused_k=used_t, block_table=table, **kw)


@needs_paged_op
def test_paged_decode_op_fake():
    """The fake (Meta kernel): out (N, Hq, D) in q's dtype, LSE (Hq, N) float32."""
    q = torch.empty(5, 8, 64, dtype=torch.bfloat16, device="meta")
    pages = torch.empty(10, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    table = torch.empty(5, 3, dtype=torch.int32, device="meta")
    used = torch.empty(5, dtype=torch.int32, device="meta")
    out, lse = PAGED_DECODE(q, pages, pages, table, used, 0.125)
    assert out.shape == (5, 8, 64) and out.dtype == torch.bfloat16
    assert lse.shape == (8, 5) and lse.dtype == torch.float32


@needs_paged_op
@pytest.mark.parametrize("change,message", [
    (dict(q=torch.zeros(5, 8, 64, 1, dtype=torch.float16)), "q must be 3-D"),
    (dict(q=torch.zeros(5, 8, 64)), "q must be float16 or bfloat16"),
    (dict(key_pages=torch.zeros(10, 16, 2, 32, dtype=torch.float16)), "key_pages's head dim"),
    (dict(value_pages=torch.zeros(10, 16, 2, 64, dtype=torch.bfloat16)), "value_pages must have q's dtype"),
    (dict(key_pages=torch.zeros(10, 24, 2, 64, dtype=torch.float16),
          value_pages=torch.zeros(10, 24, 2, 64, dtype=torch.float16)), "multiple of 16"),
    (dict(key_pages=torch.zeros(10, 16, 3, 64, dtype=torch.float16),
          value_pages=torch.zeros(10, 16, 3, 64, dtype=torch.float16)), "multiple of key_pages'"),
    (dict(block_table=torch.zeros(5, 3)), "block_table must be a 2-D int32"),
    (dict(block_table=torch.zeros(4, 3, dtype=torch.int32)), "one row per query"),
    (dict(seqused_k=torch.zeros(4, dtype=torch.int32)), "seqused_k must be a 1-D int32"),
    (dict(scale=float("nan")), "scale must be finite"),
    ({}, "must be a CUDA tensor"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_paged_decode_op_argument_errors(change, message):
    """The op's checks name the argument (on CPU: the same checks, then "CUDA only")."""
    args = dict(q=torch.zeros(5, 8, 64, dtype=torch.float16),
                key_pages=torch.zeros(10, 16, 2, 64, dtype=torch.float16),
                value_pages=torch.zeros(10, 16, 2, 64, dtype=torch.float16),
                block_table=torch.zeros(5, 3, dtype=torch.int32),
                seqused_k=torch.zeros(5, dtype=torch.int32), scale=0.125)
    args.update(change)
    with pytest.raises(RuntimeError, match=message):
        PAGED_DECODE(*args.values())


@needs_paged_op
def test_paged_decode_declines():
    """What the fused path leaves to the per-sequence loop; metadata only, so checked on CPU
    (where the last reason is "not on CUDA")."""
    used = [5, 0, 17]
    (q, pk, pv, table, used_t), _ = decode_batch(used, 16)
    declines = lambda **kw: varlen_mod._paged_decode_declines(
        kw.get("q", q), kw.get("k", pk), kw.get("v", pv), used_t, kw.get("table", table),
        kw.get("max_q", 1), kw.get("left", -1))
    assert declines() == "not on CUDA"
    assert declines(table=None).startswith("not paged")
    assert declines(q=q.float(), k=pk.float(), v=pv.float()).startswith("dtype")
    assert declines(q=q[..., :32], k=pk[..., :32], v=pv[..., :32]).startswith("head dim")
    assert declines(v=pv[..., :32]).startswith("head dim")
    (q8, pk8, pv8, table8, used8), _ = decode_batch(used, 8)
    assert declines(k=pk8, v=pv8).startswith("page size")
    assert declines(left=4) == "a left window"
    (q66, pk66, pv66, _, _), _ = decode_batch(used, 16, hq=66, hkv=2)
    assert declines(q=q66, k=pk66, v=pv66).startswith("more than 32")
    assert declines(max_q=2).startswith("not one query row per sequence")
    assert declines(q=torch.zeros(4, 8, 64, dtype=torch.float16)).startswith(
        "not one query row per sequence")


@needs_paged_op
def test_paged_decode_plan_reads_values_once():
    """The fused path's plan from the values (vectorized, one read): the table width the kernel
    needs and whether a sequence is empty; None for values it does not take, which then go to
    _plan (the error naming the argument, or the loop). Runs on CPU tensors too."""
    used = [5, 0, 17]
    (q, pk, pv, table, used_t), _ = decode_batch(used, 16)
    plan = lambda cu=offsets([1, 1, 1]), cu_k=None, max_k=17, u=used_t, t=table: \
        varlen_mod._paged_decode_plan(q, pk, cu, cu_k, max_k, u, t)
    assert plan() == varlen_mod._PagedPlan(width=2, any_empty=True)
    (q3, pk3, _, table3, used3), _ = decode_batch([5, 3, 17], 16)
    assert varlen_mod._paged_decode_plan(q3, pk3, offsets([1, 1, 1]), None, 17, used3, table3) \
        == varlen_mod._PagedPlan(width=2, any_empty=False)
    assert plan(cu=torch.tensor([0, 1, 1, 3], dtype=torch.int32)) is None   # not one row each
    assert plan(cu=torch.tensor([1, 2, 3, 4], dtype=torch.int32)) is None   # not from 0
    assert plan(cu_k=torch.tensor([0, 5, 4, 9], dtype=torch.int32)) is None  # decreasing
    assert plan(max_k=16) is None                                           # 17 > max_k
    assert plan(u=torch.tensor([5, -1, 17], dtype=torch.int32)) is None     # negative
    assert plan(u=torch.tensor([5, 0, 16 * table.shape[1] + 1], dtype=torch.int32), max_k=10**6) is None
    bad = table.clone()
    bad[2, 1] = pk.shape[0]  # a page sequence 2 reads, past the pools
    assert plan(t=bad) is None
    with pytest.raises(ValueError, match=r"block_table\[2\] refers to page"):
        run_paged(q, pk, pv, bad, used_t, used, enable_gqa=True)
    unread = table.clone()
    unread[0, 1] = -7  # sequence 0 (5 keys) reads one page: the entry after it is never read
    assert plan(t=unread) == varlen_mod._PagedPlan(width=2, any_empty=True)


def count_calls(monkeypatch, name):
    """A list that grows by one at each call of varlen's module-level op `name` (_PAGED_DECODE,
    _VARLEN_FWD): the op runs inside varlen_attn's custom op, below what OpRecorder sees."""
    calls, real = [], getattr(varlen_mod, name)

    def counted(*args):
        calls.append(name)
        return real(*args)

    monkeypatch.setattr(varlen_mod, name, counted)
    return calls


@needs_paged_op
def test_paged_decode_cpu_keeps_the_loop(monkeypatch):
    """On CPU the call keeps the per-sequence loop (the op is CUDA only), same results."""
    used = [5, 0, 17, 33]
    (q, pk, pv, table, used_t), (q64, k, v) = decode_batch(used, 16, dtype=torch.float32)
    calls = count_calls(monkeypatch, "_PAGED_DECODE")
    out, lse = run_paged(q, pk, pv, table, used_t, used, enable_gqa=True, return_aux=LSE)
    assert calls == []
    ref, ref_lse = reference(q64, k, v, [1] * 4, used)
    close(out, ref)
    close(lse, ref_lse)


def _launched_decode(kernels):
    """The decode kernels among launched (name, grid) pairs, and whether each read pages (the
    fifth template argument, kPaged)."""
    found = []
    for name, _ in kernels:
        flat = name.replace(" ", "")
        m = re.search(r"decode::decode_(?:mma_)?kernel<([^<>]*)>", flat)
        if m:
            found.append(m.group(1).split(",")[-1] in ("true", "(bool)1"))
    return found


@cuda_only
@needs_paged_op
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (32, 4), (32, 1)])
def test_cuda_paged_decode_matches_reference(dtype, d, page_size, hq, hkv):
    used = [1, 0, 17, 127, 1000, 0, 300, 64]
    (q, pk, pv, table, used_t), (q64, k, v) = decode_batch(used, page_size, hq=hq, hkv=hkv, d=d,
                                                            dtype=dtype, device="cuda")
    out, lse = run_paged(q, pk, pv, table, used_t, used, enable_gqa=hq != hkv,
                         window_size=(-1, 0), return_aux=LSE)
    ref, ref_lse = reference(q64.cuda(), k.cuda(), v.cuda(), [1] * len(used), used)
    assert (out.double() - ref).abs().max().item() <= (2e-2 if dtype == torch.bfloat16 else 4e-3)
    close(lse, ref_lse, atol=2e-3, rtol=2e-3)
    assert torch.isposinf(lse[:, 1]).all() and torch.equal(out[1], torch.zeros_like(out[1]))


@cuda_only
@needs_paged_op
def test_cuda_paged_decode_is_one_launch():
    """A paged decode step is one call of the fused op and one decode kernel reading pages (plus
    its split merge), whatever the number of sequences; the per-sequence loop is not run."""
    from kernel_trace import launched_kernels
    counts = []
    for n in (3, 24):
        used = [40 + 97 * i % 700 for i in range(n)]  # no empty sequence: no LSE fix-up launch
        (q, pk, pv, table, used_t), _ = decode_batch(used, 16, hq=16, hkv=2, d=128,
                                                     dtype=torch.bfloat16, device="cuda")
        call = lambda: run_paged(q, pk, pv, table, used_t, used, enable_gqa=True)
        with OpRecorder() as rec:
            call()
        assert rec.count(torch.ops.flashcore.varlen_attn.default) == 1
        kernels = launched_kernels(call)
        decode = _launched_decode(kernels)
        assert decode == [True], kernels
        others = [name for name, _ in kernels if "decode_" not in name and "combine_kernel" not in name]
        assert others == [], others
        assert len(kernels) <= 2, kernels
        counts.append(len(kernels))
    assert counts[0] == counts[1] or max(counts) <= 2


@cuda_only
@needs_paged_op
def test_cuda_paged_decode_in_cuda_graph():
    """A paged decode step captures in a CUDA graph (nothing is read on the host then) and its
    replays read the buffers' current values: same results as eager calls."""
    used = [40, 0, 300, 17]
    (q, pk, pv, table, used_t), _ = decode_batch(used, 64, hq=16, hkv=2, d=128,
                                                 dtype=torch.bfloat16, device="cuda")
    cu_q = offsets([1] * len(used), q.device)
    call = lambda: varlen_attn(q, pk, pv, cu_q, None, 1, 512, seqused_k=used_t,
                               block_table=table, enable_gqa=True, return_aux=LSE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up outside the capture, as torch.cuda.graph asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for step in range(2):
        if step:  # the next decode step: new query rows, one more key for sequence 2
            q.copy_(torch.randn_like(q))
            used_t.copy_(torch.tensor([40, 0, 301, 17], dtype=torch.int32))
        graph.replay()
        eager_out, eager_lse = call()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, eager_out, atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(lse, eager_lse, atol=1e-3, rtol=1e-3)
        assert torch.isposinf(lse[:, 1]).all()


@cuda_only
@needs_paged_op
def test_cuda_paged_decode_declined_calls_loop():
    """Calls the fused path declines run the per-sequence loop (no kPaged kernel), still right."""
    from kernel_trace import launched_kernels
    used = [5, 17, 40]
    (q, pk, pv, table, used_t), (q64, k, v) = decode_batch(used, 16, d=64, dtype=torch.float16,
                                                            device="cuda")
    for kw, qs in ((dict(window_size=(8, 0)), [1, 1, 1]),):
        call = lambda: run_paged(q, pk, pv, table, used_t, used, enable_gqa=True, **kw)
        assert True not in _launched_decode(launched_kernels(call))
        ref, _ = reference(q64.cuda(), k.cuda(), v.cuda(), qs, used, (8, 0))
        assert (call().double() - ref).abs().max().item() <= 4e-3
    # page size 8: not a multiple of 16
    (q8, pk8, pv8, table8, used8), (q64, k, v) = decode_batch(used, 8, d=64, dtype=torch.float16,
                                                              device="cuda")
    call = lambda: run_paged(q8, pk8, pv8, table8, used8, used, enable_gqa=True)
    assert True not in _launched_decode(launched_kernels(call))
    ref, _ = reference(q64.cuda(), k.cuda(), v.cuda(), [1, 1, 1], used)
    assert (call().double() - ref).abs().max().item() <= 4e-3


@cuda_only
@needs_paged_op
def test_cuda_paged_decode_gradients_and_compile():
    """The fused forward's LSE feeds the per-sequence backward (+inf for empty sequences), and the
    call compiles as one opaque op."""
    used = [9, 0, 33]
    (q, pk, pv, table, used_t), (q64, k, v) = decode_batch(used, 16, d=64, dtype=torch.bfloat16,
                                                            device="cuda")
    q, pk, pv = (t.detach().requires_grad_() for t in (q, pk, pv))
    out, lse = run_paged(q, pk, pv, table, used_t, used, enable_gqa=True, return_aux=LSE)
    assert torch.isposinf(lse[:, 1]).all()
    out.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all() and torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))
    compiled = torch.compile(lambda *a: run_paged(*a, used, enable_gqa=True), fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, pk, pv, table, used_t), out.detach())


# ---- the fused packed forward (torch.ops.flashcore._varlen_fwd: the Hopper forward, one launch) --

VARLEN_FWD = getattr(torch.ops.flashcore, "_varlen_fwd", None)
needs_varlen_op = pytest.mark.skipif(VARLEN_FWD is None,
                                     reason="this op library has no flashcore::_varlen_fwd")


def _hopper():
    return HAVE_CUDA and torch.cuda.get_device_capability() == (9, 0)


hopper_only = pytest.mark.skipif(not _hopper(), reason="the packed forward is the sm_90 family's")

PACKED_LAYOUTS = {  # name: (query lengths, key lengths)
    "many-short": ([1, 2, 3, 5, 8, 13, 17, 1, 127, 128, 129, 0, 255, 64, 31], None),
    "one-long-many-short": ([1000] + [1, 7, 3] * 20 + [4097], None),
    "all-equal": ([256] * 9, None),
    "sq-ne-sk": ([3, 130, 1, 77, 0, 300], [5, 2, 600, 77, 9, 1]),
    "no-key": ([5, 70, 3], [0, 130, 0]),
}


@needs_varlen_op
@hopper_only
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", list(PACKED_LAYOUTS))
def test_cuda_packed_forward_is_one_launch(layout, causal, dtype, d, monkeypatch):
    """Against the float64 reference with the low-precision yardstick; rows past the last
    sequence (extra_q) zero with LSE +inf; the op's outputs poisoned first through the allocator
    (a row the kernel leaves unwritten would keep a NaN)."""
    q_lens, k_lens = PACKED_LAYOUTS[layout]
    k_lens = q_lens if k_lens is None else k_lens
    window = (-1, 0) if causal else (-1, -1)
    hq, hkv = (8, 2) if d != 256 else (4, 4)
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv, d=d, dtype=dtype, device="cuda", extra_q=3,
                     seed=len(q_lens) + d)
    fused = not causal or all(a in (0, b) for a, b in zip(q_lens, k_lens))
    torch.empty(4 << 20, device="cuda").fill_(float("nan"))  # poison what the op will allocate
    calls = count_calls(monkeypatch, "_VARLEN_FWD")
    out, lse = run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=hq != hkv, return_aux=LSE)
    assert len(calls) == int(fused)
    ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
    tol = 2 * _low_precision_yardstick(q, k, v, q_lens, k_lens, window) + 1e-3
    assert not out.isnan().any()
    assert (out.double() - ref).abs().max().item() <= tol
    close(lse, ref_lse, atol=2e-3, rtol=2e-3)


@needs_varlen_op
@hopper_only
def test_cuda_packed_forward_strided_views_and_gradients(monkeypatch):
    """q, k, v as views of one (T, 3, H, D) buffer (strided rows); gradients through the
    per-sequence backward against the float64 reference."""
    q_lens = [130, 1, 64, 0, 257]
    t, h, d = sum(q_lens), 4, 128
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(t, 3, h, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    wo = torch.randn(t, h, d, generator=g).to("cuda", torch.bfloat16)
    wl = torch.zeros(h, t, device="cuda")
    calls = count_calls(monkeypatch, "_VARLEN_FWD")
    out, lse = run(q, k, v, q_lens, q_lens, window_size=(-1, 0), return_aux=LSE)
    assert len(calls) == 1
    ref, ref_lse = reference(q.detach(), k.detach(), v.detach(), q_lens, q_lens, (-1, 0))
    assert (out.double() - ref).abs().max().item() <= 2e-2
    close(lse, ref_lse, atol=2e-3, rtol=2e-3)

    def ours(q, k, v):
        return run(q, k, v, q_lens, q_lens, window_size=(-1, 0), return_aux=LSE)

    def refd(q, k, v):
        return reference(q, k, v, q_lens, q_lens, (-1, 0))

    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    for got, want in zip(grads(ours, *leaves, wo, wl), grads(refd, *leaves, wo, wl)):
        assert (got.double() - want).abs().max().item() <= 2e-2 * max(want.abs().max().item(), 1.0)


@needs_varlen_op
@hopper_only
def test_cuda_packed_forward_offsets_rewritten_in_place():
    """The plan is cached per offsets tensor (_cached_varlen_fwd_plan): the same tensor, written
    on the GPU between two calls, gives the second call's result for the new offsets."""
    first, second = [200, 56, 1], [1, 128, 128]
    q, k, v = packed(first, hq=4, hkv=4, d=128, dtype=torch.bfloat16, device="cuda", seed=3)
    cu = offsets(first, "cuda")
    for lens in (first, second, second):
        cu.copy_(offsets(lens, "cuda"))
        out = varlen_attn(q, k, v, cu, cu, 200, 200, window_size=(-1, 0))
        ref = reference(q, k, v, lens, lens, (-1, 0))[0]
        assert (out.double() - ref).abs().max().item() <= 2e-2, lens


def _capture(call):
    """(graph, outputs of call) captured on a side stream after one warm-up (torch.cuda.graph's
    recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = call()
    return graph, outs


@needs_varlen_op
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_packed_forward_in_cuda_graph(causal, monkeypatch):
    """varlen_attn captured in a CUDA graph (as transformers' continuous batching captures its
    steps): nothing is read on the host, and each replay computes the offsets it finds then,
    against the float64 reference, LSE included (rows past the last sequence: zeros, +inf).
    Non-causal runs the packed kernel planned from max_q / max_k; causal, exact there only where
    each sequence has as many queries as keys, goes to PyTorch's varlen_attn."""
    layouts = [([200, 56, 1], [70, 300, 9]), ([1, 120, 60], [256, 3, 120]), ([0, 250, 5], [0, 379, 0])]
    if causal:
        layouts = [(a, a) for a, _ in layouts] + [([3, 100, 2], [50, 200, 129])]
    window = (-1, 0) if causal else (-1, -1)
    tq, tk = 260, 379
    q, k, v = packed([tq], [tk], hq=8, hkv=2, d=128, dtype=torch.bfloat16, device="cuda", seed=9)
    cu_q, cu_k = offsets(layouts[0][0], "cuda"), offsets(layouts[0][1], "cuda")
    calls = count_calls(monkeypatch, "_VARLEN_FWD")
    graph, (out, lse) = _capture(lambda: varlen_attn(q, k, v, cu_q, cu_k, tq, tk, window_size=window,
                                                     enable_gqa=True, return_aux=LSE))
    assert len(calls) == (1 if causal else 2)  # (the warm-up outside the capture, and the capture)
    for q_lens, k_lens in layouts:
        cu_q.copy_(offsets(q_lens, "cuda"))
        cu_k.copy_(offsets(k_lens, "cuda"))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = reference(q, k, v, q_lens, k_lens, window)
        tol = 2 * _low_precision_yardstick(q, k, v, q_lens, k_lens, window) + 1e-3
        assert (out.double() - ref).abs().max().item() <= tol, (q_lens, k_lens)
        close(lse, ref_lse, atol=2e-3, rtol=2e-3)


def test_capture_without_a_fused_path_is_a_clear_error(monkeypatch):
    """Under CUDA graph capture (posed on the CPU: only the decision is tested) a call that no
    fused path takes and PyTorch's function cannot take either raises, naming the capture, and
    explain_varlen says the same; outside capture the same call runs the loop."""
    q_lens = [3, 5]
    q, k, v = packed(q_lens)
    args = (q, k, v, offsets(q_lens), offsets(q_lens), 5, 5)
    assert explain_varlen(*args).startswith("per-sequence loop")
    monkeypatch.setattr(varlen_mod, "_capturing", lambda query: True)
    assert explain_varlen(*args).startswith("cannot run inside CUDA graph capture: dtype torch.float32")
    with pytest.raises(RuntimeError, match="cannot run this call inside CUDA graph capture"):
        varlen_attn(*args)


@needs_varlen_op
@hopper_only
def test_cuda_packed_forward_compiles():
    q_lens = [100, 3, 200]
    q, k, v = packed(q_lens, hq=8, hkv=8, d=64, dtype=torch.float16, device="cuda")
    cu = offsets(q_lens, "cuda")
    f = torch.compile(lambda q, k, v: varlen_attn(q, k, v, cu, cu, 200, 200, window_size=(-1, 0)),
                      fullgraph=True)
    close(f(q, k, v), reference(q, k, v, q_lens, q_lens, (-1, 0))[0], atol=1e-2, rtol=1e-2)


def test_packed_forward_declines():
    """The metadata rule (_varlen_fwd_declines) on CPU tensors: each reason named."""
    q, k, v = packed([4], hq=2, hkv=2, d=64, dtype=torch.float16)
    declines = lambda **kw: varlen_mod._varlen_fwd_declines(
        kw.get("q", q), k, kw.get("v", v), kw.get("cu_seq_k", offsets([4])), kw.get("used"),
        kw.get("table"), kw.get("left", -1), kw.get("right", -1), kw.get("scale", 0.125))
    if varlen_mod._VARLEN_FWD is None:
        assert declines() == "the op library has no _varlen_fwd"
        return
    assert "not on CUDA" in declines()
    assert "paged" in declines(used=torch.tensor([4], dtype=I32))
    assert "window" in declines(left=2, right=0)
    assert "window" in declines(right=3)
    assert "head dim" in declines(q=q[..., :32], v=v[..., :32])
    assert "dtype" in declines(q=q.float())
    assert "scale" in declines(scale=-1.0)


@pytest.mark.parametrize("q_lens,k_lens,causal,want", [
    ([4, 0], [4, 3], True, (4, 4, 4, False, 7)),
    ([4, 0], [4, 3], False, (4, 4, 4, False, 7)),
    ([4], [5], True, None),  # causal with Sq != Sk: the loop (bottom-right)
    ([4], [5], False, (4, 5, 4, False, 5)),
    ([0, 0], [5, 1], False, None),  # no query at all
    ([3, 2], [0, 6], False, (3, 6, 5, True, 6)),  # a sequence with no key
], ids=str)
def test_packed_forward_plan(q_lens, k_lens, causal, want):
    """_varlen_fwd_plan on CPU offsets: what it takes, and None where the values send the call
    to _plan (which raises for bad offsets: checked there by test_bad_arguments)."""
    q, k, _ = packed(q_lens, k_lens, extra_q=1)
    plan = varlen_mod._varlen_fwd_plan(q, k, offsets(q_lens), offsets(k_lens), 8, 8, causal)
    assert (None if plan is None else tuple(plan)) == want


@pytest.mark.parametrize("cu_q,cu_k,max_q,max_k", [
    ([1, 4], [0, 4], 8, 8),  # not from 0
    ([0, 4, 3], [0, 4, 8], 8, 8),  # decreasing
    ([0, 40], [0, 4], 64, 8),  # past query's rows
    ([0, 4], [0, 4], 3, 8),  # max_q below the longest
    ([0, 4], [0, 4], 8, 3),
], ids=str)
def test_packed_forward_plan_leaves_bad_offsets_to_plan(cu_q, cu_k, max_q, max_k):
    q, k, _ = packed([4], [8], extra_q=2)
    as_t = lambda xs: torch.tensor(xs, dtype=I32)
    assert varlen_mod._varlen_fwd_plan(q, k, as_t(cu_q), as_t(cu_k), max_q, max_k, False) is None


def test_packed_forward_plan_cache(monkeypatch):
    """_cached_varlen_fwd_plan reads the offsets again exactly when a cached plan could be stale:
    other offset tensors, offsets written in place, other sizes or bounds; never for inference
    tensors (no version counter)."""
    reads = []
    real = varlen_mod._varlen_fwd_plan
    monkeypatch.setattr(varlen_mod, "_varlen_fwd_plan", lambda *a: reads.append(1) or real(*a))
    monkeypatch.setattr(varlen_mod, "_last_varlen_plan", None)
    q, k, _ = packed([4, 3], [4, 3], extra_q=1)
    cu = offsets([4, 3])

    def plan(cu_q=cu, cu_k=cu, q_=q, max_q=8, causal=True):
        before = len(reads)
        got = varlen_mod._cached_varlen_fwd_plan(q_, k, cu_q, cu_k, max_q, 8, causal)
        return got, len(reads) - before

    first, n = plan()
    assert n == 1 and tuple(first) == (4, 4, 7, False, 7)
    assert plan() == (first, 0)  # same tensors, unwritten: no read
    assert plan(max_q=16)[1] == 1  # another bound
    assert plan(causal=False)[1] == 1
    assert plan(q_=q[:-1])[1] == 1  # another query size
    assert plan()[1] == 1 and plan()[1] == 0
    cu[1] = 4  # written in place (same values): read again
    assert plan()[1] == 1 and plan()[1] == 0
    other = offsets([4, 3])
    assert plan(cu_q=other, cu_k=other)[1] == 1  # equal values, other tensors
    cu[1] = 5  # a write that changes the plan
    got, n = plan()
    assert n == 1 and tuple(got) == (5, 5, 7, False, 7)
    with torch.inference_mode():
        frozen = offsets([4, 3])
    assert plan(cu_q=frozen, cu_k=frozen)[1] == 1 and plan(cu_q=frozen, cu_k=frozen)[1] == 1


# ---- the fused packed backward (torch.ops.flashcore._varlen_bwd: the Hopper backward, one launch) -

VARLEN_BWD = getattr(torch.ops.flashcore, "_varlen_bwd", None)


def _fused_bwd_here():
    return VARLEN_BWD is not None and _hopper()


fused_bwd_only = pytest.mark.skipif(not _fused_bwd_here(),
                                    reason="the packed backward is the sm_90 family's (and needs flashcore::_varlen_bwd)")


def _poison_allocator():
    torch.empty(64 << 20, device="cuda").fill_(float("nan"))  # what the ops allocate next starts as NaN


@fused_bwd_only
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", list(PACKED_LAYOUTS))
def test_cuda_packed_backward_is_one_launch(layout, causal, dtype, d, monkeypatch):
    """Gradients of out and LSE (both weighted) against the float64 reference, GQA 8:2, query
    rows past the last sequence (extra_q) and key rows past the last sequence (an extra key row):
    dq zero there, dk / dv zero there; everything the ops allocate poisoned with NaN first. One
    launch of the fused backward wherever the packed forward ran (causal with Sq != Sk: the loop)."""
    q_lens, k_lens = PACKED_LAYOUTS[layout]
    k_lens = q_lens if k_lens is None else k_lens
    window = (-1, 0) if causal else (-1, -1)
    hq, hkv = 8, 2
    q, k, v = packed(q_lens, k_lens, hq=hq, hkv=hkv, d=d, dtype=dtype, device="cuda", extra_q=3,
                     seed=len(q_lens) + d + 7)
    k, v = (torch.cat((t, t[:1])) for t in (k, v))  # a key row of no sequence
    fused = not causal or all(a in (0, b) for a, b in zip(q_lens, k_lens))
    g = torch.Generator().manual_seed(d + len(q_lens))
    wo = torch.randn(q.shape, generator=g).to("cuda", dtype)
    wl = torch.randn(hq, q.shape[0], generator=g).to("cuda")
    calls = count_calls(monkeypatch, "_VARLEN_BWD")

    def ours(q, k, v):
        return run(q, k, v, q_lens, k_lens, window_size=window, enable_gqa=True, return_aux=LSE)

    def ref(q, k, v):
        return reference(q, k, v, q_lens, k_lens, window)

    _poison_allocator()
    got = grads(ours, q, k, v, wo, wl)
    assert len(calls) == int(fused)
    want = grads(ref, q, k, v, wo, wl)
    for name, a, b in zip("qkv", got, want):
        assert not a.isnan().any(), name
        err = (a.double() - b).abs().max().item()
        assert err <= 2e-2 * max(b.abs().max().item(), 1.0), (name, err)
    n_q, n_k = sum(q_lens), sum(k_lens)
    assert (got[0][n_q:] == 0).all() and (got[1][n_k:] == 0).all() and (got[2][n_k:] == 0).all()


@fused_bwd_only
def test_cuda_packed_backward_many_sequences_and_long_ones(monkeypatch):
    """Hundreds of sequences (the key-block list sorted by work, the persistent grid's order), one
    longer than a causal chunk, D=128 bf16 causal, GQA 4:1, against the float64 reference."""
    q_lens = [4097] + [1, 17, 64, 127, 128, 129] * 40 + [1000]
    q, k, v = packed(q_lens, hq=4, hkv=1, d=128, dtype=torch.bfloat16, device="cuda", seed=9)
    g = torch.Generator().manual_seed(9)
    wo = torch.randn(q.shape, generator=g).to("cuda", torch.bfloat16)
    wl = torch.zeros(4, q.shape[0], device="cuda")
    calls = count_calls(monkeypatch, "_VARLEN_BWD")

    def ours(q, k, v):
        return run(q, k, v, q_lens, q_lens, window_size=(-1, 0), enable_gqa=True, return_aux=LSE)

    def ref(q, k, v):
        return reference(q, k, v, q_lens, q_lens, (-1, 0))

    got = grads(ours, q, k, v, wo, wl)
    assert len(calls) == 1
    for name, a, b in zip("qkv", got, grads(ref, q, k, v, wo, wl)):
        err = (a.double() - b).abs().max().item()
        assert err <= 2e-2 * max(b.abs().max().item(), 1.0), (name, err)


@fused_bwd_only
def test_cuda_packed_backward_strided_views_and_compile(monkeypatch):
    """q, k, v as views of one (T, 3, H, D) buffer (strided rows) under torch.compile(fullgraph):
    the fused backward runs and its gradients match the eager call's (dq is summed in any order,
    so its last bits may differ: dk and dv are equal)."""
    q_lens = [130, 1, 64, 0, 257]
    t, h, d = sum(q_lens), 4, 64
    g = torch.Generator().manual_seed(6)
    base = torch.randn(t, 3, h, d, generator=g).to("cuda", torch.float16)
    calls = count_calls(monkeypatch, "_VARLEN_BWD")
    cu = offsets(q_lens, "cuda")

    def loss(qkv):
        out = varlen_attn(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, 257, 257, window_size=(-1, 0))
        return (out.float() * torch.arange(d, device="cuda")).sum()

    eager = base.clone().requires_grad_()
    loss(eager).backward()
    compiled = base.clone().requires_grad_()
    torch.compile(loss, fullgraph=True)(compiled).backward()
    assert len(calls) == 2
    torch.testing.assert_close(compiled.grad[:, 1:], eager.grad[:, 1:], atol=0, rtol=0)
    torch.testing.assert_close(compiled.grad[:, 0], eager.grad[:, 0], atol=2e-3, rtol=2e-3)


# ---- training calls to PyTorch's varlen_attn (_training_goes_to_torch) -------------------------

def test_training_route_stays_on_cpu():
    q, k, v = (t.requires_grad_() for t in packed([4], hq=2, hkv=2, d=64, dtype=torch.float16))
    cu = offsets([4])
    assert not varlen_mod._training_goes_to_torch(q, k, v, cu, cu, 4, 4, None, None, (-1, 0), False, None,
                                                  None)


@cuda_only
@needs_torch_varlen
@pytest.mark.parametrize("forced", [False, True], ids=["auto", "FLASHCORE_TRAINING=flashcore"])
def test_cuda_training_goes_to_pytorch_varlen(forced, monkeypatch):
    """A causal training call without the LSE runs in PyTorch's varlen_attn where the fused
    packed backward does not take it (FlashCore's per-sequence loop is slower): here on GPUs other
    than Hopper, and on Hopper in deterministic mode; FLASHCORE_TRAINING=flashcore keeps it here,
    and an LSE request too. Gradients against the float64 reference either way."""
    if forced:
        monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    torch_calls, real = [], varlen_mod._TORCH_ORIGINAL

    def counted(*args, **kw):
        torch_calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(varlen_mod, "_TORCH_ORIGINAL", counted)
    q_lens = [130, 1, 64, 257]
    q, k, v = packed(q_lens, hq=8, hkv=8, d=64, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(3)
    wo = torch.randn(q.shape, generator=g).to("cuda", torch.bfloat16)

    def ours(q, k, v):
        return run(q, k, v, q_lens, q_lens, window_size=(-1, 0)), None

    def ref(q, k, v):
        return reference(q, k, v, q_lens, q_lens, (-1, 0))[0], None

    def grads_out(fn):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out, _ = fn(*leaves)
        return torch.autograd.grad(out, leaves, wo.to(out.dtype))

    for got, want in zip(grads_out(ours), grads_out(ref)):
        assert (got.double() - want).abs().max().item() <= 2e-2 * max(want.abs().max().item(), 1.0)
    to_torch = 0 if forced or _fused_bwd_here() else 1
    assert len(torch_calls) == to_torch
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    run(*leaves, q_lens, q_lens, window_size=(-1, 0), return_aux=LSE)  # the LSE: ours
    assert len(torch_calls) == to_torch
    if _fused_bwd_here() and not forced:  # deterministic mode: no fused packed backward
        with torch.backends.cudnn.flags(deterministic=True):
            torch.use_deterministic_algorithms(True)
            try:
                grads_out(ours)
            finally:
                torch.use_deterministic_algorithms(False)
        assert len(torch_calls) == 1


# ---- explain_varlen ------------------------------------------------------------------------------

def test_explain_varlen_on_cpu():
    q_lens = [4, 3]
    q, k, v = packed(q_lens, hq=2, hkv=2, d=64, dtype=torch.float16)
    cu = offsets(q_lens)
    words = flashcore.explain_varlen(q, k, v, cu, cu, 4, 4, window_size=(-1, 0))
    expected = ("per-sequence loop: not on CUDA" if varlen_mod._VARLEN_FWD is not None
                else "per-sequence loop: the op library has no _varlen_fwd")
    assert words == expected
    grads = [t.requires_grad_() for t in (q, k, v)]
    assert flashcore.explain_varlen(*grads, cu, cu, 4, 4).endswith("; backward: per-sequence loop")
    with pytest.raises(ValueError, match="cu_seq_k may be None only with block_table"):
        flashcore.explain_varlen(q, k, v, cu, None, 4, 4)


@cuda_only
@needs_varlen_op
def test_cuda_explain_varlen():
    """explain_varlen names the path the call then takes (on Hopper: fused; elsewhere the loop),
    and the training route."""
    q_lens = [100, 3, 200]
    q, k, v = packed(q_lens, hq=8, hkv=2, d=128, dtype=torch.bfloat16, device="cuda")
    cu = offsets(q_lens, "cuda")
    words = flashcore.explain_varlen(q, k, v, cu, cu, 200, 200, window_size=(-1, 0), enable_gqa=True)
    if _hopper():
        assert words == "fused packed forward (one launch of the sm90 forward)"
    else:
        assert words.startswith("per-sequence loop: not a Hopper GPU")
    cu_k = offsets([101, 3, 200], "cuda")
    k2, v2 = (torch.cat((t, t[:1])) for t in (k, v))
    words = flashcore.explain_varlen(q, k2, v2, cu, cu_k, 200, 201, window_size=(-1, 0), enable_gqa=True)
    if _hopper():  # causal with Sq != Sk in a sequence: the loop (bottom-right)
        assert words.startswith("per-sequence loop: the offsets' values")
    grads = [t.detach().requires_grad_() for t in (q, k, v)]
    words = flashcore.explain_varlen(*grads, cu, cu, 200, 200, window_size=(-1, 0), enable_gqa=True)
    if _fused_bwd_here():
        assert words == ("fused packed forward (one launch of the sm90 forward); "
                         "backward: fused packed backward (one launch of the sm90 backward)")
    elif varlen_mod._TORCH_ORIGINAL is not None:
        assert words.startswith("torch varlen_attn: a training call")


def test_op_takes_the_path_explain_reports(monkeypatch):
    """_varlen_op runs the one-launch path _forward_path names, with its plan (the fused op
    stubbed, the Hopper checks passed, on CPU tensors): packed for causal sequences with as many
    queries as keys, the loop for a decode-like call; explain_varlen reports the same."""
    monkeypatch.setattr(varlen_mod, "_varlen_fwd_declines", lambda *a: None)
    monkeypatch.setattr(varlen_mod, "_last_varlen_plan", None)
    seen = []

    def fused(q, k, v, cu_q, cu_k, plan, causal, scale):
        seen.append((tuple(plan), causal))
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[-1]), q.new_zeros(q.shape[1], q.shape[0])

    monkeypatch.setattr(varlen_mod, "_fused_varlen_fwd", fused)
    q, k, v = packed([4, 3])
    cu = offsets([4, 3])
    varlen_mod._varlen_op(q, k, v, cu, cu, 4, 4, -1, 0, None, False, None, None)
    assert seen == [((4, 4, 7, False, 7), True)]
    assert flashcore.explain_varlen(q, k, v, cu, cu, 4, 4, window_size=(-1, 0)).startswith("fused packed")
    q1, k1, v1 = packed([1, 1], [4, 3])
    cu_q, cu_k = offsets([1, 1]), offsets([4, 3])
    out, _ = varlen_mod._varlen_op(q1, k1, v1, cu_q, cu_k, 1, 4, -1, 0, None, False, None, None)
    assert len(seen) == 1  # the loop (causal with fewer queries than keys)
    assert flashcore.explain_varlen(q1, k1, v1, cu_q, cu_k, 1, 4, window_size=(-1, 0)).startswith("per-sequence loop")
    close(out, reference(q1, k1, v1, [1, 1], [4, 3], (-1, 0))[0], atol=1e-5, rtol=1e-5)
