"""CPU tests of torch.compile, fake tensors and autograd for the FlashCore ops.

  * flashcore::sdpa_fwd returns (out, lse): out equal to aten's SDPA bit for bit (the CPU path
    is aten), lse equal to a float64 log-sum-exp of the scaled, masked scores;
  * 4-D outputs lie in storage ordered as the query's (tests/sdpa_layout.py), and the fakes give
    the same sizes, strides and dtypes (torch.library.opcheck with every test util, for every op);
  * gradients through torch.ops.flashcore.sdpa equal F.scaled_dot_product_attention's in float64,
    and torch.autograd.gradcheck passes (causal with Sq != Sk, GQA, scale, masks with and
    without a mask gradient, broadcast batch, 3-D, fully masked rows, dropout via aten);
  * torch.compile(fullgraph=True, dynamic=True) compiles a module calling the op once, with no
    graph break, for several sequence lengths, and matches eager forward and backward.
"""
import importlib.util
import os
import sys

import pytest
import torch
import torch.nn.functional as F

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402
from attention_block import Attention as _AttentionBlock, compiled_matches_eager  # noqa: E402
from sdpa_layout import has_sdpa_layout  # noqa: E402

SDPA = torch.ops.flashcore.sdpa.default


@pytest.fixture(autouse=True)
def _flashcore_training(monkeypatch):
    """Training calls on FlashCore's ops (sdpa_fwd, sdpa_bwd: what GPU training calls run): on
    the CPU the training route would send them to aten (tests/test_training_route.py)."""
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
FWD = torch.ops.flashcore.sdpa_fwd.default
BWD = torch.ops.flashcore.sdpa_bwd.default
EXPLAIN = torch.ops.flashcore.explain.default
ALL_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")

# name -> q shape, k shape, and options (v_d: value head dim; mask: (shape, kind))
CASES = {
    "plain": dict(q=(2, 3, 17, 16), k=(2, 3, 23, 16)),
    "causal": dict(q=(2, 3, 17, 16), k=(2, 3, 17, 16), is_causal=True),
    "causal_sq_lt_sk": dict(q=(1, 2, 5, 16), k=(1, 2, 11, 16), is_causal=True),
    "causal_sq_gt_sk": dict(q=(1, 2, 11, 16), k=(1, 2, 5, 16), is_causal=True),
    "scale": dict(q=(2, 2, 9, 8), k=(2, 2, 13, 8), scale=0.3),
    "gqa": dict(q=(2, 8, 9, 16), k=(2, 2, 13, 16), enable_gqa=True),
    "gqa_causal": dict(q=(2, 6, 13, 16), k=(2, 3, 9, 16), enable_gqa=True, is_causal=True),
    "mqa": dict(q=(1, 4, 7, 16), k=(1, 1, 7, 16), enable_gqa=True),
    "bool_mask": dict(q=(2, 3, 9, 16), k=(2, 3, 12, 16), mask=((2, 1, 9, 12), "bool")),
    "bool_mask_2d": dict(q=(2, 3, 9, 16), k=(2, 3, 12, 16), mask=((9, 12), "bool")),
    "additive_mask": dict(q=(2, 3, 9, 16), k=(2, 3, 12, 16), mask=((2, 3, 9, 12), "float")),
    "additive_mask_bcast": dict(q=(2, 3, 9, 16), k=(2, 3, 12, 16), mask=((1, 3, 1, 12), "float")),
    "fully_masked_row": dict(q=(1, 2, 6, 8), k=(1, 2, 7, 8), mask=((1, 1, 6, 7), "bool_holes")),
    "value_head_dim_differs": dict(q=(2, 3, 9, 16), k=(2, 3, 9, 16), v_d=24),
    "batch_broadcast": dict(q=(1, 3, 9, 16), k=(2, 3, 9, 16)),
    "3d": dict(q=(4, 9, 16), k=(4, 11, 16)),
    "5d": dict(q=(2, 2, 3, 5, 8), k=(2, 2, 3, 5, 8)),
    "empty_q": dict(q=(2, 3, 0, 16), k=(2, 3, 9, 16)),
    "empty_k": dict(q=(2, 3, 5, 16), k=(2, 3, 0, 16)),
}


# Tiny versions for torch.autograd.gradcheck (two forwards per input element).
GRADCHECK_CASES = {
    "gc_plain": dict(q=(1, 2, 5, 8), k=(1, 2, 7, 8)),
    "gc_causal_sq_gt_sk": dict(q=(1, 2, 7, 8), k=(1, 2, 4, 8), is_causal=True),
    "gc_gqa_causal": dict(q=(1, 4, 6, 8), k=(1, 2, 5, 8), enable_gqa=True, is_causal=True),
    "gc_scale": dict(q=(1, 2, 5, 8), k=(1, 2, 6, 8), scale=0.3),
    "gc_additive_mask_bcast": dict(q=(1, 2, 5, 8), k=(1, 2, 7, 8), mask=((1, 2, 1, 7), "float")),
    "gc_bool_mask": dict(q=(1, 2, 5, 8), k=(1, 2, 7, 8), mask=((1, 1, 5, 7), "bool")),
    "gc_batch_broadcast": dict(q=(1, 2, 5, 8), k=(2, 2, 5, 8)),
    "gc_3d": dict(q=(2, 5, 8), k=(2, 6, 8)),
    "gc_value_head_dim_differs": dict(q=(1, 2, 5, 8), k=(1, 2, 6, 8), v_d=6),
}


def make(name, dtype=torch.float64, requires_grad=False, transposed=False, seed=0):
    case = CASES[name] if name in CASES else GRADCHECK_CASES[name]
    g = torch.Generator().manual_seed(seed)
    q_shape, k_shape = case["q"], case["k"]
    v_shape = k_shape[:-1] + (case.get("v_d", k_shape[-1]),)

    def rand(shape):
        if transposed and len(shape) == 4:  # (B, S, H, D) storage seen as (B, H, S, D)
            b, h, s, d = shape
            return torch.randn(b, s, h, d, generator=g, dtype=dtype).transpose(1, 2)
        return torch.randn(*shape, generator=g, dtype=dtype)

    q, k, v = rand(q_shape), rand(k_shape), rand(v_shape)
    mask = None
    if "mask" in case:
        shape, kind = case["mask"]
        if kind == "bool":
            mask = torch.rand(shape, generator=g) > 0.3
            mask[..., 0] = True
        elif kind == "bool_holes":  # row 2 sees nothing at all
            mask = torch.rand(shape, generator=g) > 0.3
            mask[..., 0] = True
            mask[..., 2, :] = False
        else:
            mask = torch.randn(shape, generator=g, dtype=dtype)
    kwargs = {key: case[key] for key in ("is_causal", "scale", "enable_gqa") if key in case}
    if requires_grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, mask, kwargs


def ref_lse(q, k, mask, is_causal=False, scale=None, enable_gqa=False):
    q, k = q.double(), k.double()
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if is_causal:
        keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s.logsumexp(-1)


# ---- schemas ----------------------------------------------------------------------------------

def test_fwd_schema_takes_sdpa_arguments():
    """SDPA's arguments, then flashcore.attention's band and softcap (keyword-only, defaults:
    none)."""
    ours, aten = FWD._schema, torch.ops.aten.scaled_dot_product_attention.default._schema
    band = [("window_left", "int", -1, True), ("window_right", "int", -1, True),
            ("bottom_right", "bool", False, True), ("softcap", "float", 0.0, True)]
    assert [(a.name, str(a.type), a.default_value, a.kwarg_only) for a in ours.arguments] == \
           [(a.name, str(a.type), a.default_value, a.kwarg_only) for a in aten.arguments] + band
    assert [str(r.type) for r in ours.returns] == ["Tensor", "Tensor"]
    assert [str(r.type) for r in BWD._schema.returns] == ["Tensor"] * 4


# ---- forward with LSE -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64],
                         ids=["fp32", "bf16", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_fwd_out_and_lse(name, dtype):
    q, k, v, mask, kw = make(name, dtype)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(dtype)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask, **kw)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    assert torch.equal(out, expected)
    assert torch.equal(torch.ops.flashcore.sdpa(q, k, v, mask, **kw), expected)
    assert has_sdpa_layout(out, q) and lse.is_contiguous()
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert lse.shape == out.shape[:-1]
    ref = ref_lse(q, k, mask, **kw)
    # fp32: the op's LSE and the reference sum the scores in different orders (cuBLAS on CUDA; on
    # a 16-core CPU the multithreaded matmul), 1 row in 102 was 4.9e-5 off (relative 1.4e-5) on
    # each, so 1e-4 everywhere: still ~100x below what a wrong scale or mask would give.
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    got = lse.double()
    assert torch.equal(torch.isneginf(got), torch.isneginf(ref))  # fully masked rows / Sk = 0
    finite = torch.isfinite(ref)
    torch.testing.assert_close(got[finite], ref[finite], atol=tol, rtol=tol)


def test_fwd_fully_masked_row_lse_is_minus_inf():
    q, k, v, mask, kw = make("fully_masked_row")
    _, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask)
    assert torch.isneginf(lse[..., 2]).all() and torch.isfinite(lse[..., :2]).all()


@pytest.mark.parametrize("name", ["plain", "gqa", "causal_sq_gt_sk"])
@pytest.mark.parametrize("transposed", [False, True])
def test_outputs_in_sdpa_layout_for_any_input_layout(name, transposed):
    q, k, v, mask, kw = make(name, torch.float32, transposed=transposed)
    assert q.is_contiguous() != transposed
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    for out in (torch.ops.flashcore.sdpa(q, k, v, mask, **kw),
                torch.ops.flashcore.sdpa_fwd(q, k, v, mask, **kw)[0]):
        assert has_sdpa_layout(out, q) and torch.equal(out, expected)
        # The query's storage order: (B, S, H, D) views give an output whose usual next step is
        # a view, not a copy; contiguous queries a contiguous output, as PyTorch's cuDNN gives.
        assert out.transpose(1, 2).is_contiguous() if transposed else out.is_contiguous()


def _query_in_storage_order(order, B=2, H=3, S=5, D=8):
    """A (B, H, S, D) query whose storage holds its dims in `order` (a permutation of 0..3)."""
    sizes = (B, H, S, D)
    storage = torch.randn([sizes[i] for i in order], dtype=torch.float64)
    return storage.permute([order.index(i) for i in range(4)])


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (0, 2, 1, 3), (1, 0, 2, 3), (2, 0, 1, 3),
                                   (2, 1, 0, 3), (1, 2, 0, 3)])
@pytest.mark.parametrize("S", [1, 5])
def test_output_follows_any_query_storage_order(order, S):
    """Every storage order of the query's batch, head and sequence dims (and a length of 1, whose
    stride ties with a neighbour's): the output follows it, from the op and from its fake, and
    the output of the aten fallback is in it too."""
    q = _query_in_storage_order(order, S=S)
    k = v = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    expected = F.scaled_dot_product_attention(q, k, v)
    for op in (torch.ops.flashcore.sdpa, lambda *a: torch.ops.flashcore.sdpa_fwd(*a)[0]):
        out = op(q, k, v)
        assert torch.equal(out, expected) and has_sdpa_layout(out, q), (order, out.stride())
    torch.library.opcheck(torch.ops.flashcore.sdpa.default, (q, k, v), test_utils=ALL_UTILS)


@pytest.mark.parametrize("q_shape, kv_shape, q_transposed", [
    ((4, 8, 16), (2, 4, 8, 16), True), ((4, 8, 16), (2, 4, 8, 16), False),
    ((2, 4, 8, 16), (4, 8, 16), True)])
def test_mixed_ranks_output_layout(q_shape, kv_shape, q_transposed):
    """A 3-D query beside 4-D key and value (a 4-D output: batch from key) gets the contiguous
    order; a 4-D query beside 3-D ones its own. The op and its fake agree (opcheck)."""
    q = torch.randn(q_shape, dtype=torch.float64)
    if q_transposed:
        q = q.transpose(-3, -2).contiguous().transpose(-3, -2)
    k = v = torch.randn(kv_shape, dtype=torch.float64)
    out = torch.ops.flashcore.sdpa(q, k, v)
    assert out.dim() == 4 and torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    if q.dim() != 4:
        assert out.is_contiguous()
    else:
        assert has_sdpa_layout(out, q)
    for op in (torch.ops.flashcore.sdpa.default, torch.ops.flashcore.sdpa_fwd.default):
        torch.library.opcheck(op, (q, k, v), test_utils=ALL_UTILS)


@pytest.mark.parametrize("orders", [((0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3)),
                                    ((0, 2, 1, 3), (0, 2, 1, 3), (0, 2, 1, 3)),
                                    ((0, 2, 1, 3), (2, 0, 1, 3), (1, 0, 2, 3))])
def test_grads_follow_each_inputs_storage_order(orders):
    """dq, dk, dv lie as query, key and value do, each after its own input (what PyTorch's cuDNN
    and flash backwards give; a (B, S, H, D) view's gradient then needs no copy): from the
    backward ops on the CPU (the Python reference) and from their fakes (opcheck), and the values
    are aten's."""
    q, k, v = (_query_in_storage_order(o, S=S).requires_grad_() for o, S in zip(orders, (5, 7, 7)))
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, True)
    g = torch.randn_like(out)
    grads = torch.ops.flashcore.sdpa_bwd(g, q, k, v, out, lse, None, None, True, None, False, False)[:3]
    kernel_grads = torch.ops.flashcore.sdpa_bwd_kernel(g, q, k, v, out, lse, None, True, None, False)
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), g)
    for got in (grads, kernel_grads):
        for t, like, ref in zip(got, (q, k, v), expected):
            assert has_sdpa_layout(t, like), (orders, t.stride(), like.stride())
            torch.testing.assert_close(t, ref)
    detached = [t.detach() for t in (g, q, k, v, out, lse)]
    torch.library.opcheck(torch.ops.flashcore.sdpa_bwd.default,
                          (*detached, None, None, True, None, False, False), test_utils=ALL_UTILS)
    torch.library.opcheck(torch.ops.flashcore.sdpa_bwd_kernel.default,
                          (*detached, None, True, None, False), test_utils=ALL_UTILS)


def test_sliced_query_output_is_dense():
    """A query sliced out of a fused projection (not dense: (B, S, 3, H, D) storage) gets a dense
    output in its dims' order, (B, S, H, D)."""
    qkv = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    out = torch.ops.flashcore.sdpa(q, k, v)
    assert out.stride() == (5 * 4 * 8, 8, 4 * 8, 1) and has_sdpa_layout(out, q)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


def test_fwd_rejects_dropout():
    q, k, v, mask, kw = make("plain", torch.float32)
    with pytest.raises(RuntimeError, match="sdpa_fwd: dropout_p must be 0"):
        torch.ops.flashcore.sdpa_fwd(q, k, v, dropout_p=0.1)


def test_fwd_raises_sdpa_errors():
    q, k, v, mask, kw = make("plain", torch.float32)
    with pytest.raises(RuntimeError, match="key must have the same dtype as query"):
        torch.ops.flashcore.sdpa_fwd(q, k.double(), v)


# ---- gradients --------------------------------------------------------------------------------

GRAD_CASES = [n for n in CASES if n not in ("empty_q", "empty_k")]


@pytest.mark.parametrize("name", GRAD_CASES)
def test_grads_match_aten_fp64(name):
    q, k, v, mask, kw = make(name, requires_grad=True)
    inputs = [q, k, v]
    if mask is not None and mask.is_floating_point():
        mask.requires_grad_(True)
        inputs.append(mask)
    out = torch.ops.flashcore.sdpa(q, k, v, mask, **kw)
    assert out.grad_fn is not None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, inputs, grad)
    expected = torch.autograd.grad(ref, inputs, grad)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck(name):
    q, k, v, mask, kw = make(name, requires_grad=True)
    inputs = [q, k, v]
    if mask is not None and mask.is_floating_point():
        mask.requires_grad_(True)
        inputs.append(mask)

    def fn(*ts):
        m = ts[3] if len(ts) > 3 else mask
        return torch.ops.flashcore.sdpa(ts[0], ts[1], ts[2], m, **kw)

    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("name", ["empty_q", "empty_k"])
def test_grads_of_empty_inputs(name):
    q, k, v, mask, kw = make(name, requires_grad=True)
    out = torch.ops.flashcore.sdpa(q, k, v, mask, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    grad = torch.randn_like(ref)
    for g, e in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad)):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e)


def test_grad_through_lse():
    q, k, v, mask, kw = make("gqa_causal", requires_grad=True)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask, **kw)
    w = torch.randn_like(lse)
    got = torch.autograd.grad((out.sum() + (lse * w).sum()), (q, k, v))
    ref = ref_lse(q, k, None, **kw)  # differentiable float64 reference
    ref_out = F.scaled_dot_product_attention(q, k, v, **kw)
    expected = torch.autograd.grad((ref_out.sum() + (ref * w).sum()), (q, k, v))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-9)
    # only the lse used: out's gradient is absent, not materialized
    _, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask, **kw)
    ref = ref_lse(q, k, None, **kw)
    got = torch.autograd.grad((lse * w).sum(), (q, k))
    expected = torch.autograd.grad((ref * w).sum(), (q, k))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-9)


def test_only_some_inputs_require_grad():
    q, k, v, mask, kw = make("gqa")
    k.requires_grad_(True)
    out = torch.ops.flashcore.sdpa(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    (g,) = torch.autograd.grad(out.sum(), k)
    (e,) = torch.autograd.grad(ref.sum(), k)
    torch.testing.assert_close(g, e)


def test_no_grad_path_has_no_graph():
    q, k, v, mask, kw = make("plain", requires_grad=True)
    with torch.no_grad():
        out = torch.ops.flashcore.sdpa(q, k, v)
    assert out.grad_fn is None and not out.requires_grad
    out = torch.ops.flashcore.sdpa(q.detach(), k.detach(), v.detach())
    assert out.grad_fn is None


def test_dropout_grads_go_through_aten():
    q, k, v, mask, kw = make("plain", torch.float32, requires_grad=True)
    torch.manual_seed(1)
    out = flashcore.sdpa(q, k, v, dropout_p=0.3)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    torch.manual_seed(1)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    expected = torch.autograd.grad(ref.sum(), (q, k, v))
    assert torch.equal(out, ref) and has_sdpa_layout(out, q)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def test_double_backward_raises():
    q, k, v, mask, kw = make("plain", requires_grad=True)
    out = torch.ops.flashcore.sdpa(q, k, v)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gq.sum().backward()


def test_bwd_chunking_matches_unchunked(monkeypatch):
    from flashcore import _ops
    q, k, v, mask, kw = make("additive_mask", requires_grad=True)
    mask.requires_grad_(True)
    expected = torch.autograd.grad(torch.ops.flashcore.sdpa(q, k, v, mask).sum(), (q, k, v, mask))
    monkeypatch.setattr(_ops, "_BWD_CHUNK_ELEMS", 1)  # one query row per chunk
    got = torch.autograd.grad(torch.ops.flashcore.sdpa(q, k, v, mask).sum(), (q, k, v, mask))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


# ---- opcheck: schema, autograd registration, fakes, AOT dispatch with dynamic shapes ----------

OPCHECK_CASES = ["plain", "causal_sq_gt_sk", "gqa_causal", "bool_mask", "additive_mask_bcast",
                 "value_head_dim_differs", "batch_broadcast", "3d", "empty_q"]


@pytest.mark.parametrize("transposed", [False, True], ids=["contig", "transposed"])
@pytest.mark.parametrize("name", OPCHECK_CASES)
@pytest.mark.parametrize("op", ["sdpa", "sdpa_fwd"])
def test_opcheck_forward_ops(op, name, transposed):
    q, k, v, mask, kw = make(name, torch.float32, requires_grad=True, transposed=transposed)
    if mask is not None and mask.is_floating_point():
        mask.requires_grad_(True)
    torch.library.opcheck(getattr(torch.ops.flashcore, op).default, (q, k, v, mask), kw,
                          test_utils=ALL_UTILS)


@pytest.mark.parametrize("name", ["plain", "gqa_causal", "additive_mask_bcast", "bool_mask"])
def test_opcheck_bwd(name):
    q, k, v, mask, kw = make(name, torch.float32)
    out, lse = FWD(q, k, v, mask, **kw)
    grad_mask = mask is not None and mask.is_floating_point()
    args = (torch.randn_like(out), q, k, v, out, lse, torch.randn_like(lse), mask,
            kw.get("is_causal", False), kw.get("scale"), kw.get("enable_gqa", False), grad_mask)
    torch.library.opcheck(BWD, args, test_utils=ALL_UTILS)


@pytest.mark.parametrize("name", ["plain", "gqa_causal", "causal_sq_gt_sk"])
def test_opcheck_bwd_kernel_ops(name):
    """The fused backward's ops (torch_op/flashcore_bwd_op.cpp): on the CPU sdpa_bwd_kernel is
    the Python reference and explain_bwd says "not CUDA" (reason 1, no kernel family)."""
    q, k, v, mask, kw = make(name, torch.float32)
    out, lse = FWD(q, k, v, mask, **kw)
    args = (torch.randn_like(out), q, k, v, out, lse, torch.randn_like(lse),
            kw.get("is_causal", False), kw.get("scale"), kw.get("enable_gqa", False))
    torch.library.opcheck(torch.ops.flashcore.sdpa_bwd_kernel.default, args, test_utils=ALL_UTILS)
    torch.library.opcheck(torch.ops.flashcore.explain_bwd.default, args, test_utils=ALL_UTILS)
    assert torch.ops.flashcore.explain_bwd(*args) == (0, 1)  # not CUDA: no family, reason 1
    got = torch.ops.flashcore.sdpa_bwd_kernel(*args)
    exp = BWD(*args[:7], None, *args[7:], False)[:3]
    for g, e in zip(got, exp):
        torch.testing.assert_close(g, e)


def test_opcheck_explain():
    q, k, v, mask, kw = make("gqa", torch.float16)
    torch.library.opcheck(EXPLAIN, (q, k, v, mask), kw, test_utils=ALL_UTILS)


def test_fake_explain_on_cpu_says_not_cuda():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v, mask, kw = make("plain", torch.float16)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert EXPLAIN(fq, fk, fv) == (0, 1)


# ---- torch.compile ----------------------------------------------------------------------------

def Attention():
    """tests/attention_block.py's block at dim 32: head dim 8 (CPU fallback)."""
    return _AttentionBlock(32)


def _compile_check(model, lengths):
    """Inductor's compile of `model` against eager for each length; returns the compile counter."""
    import torch._dynamo.testing
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled_matches_eager(model, counter, lengths)
    return counter


def test_compile_fullgraph_dynamic_matches_eager():
    torch.manual_seed(0)
    counter = _compile_check(Attention(), lengths=(17, 33, 50))
    assert counter.frame_count == 1  # one graph for every length: no recompile


def test_compile_no_grad_inference():
    torch.manual_seed(0)
    model = Attention()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for s in (9, 21):
            x = torch.randn(2, s, 32)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_dynamo_explain_no_graph_break():
    torch._dynamo.reset()
    result = torch._dynamo.explain(Attention())(torch.randn(2, 9, 32))
    assert result.graph_break_count == 0 and result.graph_count == 1


def test_compiled_graph_calls_flashcore_ops():
    """The traced forward/backward graphs hold flashcore's ops, not a decomposition."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.utils import make_boxed_func
    seen = []

    def compiler(gm, _inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    q, k, v, mask, kw = make("gqa_causal", torch.float32, requires_grad=True)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c: torch.ops.flashcore.sdpa(a, b, c, **kw), fullgraph=True,
                       backend=aot_autograd(fw_compiler=compiler, bw_compiler=compiler))
    fn(q, k, v).sum().backward()
    assert "flashcore.sdpa_fwd.default" in seen and "flashcore.sdpa_bwd.default" in seen


@pytest.mark.parametrize("transposed", [False, True], ids=["contig", "transposed"])
def test_inductor_output_layout_matches_eager(transposed):
    """Compiled by inductor with dynamic shapes, the op's output has eager's strides (the query's
    storage order, which the fake promises and the compiled graph assumes), with and without
    gradients, and the same values."""
    q, k, v, mask, kw = make("gqa_causal", torch.float32, requires_grad=True, transposed=transposed)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, b, c: torch.ops.flashcore.sdpa(a, b, c, **kw), fullgraph=True,
                       dynamic=True)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            out, ref = fn(q, k, v), torch.ops.flashcore.sdpa(q, k, v, **kw)
        assert out.stride() == ref.stride() and has_sdpa_layout(out, q), (grad, out.stride())
        torch.testing.assert_close(out, ref)
