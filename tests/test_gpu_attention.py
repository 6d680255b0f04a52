"""GPU tests of flashcore.attention's band (sliding window, bottom-right causal) in the kernels.

What it checks, on a CUDA machine with FlashCore's kernels:
  * forward against a float64 reference with the rule of tests/test_gpu_sdpa.py,
        max|out - ref_hi| <= 2 * max|ref_lp - ref_hi| + atol,
    ref_lp the same math in the input's dtype; the LSE within 1e-3 of float64's; rows that see
    no key exactly zero with LSE -inf; over windows (0, 0), (1, 0), (127, 0), (S - 1, 0),
    asymmetric, larger than S; both alignments with Sq < Sk and Sq > Sk; odd lengths (1, 17,
    127, 1000, 4097); GQA; fp16 / bf16; D 64 / 128 / 256; outputs are poisoned first;
  * on Hopper the band runs in the sm90 kernel, or the decode kernels for up to 16 query rows
    per KV head (explain_attention says which; no mask),
    and the kernel's answer equals FlashCore's own dense-mask path for the same band;
  * gradients (whichever backward runs: the sm90 kernel where it takes bands, else the Python
    backward with the band as a mask) against float64 autograd with the same rule.

Run:  python -m pytest tests/test_gpu_attention.py -q     (each test skips without a CUDA device)
"""
import math
import zlib

import pytest
import torch

from gpu_gate import gpu_gate  # noqa: E402

GPU, pytestmark = gpu_gate("no CUDA device: GPU tests of flashcore.attention skipped")

import flashcore  # noqa: E402
from flashcore import _band  # noqa: E402
from build_record import skip_unless_built  # noqa: E402
from kernel_trace import launched_kernels  # noqa: E402

DEVICE = "cuda"
HOPPER = GPU and torch.cuda.get_device_capability() == (9, 0)
ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2}
NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def reference(q, k, v, keep, dtype):
    """softmax(q k^T * scale, keys outside keep removed) v in `dtype` (fp32 accumulation for the
    16-bit dtypes, each result rounded), per (batch, head); rows with no key give zeros. Also
    the LSE (natural log, -inf for such rows), in float64 when dtype is."""
    B, Hq, Sq, D = q.shape
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D)
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.empty(B, Hq, Sq, dtype=torch.float64, device=q.device)
    for b in range(B):
        for h in range(Hq):
            s = torch.matmul(q[b, h].to(dtype), k[b, h // group].to(dtype).T) * scale
            s = s.masked_fill(~keep, NEG_INF)
            p = torch.softmax(s.float() if dtype != torch.float64 else s, dim=-1).to(dtype)
            p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
            out[b, h] = torch.matmul(p, v[b, h // group].to(dtype))
            lse[b, h] = torch.logsumexp(s.double(), dim=-1)
    return out, lse


def keep_of(sq, sk, causal, window, bottom_right):
    band = _band.band_bounds(sq, sk, causal, *window, bottom_right)
    return _band.band_mask(range(sq), sk, band, DEVICE), band


def poison_allocator(shape, dtype):
    junk = torch.empty(shape, dtype=dtype, device=DEVICE)
    junk.fill_(float("nan"))
    del junk


def assert_grads_close(grads, hi, lp, names=("q", "k", "v"), what=""):
    """Each gradient finite and within twice the low-precision reference's error (lp against the
    float64 hi) plus 3% of the gradient's largest value plus 1e-2."""
    for name, g, h, l in zip(names, grads, hi, lp):
        assert torch.isfinite(g).all(), f"{what}d{name} has NaN/inf"
        err = (g.double() - h).abs().max().item()
        bound = 2 * (l.double() - h).abs().max().item() + 3e-2 * h.abs().max().item() + 1e-2
        assert err <= bound, f"{what}d{name}: {err:.3e} > {bound:.3e}"


CASES = [
    # (Sq, Sk, causal, window, alignment)
    (1000, 1000, True, (127, 0), "top_left"),
    (1000, 1000, True, (0, 0), "top_left"),
    (1000, 1000, True, (1, 0), "top_left"),
    (1000, 1000, False, (64, 32), "top_left"),
    (4097, 4097, True, (1000, 0), "top_left"),
    (4097, 4097, False, (300, 300), "top_left"),
    (127, 127, True, (200, 0), "top_left"),            # larger than S: plain causal
    (17, 4097, True, (-1, -1), "bottom_right"),        # a chunk of queries against a cache
    (512, 4097, True, (1024, 0), "bottom_right"),      # chunked prefill with a window
    (1, 4097, True, (255, 0), "bottom_right"),         # one decoding row, window
    (4, 1000, True, (-1, -1), "bottom_right"),         # speculative decoding
    (1000, 127, True, (-1, -1), "bottom_right"),       # Sq > Sk: rows that see no key
    (1000, 127, False, (0, 5), "top_left"),            # window past the keys: rows see none
]


def _case_id(c):
    return f"{c[0]}x{c[1]}-c{int(c[2])}-w{c[3][0]}_{c[3][1]}-{c[4]}"


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward(case, dtype, D):
    skip_unless_built(D, dtype)
    sq, sk, causal, window, alignment = case
    br = alignment == "bottom_right"
    B, Hq, Hkv = (1, 4, 2) if max(sq, sk) > 2000 else (2, 4, 1)
    q = torch.randn(B, Hq, sq, D, device=DEVICE, dtype=dtype)
    k = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype)
    v = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype)
    keep, band = keep_of(sq, sk, causal, window, br)
    kw = dict(is_causal=causal, causal_alignment=alignment, window_size=window, enable_gqa=True)
    poison_allocator((B, Hq, sq, D), dtype)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
    torch.cuda.synchronize()
    ref_hi, lse_hi = reference(q, k, v, keep, torch.float64)
    ref_lp, _ = reference(q, k, v, keep, dtype)
    err = (out.double() - ref_hi).abs().max().item()
    bound = 2 * (ref_lp.double() - ref_hi).abs().max().item() + ATOL[dtype]
    assert err <= bound, f"max|out - ref| {err:.3e} > {bound:.3e}"
    none_seen = ~keep.any(-1)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_hi)), "LSE -inf exactly on rows with no key"
    assert (out[..., none_seen, :] == 0).all(), "rows with no key give zeros"
    fin = torch.isfinite(lse_hi)
    assert (lse[fin].double() - lse_hi[fin]).abs().max().item() < 1e-3 * max(1.0, math.log(sk))
    if HOPPER and band.kind == _band.OTHER and D in (64, 128, 256):
        words = flashcore.explain_attention(q, k, v, **kw)
        # (the decode kernels take Sq <= 16 and up to 32 rows per KV head, at D = 64 and 128)
        decode = sq <= 16 and (Hq // Hkv) * sq <= 32 and D in (64, 128)
        assert words == ("kernel decode" if decode else "kernel sm90"), words
        # the same band as FlashCore's own dense-mask path
        dense = flashcore.attention(q, k, v, keep, enable_gqa=True)
        err_dense = (out.double() - dense.double()).abs().max().item()
        assert err_dense <= 2 * bound


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("case", [
    (1000, 1000, True, (127, 0), "top_left"),
    (255, 1000, True, (300, 0), "bottom_right"),
    (1000, 127, True, (-1, -1), "bottom_right"),
    (513, 513, False, (64, 32), "top_left"),
], ids=_case_id)
def test_backward(case, D):
    """Gradients of a band against float64; on Hopper the sm90 backward runs them (D=256: its own
    kernel, bwd_kernel_d256, launched)."""
    dtype = torch.bfloat16
    skip_unless_built(D, dtype)
    sq, sk, causal, window, alignment = case
    B, Hq, Hkv = 2, 4, 2
    q = torch.randn(B, Hq, sq, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    keep, _ = keep_of(sq, sk, causal, window, alignment == "bottom_right")
    out = flashcore.attention(q, k, v, is_causal=causal, causal_alignment=alignment,
                              window_size=window, enable_gqa=True)
    dout = torch.randn_like(out)
    got = {}
    names = [n for n, _ in launched_kernels(lambda: got.update(g=torch.autograd.grad(out, (q, k, v), dout)))]
    grads = got["g"]
    if HOPPER:
        want = "bwd_kernel_d256" if D == 256 else "bwd_kernel"
        assert any(want in n for n in names), names

    def ref_grads(cast):
        qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (q, k, v))
        group = Hq // Hkv
        s = torch.matmul(qq, kk.repeat_interleave(group, 1).transpose(-2, -1)) / math.sqrt(D)
        s = s.masked_fill(~keep, NEG_INF)
        seen = keep.any(-1, keepdim=True)
        p = torch.where(seen, torch.softmax(torch.where(seen, s, torch.zeros_like(s)), -1),
                        torch.zeros_like(s))
        o = torch.matmul(p, vv.repeat_interleave(group, 1))
        return torch.autograd.grad(o, (qq, kk, vv), dout.to(cast))

    hi, lp = ref_grads(torch.float64), ref_grads(torch.float32)
    assert_grads_close(grads, hi, lp)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("window", [(-1, -1), (127, 0)], ids=["causal", "window127"])
def test_sinks(window, D):
    """gpt-oss's attention sinks (one logit per head) beside causal / a window: forward, LSE and
    the gradients of q, k, v and the sinks against float64."""
    dtype = torch.bfloat16
    skip_unless_built(D, dtype)
    B, Hq, Hkv, S = 2, 4, 2, 1000
    q = torch.randn(B, Hq, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    sinks = torch.tensor([float("-inf"), 0.0, 1.5, 4.0], device=DEVICE, requires_grad=True)
    keep, _ = keep_of(S, S, True, window, False)
    out, lse = flashcore.attention(q, k, v, is_causal=True, window_size=window, enable_gqa=True,
                                   sinks=sinks, return_lse=True)
    if HOPPER:  # the kernel adds the sinks (no elementwise pass after it)
        assert flashcore.explain_attention(q, k, v, is_causal=True, window_size=window,
                                           enable_gqa=True, sinks=sinks) == "kernel sm90"
    dout = torch.randn_like(out)
    grads = torch.autograd.grad((out * dout).sum(), (q, k, v, sinks))

    def ref(cast):
        qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (q, k, v))
        ss = sinks.detach().to(cast).requires_grad_()
        s = torch.matmul(qq, kk.repeat_interleave(Hq // Hkv, 1).transpose(-2, -1)) / math.sqrt(D)
        s = s.masked_fill(~keep, NEG_INF)
        logits = torch.cat([s, ss.view(1, -1, 1, 1).expand(B, Hq, S, 1)], -1)
        o = torch.matmul(torch.softmax(logits, -1)[..., :-1], vv.repeat_interleave(Hq // Hkv, 1))
        return o, torch.logsumexp(logits, -1), torch.autograd.grad((o * dout.to(cast)).sum(), (qq, kk, vv, ss))

    o_hi, lse_hi, g_hi = ref(torch.float64)
    o_lp, _, g_lp = ref(torch.float32)
    err = (out.double() - o_hi).abs().max().item()
    assert err <= 2 * (o_lp.double() - o_hi).abs().max().item() + 2 * ATOL[dtype], err
    assert (lse.double() - lse_hi).abs().max().item() < 1e-2
    assert_grads_close(grads, g_hi, g_lp, names=("q", "k", "v", "sinks"))


# ---- logit softcap ---------------------------------------------------------------------------

TANH_REL = 2.0 ** -10.9  # tanh.approx.f32's relative error (PTX ISA), the kernels' softcap


def softcap_reference(q, k, v, keep, softcap, cast, sinks=None, dout=None):
    """(out, lse, grads) in `cast`: s = softcap tanh(q k^T scale / softcap), keys outside keep
    removed, optional sinks (one logit per head in the denominator), softmax in float32 at least;
    rows with no key (and no sink) give zeros. grads (of q, k, v[, sinks]) when dout is given."""
    B, Hq = q.shape[:2]
    group = Hq // k.shape[1]
    qq, kk, vv = (t.detach().to(cast).requires_grad_() for t in (q, k, v))
    ss = sinks.detach().to(cast).requires_grad_() if sinks is not None else None
    s = torch.matmul(qq, kk.repeat_interleave(group, 1).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, NEG_INF)
    if ss is not None:
        s = torch.cat([s, ss.view(1, -1, 1, 1).expand(B, Hq, s.shape[2], 1)], -1)
    seen = torch.isfinite(s).any(-1, keepdim=True)
    work = torch.promote_types(cast, torch.float32)
    p = torch.where(seen, torch.softmax(torch.where(seen, s, torch.zeros_like(s)).to(work), -1),
                    torch.zeros((), dtype=work, device=s.device)).to(cast)
    lse = torch.logsumexp(s.double(), -1)
    if ss is not None:
        p = p[..., :-1]
    o = torch.matmul(p, vv.repeat_interleave(group, 1))
    grads = None
    if dout is not None:
        inputs = (qq, kk, vv) + ((ss,) if ss is not None else ())
        grads = torch.autograd.grad((o * dout.to(cast)).sum(), inputs)
    return o.detach(), lse, grads


SOFTCAP_CASES = [
    # (Sq, Sk, causal, window, alignment)
    (1000, 1000, True, (-1, -1), "top_left"),
    (1000, 1000, False, (-1, -1), "top_left"),
    (17, 4097, False, (-1, -1), "top_left"),
    (1, 4097, False, (-1, -1), "top_left"),          # one decoding row: the sm90 kernel, packed GQA
    (1000, 1000, True, (127, 0), "top_left"),
    (255, 1000, True, (300, 0), "bottom_right"),
    (1000, 127, True, (-1, -1), "bottom_right"),     # rows that see no key
]


@pytest.mark.parametrize("softcap", [30.0, 1e-3, 1e4], ids=["cap30", "tiny", "huge"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=_case_id)
def test_softcap(case, dtype, D, softcap):
    """Forward and LSE (every case), gradients (D 64 / 128: the sm90 backward; D=256: its own sm90
    kernel, launched; off Hopper the Python backward, small calls only) against float64. The bound adds
    tanh.approx's error to the low-precision one: a logit moved by at most |s| 2^-10.9 moves out
    by at most twice that times max|v|."""
    skip_unless_built(D, dtype)
    sq, sk, causal, window, alignment = case
    br = alignment == "bottom_right"
    B, Hq, Hkv = 2, 4, 2
    q = torch.randn(B, Hq, sq, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    keep, band = keep_of(sq, sk, causal, window, br)
    kw = dict(is_causal=causal, causal_alignment=alignment, window_size=window, enable_gqa=True,
              softcap=softcap)
    if HOPPER:
        assert flashcore.explain_attention(q, k, v, **kw) == "kernel sm90"
    poison_allocator((B, Hq, sq, D), dtype)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
    dout = torch.randn_like(out)
    d256_kernel = D == 256 and HOPPER
    backward = D in (64, 128) or d256_kernel or sq * sk <= 1 << 20
    grads = None
    if backward:
        got = {}
        names = [n for n, _ in launched_kernels(lambda: got.update(
            g=torch.autograd.grad((out * dout).sum(), (q, k, v))))]
        grads = got["g"]
        if d256_kernel:
            assert any("bwd_kernel_d256" in n for n in names), names
    o_hi, lse_hi, g_hi = softcap_reference(q, k, v, keep, softcap, torch.float64,
                                           dout=dout if backward else None)
    o_lp, _, g_lp = softcap_reference(q, k, v, keep, softcap, dtype)
    logit_max = min(softcap, (q.double().norm(dim=-1).max() * k.double().norm(dim=-1).max()
                              / math.sqrt(D)).item())
    tanh_term = 2 * TANH_REL * logit_max * v.double().abs().max().item()
    err = (out.double() - o_hi).abs().max().item()
    bound = 2 * (o_lp.double() - o_hi).abs().max().item() + ATOL[dtype] + tanh_term
    assert err <= bound, f"max|out - ref| {err:.3e} > {bound:.3e}"
    none_seen = ~keep.any(-1)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_hi)), "LSE -inf exactly on rows with no key"
    assert (out[..., none_seen, :] == 0).all(), "rows with no key give zeros"
    fin = torch.isfinite(lse_hi)
    assert (lse[fin].double() - lse_hi[fin]).abs().max().item() < \
        1e-3 * max(1.0, math.log(sk)) + TANH_REL * logit_max
    if not backward:
        return
    _, _, g_lp = softcap_reference(q, k, v, keep, softcap, torch.float32, dout=dout)
    assert_grads_close(grads, g_hi, g_lp)


SM80_SOFTCAP_MASKS = ["none", "causal", "bool", "additive"]


@pytest.mark.parametrize("mask_kind", SM80_SOFTCAP_MASKS)
@pytest.mark.parametrize("D", [32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_softcap_sm80(dtype, D, mask_kind, monkeypatch):
    """The sm80-class forward's softcap (kSoftcap), which takes masks: unmasked and causal calls
    forced onto the family, a bool padding mask and an additive mask (finite values and -inf)
    run there anyway. Forward and LSE against float64, the bound of test_softcap (the softcap
    applies before the mask: an additive value is not capped). Gradients (D != 256: the
    sm80-class backward's kSoftcap kernels, launched, no Python backward) against float64 with
    test_softcap's rule. D=256 with a bool mask on Hopper: the sm90 family's D=256 kernel."""
    skip_unless_built(D, dtype)
    softcap = 5.0
    B, Hq, Hkv, sq, sk = 2, 4, 2, 127, 300
    q = torch.randn(B, Hq, sq, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, sk, D, device=DEVICE, dtype=dtype, requires_grad=True)
    mask, causal, add = None, mask_kind == "causal", None
    if mask_kind in ("none", "causal"):
        monkeypatch.setenv("FLASHCORE_FAMILY", "sm80")
    elif mask_kind == "bool":
        mask = torch.ones(B, 1, sq, sk, dtype=torch.bool, device=DEVICE)
        mask[1, ..., :41] = False          # left padding of the second sequence
        mask[0, :, 5] = False              # a row that sees no key
    else:
        add = torch.rand(B, Hq, sq, sk, device=DEVICE) * -3.0
        add[..., 7:19] = NEG_INF
        mask = add.to(dtype)
    words = flashcore.explain_attention(q, k, v, mask, is_causal=causal, enable_gqa=True,
                                        softcap=softcap)
    assert words.startswith("kernel sm80"), words
    poison_allocator((B, Hq, sq, D), dtype)
    out, lse = flashcore.attention(q, k, v, mask, is_causal=causal, enable_gqa=True,
                                   softcap=softcap, return_lse=True)

    def ref(cast, qkv=None):
        qq, kk, vv = qkv or (q.detach(), k.detach(), v.detach())
        kk = kk.to(cast).repeat_interleave(Hq // Hkv, 1)
        s = torch.matmul(qq.to(cast), kk.transpose(-2, -1)) / math.sqrt(D)
        s = softcap * torch.tanh(s / softcap)
        if add is not None:
            s = s + mask.to(cast)
        elif mask is not None:
            s = s.masked_fill(~mask, NEG_INF)
        if causal:
            s = s.masked_fill(~torch.ones(sq, sk, dtype=torch.bool, device=DEVICE).tril(), NEG_INF)
        lse_ = torch.logsumexp(s.double(), -1)
        p = torch.exp(s.double() - lse_.masked_fill(torch.isinf(lse_), 0).unsqueeze(-1)).to(cast)
        return torch.matmul(p, vv.to(cast).repeat_interleave(Hq // Hkv, 1)), lse_

    o_hi, lse_hi = ref(torch.float64)
    o_lp, _ = ref(dtype)
    tanh_term = 2 * TANH_REL * softcap * v.double().abs().max().item()
    err = (out.double() - o_hi).abs().max().item()
    bound = 2 * (o_lp.double() - o_hi).abs().max().item() + ATOL[dtype] + tanh_term
    assert err <= bound, f"max|out - ref| {err:.3e} > {bound:.3e}"
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_hi)), "LSE -inf exactly on rows with no key"
    assert (out[torch.isinf(lse_hi)] == 0).all(), "rows with no key give zeros"
    fin = torch.isfinite(lse_hi)
    assert (lse[fin].double() - lse_hi[fin]).abs().max().item() < 1e-3 * math.log(sk) + TANH_REL * softcap
    if D == 256 and not (HOPPER and mask_kind == "bool"):
        # (the sm80-class family has no D=256 backward; the sm90 family's takes a softcap with a
        # bool mask, not an additive one: else the Python one, test_softcap's)
        return

    dout = torch.randn_like(out)
    got = {}
    names = [n for n, _ in launched_kernels(lambda: got.update(g=torch.autograd.grad(
        (out * dout).sum(), (q, k, v))))]
    kernel = "bwd_kernel_d256" if D == 256 else "dkdv_kernel"
    assert any(kernel in n for n in names), names

    def ref_grads(cast):
        leaves = tuple(t.detach().to(cast).requires_grad_() for t in (q, k, v))
        o, _ = ref(cast, leaves)
        return torch.autograd.grad((o * dout.to(cast)).sum(), leaves)

    assert_grads_close(got["g"], ref_grads(torch.float64), ref_grads(torch.float32), what=f"{mask_kind} ")


@pytest.mark.parametrize("D", [64, 128])
def test_softcap_with_sinks_and_mask(D):
    """Softcap with sinks (the sm90 kernel takes both), with a padding mask (the sm80-class
    kernel; the Python backward), and with both (the sm80-class kernel, its sinks applied to the
    output by flashcore.attention), forward and gradients against float64."""
    dtype = torch.bfloat16
    skip_unless_built(D, dtype)
    B, Hq, Hkv, S = 2, 4, 2, 300
    q = torch.randn(B, Hq, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, device=DEVICE, dtype=dtype, requires_grad=True)
    sinks = torch.tensor([float("-inf"), 0.0, 1.5, 4.0], device=DEVICE, requires_grad=True)
    causal_keep, _ = keep_of(S, S, True, (-1, -1), False)
    pad = torch.ones(B, 1, 1, S, dtype=torch.bool, device=DEVICE)
    pad[1, ..., :37] = False  # left padding of the second sequence
    for mask, use_sinks in ((None, True), (pad, False), (pad, True)):
        kw = dict(is_causal=True, enable_gqa=True, softcap=20.0,
                  sinks=sinks if use_sinks else None)
        words = flashcore.explain_attention(q, k, v, mask, **kw)
        if HOPPER:
            expect = "kernel sm90" if mask is None else "kernel sm80"
            assert words.startswith(expect), words
            assert ("sinks applied to the output" in words) == (mask is not None and use_sinks), words
        out = flashcore.attention(q, k, v, mask, **kw)
        dout = torch.randn_like(out)
        inputs = (q, k, v) + ((sinks,) if use_sinks else ())
        grads = torch.autograd.grad((out * dout).sum(), inputs)
        keep = causal_keep if mask is None else causal_keep & mask
        s_arg = sinks if use_sinks else None
        o_hi, _, g_hi = softcap_reference(q, k, v, keep, 20.0, torch.float64, s_arg, dout)
        o_lp, _, g_lp = softcap_reference(q, k, v, keep, 20.0, torch.float32, s_arg, dout)
        o_bf, _, _ = softcap_reference(q, k, v, keep, 20.0, dtype, s_arg)
        err = (out.double() - o_hi).abs().max().item()
        assert err <= 2 * (o_bf.double() - o_hi).abs().max().item() + 2 * ATOL[dtype], err
        assert_grads_close(grads, g_hi, g_lp, names=("q", "k", "v", "sinks"),
                           what=f"mask={mask is not None} sinks={use_sinks} ")
