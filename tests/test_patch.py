"""flashcore.patch() / unpatch() / patched(): F.scaled_dot_product_attention routed to FlashCore.

CPU tests (the op falls back to aten's SDPA on CPU, so results equal PyTorch's bit for bit);
the GPU test at the end runs where CUDA is present and checks a FlashCore kernel ran.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402
from flashcore.integrations import patch as patch_mod  # noqa: E402
from op_recorder import OpRecorder  # noqa: E402

ORIGINAL = torch._C._nn.scaled_dot_product_attention
FC_SDPA = torch.ops.flashcore.sdpa.default
# A call that records no gradient reaches the op's twin without an Autograd kernel (_entry.py).
FC_SDPA_OPS = (FC_SDPA, torch.ops.flashcore._sdpa_inference.default)


def fc_calls(rec) -> int:
    """FlashCore SDPA calls the recorder saw, through either op."""
    return sum(rec.count(op) for op in FC_SDPA_OPS)


def has_fake() -> bool:
    """Whether flashcore::sdpa can be traced by torch.compile (a fake / Meta kernel exists)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("flashcore::sdpa", "Meta")


needs_fake = pytest.mark.skipif(not has_fake(), reason="flashcore::sdpa has no fake (meta) "
                                "implementation in this build, so torch.compile cannot trace it")


@pytest.fixture(autouse=True)
def _restore():
    """Every test starts and ends with PyTorch's own F.scaled_dot_product_attention."""
    flashcore.unpatch()
    assert F.scaled_dot_product_attention is ORIGINAL
    yield
    flashcore.unpatch()
    assert F.scaled_dot_product_attention is ORIGINAL


def qkv(b=2, hq=4, hkv=4, sq=16, sk=16, d=32, dtype=torch.float32, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)  # noqa: E731
    return mk(b, hq, sq, d), mk(b, hkv, sk, d), mk(b, hkv, sk, d)


# ---- patch / unpatch / patched ------------------------------------------------------------------

def test_exports():
    for name in ("patch", "unpatch", "patched", "is_patched"):
        assert callable(getattr(flashcore, name)) and name in flashcore.__all__


def test_patch_unpatch_idempotent():
    assert not flashcore.is_patched()
    flashcore.unpatch()  # unpatching an unpatched torch does nothing
    assert F.scaled_dot_product_attention is ORIGINAL
    flashcore.patch()
    assert flashcore.is_patched()
    patched_fn = F.scaled_dot_product_attention
    assert patched_fn is not ORIGINAL and patched_fn.__wrapped__ is ORIGINAL
    flashcore.patch()  # twice: still one layer, same function
    assert F.scaled_dot_product_attention is patched_fn
    assert torch.nn.functional.scaled_dot_product_attention is patched_fn
    flashcore.unpatch()
    assert F.scaled_dot_product_attention is ORIGINAL
    flashcore.unpatch()
    assert F.scaled_dot_product_attention is ORIGINAL


def test_context_manager_restores_and_nests():
    with flashcore.patched():
        assert flashcore.is_patched()
        with flashcore.patched():
            assert flashcore.is_patched()
        assert flashcore.is_patched()  # the inner block restores what it found: patched
    assert F.scaled_dot_product_attention is ORIGINAL
    flashcore.patch()
    with flashcore.patched():
        pass
    assert flashcore.is_patched()  # was patched before the block: stays patched


def test_context_manager_restores_on_exception():
    with pytest.raises(ValueError, match="boom"):
        with flashcore.patched():
            raise ValueError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL


def test_refuses_to_stack_on_a_foreign_patch(monkeypatch):
    foreign = lambda *a, **k: None  # noqa: E731
    monkeypatch.setattr(F, "scaled_dot_product_attention", foreign)
    with pytest.raises(RuntimeError, match="already replaced"):
        flashcore.patch()
    flashcore.unpatch()  # not ours: left alone
    assert F.scaled_dot_product_attention is foreign


def test_signature_matches_torch():
    q, k, v = qkv()
    with flashcore.patched():
        with pytest.raises(TypeError):  # scale is keyword-only, as in PyTorch
            F.scaled_dot_product_attention(q, k, v, None, 0.0, False, 0.5)
        with pytest.raises(TypeError):
            F.scaled_dot_product_attention(q, k, v, nonsense=1)


# ---- results: same as PyTorch, through the op ---------------------------------------------------

CASES = {
    "plain": (dict(), dict()),
    "causal": (dict(), dict(is_causal=True)),
    "causal_sq_lt_sk": (dict(sq=5, sk=11), dict(is_causal=True)),
    "scale": (dict(), dict(scale=0.3)),
    "gqa": (dict(hq=8, hkv=2), dict(enable_gqa=True)),
    "gqa_causal": (dict(hq=6, hkv=3, sq=9, sk=13), dict(enable_gqa=True, is_causal=True)),
    "bool_mask": (dict(sk=24), dict(mask=("bool", (2, 1, 16, 24)))),
    "additive_mask": (dict(sk=24), dict(mask=("float", (1, 4, 1, 24)))),
    "positional_args": (dict(), dict(positional=True)),
    "fp64": (dict(dtype=torch.float64), dict(is_causal=True)),
    "bf16": (dict(dtype=torch.bfloat16), dict(is_causal=True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_result_as_torch_through_the_op(name):
    shape, kw = CASES[name]
    kw = dict(kw)
    q, k, v = qkv(**shape)
    mask = kw.pop("mask", None)
    if mask is not None:
        g = torch.Generator().manual_seed(1)
        kind, mshape = mask
        mask = (torch.rand(mshape, generator=g) > 0.3 if kind == "bool"
                else torch.randn(mshape, generator=g, dtype=q.dtype))
    positional = kw.pop("positional", False)
    if positional:
        args, kwargs = (q, k, v, mask, 0.0, True), {}
    else:
        args, kwargs = (q, k, v), dict(attn_mask=mask, **kw)
    expected = ORIGINAL(*args, **kwargs)
    with flashcore.patched(), OpRecorder() as rec:
        out = F.scaled_dot_product_attention(*args, **kwargs)
    assert fc_calls(rec) == 1, rec.ops
    assert out.shape == expected.shape and out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_hf_layout_views():
    """(B, S, H, D) storage viewed as (B, H, S, D), as HuggingFace passes it."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv(hq=8, hkv=2))
    expected = ORIGINAL(q, k, v, is_causal=True, enable_gqa=True)
    with flashcore.patched():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_dropout_goes_through_and_matches_torch_rng():
    q, k, v = qkv()
    torch.manual_seed(3)
    expected = ORIGINAL(q, k, v, dropout_p=0.5)
    with flashcore.patched():
        torch.manual_seed(3)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


# ---- fallbacks: what the op cannot take goes to PyTorch's function --------------------------------

def test_meta_tensors_go_to_torch():
    q, k, v = (t.to("meta") for t in qkv())
    with flashcore.patched(), OpRecorder() as rec:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.device.type == "meta" and out.shape == (2, 4, 16, 32)
    assert fc_calls(rec) == 0


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensors_go_to_torch():
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(4, n, 16, generator=g) for n in (5, 9)]
    q = torch.nested.nested_tensor(parts)
    expected = ORIGINAL(q, q, q)
    with flashcore.patched():
        out = F.scaled_dot_product_attention(q, q, q)
    assert out.is_nested
    for a, b in zip(out.unbind(), expected.unbind()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


class Tagged(torch.Tensor):
    """A __torch_function__ subclass: must see PyTorch's F.sdpa, not our op."""
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_torch_function_subclasses_go_to_torch():
    q, k, v = (t.as_subclass(Tagged) for t in qkv())
    Tagged.seen.clear()
    with flashcore.patched():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert ORIGINAL in Tagged.seen
    assert not any("flashcore" in str(f) for f in Tagged.seen)


def test_gradients_match_torch():
    q, k, v = (t.requires_grad_() for t in qkv(hq=4, hkv=2))
    out = ORIGINAL(q, k, v, is_causal=True, enable_gqa=True)
    expected = torch.autograd.grad(out.square().sum(), (q, k, v))
    with flashcore.patched():
        out2 = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    grads = torch.autograd.grad(out2.square().sum(), (q, k, v))
    torch.testing.assert_close(out2, out, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_import_flashcore_does_not_import_transformers():
    code = ("import sys, flashcore; assert 'transformers' not in sys.modules, 'imported'; "
            "assert not flashcore.is_patched()")
    env = dict(os.environ)
    if importlib.util.find_spec("flashcore").origin.startswith(_REPO_PYTHON):
        env["PYTHONPATH"] = _REPO_PYTHON + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---- torch.compile ------------------------------------------------------------------------------

def attention_block(x, wq, wk, wv):
    b, s, _ = x.shape
    q = (x @ wq).view(b, s, 4, 16).transpose(1, 2)
    k = (x @ wk).view(b, s, 2, 16).transpose(1, 2)
    v = (x @ wv).view(b, s, 2, 16).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(b, s, 64).relu()


@needs_fake
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_no_graph_break(dynamic):
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 64, generator=g)
    ws = [torch.randn(64, n, generator=g) / 8 for n in (64, 32, 32)]
    expected = attention_block(x, *ws)
    with flashcore.patched():
        cnt = CompileCounterWithBackend("aot_eager")
        fn = torch.compile(attention_block, fullgraph=True, backend=cnt, dynamic=dynamic)
        out = fn(x, *ws)
        out2 = fn(torch.cat([x, x]), *ws)  # another batch size
    assert cnt.frame_count >= 1
    targets = [n.target for gm in cnt.graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert any("flashcore" in str(t) for t in targets), targets
    assert not any("scaled_dot_product" in str(t) and "flashcore" not in str(t) for t in targets)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out2, attention_block(torch.cat([x, x]), *ws), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@needs_fake
def test_compile_inductor_matches_eager():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, 64, generator=g)
    ws = [torch.randn(64, n, generator=g) / 8 for n in (64, 32, 32)]
    expected = attention_block(x, *ws)
    with flashcore.patched():
        out = torch.compile(attention_block, fullgraph=True)(x, *ws)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()


# ---- GPU ----------------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_patched_runs_a_kernel(dtype):
    q, k, v = qkv(b=2, hq=8, hkv=2, sq=300, sk=300, d=128, dtype=dtype, device="cuda")
    why = flashcore.explain(q, k, v, is_causal=True, enable_gqa=True)
    expected = ORIGINAL(q, k, v, is_causal=True, enable_gqa=True)
    with flashcore.patched(), OpRecorder() as rec:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert fc_calls(rec) == 1
    if torch.cuda.get_device_capability() in ((8, 9), (9, 0)):
        assert why.startswith("kernel"), why
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
