"""GPU correctness tests for torch.ops.flashcore.sdpa.

What it checks, on a CUDA machine:
  * kernel cases (fp16/bf16, D 32/64/80/96/128/256, causal or not, many Sq/Sk, GQA, strided
    and transposed inputs) match a float64 reference within a tolerance derived
    from the error of the same math done in the input's low precision:
        max|out - ref_hi| <= 2 * max|ref_lp - ref_hi| + atol
    and flashcore.explain() says a FlashCore kernel ran (no silent fallback);
  * every output element is written (the caching allocator is filled with NaN
    right before each call, so the op's fresh output reuses poisoned memory);
  * fallback cases (fp32, float32 masks with fp16 inputs, D=40, dropout) equal F.scaled_dot_product_attention
    bit for bit and explain() says "fallback";
  * the op runs on the caller's current stream and inside a CUDA graph capture.
Each kernel case runs under FLASHCORE_FAMILY=sm80 and =sm90 (forced; sm90 on Hopper only) and =auto.

Run:  python -m pytest tests/test_gpu_sdpa.py -q
Without a CUDA device each test skips with a reason (tests/gpu_gate.py). A failed
`import flashcore` is an error, never a skip. Set FLASHCORE_REQUIRE_GPU=1 to make
a missing CUDA device an error too (for the GPU machine's script).
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

GPU, pytestmark = gpu_gate("no CUDA device: GPU tests of flashcore.sdpa skipped")

# The package must load (the cases are collected everywhere): let ImportError fail the run.
import flashcore  # noqa: E402
from build_record import skip_unless_built  # noqa: E402
from kernel_trace import launched_kernels, launched_narrow  # noqa: E402

sdpa = torch.ops.flashcore.sdpa
DEVICE = "cuda"
# The sm80 kernel family is built for sm_89 and sm_90; elsewhere the op falls back to aten.
KERNEL_CARD = GPU and torch.cuda.get_device_capability() in ((8, 9), (9, 0))
HOPPER = GPU and torch.cuda.get_device_capability() == (9, 0)

# atol covers the final rounding of the output, which ref_lp can get luckily right:
# one fp16 ulp at |x| ~ 1 is 2^-10 ~ 9.8e-4 -> 1e-3; one bf16 ulp at 1 is 2^-7 ~ 7.8e-3 -> 1e-2.
# Outputs are convex combinations of randn rows, so |out| is rarely above ~3.
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}


# --------------------------------------------------------------------------- references

def _expand_kv(x, hq):
    """(B, Hkv, S, D) -> (B, Hq, S, D) the way enable_gqa does (repeat_interleave)."""
    hkv = x.shape[1]
    return x if hkv == hq else x.repeat_interleave(hq // hkv, dim=1)


def _causal_keep(sq, sk, device):
    """Top-left aligned causal mask as PyTorch defines is_causal: key j visible to query i iff j <= i."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).tril(diagonal=0)


def reference(q, k, v, is_causal, scale, compute_dtype):
    """SDPA by explicit matmul + softmax in compute_dtype, result in compute_dtype.

    compute_dtype=float64: the high-precision reference (inputs upcast exactly).
    compute_dtype=q.dtype (fp16/bf16): the same math in low precision; every matmul
    and softmax output is rounded to the low dtype, like the P->fp16 rounding a fused
    kernel does (aten's MATH backend would upcast to fp32 by default, hiding that error).
    Heads are processed in chunks so the score matrix stays under ~2^27 elements.
    """
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kk = _expand_kv(k, Hq)
    vv = _expand_kv(v, Hq)
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=compute_dtype, device=q.device)
    keep = _causal_keep(Sq, Sk, q.device) if is_causal else None
    step = max(1, (1 << 27) // max(1, Sq * Sk))
    # fp32 accumulation in the low-precision matmuls, so ref_lp's error (and so the
    # tolerance) does not depend on cuBLAS choosing a reduced-precision split-K.
    m = torch.backends.cuda.matmul
    saved = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = False
    m.allow_bf16_reduced_precision_reduction = False
    try:
        _reference_chunks(q, kk, vv, out, keep, scale, step, compute_dtype)
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved
    return out


def _reference_chunks(q, kk, vv, out, keep, scale, step, compute_dtype):
    B, Hq = q.shape[:2]
    for b in range(B):
        for h0 in range(0, Hq, step):
            h1 = min(Hq, h0 + step)
            qc = q[b, h0:h1].to(compute_dtype)
            kc = kk[b, h0:h1].to(compute_dtype)
            vc = vv[b, h0:h1].to(compute_dtype)
            s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
            if keep is not None:
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.softmax(s, dim=-1)
            out[b, h0:h1] = torch.matmul(p, vc)


# --------------------------------------------------------------------------- helpers

def poison_allocator(shape, dtype):
    """Fill a block of the output's size with NaN and free it, so that the op's own
    output allocation (same size, same stream) likely reuses it: unwritten elements
    then show as NaN instead of whatever stale data was there."""
    junk = torch.empty(shape, dtype=dtype, device=DEVICE)
    junk.fill_(float("nan"))
    del junk


def make_inputs(B, Hq, Hkv, Sq, Sk, D, dtype, layout, gen=None):
    """Fresh randn q, k, v as (B, H, S, D) views in the requested memory layout.

    bhsd:   contiguous (B, H, S, D).
    bshd:   contiguous (B, S, H, D) transposed to (B, H, S, D) (HuggingFace layout).
    sliced: a (B, H, S, D) view at a 16-byte offset inside a (B, H, S, D + 24) buffer:
            row stride is not D and the base is only 16-byte aligned.
    """
    def one(H, S):
        if layout == "bhsd":
            return torch.randn(B, H, S, D, dtype=dtype, device=DEVICE, generator=gen)
        if layout == "bshd":
            return torch.randn(B, S, H, D, dtype=dtype, device=DEVICE, generator=gen).transpose(1, 2)
        if layout == "sliced":
            off = 16 // torch.empty((), dtype=dtype).element_size()
            buf = torch.randn(B, H, S, D + 24, dtype=dtype, device=DEVICE, generator=gen)
            return buf[..., off:off + D]
        raise ValueError(layout)

    q, k, v = one(Hq, Sq), one(Hkv, Sk), one(Hkv, Sk)
    if layout != "bhsd":
        assert not q.is_contiguous() and q.stride(-1) == 1
    return q, k, v


def check_close(out, q, k, v, is_causal, scale, what):
    ref_hi = reference(q, k, v, is_causal, scale, torch.float64)
    ref_lp = reference(q, k, v, is_causal, scale, q.dtype)
    assert out.shape == ref_hi.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref_hi.shape)}"
    assert out.dtype == q.dtype and out.device == q.device, f"{what}: dtype/device"
    n_nan = torch.isnan(out).sum().item()
    assert n_nan == 0, f"{what}: {n_nan} NaN elements in the output (unwritten or bad softmax)"
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    err = (out.double() - ref_hi).abs().max().item()
    lp_err = (ref_lp.double() - ref_hi).abs().max().item()
    tol = 2 * lp_err + ATOL[q.dtype]
    assert err <= tol, f"{what}: max|out-ref|={err:.3e} > tol={tol:.3e} (low-precision ref err {lp_err:.3e})"
    return err, tol


def family_kwargs(enable_gqa, scale):
    kw = {}
    if enable_gqa:
        kw["enable_gqa"] = True
    if scale is not None:
        kw["scale"] = scale
    return kw


@pytest.fixture(autouse=True)
def _seed(request):
    """Fresh inputs per test, yet reproducible: seed from the test's own id."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=["sm80", "sm90", "auto"])
def family(request, monkeypatch):
    """The op reads FLASHCORE_FAMILY at every call; os.environ writes reach getenv()."""
    if request.param == "sm80" and not KERNEL_CARD:
        pytest.skip("forcing the sm80 family raises on cards other than sm_89 / sm_90")
    if request.param == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    monkeypatch.setenv("FLASHCORE_FAMILY", request.param)
    return request.param


# --------------------------------------------------------------------------- kernel cases

@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    D: int
    causal: bool
    Sq: int
    Sk: int
    Hkv: int = 2
    ratio: int = 1          # Hq = ratio * Hkv
    layout: str = "bhsd"
    B: int = 2
    scale: float = None

    @property
    def id(self):
        dt = {torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]
        s = f"{dt}-d{self.D}-{'causal' if self.causal else 'full'}-q{self.Sq}-k{self.Sk}"
        s += f"-b{self.B}-hkv{self.Hkv}x{self.ratio}-{self.layout}"
        if self.scale is not None:
            s += f"-scale{self.scale}"
        return s


def _cases():
    fp16, bf16 = torch.float16, torch.bfloat16
    cases = []
    # Core grid, every dtype x D x causal: S=1, odd sizes, Sq != Sk both ways,
    # Sq > Sk (causal: top-left alignment, rows past Sk see every key), tile edges 127/128.
    core = [(1, 1), (17, 17), (128, 128), (127, 128), (128, 127), (1, 1000), (1000, 1),
            (64, 1000), (1000, 64), (1000, 1000)]
    for dt in (fp16, bf16):
        for D in (64, 128):
            for causal in (False, True):
                for sq, sk in core:
                    cases.append(Case(dt, D, causal, sq, sk, Hkv=2, ratio=1 if D == 64 else 4))
    # Long sequences (4097 = 4096 + 1 crosses every power-of-two tile): fp16 full grid, bf16 one each.
    for D in (64, 128):
        for causal in (False, True):
            for sq, sk in ((4097, 4097), (1, 4097), (4097, 17), (17, 4097)):
                cases.append(Case(fp16, D, causal, sq, sk, Hkv=1, ratio=8, B=1))
            cases.append(Case(bf16, D, causal, 4097, 4097, Hkv=2, ratio=4, B=1))
    # GQA: every ratio x every Hkv, short-q/long-k causal and long-q/short-k full.
    for ratio in (1, 4, 8):
        for hkv in (1, 2, 8):
            cases.append(Case(fp16, 64, True, 127, 1000, Hkv=hkv, ratio=ratio, B=1))
            cases.append(Case(bf16, 128, False, 1000, 127, Hkv=hkv, ratio=ratio, B=1))
    # The decode kernel's 17-32-row path (CUDA cores; <= 16 rows take the tensor-core one):
    # MQA 32:1 at Sq = 1, GQA 8:1 with Sq = 3 and 4 (speculative steps), causal or not.
    cases.append(Case(fp16, 128, False, 1, 1000, Hkv=1, ratio=32))
    cases.append(Case(bf16, 64, True, 3, 777, Hkv=2, ratio=8))
    cases.append(Case(fp16, 128, True, 4, 4097, Hkv=1, ratio=8, B=1))
    # Non-contiguous layouts.
    for layout in ("bshd", "sliced"):
        for dt in (fp16, bf16):
            for D in (64, 128):
                for causal in (False, True):
                    for sq, sk in ((1000, 1000), (17, 128)):
                        cases.append(Case(dt, D, causal, sq, sk, Hkv=2, ratio=4, layout=layout))
    # Head dims only the sm80 family has (32, 80, 96: Phi-2 / Phi-3 use 80 and 96): odd lengths,
    # Sq != Sk both ways, GQA, both dtypes, causal or not; a long and a transposed case each.
    for dt in (fp16, bf16):
        for D in (32, 80, 96):
            for causal in (False, True):
                for sq, sk in ((1, 1), (17, 17), (127, 127), (1000, 1000), (1, 1000), (1000, 1),
                               (17, 1000), (1000, 127), (128, 127)):
                    cases.append(Case(dt, D, causal, sq, sk, Hkv=2, ratio=1 if D == 80 else 4))
    for D in (32, 80, 96):
        for causal in (False, True):
            cases.append(Case(fp16, D, causal, 4097, 4097, Hkv=1, ratio=8, B=1))
            cases.append(Case(bf16, D, causal, 1000, 777, Hkv=8, ratio=1, layout="bshd"))
            cases.append(Case(fp16, D, causal, 127, 1000, Hkv=2, ratio=4, layout="sliced"))
        cases.append(Case(bf16, D, True, 300, 300, scale=0.05))
    # Head dim 256: the sm90 family on Hopper (auto), the sm80 family forced or on Ada.
    for dt in (fp16, bf16):
        for causal in (False, True):
            for sq, sk in ((1, 1), (17, 300), (300, 17), (1000, 1000), (4097, 4097)):
                cases.append(Case(dt, 256, causal, sq, sk, Hkv=2, ratio=2, B=1))
    cases.append(Case(fp16, 256, True, 1000, 1000, Hkv=2, ratio=2, layout="bshd"))
    cases.append(Case(bf16, 256, False, 127, 1000, Hkv=1, ratio=8, layout="sliced"))
    # Explicit scale.
    for dt in (fp16, bf16):
        cases.append(Case(dt, 128, True, 300, 300, scale=0.05))
        cases.append(Case(dt, 64, False, 300, 200, Hkv=1, ratio=8, scale=0.3, layout="bshd"))
    return cases


CASES = _cases()
SM80_ONLY_DIMS = (32, 80, 96)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_reference(case, family):
    c = case
    if c.D in SM80_ONLY_DIMS and family == "sm90":
        pytest.skip(f"the sm90 family has no D={c.D} kernel (the sm80 family covers it on Hopper)")
    skip_unless_built(c.D, c.dtype)
    q, k, v = make_inputs(c.B, c.Hkv * c.ratio, c.Hkv, c.Sq, c.Sk, c.D, c.dtype, c.layout)
    kw = family_kwargs(c.ratio > 1, c.scale)
    path = flashcore.explain(q, k, v, is_causal=c.causal, scale=c.scale, enable_gqa=c.ratio > 1)
    if KERNEL_CARD and c.D in SM80_ONLY_DIMS and family == "auto" and HOPPER:
        # AUTO on Hopper leaves these dims to PyTorch's faster cuDNN path (the "sm80" param runs
        # the kernel); the answer must still match the reference.
        assert path.startswith("fallback") and "cuDNN" in path, path
    elif KERNEL_CARD:
        assert path.startswith("kernel"), f"expected a FlashCore kernel, explain() says: {path!r}"
    poison_allocator((c.B, c.Hkv * c.ratio, c.Sq, c.D), c.dtype)
    out = sdpa(q, k, v, None, 0.0, c.causal, **kw)
    torch.cuda.synchronize()
    check_close(out, q, k, v, c.causal, c.scale, f"{c.id} [{family}] ({path})")


# (head dim, key count, whether that count is the narrow tile): each dim's two tile shapes.
SM80_TILE_SHAPES = [(64, "64", True), (64, "128", False), (128, "32", True), (128, "64", False)]


@pytest.mark.parametrize("d,keys,narrow", SM80_TILE_SHAPES, ids=[f"d{d}-{n}keys" for d, n, _ in SM80_TILE_SHAPES])
@pytest.mark.parametrize("b,hq,hkv,sq,sk,causal,dtype", [
    (2, 4, 4, 1000, 1000, True, torch.float16), (1, 8, 2, 127, 4097, False, torch.bfloat16),
    (3, 6, 3, 200, 77, True, torch.bfloat16), (1, 2, 2, 4097, 4097, False, torch.float16),
    (2, 4, 1, 17, 1, False, torch.float16)])
def test_sm80_tile_shapes(b, hq, hkv, sq, sk, causal, dtype, d, keys, narrow, monkeypatch):
    """The sm80 family's D=64 and D=128 kernels have two tile shapes each (kernels/sm80/fwd_traits.cuh,
    FwdTraits' kNarrow): D=64 128x128 and D=128 128x64 on Hopper, 128x64 and 128x32 below compute
    capability 9 (Ada); FLASHCORE_SM80_TILES=narrow / wide picks Ada's or Hopper's anywhere. Each
    matches the reference at odd lengths, Sq != Sk, GQA and causal, and the variable does pick
    the kernel (its template argument in the launched kernel's name)."""
    if not KERNEL_CARD:
        pytest.skip("no FlashCore kernel on this card")
    skip_unless_built(d, dtype)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm80")
    monkeypatch.setenv("FLASHCORE_SM80_TILES", "narrow" if narrow else "wide")
    q, k, v = make_inputs(b, hq, hkv, sq, sk, d, dtype, "bshd")
    poison_allocator((b, hq, sq, d), dtype)
    out = {}
    launched = launched_kernels(lambda: out.update(o=sdpa(q, k, v, None, 0.0, causal, enable_gqa=hq != hkv)))
    names = [n for n, _ in launched if "sm80::fwd_kernel" in n]
    assert len(names) == 1, launched
    assert launched_narrow(names[0]) == narrow, names
    check_close(out["o"], q, k, v, causal, None, f"sm80 D={d} {keys}-key tiles B={b} H={hq}/{hkv} {sq}x{sk}")


def test_repeated_calls_are_deterministic(family):
    """Same inputs twice -> bit-identical outputs (a race or stale-state bug shows here)."""
    q, k, v = make_inputs(2, 8, 2, 1000, 1000, 128, torch.float16, "bhsd")
    outs = []
    for _ in range(3):
        poison_allocator((2, 8, 1000, 128), torch.float16)
        outs.append(sdpa(q, k, v, None, 0.0, True, enable_gqa=True))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("sk", [257, 1000, 4097])
def test_decode_split_count_does_not_change_result(dtype, sk):
    """Split-KV (issue 5): one (batch, KV head) alone is cut into many key ranges (fewer CTAs
    than SMs, c_src/dispatch.c), while the same slice inside a batch of SMs + 1 runs unsplit.
    The two answers agree up to the final rounding, and both match the reference."""
    if not KERNEL_CARD:
        pytest.skip("no FlashCore kernel on this card")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v = make_inputs(1, 4, 1, 1, sk, 128, dtype, "bhsd")
    assert flashcore.explain(q, k, v, enable_gqa=True) == "kernel decode"
    poison_allocator((1, 4, 1, 128), dtype)
    alone = sdpa(q, k, v, enable_gqa=True)
    qb, kb, vb = (t.expand(sms + 1, -1, -1, -1).contiguous() for t in (q, k, v))
    batched = sdpa(qb, kb, vb, enable_gqa=True)
    torch.cuda.synchronize()
    check_close(alone, q, k, v, False, None, f"decode alone Sk={sk}")
    ulp = 1e-3 if dtype == torch.float16 else 8e-3  # one ulp at |x| ~ 1
    torch.testing.assert_close(alone[0], batched[0], atol=ulp, rtol=0)
    torch.testing.assert_close(batched[0], batched[-1], atol=0, rtol=0)  # same slice, same answer


@pytest.mark.parametrize("splits", [1, 2, 7, 64])
@pytest.mark.parametrize("ratio,sq,causal", [(4, 1, False), (8, 3, False), (8, 3, True)],
                         ids=["mma-4rows", "cuda-core-24rows", "cuda-core-24rows-causal"])
def test_decode_forced_split_count(ratio, sq, causal, splits, monkeypatch):
    """FLASHCORE_DECODE_SPLITS (the A/B switch, c_src/flashcore.c) forces the decode split count
    for both decode kernels (up to 16 rows per KV head: tensor cores; 17-32: CUDA cores). 64
    splits of Sk=1000 (32 chunks) leave half the CTAs an empty key range, and causal Sq=3 sees
    only keys 0-2 (top-left), so all but one range is empty: the merge must weigh those at
    zero. The answer matches the reference and the heuristic's split count up to rounding."""
    if not KERNEL_CARD:
        pytest.skip("no FlashCore kernel on this card")
    q, k, v = make_inputs(2, 2 * ratio, 2, sq, 1000, 128, torch.float16, "bhsd")
    assert flashcore.explain(q, k, v, is_causal=causal, enable_gqa=True) == "kernel decode"
    monkeypatch.delenv("FLASHCORE_DECODE_SPLITS", raising=False)
    chosen = sdpa(q, k, v, None, 0.0, causal, enable_gqa=True)
    monkeypatch.setenv("FLASHCORE_DECODE_SPLITS", str(splits))
    poison_allocator(tuple(q.shape), q.dtype)
    forced = sdpa(q, k, v, None, 0.0, causal, enable_gqa=True)
    torch.cuda.synchronize()
    check_close(forced, q, k, v, causal, None, f"decode forced to {splits} splits")
    torch.testing.assert_close(forced, chosen, atol=1e-3, rtol=0)  # one fp16 ulp at |x| ~ 1


@pytest.mark.parametrize("b,hq,hkv,sk,layout", [(2, 6, 2, 1000, "sliced"), (1, 32, 4, 4097, "sliced"),
                                                 (3, 8, 1, 17, "bhsd"), (2, 4, 4, 300, "sliced"),
                                                 (8, 16, 8, 2049, "bhsd")])
def test_sm90_decode_packs_gqa_rows(b, hq, hkv, sk, layout, monkeypatch):
    """One query row, no causal mask, in the Hopper family: the query heads of each KV head's
    group go as the rows of one block (fc_pack_decode_gqa rewrites sizes and strides, so K/V are
    read once per KV head). Output and LSE match the reference at odd lengths, group sizes 1-8
    and strided layouts (sliced: the packed rows are S * (D + 24) apart, not D), split or not
    (B=8 Hkv=8: 64 blocks, a small grid, split across CTAs)."""
    if not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    q, k, v = make_inputs(b, hq, hkv, 1, sk, 128, torch.float16, layout)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    poison_allocator((b, hq, 1, 128), torch.float16)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, False, enable_gqa=hq != hkv)
    torch.cuda.synchronize()
    check_close(out, q, k, v, False, None, f"sm90 packed decode B={b} H={hq}/{hkv} Sk={sk} {layout}")
    scores = q.double() @ _expand_kv(k, hq).double().transpose(-1, -2) / math.sqrt(128)
    ref_lse = torch.logsumexp(scores, dim=-1).reshape(lse.shape)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("splits", [None, 2, 5, 16, 64])
@pytest.mark.parametrize("b,hq,hkv,sk,layout", [(1, 32, 8, 4097, "bhsd"), (1, 32, 32, 1000, "sliced"),
                                                 (1, 28, 4, 2049, "bhsd"), (3, 6, 6, 300, "bhsd"),
                                                 (1, 8, 1, 17, "sliced"), (2, 16, 2, 33000, "bhsd")])
def test_sm90_decode_grid_split(b, hq, hkv, sk, layout, splits, monkeypatch):
    """The Hopper family's grid split for one-row D=128 decoding over fewer than 64 (batch, KV
    head) pairs (c_src/dispatch.c, fc_sm90_decode_splits): each pair's block is cut into key
    ranges, one CTA each without clusters, and combine_kernel merges the partials from the
    workspace. Forced counts (FLASHCORE_DECODE_SPLITS) up to 64 leave some ranges empty (17 and
    300 keys are one or three key tiles), which the merge must weigh zero. Output and LSE match
    the reference at odd lengths, GQA groups 1-8 and strided layouts, for every count."""
    if not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    skip_unless_built(128, torch.float16)
    q, k, v = make_inputs(b, hq, hkv, 1, sk, 128, torch.float16, layout)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    if splits is None:
        monkeypatch.delenv("FLASHCORE_DECODE_SPLITS", raising=False)
    else:
        monkeypatch.setenv("FLASHCORE_DECODE_SPLITS", str(splits))
    poison_allocator((b, hq, 1, 128), torch.float16)
    res = {}
    launched = launched_kernels(lambda: res.update(r=torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, False,
                                                                                  enable_gqa=hq != hkv)))
    out, lse = res["r"]
    names = [n for n, _ in launched]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    split = splits is not None or min(sms // (b * hkv), sk // 512) > 1  # fc_sm90_decode_splits' count
    assert any("combine_kernel" in n for n in names) == split, names
    check_close(out, q, k, v, False, None, f"sm90 grid split {splits} B={b} H={hq}/{hkv} Sk={sk} {layout}")
    scores = q.double() @ _expand_kv(k, hq).double().transpose(-1, -2) / math.sqrt(128)
    ref_lse = torch.logsumexp(scores, dim=-1).reshape(lse.shape)
    torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("b,hq,hkv,sq,sk,d,tiles", [(8, 32, 32, 1, 1000, 128, 256), (32, 32, 8, 1, 777, 128, 256),
                                                   (4, 40, 40, 17, 300, 128, 160), (3, 16, 16, 1000, 513, 128, 384),
                                                   (2, 16, 4, 1000, 1000, 64, 192)])
def test_sm90_balanced_grid(b, hq, hkv, sq, sk, d, tiles, monkeypatch):
    """Non-causal calls with more tiles than SMs run on a persistent grid of fc_balanced_grid's
    size (c_src/dispatch.c): the fewest CTAs that keep a full wave's number of rounds, e.g. 128
    CTAs of two tiles for 256 one-row decode tiles, and match the reference. The D=128 rows
    include tiles whose second warpgroup has no live row (one query row, 4 packed rows, 17 rows),
    which skips its key tiles (kSkipDeadRows in kernels/sm90/fwd_kernel.cuh). (The bitwise
    comparison with the full-wave grid went with its switch, FLASHCORE_SM90_BALANCED, retired:
    docs/TUNING.md; a persistent CTA's tiles do not depend on the grid's size.)"""
    if not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    skip_unless_built(d, torch.float16)
    q, k, v = make_inputs(b, hq, hkv, sq, sk, d, torch.float16, "bhsd")
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    monkeypatch.setenv("FLASHCORE_SM90_SHORT", "0")  # D=64: the three-warpgroup configuration (192-row blocks)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    poison_allocator((b, hq, sq, d), torch.float16)
    launched = launched_kernels(lambda: out.update(o=sdpa(q, k, v, enable_gqa=hq != hkv)))
    grids = [grid[0] for name, grid in launched if "fwd_kernel" in name]
    rounds = -(-tiles // sms)
    assert grids == [-(-tiles // rounds) if tiles > sms else tiles], grids
    check_close(out["o"], q, k, v, False, None, f"balanced grid B={b} H={hq}/{hkv} {sq}x{sk} D={d}")


@pytest.mark.parametrize("b,hq,hkv,sk", [(8, 32, 32, 8200), (32, 32, 8, 8200), (8, 32, 8, 32769), (8, 32, 32, 1000),
                                         (1, 32, 8, 131072), (32, 32, 32, 1024), (32, 32, 8, 1024),
                                         (8, 32, 8, 1000), (4, 32, 32, 2047), (4, 32, 32, 2049), (1, 32, 32, 8192),
                                         (1, 32, 32, 32768), (1, 32, 8, 32768), (2, 32, 8, 65536), (1, 32, 8, 131071)])
def test_decode_route_by_pairs(b, hq, hkv, sk):
    """Under AUTO on Hopper, D=128 decoding over at least 64 (batch, KV head) pairs and 2^18 key
    rows, or over fewer pairs and 2^20 key rows (split over the grid), runs in the Hopper family
    (c_src/dispatch.c, sm90_reads_decode_faster), other calls in the decode kernel; both match
    the reference."""
    if not HOPPER:
        pytest.skip("the decode route to the sm90 family is for sm_90 only")
    skip_unless_built(128, torch.bfloat16)  # a trimmed build has neither family's kernels for it
    q, k, v = make_inputs(b, hq, hkv, 1, sk, 128, torch.bfloat16, "bhsd")
    pairs = b * hkv
    want = "kernel sm90" if pairs * sk >= (1 << 18 if pairs >= 64 else 1 << 20) else "kernel decode"
    if want == "kernel sm90" and pairs * sk >= 1 << 20 and _aten_picks_cudnn(q, k, v, hq != hkv):
        want = "fallback: " + flashcore._reason_string(14)  # kCudnnDecodes: test_decode_left_to_cudnn
    assert flashcore.explain(q, k, v, enable_gqa=hq != hkv) == want
    poison_allocator((b, hq, 1, 128), torch.bfloat16)
    out = sdpa(q, k, v, enable_gqa=hq != hkv)
    torch.cuda.synchronize()
    check_close(out, q, k, v, False, None, f"decode route B={b} H={hq}/{hkv} Sk={sk} ({want})")


def _aten_picks_cudnn(q, k, v, gqa):
    return torch._fused_sdp_choice(q, k, v, enable_gqa=gqa) == SDPBackend.CUDNN_ATTENTION.value


@pytest.mark.parametrize("b,hq,hkv,sk", [(8, 32, 32, 8200), (32, 32, 8, 32769), (1, 32, 32, 32768)])
def test_decode_left_to_cudnn(b, hq, hkv, sk, monkeypatch):
    """One-row decoding that the decode route sends to the Hopper family, over at least 2^20
    (batch, KV head, key) rows, goes to PyTorch's SDPA when PyTorch would run it in cuDNN, which
    decodes as fast or faster (torch_op/flashcore_op.cpp, decode_left_to_cudnn; reason 14):
    explain says so, no FlashCore kernel runs and the output is cuDNN's (to rounding). Where cuDNN
    is switched off, the LSE is wanted, or the family is forced, the kernel runs it, and matches."""
    if not HOPPER:
        pytest.skip("the decode route to the sm90 family is for sm_90 only")
    skip_unless_built(128, torch.float16)
    q, k, v = make_inputs(b, hq, hkv, 1, sk, 128, torch.float16, "bhsd")
    gqa = hq != hkv
    if not _aten_picks_cudnn(q, k, v, gqa):
        pytest.skip("PyTorch does not pick cuDNN for this call here")
    left = "fallback: " + flashcore._reason_string(14)
    assert flashcore.explain(q, k, v, enable_gqa=gqa) == left
    res = {}
    names = [n for n, _ in launched_kernels(lambda: res.update(o=sdpa(q, k, v, enable_gqa=gqa)))]
    assert not any("fwd_kernel" in n for n in names), names
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        torch.testing.assert_close(res["o"], F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
                                   atol=2e-3, rtol=0)
    check_close(res["o"], q, k, v, False, None, f"decode left to cuDNN B={b} H={hq}/{hkv} Sk={sk}")
    # The LSE wanted: the kernel.
    names = [n for n, _ in launched_kernels(lambda: res.update(r=torch.ops.flashcore.sdpa_fwd(
        q, k, v, None, 0.0, False, enable_gqa=gqa)))]
    assert any("fwd_kernel" in n for n in names), names
    check_close(res["r"][0], q, k, v, False, None, f"decode with LSE B={b} H={hq}/{hkv} Sk={sk}")
    # cuDNN switched off (PyTorch would take another backend): the kernel.
    cudnn_was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        assert flashcore.explain(q, k, v, enable_gqa=gqa) == "kernel sm90"
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_was)
    # The family forced: the kernel.
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    assert flashcore.explain(q, k, v, enable_gqa=gqa) == "kernel sm90"
    check_close(sdpa(q, k, v, enable_gqa=gqa), q, k, v, False, None, f"decode forced sm90 B={b} Sk={sk}")


@pytest.mark.parametrize("b,sq,sk", [(8, 4, 8192), (32, 16, 1024), (4, 2, 8200), (2, 16, 32768), (16, 16, 1024),
                                     (8, 16, 1024), (8, 17, 8192)])
def test_decode_rows_left_to_cudnn(b, sq, sk, monkeypatch):
    """2-16 query rows without GQA in the decode kernel over at least 128 (batch, KV head) pairs
    and 2^19 key rows go to PyTorch's SDPA where it would run them in cuDNN (decode_left_to_cudnn,
    reason 14); fewer pairs or rows, or 17 rows (not the decode kernel's), keep FlashCore's route;
    the family forced runs the decode kernel. Every way matches the reference."""
    if not HOPPER:
        pytest.skip("the rule is for sm_90 only")
    skip_unless_built(128, torch.float16)
    q, k, v = make_inputs(b, 32, 32, sq, sk, 128, torch.float16, "bhsd")
    left = "fallback: " + flashcore._reason_string(14)
    want_left = sq <= 16 and b * 32 >= 128 and b * 32 * sk >= 1 << 19 and _aten_picks_cudnn(q, k, v, False)
    got = flashcore.explain(q, k, v)
    if want_left:
        assert got == left, got
    else:
        assert got != left, got
    check_close(sdpa(q, k, v), q, k, v, False, None, f"decode rows B={b} Sq={sq} Sk={sk} ({got})")
    if sq <= 16:
        monkeypatch.setenv("FLASHCORE_FAMILY", "decode")
        assert flashcore.explain(q, k, v) == "kernel decode"
        check_close(sdpa(q, k, v), q, k, v, False, None, f"decode rows forced B={b} Sq={sq} Sk={sk}")


@pytest.mark.parametrize("shape", [(1, 8, 8, 512, 512, 64), (2, 8, 8, 700, 700, 128), (1, 32, 8, 1, 4096, 128)],
                         ids=["sm90-split", "sm90-persistent", "decode-split-combine"])
def test_pdl_chain_matches_serial(shape, monkeypatch):
    """Programmatic dependent launch (on by default on sm_90 for one-wave grids; FLASHCORE_PDL=0
    turns it off): each call's kernel may start under the previous kernel's tail and waits for it
    before touching global memory. A chain in which every call reads the previous call's output
    as its query (and the decode case's combine pass reads its own partials) must give, eagerly
    and replayed in a CUDA graph, bit for bit the chain without PDL."""
    if not HOPPER:
        pytest.skip("programmatic dependent launch is used on sm_90 only")
    B, Hq, Hkv, Sq, Sk, D = shape
    q, k, v = make_inputs(B, Hq, Hkv, Sq, Sk, D, torch.float16, "bhsd")

    def chain(x):
        for _ in range(4):
            x = sdpa(x, k, v, enable_gqa=True)
        return x

    monkeypatch.setenv("FLASHCORE_PDL", "0")
    serial = chain(q)
    monkeypatch.delenv("FLASHCORE_PDL")
    eager = chain(q)
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(static_q)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = chain(static_q)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(serial).all()
    assert torch.equal(eager, serial), "programmatic dependent launch changed an eager chain's result"
    assert torch.equal(replayed, serial), "programmatic dependent launch changed a graph-replayed chain's result"


SPLIT_CASES = [  # (dtype, D, causal, B, Hkv, ratio, Sq, Sk): small grids, ragged ends
    (torch.float16, 64, False, 1, 8, 1, 512, 512),
    (torch.bfloat16, 64, True, 1, 2, 4, 300, 1000),
    (torch.float16, 128, False, 1, 2, 4, 128, 4097),
    (torch.bfloat16, 128, True, 1, 4, 1, 1000, 1000),
    (torch.float16, 128, True, 2, 1, 8, 17, 777),
    (torch.float16, 256, False, 1, 2, 2, 200, 1000),
    (torch.bfloat16, 256, True, 1, 1, 2, 1000, 1000),
]


@pytest.mark.parametrize("splits", [2, 3, 5, 8])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: f"{'fp16' if c[0] == torch.float16 else 'bf16'}"
                         f"-d{c[1]}-{'causal' if c[2] else 'full'}-b{c[3]}-hkv{c[4]}x{c[5]}-q{c[6]}-k{c[7]}")
def test_sm90_kv_split_does_not_change_result(case, splits, monkeypatch):
    """Split-KV in the sm90 family (issue 5): a cluster of `splits` CTAs shares each query
    block's keys and merges through distributed shared memory. Forced split counts (some
    leave CTAs with empty key ranges: causal first blocks, 8 splits of 4 key tiles) must match
    the reference, give the same LSE, and agree with the unsplit kernel up to rounding."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    dtype, D, causal, B, hkv, ratio, sq, sk = case
    skip_unless_built(D, dtype)
    q, k, v = make_inputs(B, hkv * ratio, hkv, sq, sk, D, dtype, "bhsd")
    gqa = ratio > 1
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    if D == 64:  # the configurations that split across CTAs (all merge by pushing, SplitSlots):
        # three warpgroups, two, or one (tiny grids)
        monkeypatch.setenv("FLASHCORE_SM90_SHORT", {2: "1", 3: "2", 5: "0", 8: "2"}[splits])
    assert flashcore.explain(q, k, v, is_causal=causal, enable_gqa=gqa) == "kernel sm90"
    monkeypatch.setenv("FLASHCORE_KV_SPLITS", "1")
    poison_allocator((B, hkv * ratio, sq, D), dtype)
    whole, lse_whole = torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, causal, enable_gqa=gqa)
    monkeypatch.setenv("FLASHCORE_KV_SPLITS", str(splits))
    poison_allocator((B, hkv * ratio, sq, D), dtype)
    split, lse_split = torch.ops.flashcore.sdpa_fwd(q, k, v, None, 0.0, causal, enable_gqa=gqa)
    torch.cuda.synchronize()
    check_close(split, q, k, v, causal, None, f"sm90 split {splits}")
    ulp = 2e-3 if dtype == torch.float16 else 1.6e-2  # two ulps at |x| ~ 1
    torch.testing.assert_close(split, whole, atol=ulp, rtol=0)
    assert torch.isfinite(lse_split).all()
    torch.testing.assert_close(lse_split, lse_whole, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("short", ["0", "1", "2", "3"])
@pytest.mark.parametrize("causal,sq,sk", [(False, 1000, 1000), (True, 1000, 777), (True, 4097, 4097),
                                          (False, 17, 3000), (True, 300, 1000), (False, 200, 100),
                                          (True, 100, 300), (False, 200, 400), (False, 64, 300)])
def test_sm90_d64_configurations(causal, sq, sk, short, monkeypatch):
    """D=64 has four sm90 configurations (three consumer warpgroups, two for short query
    sequences, one for tiny grids, and two splitting one block's keys; kernels/sm90/fwd_launch.cuh
    launch_fwd). Each is forced over lengths the automatic choice would give to another (a
    single key tile leaves the pair's second warpgroup nothing; 200 x 400 and 64 x 300 give the
    pair at most 64 blocks, half the SMs, and warpgroups of two key tiles, which issue both S
    GEMMs at once, beside one of a single tile at 300 keys); all must match the reference."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    skip_unless_built(64, torch.bfloat16)
    q, k, v = make_inputs(2, 8, 2, sq, sk, 64, torch.bfloat16, "bshd")
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    monkeypatch.setenv("FLASHCORE_SM90_SHORT", short)
    poison_allocator((2, 8, sq, 64), torch.bfloat16)
    out = sdpa(q, k, v, None, 0.0, causal, enable_gqa=True)
    torch.cuda.synchronize()
    check_close(out, q, k, v, causal, None, f"sm90 D=64 short={short}")


@pytest.mark.parametrize("b,hq,hkv,sq,sk,causal,dtype,layout", [
    (1, 8, 8, 512, 512, False, torch.float16, "bhsd"),   # the small shape: 4 key tiles, both S up front
    (1, 8, 8, 512, 512, True, torch.float16, "bhsd"),    # causal: 1-4 key tiles per block
    (2, 8, 2, 200, 400, False, torch.bfloat16, "bshd"),  # GQA 4:1, a ragged last block and key tile
    (1, 8, 2, 64, 300, True, torch.float16, "sliced"),   # 3 key tiles (causal, Sq < Sk: 1)
    (1, 4, 1, 17, 127, False, torch.float16, "bhsd"),    # one key tile: the second warpgroup has none
    (3, 4, 4, 256, 1, True, torch.bfloat16, "bhsd"),     # a single key
    (1, 8, 8, 384, 384, True, torch.float16, "bshd"),    # 1-3 key tiles
])
def test_sm90_pair_lead_load(b, hq, hkv, sq, sk, causal, dtype, layout, monkeypatch):
    """On grids of at most half the SMs, a pair CTA whose key tiles all fit its ring loads K0
    alone, waits for it, then the other tiles in the order its warpgroups need them (the producer
    in kernels/sm90/fwd_producer.cuh, maps.pair_lead_load). The result must match the reference (on
    poisoned outputs), twice over, bit for bit. (The comparison with the interleaved order on the
    same grid went with its switch, FLASHCORE_SM90_PAIR_ORDER, retired: docs/TUNING.md; larger
    grids run the interleaved order: test_sm90_d64_configurations' pair cases.)"""
    if not HOPPER:
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    skip_unless_built(64, dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert 2 * (-(-sq // 64)) * hq * b <= sms, "the shape must be a small grid, or the path is not taken"
    q, k, v = make_inputs(b, hq, hkv, sq, sk, 64, dtype, layout)
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    monkeypatch.setenv("FLASHCORE_SM90_SHORT", "3")  # the pair
    outs = []
    for _ in range(2):
        poison_allocator((b, hq, sq, 64), dtype)
        outs.append(sdpa(q, k, v, None, 0.0, causal, enable_gqa=hq != hkv))
        torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]), "the same call gave two results"
    check_close(outs[0], q, k, v, causal, None, f"pair lead load B={b} H={hq}/{hkv} {sq}x{sk} causal={causal}")


@pytest.mark.parametrize("b,hq,hkv,s", [(1, 3, 1, 4097), (1, 5, 5, 2100), (1, 7, 7, 2049), (1, 16, 4, 2049)])
def test_sm90_d64_causal_waves(b, hq, hkv, s):
    """The automatic D=64 choice for causal grids past one wave of 64-row blocks
    (fc_sm90_d64_config's causal-waves rule): B=1 H=3 4097 takes the pair over 1.5 waves (one CTA
    per block, 33 key tiles), H=5 2100 the pair within 1.25 waves (17 key tiles), H=7 2049 one
    warpgroup over 1.75 waves, H=16 2049 two warpgroups."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    q, k, v = make_inputs(b, hq, hkv, s, s, 64, torch.float16, "bhsd")
    poison_allocator((b, hq, s, 64), torch.float16)
    out = sdpa(q, k, v, None, 0.0, True, enable_gqa=hq != hkv)
    torch.cuda.synchronize()
    check_close(out, q, k, v, True, None, f"sm90 D=64 causal B={b} H={hq}/{hkv} S={s}")


@pytest.mark.parametrize("short", ["auto", "0", "1", "2"])
@pytest.mark.parametrize("case", [
    (torch.float16, 64, False, 2, 4, 2, 1000, 777, "bhsd"),
    (torch.bfloat16, 64, True, 1, 3, 1, 4097, 4097, "bshd"),
    (torch.float16, 64, True, 3, 2, 4, 17, 300, "sliced"),
    (torch.float16, 128, False, 2, 4, 2, 1000, 1000, "bshd"),
    (torch.bfloat16, 128, False, 1, 2, 8, 127, 4097, "bhsd"),
    (torch.float16, 128, True, 2, 4, 1, 1000, 1000, "bhsd"),
    (torch.bfloat16, 256, False, 1, 2, 2, 300, 1000, "bshd"),
], ids=lambda c: f"{'fp16' if c[0] == torch.float16 else 'bf16'}-d{c[1]}-{'causal' if c[2] else 'full'}"
                 f"-b{c[3]}-hkv{c[4]}x{c[5]}-q{c[6]}-k{c[7]}-{c[8]}")
def test_sm90_tma_store_epilogue(case, short, monkeypatch):
    """The sm90 epilogue stores O through shared memory and TMA where the configuration has a
    staging buffer (all but the pair; kernels/sm90/fwd_traits.cuh, FwdTraits::kOBufs), else from
    registers (the pair, and split CTAs: test_sm90_kv_split_does_not_change_result,
    test_sm90_pair_lead_load). It must match the reference and write every row of the
    NaN-poisoned output (odd Sq: the map clips the last block's rows past Sq). (The bitwise
    comparison with the register stores in the same configuration went with their switch,
    FLASHCORE_SM90_TMA_STORE, retired: docs/TUNING.md.)"""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs on sm_90 (Hopper) only")
    dtype, D, causal, B, hkv, ratio, sq, sk, layout = case
    if short != "auto" and D != 64:
        pytest.skip("only D=64 has more than one configuration")
    skip_unless_built(D, dtype)
    q, k, v = make_inputs(B, hkv * ratio, hkv, sq, sk, D, dtype, layout)
    gqa = ratio > 1
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    monkeypatch.setenv("FLASHCORE_KV_SPLITS", "1")  # split CTAs always store from registers
    if short != "auto":
        monkeypatch.setenv("FLASHCORE_SM90_SHORT", short)
    poison_allocator((B, hkv * ratio, sq, D), dtype)
    out = sdpa(q, k, v, None, 0.0, causal, enable_gqa=gqa)
    torch.cuda.synchronize()
    check_close(out, q, k, v, causal, None, f"sm90 TMA-store epilogue short={short}")


# --------------------------------------------------------------------------- fallbacks

def _fallback_cases():
    g = torch.Generator(device=DEVICE).manual_seed(0)
    r = lambda *s, dt=torch.float16: torch.randn(*s, dtype=dt, device=DEVICE, generator=g)  # noqa: E731
    cases = {}
    q, k, v = r(2, 4, 100, 64, dt=torch.float32), r(2, 4, 90, 64, dt=torch.float32), r(2, 4, 90, 64, dt=torch.float32)
    cases["fp32"] = (q, k, v, dict(is_causal=True))
    q, k, v = r(2, 4, 100, 40), r(2, 4, 90, 40), r(2, 4, 90, 40)
    cases["d40"] = (q, k, v, dict())
    q, k, v = r(2, 4, 100, 64), r(2, 4, 90, 64), r(2, 4, 90, 64)
    # bool and q-dtype masks run in the kernel (tests/test_gpu_masks.py); a float32 mask with
    # fp16 inputs does not.
    cases["fp32_mask"] = (q, k, v, dict(attn_mask=r(100, 90, dt=torch.float32)))
    return cases


FALLBACKS = ["fp32", "d40", "fp32_mask"]


@pytest.mark.parametrize("name", FALLBACKS)
def test_fallback_equals_aten(name, family):
    q, k, v, kw = _fallback_cases()[name]
    path = flashcore.explain(q, k, v, attn_mask=kw.get("attn_mask"), is_causal=kw.get("is_causal", False))
    assert path.startswith("fallback"), f"{name}: expected a fallback, explain() says: {path!r}"
    out = sdpa(q, k, v, kw.get("attn_mask"), 0.0, kw.get("is_causal", False))
    if name == "fp32_mask":
        # The op hands aten the mask in q's dtype (torch 2.11's fused backends return NaN for a
        # float32 mask beside fp16 inputs); check that against the math backend's fp32 answer.
        mask = kw["attn_mask"]
        with sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                 attn_mask=mask.double())
        assert (out.double() - ref).abs().max().item() < 1e-2, "fp32_mask: far from the math answer"
        kw = dict(kw, attn_mask=mask.to(q.dtype))
    expected = F.scaled_dot_product_attention(q, k, v, **kw)
    assert torch.equal(out, expected), (
        f"{name}: fallback differs from aten, max diff {(out.float() - expected.float()).abs().max().item():.3e}")


def test_dropout_falls_back(family):
    q, k, v = make_inputs(2, 4, 4, 128, 128, 64, torch.float16, "bhsd")
    path = flashcore.explain(q, k, v, dropout_p=0.1)
    assert path.startswith("fallback"), f"dropout: expected a fallback, explain() says: {path!r}"
    out = sdpa(q, k, v, None, 0.1, False)
    assert out.shape == q.shape and torch.isfinite(out).all()


# --------------------------------------------------------------------------- streams and graphs

def test_runs_on_current_stream(family):
    """Launch on a non-default stream that is still busy (sleep, then the copy that
    produces q). A kernel launched on any other stream reads q before the copy lands
    and returns NaN/garbage."""
    q_src, k, v = make_inputs(2, 8, 8, 1000, 1000, 128, torch.float16, "bhsd")
    q = torch.full_like(q_src, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25-30 ms of GPU time on the side stream
        q.copy_(q_src)
        poison_allocator(q.shape, q.dtype)
        out = sdpa(q, k, v, None, 0.0, True)
    torch.cuda.current_stream().wait_stream(side)
    out.record_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    check_close(out, q_src, k, v, True, None, f"side stream [{family}]")


@pytest.mark.parametrize("causal,sq,sk,hkv,ratio", [(False, 512, 512, 8, 1), (True, 1000, 777, 2, 4)])
def test_cuda_graph_capture_and_replay(family, causal, sq, sk, hkv, ratio):
    dt, D, B = torch.float16, 64, 2
    q, k, v = make_inputs(B, hkv * ratio, hkv, sq, sk, D, dt, "bhsd")
    kw = family_kwargs(ratio > 1, None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graph expects
        for _ in range(2):
            sdpa(q, k, v, None, 0.0, causal, **kw)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sdpa(q, k, v, None, 0.0, causal, **kw)
    for i in range(3):
        nq, nk, nv = make_inputs(B, hkv * ratio, hkv, sq, sk, D, dt, "bhsd")
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_close(out, nq, nk, nv, causal, None, f"graph replay {i} [{family}]")


@pytest.mark.skipif(not HOPPER, reason="needs an sm_90 device (the Hopper family's plan)")
@pytest.mark.parametrize("causal", [False, True])
def test_one_validation_per_kernel_call(causal):
    """The op plans a call once (fc_sdpa_plan in decide()) and launches the plan: libflashcore
    validates the call's struct once per forward, with or without the LSE (a prefill in the
    Hopper family; one-row GQA calls also validate their packed copy, on purpose)."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(os.path.dirname(flashcore.__file__), "libflashcore.so"))
    count = lib.fc_validations_on_thread_
    count.restype = ctypes.c_ulonglong
    q, k, v = make_inputs(2, 8, 2, 300, 300, 128, torch.float16, "bshd")
    assert flashcore.explain(q, k, v, is_causal=causal, enable_gqa=True) == "kernel sm90"
    for call in (lambda: torch.ops.flashcore.sdpa(q, k, v, is_causal=causal, enable_gqa=True),
                 lambda: torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=causal, enable_gqa=True)):
        call()  # (first calls cache the device's facts)
        before = count()
        call()
        assert count() - before == 1
