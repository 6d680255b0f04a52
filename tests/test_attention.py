"""flashcore.attention (python/flashcore/attention.py) on the CPU: SDPA plus window_size and the
causal alignment.

  * the band: Python's _band.band_bounds equals the C layer's fc_band_bounds (the kernels'
    definition, through ctypes) on random and edge cases, huge windows included;
  * results and gradients (q, k, v, a float mask) against a float64 reference written out
    independently (a per-row loop over the keys each row keeps), for both alignments, Sq < Sk
    and Sq > Sk (rows that see no key give zeros, LSE -inf), windows (0, 0), (1, 0), (S - 1, 0),
    asymmetric, larger than S, GQA, with and without a mask; the reference itself differs from
    the unwindowed result in every banded case (so a path that ignored the band would fail);
  * PyTorch's CausalBias masks; clear errors for bad arguments; torch.compile(fullgraph=True).
  * the logit softcap (computed in PyTorch here: no CPU kernel), alone and with a window, a mask
    and sinks; its gradients (the Python backward's softcap term); bad values refused.
The kernels' side (the sm90 forward's band) is tests/test_gpu_attention.py.
"""
import ctypes
import math
import os
import random

import pytest
import torch

import flashcore
from flashcore import _band

pytestmark = pytest.mark.skipif(bool(flashcore.FALLBACK_ONLY),
                                reason="needs FlashCore's compiled library")


def keep_mask(sq, sk, is_causal, window, bottom_right):
    """(Sq, Sk) bool: which keys each row sees, straight from the definition."""
    left, right = window
    keep = torch.zeros(sq, sk, dtype=torch.bool)
    for i in range(sq):
        diag = i + (sk - sq if bottom_right else 0)
        for j in range(sk):
            ok = True
            if left >= 0 and j < diag - left:
                ok = False
            if right >= 0 and j > diag + right:
                ok = False
            if is_causal and j > diag:
                ok = False
            keep[i, j] = ok
    return keep


def reference(q, k, v, keep, mask=None, scale=None, softcap=0.0):
    """float64 softmax(q k^T * scale (softcapped: c tanh(s / c)) + mask, keys outside `keep`
    removed) v and the LSE; rows with no key give zeros and LSE -inf. GQA by repeating k, v over
    each group."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + (torch.zeros_like(s).masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                 else mask)
    s = s.masked_fill(~keep, float("-inf"))
    # Rows with no key get finite stand-in scores, so that no NaN reaches the gradients.
    seen = (s != float("-inf")).any(-1, keepdim=True)
    s = torch.where(seen, s, torch.zeros_like(s))
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.where(seen, torch.exp(s - lse), torch.zeros_like(s))
    lse = torch.where(seen, lse, torch.full_like(lse, float("-inf"))).squeeze(-1)
    return torch.matmul(p, v), lse


# --------------------------------------------------------------------------- the band itself

def _c_band_bounds():
    lib = ctypes.CDLL(os.path.join(os.path.dirname(flashcore.__file__), "libflashcore.so"))
    fn = lib.fc_band_bounds
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
    return fn


def test_band_bounds_equal_the_c_layers():
    fn = _c_band_bounds()
    rng = random.Random(0)
    big = 2 ** 62
    cases = [(1, 1, 1, -1, -1, 1), (5, 3, 1, -1, -1, 1), (3, 5, 1, -1, -1, 1),
             (7, 7, 0, big, big, 0), (7, 9, 1, 2 ** 63 - 1, 0, 1), (4, 4, 0, 0, 0, 0)]
    for _ in range(3000):
        sq, sk = rng.randint(1, 300), rng.randint(1, 300)
        wl = rng.choice([-1, 0, 1, rng.randint(0, 400), big])
        wr = rng.choice([-1, 0, 1, rng.randint(0, 400), big])
        cases.append((sq, sk, rng.randint(0, 1), wl, wr, rng.randint(0, 1)))
    kinds = set()
    for sq, sk, causal, wl, wr, br in cases:
        lo, hi = ctypes.c_int64(), ctypes.c_int64()
        kind = fn(sq, sk, causal, wl, wr, br, ctypes.byref(lo), ctypes.byref(hi))
        band = _band.band_bounds(sq, sk, bool(causal), wl, wr, bool(br))
        assert (kind, lo.value, hi.value) == tuple(band), (sq, sk, causal, wl, wr, br)
        kinds.add(kind)
        if sq <= 40 and sk <= 40:  # the bounds describe the definition's mask
            keep = keep_mask(sq, sk, bool(causal), (min(wl, 10 ** 6), min(wr, 10 ** 6)), bool(br))
            assert torch.equal(_band.band_mask(range(sq), sk, band, "cpu"), keep)
    assert kinds == {0, 1, 2}
    lo, hi = ctypes.c_int64(), ctypes.c_int64()
    assert fn(0, 4, 1, -1, -1, 0, ctypes.byref(lo), ctypes.byref(hi)) == -1
    assert fn(4, 4, 1, -2, -1, 0, ctypes.byref(lo), ctypes.byref(hi)) == -1


# --------------------------------------------------------------------------- results, gradients

CASES = [
    # (Sq, Sk, is_causal, window, alignment, Hq, Hkv)
    (17, 17, True, (-1, -1), "bottom_right", 2, 2),   # = top-left causal: the plain path
    (9, 23, True, (-1, -1), "bottom_right", 2, 1),    # chunk of queries against a cache
    (23, 9, True, (-1, -1), "bottom_right", 2, 2),    # rows with no key
    (31, 31, True, (4, 0), "top_left", 4, 2),
    (31, 31, False, (0, 0), "top_left", 2, 2),
    (31, 31, True, (1, 0), "top_left", 2, 2),
    (40, 40, True, (39, 0), "top_left", 2, 2),        # S - 1: every key, = causal
    (33, 47, False, (5, 3), "bottom_right", 3, 1),    # asymmetric
    (47, 33, False, (2, 6), "top_left", 2, 2),        # top-left, Sq > Sk: late rows see no key
    (12, 12, True, (100, 0), "top_left", 2, 2),       # larger than S
    (1, 37, True, (7, 0), "bottom_right", 4, 1),      # one decoding row, window
]


def _inputs(sq, sk, hq, hkv, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, s: torch.randn(2, h, s, d, generator=g, dtype=torch.float64).requires_grad_()
    return mk(hq, sq), mk(hkv, sk), mk(hkv, sk)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}-c{int(c[2])}-w{c[3][0]}_{c[3][1]}-{c[4]}")
def test_matches_the_reference(case):
    sq, sk, causal, window, alignment, hq, hkv = case
    q, k, v = _inputs(sq, sk, hq, hkv)
    keep = keep_mask(sq, sk, causal, window, alignment == "bottom_right")
    out, lse = flashcore.attention(q, k, v, is_causal=causal, causal_alignment=alignment,
                                   window_size=window, enable_gqa=hq != hkv, return_lse=True)
    ref, ref_lse = reference(q, k, v, keep)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    torch.testing.assert_close(lse[torch.isfinite(lse)], ref_lse[torch.isfinite(ref_lse)])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for g, rg in zip(grads, ref_grads):
        torch.testing.assert_close(g, rg, rtol=1e-9, atol=1e-9)
    # The band matters here: the reference without it differs (a path that ignored the
    # window / alignment would fail above), except where the band is every key or plain causal.
    plain, _ = reference(q, k, v, keep_mask(sq, sk, causal, (-1, -1), False))
    band = _band.band_bounds(sq, sk, causal, *window, alignment == "bottom_right")
    assert (band.kind == _band.OTHER) == (not torch.allclose(plain, ref))


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_window_with_a_mask(mask_kind):
    """A padding mask beside a window (HuggingFace's sliding-window models): both apply; a float
    mask gets its gradient."""
    sq = sk = 29
    q, k, v = _inputs(sq, sk, 2, 2, seed=1)
    g = torch.Generator().manual_seed(2)
    pad = torch.ones(2, 1, 1, sk, dtype=torch.bool)
    pad[0, ..., :5] = False  # left padding of the first sequence
    mask = pad if mask_kind == "bool" else torch.zeros(2, 1, 1, sk, dtype=torch.float64).masked_fill(
        ~pad, float("-inf")).add(torch.randn(2, 1, 1, sk, generator=g, dtype=torch.float64) * 0.1)
    if mask_kind == "float":
        mask = mask.requires_grad_()
    keep = keep_mask(sq, sk, True, (6, 0), False)
    out = flashcore.attention(q, k, v, mask, is_causal=True, window_size=(6, 0))
    ref, _ = reference(q, k, v, keep, mask)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    inputs = (q, k, v) + ((mask,) if mask_kind == "float" else ())
    dout = torch.randn_like(out)
    for g_, rg in zip(torch.autograd.grad(out, inputs, dout), torch.autograd.grad(ref, inputs, dout)):
        torch.testing.assert_close(g_, rg, rtol=1e-9, atol=1e-9)


def test_causal_bias_masks():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left
    q, k, v = _inputs(9, 21, 2, 2, seed=3)
    for bias, br in ((causal_lower_right(9, 21), True), (causal_upper_left(9, 21), False)):
        out = flashcore.attention(q, k, v, bias)
        ref, _ = reference(q, k, v, keep_mask(9, 21, True, (-1, -1), br))
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="is_causal must be False"):
        flashcore.attention(q, k, v, causal_lower_right(9, 21), is_causal=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(window_size=(-2, 0)), "window_size"),
    (dict(window_size=(3,)), "window_size"),
    (dict(window_size=(1.5, 0)), "window_size"),
    (dict(causal_alignment="lower_right"), "causal_alignment"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    q, k, v = _inputs(4, 4, 1, 1)
    with pytest.raises(ValueError, match=match):
        flashcore.attention(q, k, v, **kwargs)


@pytest.mark.parametrize("case", ["mask with a window", "mask with a softcap", "heads with a softcap",
                                  "mask with a window, compiled"])
def test_bad_tensors_get_the_ops_messages(case):
    """Where PyTorch computes with the tensors before a FlashCore op would (the band joined to the
    mask, a softcap no kernel takes), bad tensors get the op's messages, which name the argument,
    not PyTorch's broadcasting errors; under torch.compile too (the fake checks them)."""
    q, k, v = (t.detach() for t in _inputs(5, 9, 2, 2))
    mask = torch.ones(5, 10, dtype=torch.bool)  # one key too many
    if case == "heads with a softcap":
        k, v = k[:, :1].expand(2, 3, 9, 16), v[:, :1].expand(2, 3, 9, 16)
        call, match = lambda: flashcore.attention(q, k, v, softcap=5.0), "key has 3 heads and query has 2"
    elif case == "mask with a softcap":
        call, match = lambda: flashcore.attention(q, k, v, mask, softcap=5.0), r"attn_mask of shape \[5, 10\]"
    else:
        call, match = lambda: flashcore.attention(q, k, v, mask, window_size=(2, 0)), r"attn_mask of shape \[5, 10\]"
    if case.endswith("compiled"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v, m: flashcore.attention(q, k, v, m, window_size=(2, 0)),
                                 fullgraph=True, backend="eager")
        call = lambda: compiled(q, k, v, mask)
    with pytest.raises(RuntimeError, match=match):
        call()


def test_the_op_refuses_a_band_without_a_kernel():
    """sdpa_fwd itself never drops a band aten cannot express (attention passes a mask instead)."""
    q, k, v = (t.detach() for t in _inputs(8, 8, 1, 1))
    with pytest.raises(RuntimeError, match="window"):
        torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, True, window_left=2, window_right=0)
    with pytest.raises(RuntimeError, match="window_size"):
        torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, True, window_left=-3)
    # a band that is plain causal is aten's is_causal
    out, _ = torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, True, bottom_right=True)
    torch.testing.assert_close(out, reference(q, k, v, keep_mask(8, 8, True, (-1, -1), False))[0])


def test_compiles_without_graph_breaks():
    q, k, v = _inputs(24, 24, 2, 2, seed=4)

    def f(q, k, v):
        return flashcore.attention(q, k, v, is_causal=True, window_size=(5, 0)).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def reference_with_sinks(q, k, v, keep, sinks):
    """float64: the sink as one more logit per row (a key with no value), as gpt-oss defines it."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    sink_col = sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    logits = torch.cat([s, sink_col], dim=-1)
    # (a row with no key and a -inf sink gives zeros and LSE -inf, with no NaN in the gradients)
    seen = (logits != float("-inf")).any(-1, keepdim=True)
    logits = torch.where(seen, logits, torch.zeros_like(logits))
    p = torch.where(seen, torch.softmax(logits, dim=-1), torch.zeros_like(logits))[..., :-1]
    lse = torch.where(seen, torch.logsumexp(logits, -1, keepdim=True), float("-inf")).squeeze(-1)
    return torch.matmul(p, v), lse


@pytest.mark.parametrize("window, alignment, sq, sk", [
    ((-1, -1), "top_left", 19, 19), ((3, 0), "top_left", 19, 19), ((-1, -1), "bottom_right", 23, 9)])
def test_sinks(window, alignment, sq, sk):
    """Sinks: results, LSE and gradients (q, k, v and the sinks) against the float64 definition,
    with -inf, 0 and large sink logits among the heads; the no-sink answer differs."""
    q, k, v = _inputs(sq, sk, 4, 2, seed=5)
    sinks = torch.tensor([float("-inf"), 0.0, 2.5, 30.0], dtype=torch.float64, requires_grad=True)
    keep = keep_mask(sq, sk, True, window, alignment == "bottom_right")
    out, lse = flashcore.attention(q, k, v, is_causal=True, causal_alignment=alignment,
                                   window_size=window, enable_gqa=True, sinks=sinks, return_lse=True)
    ref, ref_lse = reference_with_sinks(q, k, v, keep, sinks)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse)
    assert not torch.allclose(reference(q, k, v, keep)[0], ref)  # the sinks matter here
    dout = torch.randn_like(out)
    inputs = (q, k, v, sinks)
    for g, rg in zip(torch.autograd.grad((out * dout).sum() + lse.sum(), inputs),
                     torch.autograd.grad((ref * dout).sum() + ref_lse.sum(), inputs)):
        torch.testing.assert_close(g, rg, rtol=1e-8, atol=1e-9)


def test_bad_sinks_name_the_argument():
    q, k, v = _inputs(4, 4, 2, 2)
    for bad in (torch.zeros(3, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64),
                torch.zeros(2, dtype=torch.int64)):
        with pytest.raises(ValueError, match="sinks"):
            flashcore.attention(q, k, v, sinks=bad)


# --------------------------------------------------------------------------- the logit softcap

@pytest.mark.parametrize("softcap", [0.5, 30.0])
@pytest.mark.parametrize("case", [
    dict(sq=19, sk=19, is_causal=True),
    dict(sq=9, sk=21, is_causal=True, causal_alignment="bottom_right", window_size=(4, 0)),
    dict(sq=21, sk=9, is_causal=False, window_size=(2, 3)),
    dict(sq=13, sk=13, is_causal=False, mask="bool"),
    dict(sq=13, sk=17, is_causal=False, mask="float"),
], ids=["causal", "bottom_right_window", "window_sq_gt_sk", "bool_mask", "float_mask"])
def test_softcap(case, softcap):
    """Results, LSE and gradients (q, k, v, a float mask) against the float64 definition; the
    softcap changes the answer (a path that ignored it would fail)."""
    case = dict(case)
    sq, sk, mask_kind = case.pop("sq"), case.pop("sk"), case.pop("mask", None)
    q, k, v = _inputs(sq, sk, 4, 2, seed=7)
    q, k = q.detach().mul(3).requires_grad_(), k.detach().mul(3).requires_grad_()  # scores the cap bends
    mask = None
    if mask_kind == "bool":
        mask = torch.rand(1, 1, sq, sk, generator=torch.Generator().manual_seed(3)) > 0.3
    elif mask_kind == "float":
        mask = torch.randn(2, 1, sq, sk, dtype=torch.float64, requires_grad=True)
    keep = keep_mask(sq, sk, case.get("is_causal", False), case.get("window_size", (-1, -1)),
                     case.get("causal_alignment") == "bottom_right")
    out, lse = flashcore.attention(q, k, v, mask, enable_gqa=True, softcap=softcap,
                                   return_lse=True, **case)
    ref, ref_lse = reference(q, k, v, keep, mask, softcap=softcap)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, ref_lse)
    assert not torch.allclose(reference(q, k, v, keep, mask)[0], ref)
    dout = torch.randn_like(out)
    inputs = (q, k, v) + ((mask,) if mask is not None and mask.requires_grad else ())
    for g, rg in zip(torch.autograd.grad((out * dout).sum() + lse.sum(), inputs),
                     torch.autograd.grad((ref * dout).sum() + ref_lse.sum(), inputs)):
        torch.testing.assert_close(g, rg, rtol=1e-8, atol=1e-9)


def test_softcap_with_sinks():
    q, k, v = _inputs(15, 15, 4, 2, seed=8)
    sinks = torch.tensor([float("-inf"), 0.0, 2.5, 30.0], dtype=torch.float64, requires_grad=True)
    keep = keep_mask(15, 15, True, (-1, -1), False)
    out = flashcore.attention(q, k, v, is_causal=True, enable_gqa=True, softcap=2.0, sinks=sinks)
    group = 2
    s = torch.matmul(q, k.repeat_interleave(group, 1).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = (2.0 * torch.tanh(s / 2.0)).masked_fill(~keep, float("-inf"))
    logits = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    ref = torch.matmul(torch.softmax(logits, -1)[..., :-1], v.repeat_interleave(group, 1))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    dout = torch.randn_like(out)
    for g, rg in zip(torch.autograd.grad((out * dout).sum(), (q, k, v, sinks)),
                     torch.autograd.grad((ref * dout).sum(), (q, k, v, sinks))):
        torch.testing.assert_close(g, rg, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), "30", True])
def test_bad_softcap_names_the_argument(bad):
    q, k, v = _inputs(4, 4, 2, 2)
    with pytest.raises(ValueError, match="softcap"):
        flashcore.attention(q, k, v, softcap=bad)
    if isinstance(bad, float):  # the ops say so too
        with pytest.raises(RuntimeError, match="softcap"):
            torch.ops.flashcore.explain(q, k, v, softcap=bad)


def test_the_op_refuses_a_softcap_without_a_kernel():
    """sdpa_fwd never drops a softcap (aten has none); flashcore.attention computes it instead,
    and explain_attention says so."""
    q, k, v = (t.detach() for t in _inputs(8, 8, 1, 1))
    with pytest.raises(RuntimeError, match="softcap"):
        torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, True, softcap=30.0)
    words = flashcore.explain_attention(q, k, v, is_causal=True, softcap=30.0)
    assert words.startswith("PyTorch") and "softcap" in words, words


def test_softcap_compiles_without_graph_breaks():
    q, k, v = _inputs(24, 24, 2, 2, seed=4)

    def f(q, k, v):
        return flashcore.attention(q, k, v, is_causal=True, window_size=(5, 0), softcap=3.0).sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(f(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
