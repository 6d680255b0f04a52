"""PyTorch's causal masks as objects (``torch.nn.attention.bias.causal_upper_left`` /
``causal_lower_right``, a ``CausalBias``) as ``attn_mask`` of every FlashCore entry point:
``torch.ops.flashcore.sdpa``, ``flashcore.sdpa``, ``flashcore.patch()``'s
``F.scaled_dot_product_attention``, and ``flashcore.explain``.

Such an object is a tensor subclass whose data is not the mask; read as one it gave wrong
results without an error (the op: max error 3.5 before python/flashcore/_causal_bias.py),
and under ``patch()`` PyTorch's own interception never ran (an error with GQA, else wrong). The reference is
PyTorch's unpatched SDPA with the same object (its ``CausalBias._dispatch``), in float64 on the
CPU (same math: errors at rounding level) and against a float64 reference of the low-precision
inputs on a GPU, where FlashCore's kernels run (top-left causal; bottom-right as a band).
Cases: Sq < Sk, Sq == Sk, Sq > Sk (bottom-right rows that see no key: PyTorch's result, NaN
included), GQA, gradients, dropout (PyTorch's path), is_causal=True (PyTorch's ValueError).
"""
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashcore
from gpu_gate import gpu_gate

bias_mod = pytest.importorskip("torch.nn.attention.bias")
pytestmark = pytest.mark.skipif(bool(flashcore.FALLBACK_ONLY),
                                reason="needs FlashCore's compiled library")
HAVE_CUDA, cuda_only = gpu_gate("no CUDA device: FlashCore's kernels")

MAKERS = {"upper_left": bias_mod.causal_upper_left, "lower_right": bias_mod.causal_lower_right}
LENGTHS = [(5, 9), (9, 9), (9, 5), (1, 17), (17, 1)]


def inputs(sq, sk, dtype=torch.float64, device="cpu", hq=4, hkv=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h, s: torch.randn(2, h, s, d, generator=g, dtype=torch.float64).to(device, dtype)
    return make(hq, sq), make(hkv, sk), make(hkv, sk)


def pytorch_sdpa(q, k, v, bias, **kw):
    """PyTorch's own SDPA (unpatched) with the CausalBias: the semantics to match."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lower_right with Sq > Sk warns about NaNs
        return sys.modules["flashcore.integrations.patch"]._ORIGINAL(q, k, v, attn_mask=bias,
                                                                   enable_gqa=True, **kw)


def entry_points():
    def patched(q, k, v, attn_mask, **kw):
        with flashcore.patched():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
    return {"flashcore.sdpa": flashcore.sdpa, "patched": patched}


def same(got, want, atol):
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())
    assert (got.double() - want.double()).nan_to_num(0).abs().max().item() <= atol


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("entry", ["flashcore.sdpa", "patched"])
def test_cpu_outputs_and_gradients_match_pytorch(kind, sq, sk, entry):
    q, k, v = inputs(sq, sk)
    bias = MAKERS[kind](sq, sk)
    want = pytorch_sdpa(q, k, v, bias)
    call = entry_points()[entry]
    got = call(q, k, v, attn_mask=bias, enable_gqa=True)
    same(got, want, 1e-12)
    assert type(got) is torch.Tensor
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(want).nan_to_num(0)
    call(qg, kg, vg, attn_mask=bias, enable_gqa=True).nan_to_num(0).mul(grad_out).sum().backward()
    pytorch_sdpa(qr, kr, vr, bias).nan_to_num(0).mul(grad_out).sum().backward()
    for a, b in ((qg, qr), (kg, kr), (vg, vr)):
        same(a.grad, b.grad, 1e-10)


def test_op_refuses_a_bias():
    """torch.ops.flashcore.sdpa raises, naming what to call instead (PyTorch's subclass protocol
    would return its result as a CausalBias); before, it read the object as a float mask and
    returned a wrong result (max error 3.5 here)."""
    q, k, v = inputs(5, 9)
    for kind in MAKERS.values():
        with pytest.raises(ValueError, match="attn_mask is a CausalBias.*flashcore.sdpa"):
            torch.ops.flashcore.sdpa(q, k, v, attn_mask=kind(5, 9), enable_gqa=True)


def test_is_causal_with_a_bias_raises_pytorchs_error():
    q, k, v = inputs(5, 9)
    for call in entry_points().values():
        with pytest.raises(ValueError, match="CausalBias should not be used with causal=True"):
            call(q, k, v, attn_mask=bias_mod.causal_lower_right(5, 9), is_causal=True, enable_gqa=True)


def test_dropout_goes_to_pytorchs_path():
    """Dropout with a bottom-right bias: PyTorch's own CausalBias path (its RNG), seeded alike."""
    q, k, v = inputs(5, 9)
    bias = bias_mod.causal_lower_right(5, 9)
    torch.manual_seed(3)
    want = pytorch_sdpa(q, k, v, bias, dropout_p=0.5)
    torch.manual_seed(3)
    got = flashcore.sdpa(q, k, v, attn_mask=bias, dropout_p=0.5, enable_gqa=True)
    same(got, want, 1e-12)


def test_explain_names_the_call_the_bias_stands_for():
    q, k, v = inputs(9, 5)
    assert flashcore.explain(q, k, v, attn_mask=bias_mod.causal_lower_right(9, 5),
                             enable_gqa=True).startswith("fallback: PyTorch's CausalBias")
    q, k, v = inputs(5, 9)
    top = flashcore.explain(q, k, v, attn_mask=bias_mod.causal_upper_left(5, 9), enable_gqa=True)
    assert top == flashcore.explain(q, k, v, is_causal=True, enable_gqa=True)
    with pytest.raises(ValueError, match="causal=True"):
        flashcore.explain(q, k, v, attn_mask=bias_mod.causal_upper_left(5, 9), is_causal=True)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("sq,sk", [(100, 1000), (1000, 1000), (1, 4097), (127, 300)])
def test_cuda_kernels_take_the_bias(dtype, kind, sq, sk):
    """On a GPU the bias runs FlashCore's kernels (explain says which), against a float64
    reference of the same low-precision inputs; tolerance from the same computation in the
    input dtype (PyTorch's SDPA in that dtype)."""
    q, k, v = inputs(sq, sk, dtype, "cuda", hq=8, hkv=2, d=128)
    bias = MAKERS[kind](sq, sk)
    want = pytorch_sdpa(q.double(), k.double(), v.double(), bias)
    low = pytorch_sdpa(q, k, v, bias)
    tol = 2 * (low.double() - want).abs().max().item() + 1e-3
    words = flashcore.explain(q, k, v, attn_mask=bias, enable_gqa=True)
    assert words.startswith("kernel"), words
    for name, call in entry_points().items():
        out = call(q, k, v, attn_mask=bias, enable_gqa=True)
        torch.cuda.synchronize()
        assert (out.double() - want).abs().max().item() <= tol, name
