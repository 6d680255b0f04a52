"""CPU tests of torch.ops.flashcore.sdpa: schema, the aten fallback, errors, explain().

Needs no GPU. Imports the installed `flashcore` package, or the repository's python/flashcore
(where the build puts libflashcore_op.so) when none is installed.
"""
import importlib.util
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402

OP = torch.ops.flashcore.sdpa.default
ATEN = torch.ops.aten.scaled_dot_product_attention.default
# torch >= 2.13 passes aten's error message through the stable ABI; 2.11/2.12 only log it.
ATEN_MESSAGES = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 13)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


# ---- schema ---------------------------------------------------------------------------------

def test_schema_matches_aten():
    ours, theirs = OP._schema, ATEN._schema
    assert ours.name == "flashcore::sdpa" and theirs.name == "aten::scaled_dot_product_attention"

    def describe(schema):
        args = [(a.name, str(a.type), a.default_value, a.kwarg_only, a.alias_info)
                for a in schema.arguments]
        rets = [(str(r.type), r.alias_info) for r in schema.returns]
        return args, rets, schema.overload_name, schema.is_mutable

    assert describe(ours) == describe(theirs)
    assert str(ours).split("(", 1)[1] == str(theirs).split("(", 1)[1]


INFERENCE = torch.ops.flashcore._sdpa_inference.default


def test_inference_op_schema_is_sdpas():
    # The twin that inference calls reach (flashcore/_entry.py) must take exactly sdpa's arguments.
    assert str(INFERENCE._schema).split("(", 1)[1] == str(OP._schema).split("(", 1)[1]


def _top_ops(fn):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from op_recorder import OpRecorder
    with OpRecorder() as rec:
        out = fn()
    return out, [op for op in rec.ops if op in (OP, INFERENCE)]


@pytest.mark.parametrize("entry", ["flashcore.sdpa", "patched F.sdpa"])
def test_entry_points_route_by_gradient(entry):
    """Calls that record a gradient go to sdpa (its Autograd kernel, the training route); all
    others to _sdpa_inference, with the same result bit for bit; gradients still flow."""
    from flashcore.integrations.patch import scaled_dot_product_attention as patched
    call = flashcore.sdpa if entry == "flashcore.sdpa" else patched
    q, k, v = rand(2, 4, 17, 32), rand(2, 2, 23, 32), rand(2, 2, 23, 32)
    expected = OP(q, k, v, enable_gqa=True, scale=0.3)
    out, ops = _top_ops(lambda: call(q, k, v, enable_gqa=True, scale=0.3))
    assert ops == [INFERENCE] and torch.equal(out, expected)
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        out, ops = _top_ops(lambda: call(qg, k, v, enable_gqa=True, scale=0.3))
    assert ops == [INFERENCE] and not out.requires_grad and torch.equal(out, expected)
    out, ops = _top_ops(lambda: call(qg, k, v, enable_gqa=True, scale=0.3))
    assert INFERENCE not in ops and out.requires_grad
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.sum().backward()
    qr = q.clone().requires_grad_()
    F.scaled_dot_product_attention(qr, k, v, enable_gqa=True, scale=0.3).sum().backward()
    torch.testing.assert_close(qg.grad, qr.grad)


def test_inference_entry_compiles_fullgraph():
    torch._dynamo.reset()
    q, k, v = rand(1, 4, 9, 16), rand(1, 4, 9, 16), rand(1, 4, 9, 16)
    fn = torch.compile(lambda a, b, c: flashcore.sdpa(a, b, c, is_causal=True), fullgraph=True,
                       backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(fn(q, k, v), OP(q, k, v, None, 0.0, True))
    torch.library.opcheck(INFERENCE, (q, k, v), dict(is_causal=True))
    torch._dynamo.reset()


# flashcore.attention's band, after SDPA's arguments in explain and sdpa_fwd (keyword-only).
BAND_ARGS = ["window_left", "window_right", "bottom_right"]


def test_explain_op_schema():
    schema = torch.ops.flashcore.explain.default._schema
    assert [a.name for a in schema.arguments] == \
        [a.name for a in ATEN._schema.arguments] + BAND_ARGS + ["sinks", "softcap", "lse"]
    assert all(a.kwarg_only for a in schema.arguments[-6:])
    assert schema.arguments[-2].default_value == 0.0  # softcap: none
    assert schema.arguments[-1].default_value is False  # lse: sdpa's path, not sdpa_fwd's
    assert [str(r.type) for r in schema.returns] == ["int", "int"]


# ---- the CPU path is aten's SDPA, bit for bit -------------------------------------------------

CASES = {
    "plain": dict(q=(2, 4, 16, 32), k=(2, 4, 16, 32)),
    "causal": dict(q=(2, 4, 16, 32), k=(2, 4, 16, 32), is_causal=True),
    "causal_sq_lt_sk": dict(q=(1, 2, 5, 16), k=(1, 2, 11, 16), is_causal=True),
    "causal_sq_gt_sk": dict(q=(1, 2, 11, 16), k=(1, 2, 5, 16), is_causal=True),
    "sq_ne_sk": dict(q=(2, 3, 7, 64), k=(2, 3, 19, 64)),
    "scale": dict(q=(2, 4, 16, 32), k=(2, 4, 16, 32), scale=0.3),
    "gqa": dict(q=(2, 8, 16, 32), k=(2, 2, 16, 32), enable_gqa=True),
    "gqa_causal": dict(q=(2, 6, 9, 32), k=(2, 3, 13, 32), enable_gqa=True, is_causal=True),
    "bool_mask": dict(q=(2, 4, 16, 32), k=(2, 4, 24, 32), mask=((2, 1, 16, 24), "bool")),
    "bool_mask_2d": dict(q=(2, 4, 16, 32), k=(2, 4, 24, 32), mask=((16, 24), "bool")),
    "additive_mask": dict(q=(2, 4, 16, 32), k=(2, 4, 24, 32), mask=((2, 4, 16, 24), "same")),
    "additive_mask_bcast": dict(q=(2, 4, 16, 32), k=(2, 4, 24, 32), mask=((1, 4, 1, 24), "same")),
    "fp32_mask": dict(q=(2, 4, 16, 32), k=(2, 4, 24, 32), mask=((2, 4, 16, 24), "float32")),
    "value_head_dim_differs": dict(q=(2, 4, 16, 32), k=(2, 4, 16, 32), v_d=48),
    "batch_broadcast": dict(q=(1, 4, 16, 32), k=(2, 4, 16, 32)),
    "3d": dict(q=(4, 16, 32), k=(4, 16, 32)),
    "5d": dict(q=(2, 2, 3, 8, 16), k=(2, 2, 3, 8, 16)),
    "empty_seq": dict(q=(2, 4, 0, 32), k=(2, 4, 16, 32)),
}


def make_case(case, dtype, transposed=False):
    q_shape, k_shape = case["q"], case["k"]
    v_shape = k_shape[:-1] + (case.get("v_d", k_shape[-1]),)
    if transposed:  # HuggingFace layout: (B, S, H, D) storage viewed as (B, H, S, D)
        q, k, v = (rand(s[0], s[2], s[1], s[3], dtype=dtype).transpose(1, 2)
                   for s in (q_shape, k_shape, v_shape))
    else:
        q, k, v = (rand(*s, dtype=dtype) for s in (q_shape, k_shape, v_shape))
    kwargs = {key: case[key] for key in ("is_causal", "scale", "enable_gqa") if key in case}
    mask = None
    if "mask" in case:
        shape, kind = case["mask"]
        if kind == "bool":
            mask = torch.rand(shape) > 0.3
            mask[..., 0] = True  # no fully masked rows (NaN either way, but keep it simple)
        else:
            mask = torch.randn(shape, dtype=dtype if kind == "same" else torch.float32)
    return q, k, v, mask, kwargs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_cpu_fallback_equals_aten(name, dtype):
    q, k, v, mask, kwargs = make_case(CASES[name], dtype)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    got = torch.ops.flashcore.sdpa(q, k, v, attn_mask=mask, **kwargs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)
    assert torch.equal(flashcore.sdpa(q, k, v, mask, **kwargs), expected)


@pytest.mark.parametrize("name", ["plain", "causal", "gqa", "sq_ne_sk"])
def test_cpu_fallback_transposed_inputs(name):
    q, k, v, mask, kwargs = make_case(CASES[name], torch.float32, transposed=True)
    assert not q.is_contiguous()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kwargs)
    assert torch.equal(flashcore.sdpa(q, k, v, mask, **kwargs), expected)


def test_cpu_fallback_fp64_and_positional_args():
    q, k, v = (rand(2, 3, 8, 16, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, None, 0.0, True, scale=0.5)
    assert torch.equal(torch.ops.flashcore.sdpa(q, k, v, None, 0.0, True, scale=0.5), expected)


def test_cpu_fallback_dropout_runs_in_aten():
    q, k, v = (rand(2, 3, 8, 16) for _ in range(3))
    torch.manual_seed(0)
    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(0)
    assert torch.equal(flashcore.sdpa(q, k, v, dropout_p=0.5), expected)


# ---- bad inputs: clear errors naming the argument --------------------------------------------

def qkv(q=(2, 4, 8, 16), k=None, v=None, dtype=torch.float32):
    k = k or q
    v = v or k
    return rand(*q, dtype=dtype), rand(*k, dtype=dtype), rand(*v, dtype=dtype)


@pytest.mark.parametrize("fn", [flashcore.sdpa, flashcore.explain], ids=["sdpa", "explain"])
class TestBadInputs:
    def test_key_dtype(self, fn):
        q, k, v = qkv()
        with pytest.raises(RuntimeError,
                           match=r"key must have the same dtype as query \(query: Half, key: Float\)"):
            fn(q.half(), k, v.half())

    def test_value_dtype(self, fn):
        q, k, v = qkv(dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"value must have the same dtype as query "
                                               r"\(query: BFloat16, value: Half\)"):
            fn(q, k, v.half())

    def test_head_dim_mismatch(self, fn):
        q, k, v = qkv(q=(2, 4, 8, 16), k=(2, 4, 8, 32))
        with pytest.raises(RuntimeError, match=r"key must have the same head dim \(last size\) "
                                               r"as query \(query: 16, key: 32\)"):
            fn(q, k, v)

    @pytest.mark.parametrize("which", ["query", "key", "value"])
    def test_rank_too_small(self, fn, which):
        args = dict(zip(["query", "key", "value"], qkv()))
        args[which] = args[which][0, 0, 0]
        with pytest.raises(RuntimeError, match=f"{which} must have at least 2 dimensions.*got 1-D"):
            fn(args["query"], args["key"], args["value"])

    def test_batch_mismatch(self, fn):
        q, k, v = qkv(q=(3, 4, 8, 16), k=(2, 4, 8, 16))
        with pytest.raises(RuntimeError, match=r"key must have the same batch size \(dim 0\) as "
                                               r"query \(query: 3, key: 2\)"):
            fn(q, k, v)

    def test_heads_mismatch_without_gqa(self, fn):
        q, k, v = qkv(q=(2, 8, 8, 16), k=(2, 2, 8, 16))
        with pytest.raises(RuntimeError, match="key has 2 heads and query has 8: they must match "
                                               "unless enable_gqa=True"):
            fn(q, k, v)

    def test_gqa_heads_not_divisible(self, fn):
        q, k, v = qkv(q=(2, 8, 8, 16), k=(2, 3, 8, 16))
        with pytest.raises(RuntimeError, match=r"with enable_gqa=True the number of query heads "
                                               r"must be a multiple of key's \(query: 8 heads, key: 3"):
            fn(q, k, v, enable_gqa=True)

    def test_mask_dtype(self, fn):
        q, k, v = qkv()
        with pytest.raises(RuntimeError, match=r"attn_mask must be bool, float32 or query's dtype "
                                               r"\(query: Float, attn_mask: Int\)"):
            fn(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.int32))

    def test_mask_with_causal(self, fn):
        q, k, v = qkv()
        with pytest.raises(RuntimeError, match="attn_mask must be None when is_causal=True"):
            fn(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)

    def test_bad_family_env(self, fn, monkeypatch):
        monkeypatch.setenv("FLASHCORE_FAMILY", "sm70")
        with pytest.raises(RuntimeError, match="FLASHCORE_FAMILY must be one of 'auto', 'sm80', "
                                               r"'sm90', 'decode' \(got 'sm70'\)"):
            fn(*qkv())


def test_device_mismatch_named():
    # explain() runs for any device (sdpa itself has no Meta kernel until the fake is registered).
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"value must be on the same device as query "
                                           r"\(query: cpu, value: device type"):
        flashcore.explain(q, k, v.to("meta"))


@pytest.mark.parametrize("bad", ["int_dtype"])
def test_errors_aten_raises_are_raised(bad):
    """An error only aten raises reaches the caller with aten's message. (A mask of the wrong
    shape used to be one; the op now names it itself: tests/test_bad_inputs.py.)"""
    q, k, v = qkv()
    args, kwargs = (q.long(), k.long(), v.long()), {}
    with pytest.raises(RuntimeError) as aten_err:
        F.scaled_dot_product_attention(*args, **kwargs)
    with pytest.raises(RuntimeError) as ours:
        flashcore.sdpa(*args, **kwargs)
    if ATEN_MESSAGES:
        assert str(aten_err.value).splitlines()[0] in str(ours.value)


# ---- explain() ---------------------------------------------------------------------------------

def test_explain_cpu_says_fallback_not_cuda():
    q, k, v = qkv(dtype=torch.float16)
    assert flashcore.explain(q, k, v) == "fallback: a tensor is not on a CUDA device"
    assert flashcore.explain(q, k, v, is_causal=True, scale=0.1) == \
        "fallback: a tensor is not on a CUDA device"
    assert torch.ops.flashcore.explain(q, k, v) == (0, 1)


def test_explain_meta_tensors():
    q, k, v = (t.to("meta") for t in qkv())
    assert flashcore.explain(q, k, v).startswith("fallback: a tensor is not on a CUDA device")


def test_explain_c_status_strings_reachable():
    # the Python side reads fc_status_string from libflashcore.so through ctypes
    ok, empty = flashcore._status_string(0), flashcore._status_string(4)  # FC_OK, FC_UNSUPPORTED_EMPTY
    assert ok and empty and ok != empty


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU-only torch falls back instead")
def test_broken_library_gives_clear_import_error(tmp_path):
    # A missing library means an install without kernels, which falls back (tests/test_fallback.py);
    # a library that is there but does not load is an error.
    pkg = tmp_path / "flashcore_badlib"
    pkg.mkdir()
    shutil.copy(flashcore.__file__, pkg / "__init__.py")
    (pkg / "libflashcore_op.so").write_bytes(b"not an ELF file")
    spec = importlib.util.spec_from_file_location("flashcore_badlib", pkg / "__init__.py")
    with pytest.raises(ImportError, match=r"cannot load .*libflashcore_op\.so.*Rebuild it"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_version():
    assert isinstance(flashcore.__version__, str) and flashcore.__version__


def test_build_record_lists_what_was_compiled():
    # CMake writes flashcore/_build_config.py beside the libraries; the GPU tests skip the head
    # dims and dtypes a trimmed build (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES) left out.
    from flashcore import _build_config as cfg
    assert cfg.HEAD_DIMS and all(isinstance(d, int) for d in cfg.HEAD_DIMS)
    assert set(cfg.DTYPES) <= {"fp16", "bf16"} and cfg.DTYPES
    assert set(cfg.CUDA_ARCHS) <= {"89", "90a"} and cfg.CUDA_ARCHS
    d, name = cfg.HEAD_DIMS[0], cfg.DTYPES[0]
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    assert flashcore._built_for(d, dtype)
    assert not flashcore._built_for(48, dtype)           # no family has D=48
    assert not flashcore._built_for(d, torch.float32)    # no kernel takes float32
