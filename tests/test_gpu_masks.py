"""GPU tests of attn_mask in torch.ops.flashcore.sdpa (the sm80 kernel family applies it).

What it checks, on a CUDA machine with FlashCore kernels (sm_89 / sm_90):
  * bool (True = attend) and additive (query's dtype) masks of every shape PyTorch broadcasts:
    (Sk,), (Sq, Sk), (B, 1, Sq, Sk), (1, H, Sq, Sk), (B, H, Sq, Sk); non-contiguous views (a
    slice of a bigger mask, a transposed mask, an expanded one); lengths 1, 17, 127, 1000 and
    row widths that take each of the kernel's mask copy paths (16-, 8-, 4-byte cp.async,
    element by element); Sq != Sk; GQA; fp16 / bf16; D 32 / 64 / 80 / 96 / 128 / 256;
  * against a float64 reference with the rule of tests/test_gpu_sdpa.py:
        max|out - ref_hi| <= 2 * max|ref_lp - ref_hi| + atol
    where ref_lp is the same math in the input's dtype; outputs are poisoned (NaN) first;
  * fully masked rows (bool all False, additive all -inf) are exactly what PyTorch's math
    backend gives for them (zeros: its safe softmax; its fused CUDA backends disagree among
    themselves on torch 2.11: memory-efficient returns the mean of V), -inf entries give no NaN, and
    rows masked only by finfo(dtype).min (HuggingFace's fill value) follow the float64 reference;
  * the LSE from flashcore.sdpa_fwd: float64 log-sum-exp, -inf on fully masked rows;
  * explain() says which path ran: on Hopper the sm90 family for a bool mask whose tiles TMA
    reads (D 64 / 128, keys contiguous, 16-byte-aligned base and row strides: sm90_takes_mask
    below) or whose copy with such rows the op makes (sm90_takes_copy); under auto, PyTorch's
    SDPA for the masks the sm80 family runs slower than it (goes_to_pytorch); else the sm80
    family (and, under auto, why not sm90); forcing the sm90 family with any other mask raises.
Each case runs with FLASHCORE_FAMILY=auto and =sm80 (and, on Hopper, =sm90 where it takes the mask).

Run:  python -m pytest tests/test_gpu_masks.py -q     (each test skips without a CUDA device)
"""
import math
import os
import zlib
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpu_gate import gpu_gate  # noqa: E402

GPU, pytestmark = gpu_gate("no CUDA device: GPU tests of attn_mask skipped")

import flashcore  # noqa: E402  (on a GPU machine a failed import is an error)
from build_record import skip_unless_built  # noqa: E402
from kernel_trace import launched_kernels, launched_narrow  # noqa: E402

DEVICE = "cuda"
KERNEL_CARD = GPU and torch.cuda.get_device_capability() in ((8, 9), (9, 0))
HOPPER = GPU and torch.cuda.get_device_capability() == (9, 0)
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}  # one output ulp at |x| ~ 1 (see test_gpu_sdpa)
NEG_INF = float("-inf")


# --------------------------------------------------------------------------- reference

def additive_form(mask, dtype):
    """The mask as scores to add, in `dtype` (bool False -> -inf, True -> 0)."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, NEG_INF)
    return mask.to(dtype)


def reference(q, k, v, mask, scale, dtype):
    """softmax(q k^T * scale + mask) v in `dtype`, per (batch, head) so the scores stay small;
    rows whose every score is -inf give zeros (PyTorch's safe softmax). In fp16/bf16 every
    matmul, the mask addition and the softmax output are rounded to the dtype, with fp32
    accumulation in the matmuls (as test_gpu_sdpa.py's reference)."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    m = additive_form(mask, dtype).expand(B, Hq, Sq, k.shape[2])
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=dtype, device=q.device)
    mm = torch.backends.cuda.matmul
    saved = (mm.allow_fp16_reduced_precision_reduction, mm.allow_bf16_reduced_precision_reduction)
    mm.allow_fp16_reduced_precision_reduction = mm.allow_bf16_reduced_precision_reduction = False
    try:
        for b in range(B):
            for h in range(Hq):
                hk = h // (Hq // Hkv)
                s = torch.matmul(q[b, h].to(dtype), k[b, hk].to(dtype).T) * scale + m[b, h]
                p = torch.softmax(s, dim=-1)
                p = torch.where((s == NEG_INF).all(-1, keepdim=True), torch.zeros_like(p), p)
                out[b, h] = torch.matmul(p, v[b, hk].to(dtype))
    finally:
        mm.allow_fp16_reduced_precision_reduction, mm.allow_bf16_reduced_precision_reduction = saved
    return out


def fully_masked_rows(mask, shape):
    """(B, Hq, Sq) bool: rows where the mask leaves no key."""
    keep = mask if mask.dtype == torch.bool else mask != NEG_INF
    return ~keep.expand(shape).any(-1)


def pytorch_sdpa(q, k, v, mask, kw):
    """PyTorch's reference answer: F.scaled_dot_product_attention under its MATH backend, the
    definition the fused backends approximate. Not the default backend, because on torch 2.11
    (H100) the fused ones disagree on fully masked rows (the memory-efficient backend returns
    the mean of V there, math and the CPU return zeros) and fault with "misaligned address" on
    a sliced additive mask, which poisons the CUDA context for every later test."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def poison_allocator(shape, dtype):
    junk = torch.empty(shape, dtype=dtype, device=DEVICE)
    junk.fill_(float("nan"))
    del junk


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=["auto", "sm80", "sm90"])
def family(request, monkeypatch):
    if request.param == "sm80" and not KERNEL_CARD:
        pytest.skip("forcing the sm80 family raises on cards other than sm_89 / sm_90")
    if request.param == "sm90" and not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 only")
    monkeypatch.setenv("FLASHCORE_FAMILY", request.param)
    return request.param


def sm90_takes_mask(q, mask, is_causal=False):
    """The Hopper family's mask rule (c_src/dispatch.c, family_takes_mask), stated on its own: a
    bool mask at D = 64, 128 or 256, not causal, whose (B, H, Sq, Sk) view (broadcast dims at stride 0,
    as torch_op/op_common.h describes it) has contiguous keys, a query stride that is a positive
    16-byte multiple, head and batch strides that are 16-byte multiples, and a 16-byte-aligned
    base."""
    if mask.dtype != torch.bool or q.shape[-1] not in (64, 128, 256) or is_causal:
        return False
    target = (q.shape[0], q.shape[1], q.shape[2], mask.shape[-1])
    strides = [0, 0, 0, 0]
    for i in range(mask.dim()):
        d = 4 - mask.dim() + i
        strides[d] = 0 if mask.shape[i] == 1 else mask.stride(i)
    if any(size == 1 for size in target[3:]):
        strides[3] = 0
    sb, sh, sq, sk = strides
    return (sk == 1 and sq > 0 and sq % 16 == 0 and sh % 16 == 0 and sb % 16 == 0
            and mask.data_ptr() % 16 == 0)


def _mask_strides(q, k, mask):
    """The mask's (B, H, Sq, Sk) strides as torch_op/op_common.h describes them: a dim of size 1
    (the mask's or the call's) has stride 0."""
    target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    strides = [0, 0, 0, 0]
    for i in range(mask.dim()):
        d = 4 - mask.dim() + i
        strides[d] = 0 if mask.shape[i] == 1 or target[d] == 1 else mask.stride(i)
    return strides


def sm90_takes_copy(q, k, mask, is_causal=False):
    """The op's mask copy rule (torch_op/flashcore_op.cpp, plan_mask_copy), stated on its own:
    on Hopper a bool mask the sm90 family cannot read as it is runs there on a copy with 16-byte
    rows, one per query, when the call has more than one query row (D = 64, 128 or 256, not causal)
    and the copy, (B or 1, H or 1, Sq, Sk rounded up to 16) bytes, is no larger than q, k, v
    and the output together or twice the bytes the mask's view spans in memory."""
    if mask.dtype != torch.bool or q.shape[-1] not in (64, 128, 256) or is_causal or q.shape[2] == 1:
        return False
    B, Hq, Sq, D = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    nd = mask.dim()
    batch = B if nd == 4 and mask.shape[0] != 1 else 1
    heads = Hq if nd >= 3 and mask.shape[nd - 3] != 1 else 1
    copy = batch * heads * Sq * ((Sk + 15) // 16 * 16)
    call = q.element_size() * D * (2 * B * Hq * Sq + 2 * B * Hkv * Sk)
    in_memory = 0 if mask.numel() == 0 else 1 + sum((n - 1) * abs(st) for n, st in zip(mask.shape, mask.stride()))
    return copy <= max(call, 2 * in_memory)


def goes_to_pytorch(q, k, mask, is_causal=False, lse=False):
    """The dispatch rule for masked calls the sm80 family would run on Hopper (c_src/dispatch.c,
    sm80_masked_slower_than_fallback), stated on its own: under auto, without an LSE wanted
    (sdpa, not sdpa_fwd) and without is_causal, PyTorch's SDPA runs every additive mask, and a
    bool one at D = 64, 128 and 256, or at the other head dims when it is broadcast over the
    query rows (or there is one)."""
    if not HOPPER or lse or is_causal or os.environ.get("FLASHCORE_FAMILY", "auto") != "auto":
        return False
    return (mask.dtype != torch.bool or q.shape[-1] in (64, 128, 256) or q.shape[2] == 1
            or _mask_strides(q, k, mask)[2] == 0)


def decode_takes(q, k, is_causal=False):
    """The decode kernels' rule for a masked call (c_src/dispatch.c, family_takes_mask and the
    decode family's shapes): at most 16 query rows and 32 rows per KV head (query heads per KV
    head x Sq), D = 64 or 128, any mask, not causal."""
    sq, d, group = q.shape[2], q.shape[3], q.shape[1] // k.shape[1]
    return not is_causal and sq <= 16 and group * sq <= 32 and d in (64, 128)


def hopper_route(family, q, k, mask, is_causal=False, lse=False):
    """Where sdpa (lse=False) or sdpa_fwd (lse=True) runs a masked call on this card:
    "decode", "sm90", "sm80" or "pytorch"."""
    if KERNEL_CARD and family == "auto" and decode_takes(q, k, is_causal):
        # (on Hopper an additive mask without the LSE goes to PyTorch: dispatch.c,
        # decode_masked_slower_than_fallback)
        return "pytorch" if HOPPER and mask.dtype != torch.bool and not lse else "decode"
    if HOPPER and family != "sm80" and (sm90_takes_mask(q, mask, is_causal) or
                                        sm90_takes_copy(q, k, mask, is_causal)):
        return "sm90"
    if family == "auto" and goes_to_pytorch(q, k, mask, is_causal, lse):
        return "pytorch"
    return "sm80"


# --------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    kind: str          # "bool" | "additive"
    shape: str         # "k" | "qk" | "b1qk" | "1hqk" | "bhqk"
    Sq: int
    Sk: int
    dtype: torch.dtype = torch.float16
    D: int = 64
    layout: str = "contiguous"  # | "slice" | "transposed" | "expand"
    B: int = 2
    Hkv: int = 2
    ratio: int = 1

    @property
    def id(self):
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]
        return (f"{self.kind}-{self.shape}-{self.layout}-q{self.Sq}-k{self.Sk}-{dt}-d{self.D}"
                f"-b{self.B}-hkv{self.Hkv}x{self.ratio}")


def mask_dims(c):
    Hq = c.Hkv * c.ratio
    return {"k": (c.Sk,), "qk": (c.Sq, c.Sk), "b1qk": (c.B, 1, c.Sq, c.Sk),
            "1hqk": (1, Hq, c.Sq, c.Sk), "bhqk": (c.B, Hq, c.Sq, c.Sk)}[c.shape]


def mask_values(c, dims):
    """Random mask of `dims`: bool with 30% of keys masked, additive randn with 10% -inf; where
    there is a query dim, every 7th row (from 3) fully masked."""
    if c.kind == "bool":
        m = torch.rand(dims, device=DEVICE) > 0.3
        if len(dims) >= 2:
            m[..., 3::7, :] = False
    else:
        m = torch.randn(dims, device=DEVICE)
        m = m.masked_fill(torch.rand(dims, device=DEVICE) < 0.1, NEG_INF)
        if len(dims) >= 2:
            m[..., 3::7, :] = NEG_INF
        m = m.to(c.dtype)
    return m


def make_mask(c):
    """The mask of case c in its memory layout (values drawn for the logical shape)."""
    dims = mask_dims(c)
    m = mask_values(c, dims)
    if c.layout == "contiguous":
        return m
    if c.layout == "slice":  # a window of a bigger mask: odd base offset and row stride
        big = torch.zeros(*dims[:-2], dims[-2] + 5, dims[-1] + 7, dtype=m.dtype, device=DEVICE) \
            if len(dims) >= 2 else torch.zeros(dims[-1] + 9, dtype=m.dtype, device=DEVICE)
        view = big[..., 3:3 + dims[-2], 5:5 + dims[-1]] if len(dims) >= 2 else big[3:3 + dims[-1]]
        view.copy_(m)
        return view
    if c.layout == "transposed":  # stored (..., Sk, Sq): keys strided
        t = m.transpose(-1, -2).contiguous().transpose(-1, -2)
        assert t.stride(-1) != 1 or c.Sk == 1
        return t
    if c.layout == "expand":  # one row (or one batch) broadcast with stride 0
        return m[..., :1, :].expand(dims) if len(dims) >= 2 else m
    raise ValueError(c.layout)


def _cases():
    fp16, bf16 = torch.float16, torch.bfloat16
    cases = []
    # Lengths: 1, 17, 127, 1000, Sq != Sk both ways; row widths Sk = 256 (16-byte rows),
    # 1000 (bool: 8-byte rows), 1004 (bool: 4-byte rows), 127 / 17 (element by element).
    lengths = [(1, 1), (17, 127), (127, 17), (1000, 1000), (1, 1000), (256, 256), (100, 1004)]
    for kind in ("bool", "additive"):
        for i, shape in enumerate(("k", "qk", "b1qk", "1hqk", "bhqk")):
            for j, (sq, sk) in enumerate(lengths):
                dt = (fp16, bf16)[(i + j) % 2]
                D = (64, 128)[(i + j + (kind == "bool")) % 2]
                cases.append(Case(kind, shape, sq, sk, dt, D))
    # Non-contiguous mask views.
    for kind in ("bool", "additive"):
        for layout in ("slice", "transposed", "expand"):
            for shape, (sq, sk) in (("b1qk", (127, 1000)), ("qk", (1000, 17)), ("bhqk", (64, 256))):
                cases.append(Case(kind, shape, sq, sk, bf16 if kind == "bool" else fp16,
                                  128 if layout == "slice" else 64, layout))
    # GQA (mask heads are query heads), one and several KV heads.
    for kind, shape in (("bool", "b1qk"), ("additive", "bhqk"), ("bool", "1hqk")):
        for D in (64, 128):
            cases.append(Case(kind, shape, 127, 300, fp16 if D == 64 else bf16, D, Hkv=2, ratio=4))
            cases.append(Case(kind, shape, 33, 1000, bf16, D, B=1, Hkv=1, ratio=8))
    # Bool masks whose tiles TMA reads (keys contiguous, rows of 16-byte multiples): on Hopper
    # the sm90 family's masked configuration. Ragged key tiles (Sk = 272: 128 + 128 + 16), rows
    # past Sq in a block, Sq != Sk, one query row pair, GQA, every 4-D broadcast.
    for shape in ("qk", "b1qk", "1hqk", "bhqk"):
        for (sq, sk), D, dt in (((17, 128), 64, fp16), ((127, 272), 128, bf16), ((300, 1024), 64, bf16),
                                ((1000, 2048), 128, fp16), ((2, 512), 64, fp16)):
            cases.append(Case("bool", shape, sq, sk, dt, D))
    for D in (64, 128):
        cases.append(Case("bool", "b1qk", 127, 528, bf16, D, Hkv=2, ratio=4))
        cases.append(Case("bool", "bhqk", 333, 256, fp16, D, B=1, Hkv=1, ratio=8))
    # Decode-sized calls (the decode kernels: kMasked in kernels/decode_sm80.cuh): 1-16 query
    # rows, GQA packing up to 16 rows per KV head (tensor-core kernel) and 17-32 (CUDA-core
    # kernel), a cache long enough to be split, one key; key padding as HuggingFace's (B, 1, Sq, Sk)
    # and per-head masks; a sliced and a transposed mask.
    for kind in ("bool", "additive"):
        for sq, sk, ratio, D, dt in ((1, 4097, 8, 128, bf16), (4, 1000, 8, 64, fp16), (16, 300, 2, 128, fp16),
                                     (3, 17, 4, 64, bf16), (1, 1, 1, 128, fp16), (1, 8192, 32, 128, fp16)):
            cases.append(Case(kind, "b1qk", sq, sk, dt, D, Hkv=2, ratio=ratio))
            cases.append(Case(kind, "bhqk", sq, sk, dt, D, B=1, Hkv=1, ratio=ratio))
        for layout in ("slice", "transposed"):
            cases.append(Case(kind, "b1qk", 4, 1000, fp16, 128, layout, Hkv=2, ratio=4))
    # Head dims 32, 80, 96 and 256 (their own tile shapes: 64 x 64, D=256 64 x 32).
    for D in (32, 80, 96, 256):
        for kind, shape, (sq, sk), dt in (("bool", "b1qk", (17, 1000), fp16),
                                          ("additive", "bhqk", (1000, 127), bf16),
                                          ("bool", "qk", (127, 1004), bf16),
                                          ("additive", "k", (1, 17), fp16)):
            cases.append(Case(kind, shape, sq, sk, dt, D))
        cases.append(Case("bool", "1hqk", 127, 300, fp16, D, Hkv=2, ratio=4))
    # D=256 bool masks the Hopper family reads as they are (64-key mask tiles, 64-byte swizzle).
    cases.append(Case("bool", "bhqk", 300, 1024, bf16, 256, B=1, Hkv=1, ratio=4))
    cases.append(Case("bool", "b1qk", 1000, 256, fp16, 256, Hkv=2, ratio=2))
    return cases


CASES = _cases()


def _check(c, family, mask, q, k, v, kw):
    out_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    skip_unless_built(q.shape[3], q.dtype)
    path = flashcore.explain(q, k, v, attn_mask=mask, **kw)
    route = hopper_route(family, q, k, mask)
    if family == "sm90" and route != "sm90":
        pytest.skip("the sm90 family does not take this mask (test_forced_sm90_with_mask_raises)")
    if KERNEL_CARD and route == "pytorch":
        assert path.startswith("fallback") and "PyTorch's own SDPA runs such calls faster" in path, path
    elif KERNEL_CARD:
        want = f"kernel {route}"
        assert path.startswith(want), f"expected {want}, explain() says {path!r}"
        if HOPPER and family == "auto" and route == "sm80":
            assert "takes this attention mask" in path, path  # says why the sm90 family did not run
    poison_allocator(out_shape, q.dtype)
    out = torch.ops.flashcore.sdpa(q, k, v, mask, 0.0, False, **kw)
    torch.cuda.synchronize()
    assert out.shape == out_shape and out.dtype == q.dtype

    ref_hi = reference(q, k, v, mask, kw.get("scale"), torch.float64)
    ref_lp = reference(q, k, v, mask, kw.get("scale"), q.dtype)
    dead = fully_masked_rows(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    # Rows that see no key, where PyTorch's SDPA ran the call: its fused backends' own answer
    # (see pytorch_sdpa), which this test makes no claim about.
    judged = ~dead if route == "pytorch" else torch.ones_like(dead)
    assert not torch.isnan(out[judged]).any(), f"{c.id} [{family}]: NaN in the output"
    err = (out.double() - ref_hi)[judged].abs().max().item() if judged.any() else 0.0
    lp_err = (ref_lp.double() - ref_hi).abs().max().item()
    tol = 2 * lp_err + ATOL[q.dtype]
    assert err <= tol, f"{c.id} [{family}]: max|out-ref|={err:.3e} > tol={tol:.3e}"

    if dead.any() and route != "pytorch":
        # Fully masked rows: exactly what PyTorch's math backend gives (zeros).
        expected = pytorch_sdpa(q, k, v, mask, kw)
        want = expected[dead]
        assert torch.equal(out[dead], want), (
            f"{c.id} [{family}]: fully masked rows differ from PyTorch's math backend "
            f"(ours: {out[dead].abs().max().item()}, PyTorch's: {want.float().abs().max().item()})")
        assert (out[dead] == 0).all()
    return out, route


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_mask_matches_reference(case, family):
    c = case
    Hq = c.Hkv * c.ratio
    q = torch.randn(c.B, Hq, c.Sq, c.D, dtype=c.dtype, device=DEVICE)
    k = torch.randn(c.B, c.Hkv, c.Sk, c.D, dtype=c.dtype, device=DEVICE)
    v = torch.randn(c.B, c.Hkv, c.Sk, c.D, dtype=c.dtype, device=DEVICE)
    mask = make_mask(c)
    kw = dict(enable_gqa=True) if c.ratio > 1 else {}
    _check(c, family, mask, q, k, v, kw)


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_everything_masked_and_scale(kind, dtype, family):
    """A mask that leaves no key anywhere ((Sk,) all False / all -inf), HuggingFace-style
    (B, S, H, D) inputs and an explicit scale."""
    B, H, S, D = 2, 4, 130, 64
    q, k, v = (torch.randn(B, S, H, D, dtype=dtype, device=DEVICE).transpose(1, 2) for _ in range(3))
    mask = torch.zeros(S, dtype=torch.bool, device=DEVICE) if kind == "bool" else \
        torch.full((S,), NEG_INF, dtype=dtype, device=DEVICE)
    c = Case(kind, "k", S, S, dtype, D)
    out, route = _check(c, family, mask, q, k, v, dict(scale=0.3))
    if route != "pytorch":
        assert (out == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_finfo_min_rows(dtype, family):
    """HuggingFace fills additive masks with finfo(dtype).min. A row masked only by that finite
    value is not fully masked, and adding one constant to a whole row leaves its softmax
    unchanged in exact arithmetic: in fp16 (-65504, far inside fp32's range) the row is the
    unmasked row's attention; in bf16 (-3.4e38) fp32 rounding erases the scores and the row
    becomes V's average. Either way: the float64 reference of the same math, no NaN."""
    if family == "sm90":
        pytest.skip("additive masks run in the sm80 family only")
    B, H, Sq, Sk, D = 1, 2, 70, 90, 64
    skip_unless_built(D, dtype)  # a fallback to PyTorch rounds the bf16 rows otherwise
    q, k, v = (torch.randn(B, H, s, D, dtype=dtype, device=DEVICE) for s in (Sq, Sk, Sk))
    mask = torch.zeros(Sq, Sk, dtype=dtype, device=DEVICE)
    if hopper_route(family, q, k, mask) == "pytorch":
        pytest.skip("PyTorch's SDPA runs this call here (FC_UNSUPPORTED_SLOWER_MASK); family sm80 checks the kernel")
    mask[5] = torch.finfo(dtype).min
    mask[9, 3:] = torch.finfo(dtype).min
    out = torch.ops.flashcore.sdpa(q, k, v, mask)
    assert not torch.isnan(out).any()
    ref_hi = reference(q, k, v, mask, None, torch.float64)
    ref_lp = reference(q, k, v, mask, None, dtype)
    err = (out.double() - ref_hi).abs().max().item()
    tol = 2 * (ref_lp.double() - ref_hi).abs().max().item() + ATOL[dtype]
    assert err <= tol, f"max|out-ref|={err:.3e} > tol={tol:.3e}"
    if dtype == torch.bfloat16:
        torch.testing.assert_close(out[:, :, 5], v.float().mean(2).to(dtype), atol=ATOL[dtype] * 4, rtol=0)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_lse_with_mask(kind, family):
    """sdpa_fwd's LSE (what autograd saves) from the masked kernel: float64 log-sum-exp of the
    scaled, masked scores; -inf on fully masked rows; the output equals sdpa's bit for bit. (336
    keys: a bool mask's rows are 16-byte multiples, so on Hopper it runs in the sm90 family.)"""
    if family == "sm90" and kind != "bool":
        pytest.skip("additive masks run in the sm80 family only")
    c = Case(kind, "b1qk", 200, 336, torch.float16, 128)
    q = torch.randn(2, 2, 200, 128, dtype=c.dtype, device=DEVICE)
    k, v = (torch.randn(2, 2, 336, 128, dtype=c.dtype, device=DEVICE) for _ in range(2))
    mask = make_mask(c)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask)
    assert hopper_route(family, q, k, mask, lse=True) != "pytorch"
    if hopper_route(family, q, k, mask) != "pytorch":  # the same kernel, bit for bit
        assert torch.equal(out, torch.ops.flashcore.sdpa(q, k, v, mask))
    else:  # sdpa goes to PyTorch's SDPA; sdpa_fwd, which wants the LSE, runs the sm80 family
        assert flashcore.explain(q, k, v, attn_mask=mask).startswith("fallback")
        torch.testing.assert_close(out, torch.ops.flashcore.sdpa(q, k, v, mask), atol=2e-3, rtol=0)
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(128)
    s = s + additive_form(mask, torch.float64)
    ref = torch.logsumexp(s, dim=-1)
    dead = torch.isneginf(ref)
    assert dead.any() and torch.isneginf(lse[dead]).all()
    torch.testing.assert_close(lse[~dead].double(), ref[~dead], atol=1e-3, rtol=1e-4)


def test_forced_sm90_with_mask_raises(monkeypatch):
    if not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 only")
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    q = k = v = torch.randn(1, 2, 64, 64, dtype=torch.float16, device=DEVICE)
    # An additive mask; one query row (no copy of a bool mask for it).
    for q1, mask in ((q, torch.zeros(64, 64, dtype=torch.float16, device=DEVICE)),
                     (q[:, :, :1], torch.ones(1, 64, dtype=torch.bool, device=DEVICE))):
        assert hopper_route("sm90", q1, k, mask) != "sm90"
        assert "takes this attention mask" in flashcore.explain(q1, k, v, attn_mask=mask)
        with pytest.raises(RuntimeError, match="FLASHCORE_FAMILY=sm90 forces a kernel family that "
                                               "cannot run this call: no kernel family here takes "
                                               "this attention mask"):
            flashcore.sdpa(q1, k, v, attn_mask=mask)
    # A bool one whose 100-byte rows TMA cannot read runs on the op's copy of it.
    mask = (torch.rand(64, 100, device=DEVICE) > 0.3)[:, :64]
    assert not sm90_takes_mask(q, mask) and sm90_takes_copy(q, k, mask)
    assert flashcore.explain(q, k, v, attn_mask=mask) == "kernel sm90"
    torch.testing.assert_close(flashcore.sdpa(q, k, v, attn_mask=mask).double(),
                               reference(q, k, v, mask, None, torch.float64), atol=2e-3, rtol=0)


@pytest.mark.parametrize("S", [304, 300])
def test_mask_in_cuda_graph(family, S):
    """Captured with a mask; replays read the mask's new contents (no host-side caching, nor a
    tensor map built from stale contents: on Hopper this mask's 304-byte rows run in sm90, and
    300-byte rows on the op's copy, which each replay makes again)."""
    q, k, v = (torch.randn(2, 4, S, 64, dtype=torch.float16, device=DEVICE) for _ in range(3))
    mask = torch.rand(2, 1, S, S, device=DEVICE) > 0.5
    if family == "sm90" and hopper_route(family, q, k, mask) != "sm90":
        pytest.skip("the sm90 family does not take this mask")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.flashcore.sdpa(q, k, v, mask)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.flashcore.sdpa(q, k, v, mask)
    for _ in range(2):
        mask.copy_(torch.rand(2, 1, S, S, device=DEVICE) > 0.5)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = reference(q, k, v, mask, None, torch.float64)
        assert (out.double() - ref).abs().max().item() < 5e-3


@pytest.mark.parametrize("rows", [64, 128], ids=["64rows", "128rows"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D,Sq,Sk,dtype", [(64, 1000, 1000, torch.float16), (128, 257, 1003, torch.bfloat16),
                                           (64, 127, 77, torch.bfloat16), (128, 1000, 1000, torch.float16),
                                           (96, 1000, 1000, torch.float16), (96, 257, 77, torch.bfloat16),
                                           (80, 333, 1001, torch.float16), (80, 127, 129, torch.bfloat16)])
def test_sm80_mask_tile_shapes(D, Sq, Sk, dtype, causal, kind, rows, monkeypatch):
    """The D=64 / 80 / 96 / 128 masked kernels have two tile shapes (kernels/sm80/fwd_traits.cuh,
    FwdTraits' kTwoAtomMask / kNarrow): 64 query rows per CTA (one m-atom per warp, 64x64) and 128
    (two m-atoms: D=64 / 80 / 96 128x64, D=128 128x32); Hopper takes 128, Ada 64,
    FLASHCORE_SM80_TILES=narrow / wide either anywhere. Each matches the reference with a bool
    and an additive mask, odd lengths, fully masked rows, and "causal" as the lower-triangular
    (B, 1, Sq, Sk) mask HuggingFace sends (the op takes no attn_mask with is_causal=True, so the
    kernel's run-time causal flag is not reached from here); and the variable does pick the
    kernel (the last template argument, kNarrow, of the launched kernel's name, and the grid's
    query blocks)."""
    if not KERNEL_CARD:
        pytest.skip("no FlashCore kernel on this card")
    skip_unless_built(D, dtype)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm80")
    monkeypatch.setenv("FLASHCORE_SM80_TILES", "narrow" if rows == 64 else "wide")
    B, H = 2, 3
    q = torch.randn(B, H, Sq, D, dtype=dtype, device=DEVICE)
    k = torch.randn(B, H, Sk, D, dtype=dtype, device=DEVICE)
    v = torch.randn(B, H, Sk, D, dtype=dtype, device=DEVICE)
    c = Case(kind, "b1qk", Sq, Sk, dtype, D, B=B, Hkv=H)
    mask = mask_values(c, mask_dims(c))  # every 7th row from 3 fully masked
    if causal:  # top-left aligned, as is_causal: key j <= query i
        keep = torch.ones(Sq, Sk, dtype=torch.bool, device=DEVICE).tril()
        mask = mask & keep if kind == "bool" else mask.masked_fill(~keep, NEG_INF)
    out = {}
    launched = launched_kernels(lambda: out.update(o=_check(c, "sm80", mask, q, k, v, {})))
    fwd = [(n, g) for n, g in launched if "sm80::fwd_kernel" in n]
    assert len(fwd) == 1, launched
    name, grid = fwd[0]
    assert launched_narrow(name) == (rows == 64), name
    mask_arg = {"bool": (",1,", ",(int)1,"), "additive": (",2,", ",(int)2,")}[kind]  # kMask
    assert any(a in name.replace(" ", "") for a in mask_arg), name
    assert grid[0] == (Sq + rows - 1) // rows, (name, grid)


def test_explain_with_and_without_lse():
    """explain(lse=True) describes sdpa_fwd, which training and flashcore.attention call: on
    Hopper an additive mask at D=64 goes to PyTorch's SDPA in sdpa (no LSE wanted) and runs in
    the sm80 family in sdpa_fwd, whose LSE FlashCore's backward reads; explain_attention and
    explain_training say the latter."""
    if not HOPPER:
        pytest.skip("the rule is Hopper's")
    q, k, v = (torch.randn(2, 4, 256, 64, dtype=torch.float16, device=DEVICE) for _ in range(3))
    mask = torch.zeros(2, 1, 256, 256, dtype=torch.float16, device=DEVICE)
    assert "PyTorch's own SDPA runs such calls faster" in flashcore.explain(q, k, v, attn_mask=mask)
    family, reason = torch.ops.flashcore.explain(q, k, v, mask, lse=True)
    assert family == 1 and reason >= flashcore._note_base(), (family, reason)
    assert flashcore.explain_attention(q, k, v, attn_mask=mask).startswith("kernel sm80 (not sm90")
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    os.environ["FLASHCORE_TRAINING"] = "flashcore"
    try:
        assert flashcore.explain_training(qg, kg, vg, attn_mask=mask).startswith(
            "flashcore: forward kernel sm80 (not sm90")
        out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask)
        torch.testing.assert_close(out, flashcore.sdpa(q, k, v, attn_mask=mask), atol=2e-3, rtol=0)
    finally:
        del os.environ["FLASHCORE_TRAINING"]


# --------------------------------------------------------------------------- masks inside causal

def hf_padded_causal(B, Sq, Sk):
    """HuggingFace's left-padded causal bool mask (B, 1, Sq, Sk), top-left: row i keeps keys
    pad_b <= j <= i (and its own key), so no kept pair lies above the diagonal."""
    i = torch.arange(Sq, device=DEVICE).view(-1, 1)
    j = torch.arange(Sk, device=DEVICE).view(1, -1)
    pad = (torch.arange(B, device=DEVICE) * (Sq // (2 * B))).view(-1, 1, 1, 1)
    return (j <= i) & ((j >= pad) | (j == i))


def sm90_forward_is_causal(call):
    """kCausal of the one sm90 forward kernel call() launches (its third template argument)."""
    names = [n for n, _ in launched_kernels(call) if "sm90::fwd_kernel" in n]
    assert len(names) == 1, names
    return names[0].split("fwd_kernel<")[1].replace(" ", "").split(",")[2] == "true"


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("Sq,Sk", [(320, 320), (300, 512), (512, 384)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_mask_inside_causal_forward(D, Sq, Sk, dtype):
    """A bool mask inside the causal triangle (HuggingFace's padded causal mask) runs the Hopper
    forward's causal configuration with the mask (its key blocks above the diagonal skipped), in
    inference and in training's forward; a mask with one kept pair above the diagonal runs the
    non-causal one. Outputs (and the LSE of the training forward, through the gradients) match
    the reference either way."""
    if not HOPPER:
        pytest.skip("the causal masked configuration is the Hopper family's")
    skip_unless_built(D, dtype)
    B, H = 2, 4
    q, k, v = (torch.randn(B, H, S, D, dtype=dtype, device=DEVICE) for S in (Sq, Sk, Sk))
    inside = hf_padded_causal(B, Sq, Sk)
    outside = inside.clone()
    outside[1, 0, Sq // 2, Sq // 2 + 7] = True  # one kept pair above the diagonal
    for mask, causal in ((inside, True), (outside, False)):
        said = flashcore.explain(q, k, v, attn_mask=mask)
        assert said.startswith("kernel sm90") and ("as causal" in said) is causal, said
        out = {}
        assert sm90_forward_is_causal(lambda: out.update(o=flashcore.sdpa(q, k, v, attn_mask=mask))) is causal
        ref_hi = reference(q, k, v, mask, None, torch.float64)
        tol = 2 * (reference(q, k, v, mask, None, dtype).double() - ref_hi).abs().max().item() + ATOL[dtype]
        err = (out["o"].double() - ref_hi).abs().max().item()
        assert err <= tol, (causal, err, tol)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        os.environ["FLASHCORE_TRAINING"] = "flashcore"
        try:
            assert sm90_forward_is_causal(
                lambda: out.update(t=flashcore.sdpa(qg, kg, vg, attn_mask=mask))) is causal
        finally:
            del os.environ["FLASHCORE_TRAINING"]
        assert (out["t"].detach().double() - ref_hi).abs().max().item() <= tol
        g = torch.randn_like(out["t"])
        out["t"].backward(g)
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
        keep = torch.zeros(mask.shape, dtype=torch.float64, device=DEVICE).masked_fill(~mask, NEG_INF)
        s = qd @ kd.transpose(-1, -2) / math.sqrt(D) + keep
        (torch.softmax(s, -1) @ vd).backward(g.double())
        for got, want in ((qg.grad, qd.grad), (kg.grad, kd.grad), (vg.grad, vd.grad)):
            scale = want.abs().max().item()
            assert (got.double() - want).abs().max().item() <= 0.02 * scale + 0.02, (causal, scale)


def test_mask_inside_causal_forward_in_cuda_graph():
    """Under CUDA-graph capture the mask is not read (no wait for the device there): the call
    runs as written, non-causal with its mask, and replays the same answer."""
    if not HOPPER:
        pytest.skip("the causal masked configuration is the Hopper family's")
    skip_unless_built(64, torch.float16)
    q, k, v = (torch.randn(2, 4, 320, 64, dtype=torch.float16, device=DEVICE) for _ in range(3))
    mask = hf_padded_causal(2, 320, 320)
    eager = flashcore.sdpa(q, k, v, attn_mask=mask)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashcore.sdpa(q, k, v, attn_mask=mask)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashcore.sdpa(q, k, v, attn_mask=mask)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, atol=2e-3, rtol=0)


@pytest.mark.parametrize("D", [64, 128])
def test_mask_broadcast_over_keys_runs_as_written(D):
    """A bool mask broadcast over the keys ((B, 1, Sq, 1): a kept row keeps every key) is not
    inside the causal triangle, though its own shape has nothing above a diagonal: the call runs
    as written (its output and gradients against float64), not as causal with the mask."""
    if not HOPPER:
        pytest.skip("the causal masked configuration is the Hopper family's")
    skip_unless_built(D, torch.float16)
    B, H, S = 2, 4, 320
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float16, device=DEVICE) for _ in range(3))
    rows = torch.rand(B, 1, S, 1, device=DEVICE) > 0.2
    out = {}
    assert not sm90_forward_is_causal(lambda: out.update(o=flashcore.sdpa(q, k, v, attn_mask=rows)))
    ref_hi = reference(q, k, v, rows, None, torch.float64)
    tol = 2 * (reference(q, k, v, rows, None, torch.float16).double() - ref_hi).abs().max().item() + ATOL[torch.float16]
    assert (out["o"].double() - ref_hi).abs().max().item() <= tol
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    os.environ["FLASHCORE_TRAINING"] = "flashcore"
    try:
        o = flashcore.sdpa(qg, kg, vg, attn_mask=rows)
    finally:
        del os.environ["FLASHCORE_TRAINING"]
    g = torch.randn_like(o)
    o.backward(g)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    # A finite fill, then the fully masked rows zeroed by a product: an all -inf row's softmax is
    # NaN, and NaN's gradient survives torch.where, so that reference's gradients would be NaN.
    scores = (qd @ kd.transpose(-1, -2) / math.sqrt(D)).masked_fill(~rows, torch.finfo(torch.float64).min)
    p = torch.softmax(scores, -1) * rows  # a row this mask drops keeps no key: zeros
    (p @ vd).backward(g.double())
    for got, want in ((qg.grad, qd.grad), (kg.grad, kd.grad), (vg.grad, vd.grad)):
        assert (got.double() - want).abs().max().item() <= 0.02 * want.abs().max().item() + 0.02
