"""GPU tests of the Hopper backward family (kernels/sm90/bwd_*.cuh) against float64.

What it checks, on an sm_90 device (elsewhere each test skips with a reason, tests/gpu_gate.py):
  * dq, dk, dv of torch.ops.flashcore.sdpa_bwd_kernel (which runs the sm90 family there unless
    deterministic=True) against a float64 autograd of the same attention, for fp16/bf16, D 64/128,
    causal or not, lengths 1/17/127/1000/4097, Sq != Sk both ways, GQA 1/2/4/8, (B, S, H, D)
    transposed views, with a tolerance derived from the same computation in low precision:
        max|g - ref64| <= 2 * max|g_lp - ref64| + atol * max(1, max|ref64|)
    where g_lp are PyTorch's own low-precision gradients (its default SDPA backend) of the call;
  * outputs poisoned: the caching allocator is filled with NaN before each call, so an element
    the kernels leave unwritten shows up;
  * the gradient of the LSE (grad_lse) and rows whose LSE is -inf (nothing attended: zero
    gradients there);
  * dk and dv bitwise equal from run to run (summed in registers in a fixed order); dq within
    the tolerance of itself (summed with fp32 reductions in any order); the deterministic path (sm80-class
    family) bitwise equal from run to run.

Run:  python -m pytest tests/test_gpu_bwd_sm90.py -q
"""
import math
import os
import zlib

import pytest
import torch
import torch.nn.functional as F

from gpu_gate import gpu_gate  # noqa: E402

GPU, pytestmark = gpu_gate("no sm_90 device: tests of the Hopper backward family skipped",
                           capability=(9, 0))

import flashcore  # noqa: E402
from build_record import skip_unless_built  # noqa: E402

DEVICE = "cuda"
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
FWD = torch.ops.flashcore.sdpa_fwd.default
BWD_KERNEL = torch.ops.flashcore.sdpa_bwd_kernel.default


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def poison_allocator():
    """Fill the caching allocator's free blocks with NaN (outputs allocated next reuse them)."""
    free = torch.cuda.mem_get_info()[0]
    n = min(free // 4, 1 << 30) // 4
    torch.full((n,), float("nan"), dtype=torch.float32, device=DEVICE)


def reference64(q, k, v, g_out, is_causal, g_lse=None, mask=None):
    """float64 autograd of (softmax(q k^T / sqrt(D) [+ mask] [causal]) v, logsumexp) (top-left
    causal; a bool mask keeps True, an additive one is added); a row that sees no key gives
    zeros, as FlashCore's forward does."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    s = q64 @ kk.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=DEVICE).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    dead = torch.isneginf(s).all(-1, keepdim=True)  # rows that see no key: P = 0, no NaN
    out = torch.softmax(s.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0) @ vv
    loss = (out * g_out.double()).sum()
    if g_lse is not None:
        loss = loss + (s.logsumexp(-1) * g_lse.double()).sum()
    return torch.autograd.grad(loss, (q64, k64, v64))


def pytorch_low(q, k, v, g_out, is_causal, mask=None):
    """PyTorch's default SDPA gradients in the inputs' dtype: the low-precision error to match
    (NaN, which some backends give rows that see no key, read as 0)."""
    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(*inputs, attn_mask=mask, is_causal=is_causal,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return tuple(g.nan_to_num(0.0) for g in torch.autograd.grad(out, inputs, g_out))


def kernel_grads(q, k, v, g_out, is_causal, deterministic=False, g_lse=None):
    with torch.no_grad():
        out, lse = FWD(q, k, v, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1])
    poison_allocator()
    return BWD_KERNEL(g_out, q, k, v, out, lse, g_lse, is_causal, None, q.shape[1] != k.shape[1],
                      deterministic=deterministic)


def check(got, ref, low, dtype, what):
    for name, g, r, lp in zip(("dq", "dk", "dv"), got, ref, low):
        assert g.shape == r.shape and g.dtype == dtype, f"{what} {name}: shape/dtype"
        assert torch.isfinite(g).all(), f"{what} {name}: non-finite (unwritten?) elements"
        err = (g.double() - r).abs().max().item()
        lp_err = (lp.double() - r).abs().max().item()
        tol = 2 * lp_err + ATOL[dtype] * max(1.0, r.abs().max().item())
        assert err <= tol, f"{what} {name}: max|g-ref64|={err:.3e} > tol={tol:.3e} (PyTorch's {lp_err:.3e})"


SHAPES = {  # name: (B, Hq, Hkv, Sq, Sk)
    "s1": (2, 4, 4, 1, 1),
    "s17": (2, 4, 4, 17, 17),
    "s127_gqa2": (2, 8, 4, 127, 127),
    "s1000_gqa4": (1, 8, 2, 1000, 1000),
    "s4097_gqa8": (1, 8, 1, 4097, 4097),
    "sq127_sk1000_mqa": (2, 4, 1, 127, 1000),
    "sq1000_sk17_gqa2": (1, 4, 2, 1000, 17),
    "sq300_sk700": (1, 2, 2, 300, 700),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_grads(dtype, D, causal, shape):
    skip_unless_built(D, dtype)
    B, Hq, Hkv, Sq, Sk = SHAPES[shape]
    q = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEVICE) for _ in range(2))
    g_out = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    got = kernel_grads(q, k, v, g_out, causal)
    check(got, reference64(q, k, v, g_out, causal), pytorch_low(q, k, v, g_out, causal), dtype,
          f"{shape} D={D} causal={causal}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
def test_sm90_grads_transposed_views(D, causal):
    """HuggingFace's (B, S, H, D) views for q, k, v and a transposed grad_out."""
    dtype = torch.bfloat16
    skip_unless_built(D, dtype)
    B, Hq, Hkv, Sq, Sk = 2, 8, 2, 300, 257
    q = torch.randn(B, Sq, Hq, D, dtype=dtype, device=DEVICE).transpose(1, 2)
    k, v = (torch.randn(B, Sk, Hkv, D, dtype=dtype, device=DEVICE).transpose(1, 2) for _ in range(2))
    g_out = torch.randn(B, Sq, Hq, D, dtype=dtype, device=DEVICE).transpose(1, 2)
    got = kernel_grads(q, k, v, g_out, causal)
    check(got, reference64(q, k, v, g_out, causal), pytorch_low(q, k, v, g_out, causal), dtype,
          f"bshd D={D} causal={causal}")


@pytest.mark.parametrize("D", [64, 128])
def test_sm90_grad_lse_and_empty_rows(D):
    """grad_lse enters through delta; rows with LSE = -inf (nothing attended) give P = 0."""
    dtype = torch.float16
    skip_unless_built(D, dtype)
    B, Hq, Hkv, Sq, Sk = 2, 4, 2, 129, 77
    q = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEVICE) for _ in range(2))
    g_out = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    g_lse = torch.randn(B, Hq, Sq, dtype=torch.float32, device=DEVICE)
    got = kernel_grads(q, k, v, g_out, True, g_lse=g_lse)
    ref = reference64(q, k, v, g_out, True, g_lse=g_lse)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        err = (g.double() - r).abs().max().item()
        assert err <= 2e-2 * max(1.0, r.abs().max().item()), f"{name}: max err {err:.3e}"

    with torch.no_grad():
        out, lse = FWD(q, k, v, is_causal=False, enable_gqa=True)
    lse[:, :, ::3] = float("-inf")  # as if those rows attended nothing
    dq, dk, dv = BWD_KERNEL(g_out, q, k, v, out, lse, None, False, None, True)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert (dq[:, :, ::3] == 0).all(), "rows with LSE -inf must get zero dq"


def test_sm90_run_to_run():
    """dk, dv bitwise equal between two calls; dq close; the deterministic path bitwise equal."""
    dtype, D = torch.bfloat16, 128
    skip_unless_built(D, dtype)
    q = torch.randn(2, 16, 1000, D, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(2, 2, 1000, D, dtype=dtype, device=DEVICE) for _ in range(2))
    g_out = torch.randn_like(q)
    a, b = kernel_grads(q, k, v, g_out, True), kernel_grads(q, k, v, g_out, True)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2]), "dk/dv must not vary between runs"
    torch.testing.assert_close(a[0], b[0], atol=1e-2, rtol=1e-2)
    c = kernel_grads(q, k, v, g_out, True, deterministic=True)
    d = kernel_grads(q, k, v, g_out, True, deterministic=True)
    for name, x, y in zip(("dq", "dk", "dv"), c, d):
        assert torch.equal(x, y), f"deterministic backward: {name} differs between two calls"
    # Both families compute the same gradients (within their rounding).
    for x, y in zip(a, c):
        torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", [(4, 16, 16, 1024, 128, False), (2, 16, 4, 1000, 64, True), (1, 2, 2, 300, 128, False)],
                         ids=["waves-full-d128", "waves-gqa-causal-d64", "one-wave"])
def test_sm90_conversion_beside_main_kernel(shape, monkeypatch):
    """The dq conversion starts while the main kernel still runs (programmatic dependent launch;
    FLASHCORE_PDL=0 runs the three kernels one after another) and converts a (batch, KV head)
    pair's rows once the pair's key blocks are counted in the workspace, which the row-terms kernel
    zeroes. Each call here finds the allocator poisoned with NaN, whose bits read as a count that is
    already complete: a conversion that ran before the zeroing or before the pair's reductions
    would give NaN or partial sums. A chain of calls, each taking the previous dq as its grad_out,
    eager and replayed in a CUDA graph, must match the serial chain (dk and dv to the bit in the
    first call; dq within its rounding) and the first call the float64 reference."""
    B, Hq, Hkv, S, D, causal = shape
    dtype = torch.float16
    skip_unless_built(D, dtype)
    q = torch.randn(B, Hq, S, D, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(B, Hkv, S, D, dtype=dtype, device=DEVICE) for _ in range(2))
    g_out = torch.randn_like(q)
    gqa = Hq != Hkv
    with torch.no_grad():
        out, lse = FWD(q, k, v, is_causal=causal, enable_gqa=gqa)

    def chain(g, poison=True):
        grads = []
        for _ in range(3):
            if poison:  # (not inside a graph capture)
                poison_allocator()
            dq, dk, dv = BWD_KERNEL(g, q, k, v, out, lse, None, causal, None, gqa)
            grads.append((dq, dk, dv))
            g = (dq / dq.abs().amax().clamp_min(1e-6)).to(dtype)  # the next call depends on this dq
        return grads

    monkeypatch.setenv("FLASHCORE_PDL", "0")
    serial = chain(g_out)
    monkeypatch.delenv("FLASHCORE_PDL")
    eager = chain(g_out)
    check(eager[0], reference64(q, k, v, g_out, causal), pytorch_low(q, k, v, g_out, causal), dtype,
          f"{shape} first call")
    static_g = g_out.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(static_g, poison=False)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = chain(static_g, poison=False)
    graph.replay()
    torch.cuda.synchronize()
    for label, run in (("eager", eager), ("graph", replayed)):
        assert torch.equal(run[0][1], serial[0][1]) and torch.equal(run[0][2], serial[0][2]), \
            f"{label}: dk/dv of the first call differ from the serial launch's"
        for i, (got, want) in enumerate(zip(run, serial)):
            for name, x, y in zip(("dq", "dk", "dv"), got, want):
                assert torch.isfinite(x).all(), f"{label} call {i} {name}: non-finite elements"
                torch.testing.assert_close(x, y, atol=2e-2, rtol=2e-2, msg=f"{label} call {i} {name}")


# ---- attn_mask (bool and additive, broadcast views; the sm90 family takes masks, not causal) ----

def make_mask(kind, B, Hq, Sq, Sk, dtype, layout):
    """A mask of `kind` ("bool" or "additive") as a view of `layout`: "b1qk" (B, 1, Sq, Sk), "qk"
    (Sq, Sk), "bhqk_t" (B, Hq, Sq, Sk) made from a key-major tensor (strided keys), "b11k"
    (B, 1, 1, Sk) a key-padding mask broadcast over the queries. Rows 3, 10, 17, ... see no key
    (not in "b11k"). Bool masks whose rows are not 16-byte multiples, with strided keys or
    broadcast over the queries reach the kernel as the op's copy (torch_op/mask_copy.h)."""
    shape = {"b1qk": (B, 1, Sq, Sk), "qk": (Sq, Sk), "bhqk_t": (B, Hq, Sq, Sk),
             "b11k": (B, 1, 1, Sk)}[layout]
    keep = torch.rand(shape, device=DEVICE) < 0.7
    keep[..., 3::7, :] = False
    if kind == "bool":
        m = keep
    else:
        m = torch.randn(shape, device=DEVICE).to(dtype).masked_fill(~keep, float("-inf"))
    if layout == "bhqk_t":
        m = m.transpose(-1, -2).contiguous().transpose(-1, -2)
    return m


MASK_SHAPES = {  # name: (B, Hq, Hkv, Sq, Sk); rows of a multiple of 16 keys: the kernel's TMA
    "s17": (2, 2, 2, 17, 17),                       # mask tiles (bool, "b1qk" and "qk")
    "s300_gqa2": (1, 4, 2, 300, 300),
    "sq127_sk1000_gqa4": (1, 4, 1, 127, 1000),
    "s1030": (1, 2, 2, 1030, 1030),
    "sq200_sk336": (2, 2, 2, 200, 336),
    "s1024_gqa2": (1, 4, 2, 1024, 1024),
}


def masked_call(shape, kind, layout, D, dtype):
    """A masked backward call of MASK_SHAPES[shape]: q, k, v, grad_out, the mask, and the backward
    ops' leading arguments (out and lse from FWD with that mask)."""
    B, Hq, Hkv, Sq, Sk = MASK_SHAPES[shape]
    q = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    k, v = (torch.randn(B, Hkv, Sk, D, dtype=dtype, device=DEVICE) for _ in range(2))
    g_out = torch.randn(B, Hq, Sq, D, dtype=dtype, device=DEVICE)
    mask = make_mask(kind, B, Hq, Sq, Sk, dtype, layout)
    gqa = Hq != Hkv
    with torch.no_grad():
        out, lse = FWD(q, k, v, mask, enable_gqa=gqa)
    return q, k, v, g_out, mask, (g_out, q, k, v, out, lse, None, False, None, gqa)


@pytest.mark.parametrize("shape", list(MASK_SHAPES))
@pytest.mark.parametrize("layout", ["b1qk", "qk", "bhqk_t", "b11k"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sm90_masked_grads(dtype, D, kind, layout, shape):
    skip_unless_built(D, dtype)
    q, k, v, g_out, mask, args = masked_call(shape, kind, layout, D, dtype)
    assert flashcore.explain_backward(*args, attn_mask=mask) == "kernel sm90"
    poison_allocator()
    got = BWD_KERNEL(*args, attn_mask=mask)
    check(got, reference64(q, k, v, g_out, False, mask=mask), pytorch_low(q, k, v, g_out, False, mask),
          dtype, f"{shape} {kind} {layout} D={D}")


@pytest.mark.parametrize("shape", ["s17", "sq127_sk1000_gqa4", "s1030", "sq200_sk336"])
@pytest.mark.parametrize("layout", ["b1qk", "bhqk_t", "b11k"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["one_pass", "deterministic"])
def test_sm80_family_masked_grads(dtype, D, kind, layout, shape, deterministic, monkeypatch):
    """The sm80-class backward (Ada's; FLASHCORE_FAMILY=sm80 here) with masks read element by
    element: both of its ways (one pass with dQ through atomics, or deterministic),
    against float64, on a poisoned allocator."""
    skip_unless_built(D, dtype)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm80")
    q, k, v, g_out, mask, args = masked_call(shape, kind, layout, D, dtype)
    assert flashcore.explain_backward(*args, deterministic=deterministic, attn_mask=mask) == "kernel sm80"
    poison_allocator()
    got = BWD_KERNEL(*args, deterministic=deterministic, attn_mask=mask)
    check(got, reference64(q, k, v, g_out, False, mask=mask), pytorch_low(q, k, v, g_out, False, mask),
          dtype, f"sm80 {shape} {kind} {layout} D={D} deterministic={deterministic}")


def test_sm90_masked_declines_what_it_cannot_take():
    """Causal with a mask, a mask that needs a gradient (through autograd), a float32 mask beside
    fp16 inputs: the Python backward (explain_backward says why), with the same gradients."""
    B, H, S, D = 1, 2, 130, 64
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float16, device=DEVICE) for _ in range(3))
    g_out = torch.randn(B, H, S, D, dtype=torch.float16, device=DEVICE)
    mask = torch.rand(B, 1, S, S, device=DEVICE) < 0.8
    with torch.no_grad():
        out, lse = FWD(q, k, v, mask)
    args = (g_out, q, k, v, out, lse, None, True, None, False)
    assert flashcore.explain_backward(*args, attn_mask=mask).startswith("python: ")
    fp32 = torch.zeros(B, 1, S, S, device=DEVICE)
    args = (g_out, q, k, v, out, lse, None, False, None, False)
    assert flashcore.explain_backward(*args, attn_mask=fp32).startswith("python: ")
    # Through autograd: an additive mask that requires grad gets its gradient (Python backward).
    additive = torch.zeros(B, 1, S, S, dtype=torch.float16, device=DEVICE, requires_grad=True)
    inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
    os.environ["FLASHCORE_TRAINING"] = "flashcore"
    try:
        out = flashcore.sdpa(*inputs, additive)
        grads = torch.autograd.grad(out, inputs + (additive,), g_out)
    finally:
        del os.environ["FLASHCORE_TRAINING"]
    assert grads[3].shape == additive.shape and torch.isfinite(grads[3]).all()


def test_sm90_masked_autograd_through_sdpa():
    """flashcore.sdpa with a bool mask under autograd (the training route forced onto FlashCore):
    the backward kernel runs and the gradients match float64."""
    B, Hq, Hkv, S, D = 2, 4, 2, 257, 128
    dtype = torch.bfloat16
    q = torch.randn(B, Hq, S, D, dtype=dtype, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(B, Hkv, S, D, dtype=dtype, device=DEVICE, requires_grad=True) for _ in range(2))
    mask = torch.ones(B, 1, S, S, dtype=torch.bool, device=DEVICE).tril()
    mask[0, :, :, :40] = False  # left padding of the first sequence
    mask[0, :, :40, 0] = True   # (its padded rows see one key)
    g_out = torch.randn(B, Hq, S, D, dtype=dtype, device=DEVICE)
    os.environ["FLASHCORE_TRAINING"] = "flashcore"
    try:
        out = flashcore.sdpa(q, k, v, mask, enable_gqa=True)
        got = torch.autograd.grad(out, (q, k, v), g_out)
    finally:
        del os.environ["FLASHCORE_TRAINING"]
    check(got, reference64(q, k, v, g_out, False, mask=mask), pytorch_low(q, k, v, g_out, False, mask),
          dtype, "sdpa autograd, HF-style mask")
