"""Bad and edge inputs of torch.ops.flashcore.sdpa: one table, each row with its expected outcome,
run on the CPU (CI) and on a CUDA device (skipped without one).

Every outcome is one of:
  * SAME       - the op does what F.scaled_dot_product_attention does with the same arguments:
                 the same result (same shape and dtype; NaN and +-inf in the same places; finite
                 values bitwise equal where the call falls back to aten, within a low-precision
                 tolerance where a FlashCore kernel runs), or, where aten raises, an error too
                 (carrying aten's message on torch >= 2.13);
  * Error(re)  - a RuntimeError from FlashCore whose message matches `re`, naming the argument.
A row may also say which path it takes on a GPU with FlashCore kernels (fp16/bf16 only):
"kernel", or a regex of flashcore.explain()'s fallback reason.

Rows: wrong or mixed dtypes, tensors on different devices, wrong ranks, mismatched B/H/D, heads
not divisible, empty dims, misaligned views (storage offsets), non-contiguous last dim, broadcast
(stride 0) and overlapping views, NaN and Inf in each input, fully masked rows, scale 0 /
negative / huge / tiny / not finite in float32. GPU-only tests at the end: offsets beyond 32 bits
(views into one 4 GiB buffer: batch strides of 2^31 elements run in the kernel; key rows 2^30
apart fall back), batch or heads above CUDA's grid limit (fall back), more than 65535 query
blocks (kernel), and seqlen_k = 2^31 - 1 (K/V broadcast along S: must fall back, not overflow).

Deliberately not asserted: NaN in V under is_causal. Where the NaN sits in a key block that a
query row does not see, that row's result depends on the kernel's tiling (a masked score is an
exact 0 probability, and 0 * NaN is NaN inside the block's P @ V) in aten's own backends too.

Run:  python -m pytest tests/test_bad_inputs.py -q      (CPU rows; GPU rows skip without CUDA)
On a GPU machine every row also runs on cuda; FLASHCORE_REQUIRE_GPU=1 makes a missing CUDA
device an error instead of a skip.
"""
import importlib.util
import os
import re
import sys
import zlib
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch
import torch.nn.functional as F

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
REQUIRE_GPU = os.environ.get("FLASHCORE_REQUIRE_GPU") == "1"
# The sm80 kernel family is built for sm_89 and sm_90; elsewhere every call falls back.
KERNEL_CARD = HAVE_CUDA and torch.cuda.get_device_capability() in ((8, 9), (9, 0))
# On Hopper an additive mask goes to PyTorch's SDPA (FC_UNSUPPORTED_SLOWER_MASK), at 16 query
# rows (the decode kernels' calls) as at more.
ADDITIVE_MASK_PATH = ("PyTorch's own SDPA runs such calls faster"
                      if HAVE_CUDA and torch.cuda.get_device_capability() == (9, 0) else "kernel")
ATEN_MESSAGES = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13)
LOWP = (torch.float16, torch.bfloat16)
# Two correct low-precision implementations differ by a few output ulps (|out| <~ 3 here).
TOL = {torch.float16: dict(atol=4e-3, rtol=4e-3), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}

SAME = "same as F.scaled_dot_product_attention"


@dataclass(frozen=True)
class Error:
    match: str


class Env:
    """What a row's builder gets: the device and dtype under test, and seeded random tensors."""

    def __init__(self, device, dtype, seed):
        self.device, self.dtype = device, dtype
        self.gen = torch.Generator().manual_seed(seed)
        # A device that is not `device`, for mixed-device rows (meta on a CPU-only machine).
        self.other_device = "cpu" if device != "cpu" else "meta"

    def rand(self, *shape, dtype=None, scale=1.0):
        x = torch.randn(tuple(shape), generator=self.gen) * scale
        return x.to(device=self.device, dtype=dtype or self.dtype)

    def ints(self, *shape, dtype=None):
        """Integers in [-2, 2]: exact in every dtype, so q.k is exact in any summation order."""
        x = torch.randint(-2, 3, shape, generator=self.gen).float()
        return x.to(device=self.device, dtype=dtype or self.dtype)

    def qkv(self, q=(2, 4, 80, 64), k=None, v=None, scale=1.0):
        k = k or q
        v = v or k
        return self.rand(*q, scale=scale), self.rand(*k, scale=scale), self.rand(*v, scale=scale)

    def at_offset(self, shape, offset):
        """A contiguous view of `shape` starting `offset` elements into its storage."""
        n = 1
        for s in shape:
            n *= s
        base = self.rand(n + offset)
        return base[offset:].view(shape)

    def padded(self, shape, row):
        """(..., S, D) whose rows are `row` elements apart (a slice of a wider tensor)."""
        return self.rand(*shape[:-1], row)[..., : shape[-1]]

    def other_dtype(self):
        return torch.float32 if self.dtype != torch.float32 else torch.float16


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable  # Env -> (args tuple, kwargs dict)
    expect: object = SAME  # SAME or Error(regex)
    path: Optional[str] = None  # on a kernel card, fp16/bf16: "kernel" or a fallback regex
    dtypes: tuple = (torch.float32, torch.float16, torch.bfloat16)
    known_bug: Optional[str] = None  # xfail(strict) with this reason: reported, not yet fixed
    # The expected result, where calling aten for it is unsafe (see the row); None: call aten.
    reference: Optional[Callable] = None


def _empty_reference(args, kwargs):
    """What PyTorch returns when there is nothing to compute: (B, Hq, Sq, Dv) empty, or zeros
    if only the key length is 0 (each row's softmax is over nothing; aten's math path gives 0)."""
    q, _k, v = args[:3]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    assert out.numel() == 0 or _k.shape[-2] == 0, "only for rows with nothing to compute"
    return out


def _aten_on_aligned_copies(args, kwargs):
    """F.scaled_dot_product_attention on fresh (16-byte-aligned) copies of the tensor inputs."""
    fresh = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    kw = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return F.scaled_dot_product_attention(*fresh, **kw)


def _aten_with_mask_in_query_dtype_on_cuda(args, kwargs):
    """What the op's fallback computes for a float32 mask beside fp16/bf16 inputs: on CUDA, aten
    with the mask in the inputs' dtype (torch 2.11's fused CUDA backends return NaN for the
    float32 mask itself); on the CPU, aten as called."""
    q = args[0]
    mask = kwargs.get("attn_mask")
    if q.is_cuda and mask is not None and mask.dtype == torch.float32 and q.dtype in LOWP:
        kwargs = dict(kwargs, attn_mask=mask.to(q.dtype))
    return F.scaled_dot_product_attention(*args, **kwargs)


def _set(t, index, value):
    t = t.clone()
    t[index] = value
    return t


def _mask_rows_off(env, Sq, Sk, rows, kind):
    keep = torch.rand(Sq, Sk, generator=env.gen) > 0.3
    keep[:, 0] = True
    keep[list(rows)] = False
    if kind == "bool":
        return keep.to(env.device)
    return torch.zeros(Sq, Sk).masked_fill(~keep, float("-inf")).to(env.device, env.dtype)


def _nan_inf_cases():
    def q_row(env, value):
        q, k, v = env.qkv(scale=0.5)
        return (_set(q, (0, 1, 3), value), k, v), {}

    def one(env, which, index, value, **kw):
        q, k, v = env.qkv(scale=0.5)
        t = dict(q=q, k=k, v=v)
        t[which] = _set(t[which], index, value)
        return (t["q"], t["k"], t["v"]), kw

    nan, inf = float("nan"), float("inf")
    return [
        Case("nan_q_row", lambda e: q_row(e, nan), path="kernel"),
        Case("nan_q_one_element", lambda e: one(e, "q", (1, 2, 17, 5), nan), path="kernel"),
        Case("nan_k", lambda e: one(e, "k", (0, 1, 7, 3), nan), path="kernel"),
        Case("nan_k_causal", lambda e: one(e, "k", (0, 1, 7, 3), nan, is_causal=True),
             path="kernel"),
        Case("nan_k_causal_late_block", lambda e: one(e, "k", (1, 0, 70, 0), nan, is_causal=True),
             path="kernel"),
        Case("nan_v", lambda e: one(e, "v", (0, 2, 40, 9), nan), path="kernel"),
        Case("nan_everywhere", lambda e: (tuple(torch.full_like(t, nan) for t in e.qkv()), {}),
             path="kernel"),
        Case("inf_q", lambda e: one(e, "q", (0, 0, 3, 0), inf), path="kernel"),
        Case("neg_inf_q", lambda e: one(e, "q", (0, 0, 3, 0), -inf), path="kernel"),
        Case("inf_k", lambda e: one(e, "k", (1, 3, 11, 2), inf), path="kernel"),
        Case("neg_inf_k_causal", lambda e: one(e, "k", (1, 3, 11, 2), -inf, is_causal=True),
             path="kernel"),
        Case("inf_v", lambda e: one(e, "v", (0, 0, 5, 3), inf), path="kernel"),
        Case("neg_inf_v", lambda e: one(e, "v", (1, 1, 79, 63), -inf), path="kernel"),
    ]


def _scale_cases():
    def ints(env, scale, **kw):
        return (env.ints(2, 4, 80, 64), env.ints(2, 4, 80, 64), env.rand(2, 4, 80, 64)), \
            dict(scale=scale, **kw)

    def rnd(env, scale, **kw):
        return env.qkv(), dict(scale=scale, **kw)

    return [
        Case("scale_zero", lambda e: rnd(e, 0.0), path="kernel"),
        Case("scale_zero_causal", lambda e: rnd(e, 0.0, is_causal=True), path="kernel"),
        Case("scale_negative", lambda e: rnd(e, -0.3), path="kernel"),
        Case("scale_negative_causal", lambda e: rnd(e, -1.0, is_causal=True), path="kernel"),
        Case("scale_tiny", lambda e: rnd(e, 1e-30), path="kernel"),
        # integer q.k: a hard max with exact ties, the same in every implementation
        Case("scale_huge_1e4", lambda e: ints(e, 1e4), path="kernel"),
        Case("scale_huge_1e30", lambda e: ints(e, 1e30), path="kernel"),
        Case("scale_huge_1e30_causal", lambda e: ints(e, 1e30, is_causal=True), path="kernel"),
        Case("scale_overflows_float32", lambda e: rnd(e, 1e39), path="scale must be finite"),
        Case("scale_inf", lambda e: rnd(e, float("inf")), path="scale must be finite"),
        Case("scale_nan", lambda e: rnd(e, float("nan")), path="scale must be finite"),
    ]


def _cases():
    c = []
    # ---- dtypes -------------------------------------------------------------------------------
    c += [
        Case("key_dtype_differs",
             lambda e: ((e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64, dtype=e.other_dtype()),
                         e.rand(2, 4, 8, 64)), {}),
             Error(r"key must have the same dtype as query \(query: \w+, key: \w+\)")),
        Case("value_dtype_differs",
             lambda e: ((e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64),
                         e.rand(2, 4, 8, 64, dtype=e.other_dtype())), {}),
             Error(r"value must have the same dtype as query \(query: \w+, value: \w+\)")),
        Case("all_int64", lambda e: (tuple(t.long() for t in e.qkv(q=(2, 4, 8, 16))), {}),
             dtypes=(torch.float32,)),
        Case("all_float64", lambda e: (tuple(t.double() for t in e.qkv(q=(2, 4, 8, 64))), {}),
             dtypes=(torch.float32,)),
        Case("mask_int32",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(8, 8, dtype=torch.int32, device=e.device))),
             Error(r"attn_mask must be bool, float32 or query's dtype \(query: \w+, attn_mask: Int\)")),
        Case("mask_float32_with_low_precision_query",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.randn(8, 8, generator=e.gen).to(e.device))),
             path="float mask whose dtype differs from query's", dtypes=LOWP,
             reference=_aten_with_mask_in_query_dtype_on_cuda),
    ]
    # ---- devices ------------------------------------------------------------------------------
    c += [
        Case("key_on_other_device",
             lambda e: ((e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64).to(e.other_device),
                         e.rand(2, 4, 8, 64)), {}),
             Error(r"key must be on the same device as query \(query: \w+(:\d+)?, key: ")),
        Case("value_on_other_device",
             lambda e: ((e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64),
                         e.rand(2, 4, 8, 64).to(e.other_device)), {}),
             Error(r"value must be on the same device as query \(query: \w+(:\d+)?, value: ")),
    ]
    # ---- ranks ----------------------------------------------------------------------------------
    c += [
        Case("query_1d", lambda e: ((e.rand(64), e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64)), {}),
             Error(r"query must have at least 2 dimensions .*got 1-D")),
        Case("key_0d", lambda e: ((e.rand(2, 4, 8, 64), e.rand(), e.rand(2, 4, 8, 64)), {}),
             Error(r"key must have at least 2 dimensions .*got 0-D")),
        Case("value_1d", lambda e: ((e.rand(2, 4, 8, 64), e.rand(2, 4, 8, 64), e.rand(64)), {}),
             Error(r"value must have at least 2 dimensions .*got 1-D")),
        Case("all_2d", lambda e: ((e.rand(8, 64), e.rand(9, 64), e.rand(9, 64)), {}),
             path="not all 4-D"),
        Case("all_3d", lambda e: (e.qkv(q=(4, 80, 64)), {}), path="not all 4-D"),
        Case("all_5d", lambda e: (e.qkv(q=(2, 2, 3, 16, 64)), {}), path="not all 4-D"),
        Case("query_4d_key_value_3d",
             lambda e: ((e.rand(2, 4, 8, 64), e.rand(4, 8, 64), e.rand(4, 8, 64)), {}),
             path="not all 4-D"),
    ]
    # ---- batch / heads / head dim / lengths -----------------------------------------------------
    c += [
        Case("batch_mismatch_key", lambda e: (e.qkv(q=(3, 4, 8, 64), k=(2, 4, 8, 64)), {}),
             Error(r"key must have the same batch size \(dim 0\) as query \(query: 3, key: 2\)")),
        Case("batch_mismatch_value",
             lambda e: (e.qkv(q=(3, 4, 8, 64), k=(3, 4, 8, 64), v=(2, 4, 8, 64)), {}),
             Error(r"value must have the same batch size \(dim 0\) as query \(query: 3, value: 2\)")),
        Case("batch_broadcast_query", lambda e: (e.qkv(q=(1, 4, 8, 64), k=(2, 4, 8, 64)), {}),
             path="broadcasting"),
        Case("heads_mismatch_without_gqa", lambda e: (e.qkv(q=(2, 8, 8, 64), k=(2, 2, 8, 64)), {}),
             Error(r"key has 2 heads and query has 8: they must match unless enable_gqa=True")),
        Case("heads_kv_1_without_gqa", lambda e: (e.qkv(q=(2, 8, 8, 64), k=(2, 1, 8, 64)), {}),
             path="enable_gqa is False"),
        Case("gqa_heads_not_divisible_key",
             lambda e: (e.qkv(q=(2, 8, 8, 64), k=(2, 3, 8, 64)), dict(enable_gqa=True)),
             Error(r"multiple of key's \(query: 8 heads, key: 3 heads\)")),
        Case("gqa_heads_not_divisible_value",
             lambda e: (e.qkv(q=(2, 8, 8, 64), k=(2, 2, 8, 64), v=(2, 3, 8, 64)),
                        dict(enable_gqa=True)),
             Error(r"multiple of value's \(query: 8 heads, value: 3 heads\)")),
        Case("gqa_zero_kv_heads",
             lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 0, 8, 64)), dict(enable_gqa=True)),
             Error(r"multiple of key's \(query: 4 heads, key: 0 heads\)")),
        Case("gqa_more_kv_heads_than_query",
             lambda e: (e.qkv(q=(2, 2, 8, 64), k=(2, 8, 8, 64)), dict(enable_gqa=True)),
             Error(r"multiple of key's \(query: 2 heads, key: 8 heads\)")),
        Case("gqa", lambda e: (e.qkv(q=(2, 8, 80, 64), k=(2, 2, 80, 64)), dict(enable_gqa=True)),
             path="kernel"),
        Case("mqa_causal", lambda e: (e.qkv(q=(2, 8, 80, 128), k=(2, 1, 33, 128)),
                                      dict(enable_gqa=True, is_causal=True)), path="kernel"),
        Case("gqa_value_heads_differ_from_key",
             lambda e: (e.qkv(q=(2, 8, 8, 64), k=(2, 2, 8, 64), v=(2, 4, 8, 64)),
                        dict(enable_gqa=True)), path="broadcasting"),
        Case("head_dim_key_differs", lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 4, 8, 32)), {}),
             Error(r"key must have the same head dim \(last size\) as query \(query: 64, key: 32\)")),
        Case("head_dim_value_differs",
             lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 4, 8, 64), v=(2, 4, 8, 32)), {}),
             path="value's head dim"),
        Case("head_dim_unsupported_72", lambda e: (e.qkv(q=(2, 4, 80, 72)), {}),
             path="no kernel for this head_dim"),
        # aten itself does not check this on the CPU (torch 2.14): it returns garbage that
        # changes from call to call. FlashCore must say which argument is wrong.
        Case("seqlen_key_value_differ",
             lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 4, 8, 64), v=(2, 4, 9, 64)), {}),
             Error(r"value must have the same sequence length \(dim -2\) as key "
                   r"\(key: 8, value: 9\)")),
        Case("mask_with_causal",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(8, 8, dtype=torch.bool, device=e.device),
                             is_causal=True)),
             Error(r"attn_mask must be None when is_causal=True")),
        Case("mask_wrong_shape",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(7, 8, dtype=torch.bool, device=e.device))),
             Error(r"attn_mask of shape \[7, 8\] does not broadcast to the scores' \(batch, heads, "
                   r"query length, key length\) = \[2, 4, 8, 8\]")),
        Case("mask_heads_wrong",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(2, 2, 8, 8, dtype=torch.bool, device=e.device))),
             Error(r"attn_mask of shape \[2, 2, 8, 8\] does not broadcast")),
        Case("mask_five_dims",
             lambda e: (e.qkv(q=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(1, 1, 1, 8, 8, dtype=torch.bool, device=e.device))),
             Error(r"attn_mask of shape \[1, 1, 1, 8, 8\] does not broadcast")),
        # A mask broadcast as the scores are: heads from key (query has one), batch from key.
        Case("mask_heads_from_key",
             lambda e: (e.qkv(q=(2, 1, 8, 64), k=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(4, 8, 8, dtype=torch.bool, device=e.device)))),
        Case("mask_batch_from_key",
             lambda e: (e.qkv(q=(1, 4, 8, 64), k=(2, 4, 8, 64)),
                        dict(attn_mask=torch.ones(2, 1, 8, 8, dtype=torch.bool, device=e.device)))),
        # aten raises on the CPU but may not on CUDA; FlashCore always names the argument.
        Case("dropout_above_one", lambda e: (e.qkv(q=(2, 4, 8, 64)), dict(dropout_p=1.5)),
             Error(r"dropout_p: dropout probability has to be between 0 and 1, but got 1.5")),
        Case("causal_sq_gt_sk", lambda e: (e.qkv(q=(2, 4, 80, 64), k=(2, 4, 17, 64)),
                                           dict(is_causal=True)), path="kernel"),
        Case("causal_sq_1", lambda e: (e.qkv(q=(2, 4, 1, 64), k=(2, 4, 100, 64)),
                                       dict(is_causal=True)), path="kernel"),
    ]
    # ---- empty dims: empty output (or zeros for Sk=0) like PyTorch -------------------------------
    zero = "a size is zero"
    # aten misbehaves on empty inputs on torch 2.11 (H100 machine: SIGFPE with zero heads, on
    # the CPU too; wrong results on CUDA with an empty batch), so the reference is written out:
    # an empty output, or zeros when there are no keys (what aten's math path gives on 2.14).
    cpu_ref = _empty_reference
    c += [
        Case("batch_0", lambda e: (e.qkv(q=(0, 4, 8, 64)), {}), path=zero, reference=cpu_ref),
        Case("batch_0_gqa", lambda e: (e.qkv(q=(0, 8, 8, 64), k=(0, 2, 8, 64)),
                                       dict(enable_gqa=True)), path=zero, reference=cpu_ref),
        Case("heads_0", lambda e: (e.qkv(q=(2, 0, 8, 64)), {}), path=zero, reference=cpu_ref),
        Case("heads_0_gqa", lambda e: (e.qkv(q=(2, 0, 8, 64)), dict(enable_gqa=True)), path=zero,
             reference=cpu_ref),
        Case("seqlen_q_0", lambda e: (e.qkv(q=(2, 4, 0, 64), k=(2, 4, 8, 64)), {}), path=zero,
             reference=cpu_ref),
        Case("seqlen_k_0", lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 4, 0, 64)), {}), path=zero,
             reference=cpu_ref),
        Case("seqlen_k_0_causal", lambda e: (e.qkv(q=(2, 4, 8, 64), k=(2, 4, 0, 64)),
                                             dict(is_causal=True)), path=zero, reference=cpu_ref),
        Case("head_dim_0", lambda e: (e.qkv(q=(2, 4, 8, 0)), {}), path=zero, reference=cpu_ref),
        Case("all_empty", lambda e: (e.qkv(q=(0, 0, 0, 0)), {}), path=zero, reference=cpu_ref),
    ]
    # ---- layouts: alignment, strides, broadcast views ---------------------------------------------
    shape = (2, 4, 80, 64)
    c += [
        # aten's own CUDA backends fault on misaligned fp32 views on torch 2.11 ("misaligned
        # address", a poisoned context): the reference is aten on aligned copies.
        Case("query_offset_1_element",
             lambda e: ((e.at_offset(shape, 1), e.rand(*shape), e.rand(*shape)), {}),
             path="16-byte aligned", reference=_aten_on_aligned_copies),
        Case("key_offset_4_elements",  # 8 bytes in fp16/bf16
             lambda e: ((e.rand(*shape), e.at_offset(shape, 4), e.rand(*shape)), {}),
             path="16-byte aligned", reference=_aten_on_aligned_copies),
        Case("value_offset_8_elements",  # 16 bytes in fp16/bf16: aligned
             lambda e: ((e.rand(*shape), e.rand(*shape), e.at_offset(shape, 8)), {}),
             path="kernel"),
        Case("rows_65_elements_apart", lambda e: ((e.padded(shape, 65), e.rand(*shape),
                                                   e.rand(*shape)), {}),
             path="multiples of 16 bytes"),
        Case("rows_72_elements_apart", lambda e: ((e.rand(*shape), e.padded(shape, 72),
                                                   e.padded(shape, 72)), {}), path="kernel"),
        Case("last_dim_stride_2", lambda e: ((e.rand(2, 4, 80, 128)[..., ::2], e.rand(*shape),
                                              e.rand(*shape)), {}), path="head_dim stride"),
        Case("last_dim_transposed",
             lambda e: ((e.rand(*shape), e.rand(2, 4, 64, 80).transpose(-1, -2), e.rand(*shape)),
                        {}), path="head_dim stride"),
        Case("last_dim_broadcast",
             lambda e: ((e.rand(*shape), e.rand(*shape), e.rand(2, 4, 80, 1).expand(*shape)),
                        {}), path="head_dim stride"),
        Case("huggingface_transposed",
             lambda e: (tuple(e.rand(2, 80, 4, 64).transpose(1, 2) for _ in range(3)), {}),
             path="kernel"),
        Case("key_value_broadcast_batch_heads",
             lambda e: ((e.rand(*shape), e.rand(1, 1, 80, 64).expand(*shape),
                         e.rand(1, 1, 80, 64).expand(*shape)), {}), path="kernel"),
        Case("key_value_broadcast_seq",  # every key the same row: stride 0 along S
             lambda e: ((e.rand(*shape), e.rand(2, 4, 1, 64).expand(*shape),
                         e.rand(2, 4, 1, 64).expand(*shape)), dict(is_causal=True)),
             path="kernel"),
        Case("query_broadcast_heads",
             lambda e: ((e.rand(2, 1, 80, 64).expand(*shape), e.rand(*shape), e.rand(*shape)),
                        {}), path="kernel"),
        Case("decode_query_odd_strides",  # Sq = 1 sliced out of a wider buffer
             lambda e: ((e.rand(2, 3, 4, 72)[:, 1:2, :, :64].transpose(1, 2),
                         e.rand(*shape), e.rand(*shape)), {}), path="kernel"),
        # read-only aliasing views (legal for SDPA): rows 16 bytes apart overlap, and heads that
        # are the same rows shifted by one; the sm90 family's TMA maps must describe them too
        Case("rows_overlapping",
             lambda e: ((e.rand(2 * 4 * 80 * 8 + 64).as_strided(shape, (4 * 80 * 8, 80 * 8, 8, 1)),
                         e.rand(*shape), e.rand(*shape)), {}), path="kernel"),
        Case("heads_alias_shifted_rows",
             lambda e: ((e.rand(*shape), e.rand(2 * 84 * 64).as_strided(shape, (84 * 64, 64, 64, 1)),
                         e.rand(*shape)), dict(is_causal=True)), path="kernel"),
        Case("non_contiguous_batch_slice",
             lambda e: ((e.rand(4, 4, 80, 64)[::2], e.rand(4, 4, 80, 64)[1::2],
                         e.rand(*shape)), {}), path="kernel"),
    ]
    # ---- NaN / Inf, masks, scale --------------------------------------------------------------------
    c += _nan_inf_cases()
    c += [
        # These masked calls (16 query rows) run in the decode kernels (additive masks on Hopper:
        # PyTorch's SDPA); fully masked rows are zeros there as in PyTorch (its safe softmax), not NaN.
        Case("mask_fully_masked_rows_bool",
             lambda e: (e.qkv(q=(2, 4, 16, 64), k=(2, 4, 24, 64)),
                        dict(attn_mask=_mask_rows_off(e, 16, 24, (0, 5, 15), "bool"))),
             path="kernel"),
        Case("mask_fully_masked_rows_additive",
             lambda e: (e.qkv(q=(2, 4, 16, 64), k=(2, 4, 24, 64)),
                        dict(attn_mask=_mask_rows_off(e, 16, 24, (0, 5, 15), "additive"))),
             path=ADDITIVE_MASK_PATH),
        Case("mask_everything_masked",
             lambda e: (e.qkv(q=(2, 4, 16, 64), k=(2, 4, 24, 64)),
                        dict(attn_mask=torch.zeros(16, 24, dtype=torch.bool, device=e.device))),
             path="kernel"),
        Case("mask_nothing_masked",
             lambda e: (e.qkv(q=(2, 4, 16, 64), k=(2, 4, 24, 64)),
                        dict(attn_mask=torch.ones(2, 1, 16, 24, dtype=torch.bool,
                                                  device=e.device))),
             path="kernel"),
        # HuggingFace fills float masks with finfo(dtype).min: a row masked only by such finite
        # values is a uniform average in PyTorch, not a fully masked (zero) row.
        Case("mask_additive_finfo_min_rows",
             lambda e: (e.qkv(q=(2, 4, 16, 64), k=(2, 4, 24, 64)),
                        dict(attn_mask=torch.zeros(16, 24).index_fill_(
                            0, torch.tensor([1, 7]), torch.finfo(e.dtype).min).to(e.device, e.dtype))),
             path=ADDITIVE_MASK_PATH),
    ]
    c += _scale_cases()
    return c


CASES = _cases()
assert len({c.name for c in CASES}) == len(CASES), "row names must be unique"

DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
NO_GPU = pytest.mark.skipif(not HAVE_CUDA and not REQUIRE_GPU, reason="no CUDA device: GPU rows skipped")


def _params():
    out = []
    for case in CASES:
        for dtype in case.dtypes:
            for device in ("cpu", "cuda"):
                marks = [NO_GPU] if device == "cuda" else []
                if case.known_bug:
                    marks.append(pytest.mark.xfail(strict=True, raises=AssertionError,
                                                   reason="known bug: " + case.known_bug))
                out.append(pytest.param(case, dtype, device, marks=marks,
                                        id=f"{case.name}-{DTYPES[dtype]}-{device}"))
    return out


def _call(fn, args, kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - compared below
        return None, e


def assert_same_values(got, expected, exact, what=""):
    """Same shape/dtype/device; NaN and +-inf in the same places; finite values equal (exact) or
    within the low-precision tolerance."""
    assert got.shape == expected.shape, f"{what}shape {tuple(got.shape)} != {tuple(expected.shape)}"
    assert got.dtype == expected.dtype, f"{what}dtype {got.dtype} != {expected.dtype}"
    assert got.device == expected.device, f"{what}device {got.device} != {expected.device}"
    g, x = got.detach().cpu(), expected.detach().cpu()
    for name, pred in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        gm, xm = pred(g), pred(x)
        if not torch.equal(gm, xm):
            diff = (gm != xm).nonzero()
            raise AssertionError(f"{what}{name} positions differ at {diff.shape[0]} elements, "
                                 f"first {diff[0].tolist()}: got {g[tuple(diff[0])]}, "
                                 f"expected {x[tuple(diff[0])]}")
    fin = torch.isfinite(x)
    if exact:
        assert torch.equal(g[fin], x[fin]), f"{what}finite values differ (expected bitwise equal)"
    else:
        torch.testing.assert_close(g[fin], x[fin], **TOL[got.dtype], msg=lambda m: what + m)


def explain_or_none(args, kwargs):
    try:
        return flashcore.explain(*args, **kwargs)
    except Exception:  # noqa: BLE001 - explain raises exactly where sdpa raises
        return None


@pytest.mark.parametrize("case,dtype,device", _params())
def test_bad_input_table(case, dtype, device):
    if device == "cuda" and not HAVE_CUDA:
        pytest.fail("FLASHCORE_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
    env = Env(device, dtype, zlib.crc32(f"{case.name}-{dtype}".encode()))
    args, kwargs = case.build(env)
    got, err = _call(flashcore.sdpa, args, kwargs)
    if device == "cuda":
        torch.cuda.synchronize()  # an asynchronous kernel fault surfaces here, not later

    if isinstance(case.expect, Error):
        assert err is not None, f"expected an error matching {case.expect.match!r}, got a result"
        assert isinstance(err, RuntimeError), f"expected RuntimeError, got {type(err).__name__}: {err}"
        assert re.search(case.expect.match, str(err)), \
            f"error message {str(err)!r} does not match {case.expect.match!r}"
        assert explain_or_none(args, kwargs) is None, \
            "explain() must raise for the arguments sdpa raises for"
        return

    if case.reference is not None:
        expected, aten_err = case.reference(args, kwargs), None
    else:
        expected, aten_err = _call(F.scaled_dot_product_attention, args, kwargs)
    if aten_err is not None:
        assert err is not None, f"aten raises ({aten_err}) but flashcore.sdpa returned a result"
        assert isinstance(err, RuntimeError), f"expected RuntimeError, got {type(err).__name__}"
        if ATEN_MESSAGES:
            first = str(aten_err).splitlines()[0]
            assert first in str(err), f"aten's message {first!r} not in {str(err)!r}"
        return
    assert err is None, f"aten returns a result but flashcore.sdpa raised {type(err).__name__}: {err}"

    why = flashcore.explain(*args, **kwargs)
    if device == "cpu":
        assert why == "fallback: a tensor is not on a CUDA device"
    elif KERNEL_CARD and dtype in LOWP and case.path is not None:
        if case.path == "kernel":
            assert why.startswith("kernel"), f"expected a FlashCore kernel, explain says {why!r}"
        else:
            assert why.startswith("fallback") and case.path in why, \
                f"expected a fallback because {case.path!r}, explain says {why!r}"
    if not why.startswith("kernel"):  # a fallback is aten itself, bit for bit
        assert_same_values(got, expected, exact=True, what=f"[{why}] ")
        return
    # A FlashCore kernel ran. PyTorch's own backends disagree on where NaN/inf land in corner
    # cases (on the CPU, measured with torch 2.14: the math backend adds the causal mask, so NaN
    # or +inf in a masked key spreads to rows that do not see it, where the flash backend masks;
    # the CPU flash backend gives NaN for a causal call with scale 0 or < 0, where math does not).
    # So the kernel must match one of: F.sdpa on the same inputs (the GPU's default backend),
    # float64 math, or the CPU's default backend in float32.
    candidates = [("F.sdpa same dtype", lambda: expected),
                  ("float64 math", lambda: _upcast_result(args, kwargs, torch.float64, None)),
                  ("CPU float32", lambda: _upcast_result(args, kwargs, torch.float32, "cpu"))]
    first_failure = None
    for name, make in candidates:
        try:
            ref = make().to(device=got.device, dtype=got.dtype)
            assert_same_values(got, ref, exact=False, what=f"[{why}, vs {name}] ")
            return
        except AssertionError as e:
            first_failure = first_failure or e
    raise first_failure


def _upcast_result(args, kwargs, dtype, device):
    def up(t):
        if not torch.is_tensor(t):
            return t
        return t.to(device=device or t.device, dtype=dtype if t.is_floating_point() else t.dtype)
    return F.scaled_dot_product_attention(*(up(a) for a in args),
                                          **{k: up(v) for k, v in kwargs.items()})


# ---- GPU-only rows: shapes whose offsets or grid leave 32 bits, built with stride tricks ----------

def _free_gpu_bytes():
    free, _ = torch.cuda.mem_get_info()
    return free


gpu_only = pytest.mark.skipif(not HAVE_CUDA and not REQUIRE_GPU,
                              reason="no CUDA device: GPU rows skipped")


def _need_gpu(min_free_gib=0.0):
    if not HAVE_CUDA:
        pytest.fail("FLASHCORE_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
    if min_free_gib and _free_gpu_bytes() < min_free_gib * 2**30:
        pytest.skip(f"needs {min_free_gib} GiB of free GPU memory")


def _reference(q, k, v, **kwargs):
    """float64 SDPA on the GPU (aten's math path): the truth the low-precision outputs approximate."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)


def _check_close_to_reference(out, q, k, v, **kwargs):
    ref = _reference(q, k, v, **kwargs)
    lowp = F.scaled_dot_product_attention(q, k, v, **kwargs).double()
    bound = 2 * (lowp - ref).abs().max().item() + (1e-3 if q.dtype == torch.float16 else 1e-2)
    err = (out.double() - ref).abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_offsets_beyond_int32_kernel_uses_64bit_bases(dtype):
    """Batch strides of 2^31 elements: the (batch, head) bases leave 32 bits, every offset inside
    a slice fits. The kernel (64-bit bases) must run and be right. One 4 GiB buffer holds q, k, v."""
    _need_gpu(min_free_gib=6)
    B, H, S, D = 2, 2, 128, 64
    big = torch.empty(2**31 + 2**21, dtype=dtype, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    views = []
    for i, offset in enumerate((0, 2**19, 2**20)):
        t = big.as_strided((B, H, S, D), (2**31, 2**18, D, 1), storage_offset=offset)
        t.copy_(torch.randn(B, H, S, D, generator=gen, device="cuda", dtype=dtype))
        views.append(t)
    q, k, v = views
    why = flashcore.explain(q, k, v)
    if KERNEL_CARD:
        assert why.startswith("kernel"), why
    out = flashcore.sdpa(q, k, v)
    torch.cuda.synchronize()
    _check_close_to_reference(out, q.contiguous(), k.contiguous(), v.contiguous())
    # the same rows read through contiguous copies give the same answer
    assert torch.equal(out, flashcore.sdpa(q.contiguous(), k.contiguous(), v.contiguous()))
    del big, views, q, k, v
    torch.cuda.empty_cache()


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_slice_offset_overflow_falls_back(dtype):
    """Keys 2^30 elements apart: (Sk - 1) * stride_s exceeds 2^31 - 1, so the C layer says
    FC_ERR_OFFSET_OVERFLOW and the call falls back to aten, which gives the right answer."""
    _need_gpu(min_free_gib=6)
    B, H, Sq, Sk, D = 1, 2, 64, 3, 64
    big = torch.zeros(2 * 2**30 + 2**20, dtype=dtype, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(2)
    k = big.as_strided((B, H, Sk, D), (0, 2**19, 2**30, 1))
    v = big.as_strided((B, H, Sk, D), (0, 2**19, 2**30, 1), storage_offset=2**18)
    for t in (k, v):
        t.copy_(torch.randn(B, H, Sk, D, generator=gen, device="cuda", dtype=dtype))
    q = torch.randn(B, H, Sq, D, generator=gen, device="cuda", dtype=dtype)
    why = flashcore.explain(q, k, v)
    if KERNEL_CARD:
        assert why.startswith("fallback: tensor too large"), why
    out = flashcore.sdpa(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))
    _check_close_to_reference(out, q, k.contiguous(), v.contiguous())
    del big, k, v
    torch.cuda.empty_cache()


@gpu_only
@pytest.mark.parametrize("dim", ["batch", "heads"])
def test_gpu_grid_beyond_cuda_limit_runs_in_slices(dim):
    """65536 batches or query heads exceed CUDA's 65535 limit on grid y/z: the C layer launches
    the kernel once per slice of at most 65535 (aten itself fails or returns wrong values here on
    torch 2.11). Inputs are one row broadcast (stride 0), so they are tiny; every output row
    equals the one-row result."""
    _need_gpu(min_free_gib=1)
    D = 64
    gen = torch.Generator(device="cuda").manual_seed(3)
    q1, k1, v1 = (torch.randn(1, 1, 1, D, generator=gen, device="cuda", dtype=torch.float16)
                  for _ in range(3))
    k1, v1 = (torch.cat([t, torch.randn_like(t)], dim=2) for t in (k1, v1))  # 2 keys
    big = (65536, 1) if dim == "batch" else (1, 65536)
    q = q1.expand(*big, 1, D)
    k, v = (t.expand(big[0], 1, 2, D) for t in (k1, v1))
    kwargs = dict(enable_gqa=True) if dim == "heads" else {}
    why = flashcore.explain(q, k, v, **kwargs)
    if KERNEL_CARD:
        assert why.startswith("kernel"), why
    out = flashcore.sdpa(q, k, v, **kwargs)
    torch.cuda.synchronize()
    assert out.shape == (*big, 1, D)
    row = F.scaled_dot_product_attention(q1, k1, v1)
    torch.testing.assert_close(out, row.expand_as(out), atol=2e-3, rtol=2e-3)


@gpu_only
def test_gpu_more_than_65535_query_blocks_kernel():
    """Sq = 65535 * 64 + 1 rows: 65536 query blocks, past what grid y allows, in grid x (or the
    persistent tile loop). q is one row broadcast along S (stride 0: the sm90 family declines
    it, the sm80 family takes it), so the input is tiny; every output row is the one-row result."""
    _need_gpu(min_free_gib=2)
    Sq, D = 65535 * 64 + 1, 64
    gen = torch.Generator(device="cuda").manual_seed(5)
    q1 = torch.randn(1, 1, 1, D, generator=gen, device="cuda", dtype=torch.float16)
    q = q1.expand(1, 1, Sq, D)
    k, v = (torch.randn(1, 1, 100, D, generator=gen, device="cuda", dtype=torch.float16)
            for _ in range(2))
    why = flashcore.explain(q, k, v)
    if KERNEL_CARD:
        assert why.startswith("kernel"), why
    out = flashcore.sdpa(q, k, v)
    torch.cuda.synchronize()
    assert out.shape == (1, 1, Sq, D)
    row = flashcore.sdpa(q1, k, v)
    _check_close_to_reference(row, q1, k, v)
    torch.testing.assert_close(out, row.expand_as(out), atol=2e-3, rtol=2e-3)


@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_seqlen_k_near_int32_max(dtype):
    """seqlen_k = 2^31 - 1 with K and V one row broadcast along S (stride 0: tiny inputs), causal
    (top-left: query i sees keys 0..i, so the work is one key block). Every visible key is the
    same, so every output row is exactly V's row (V holds powers of two). Either the kernel runs
    and is right, or the call falls back (then it is not run here: aten would need Sq x Sk)."""
    _need_gpu()
    if not KERNEL_CARD:
        pytest.skip("no FlashCore kernel on this GPU: nothing of FlashCore's runs")
    Sq, Sk, D = 100, 2**31 - 1, 64
    gen = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(1, 1, Sq, D, generator=gen, device="cuda", dtype=dtype)
    k = torch.randn(1, 1, 1, D, generator=gen, device="cuda", dtype=dtype).expand(1, 1, Sk, D)
    exps = torch.randint(-3, 3, (1, 1, 1, D), generator=gen, device="cuda").float()
    signs = torch.where(torch.rand(1, 1, 1, D, generator=gen, device="cuda") < 0.5, -1.0, 1.0)
    v1 = (torch.exp2(exps) * signs).to(dtype)
    v = v1.expand(1, 1, Sk, D)
    why = flashcore.explain(q, k, v, is_causal=True)
    if not why.startswith("kernel"):
        assert "too large" in why, why
        return
    out = flashcore.sdpa(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "NaN output: the kernel processed no key block"
    assert torch.equal(out, v1.expand(1, 1, Sq, D)), \
        f"max error {(out.float() - v1.float()).abs().max().item()}"


@gpu_only
def test_gpu_mask_on_other_device_same_as_aten():
    _need_gpu()
    q, k, v = (torch.randn(2, 4, 8, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.ones(8, 8, dtype=torch.bool)  # on the CPU
    expected, aten_err = _call(F.scaled_dot_product_attention, (q, k, v), dict(attn_mask=mask))
    got, err = _call(flashcore.sdpa, (q, k, v), dict(attn_mask=mask))
    if aten_err is not None:
        assert err is not None and isinstance(err, RuntimeError)
    else:
        assert err is None, err
        assert_same_values(got, expected, exact=True)


EMPTY_ROWS = [c for c in CASES if c.reference is _empty_reference]


@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="aten's empty-input paths crash on this torch (SIGFPE with zero heads)")
@pytest.mark.parametrize("case", EMPTY_ROWS, ids=[c.name for c in EMPTY_ROWS])
def test_empty_reference_is_what_aten_returns(case):
    """The written-out reference of the empty rows is aten's CPU answer, where aten survives."""
    args, kwargs = case.build(Env("cpu", torch.float32, 0))
    expected = F.scaled_dot_product_attention(*args, **kwargs)
    got = _empty_reference(args, kwargs)
    assert got.shape == expected.shape and torch.equal(got, expected)
