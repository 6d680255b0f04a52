"""transformers integration: attn_implementation="flashcore" against "sdpa" on real model code.

Tiny random-weight models built from configs (no downloads): Llama (GQA), Qwen2 (GQA, qkv
bias), Mistral (GQA, sliding window), GPT-2 (MHA). On CPU the op falls back to aten's SDPA, so
"flashcore" must reproduce "sdpa" (fp32, tight tolerance): logits, greedy generate() with a KV
cache, a left-padded batch, and the same under torch.compile. The GPU tests (skipped without
CUDA) run bf16/fp16 models with head_dim 64/128, where FlashCore kernels do the work, and
check a kernel ran.

Sliding windows (the "sliding windows" section): transformers' window semantics against
flashcore's band, the mask builder's skip decision, and Mistral / Qwen2 / Gemma2 / Gemma3 with
windows that cut (prompts longer than the window), against "eager" (logits, gradients) and
"sdpa" (float64, greedy generate(), chunked prefill, left padding), each sliding call checked to
have run flashcore.attention with the band.

Skipped when transformers is not installed.
"""
import importlib.util
import os
import sys
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402
import flashcore.integrations.hf as fc_hf  # noqa: E402
from transformers import (AttentionInterface, AutoModelForCausalLM, GPT2Config,  # noqa: E402
                          LlamaConfig, MistralConfig, Qwen2Config)
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

FC_SDPA = torch.ops.flashcore.sdpa.default
# Inference calls reach sdpa's twin without an Autograd kernel (flashcore/_entry.py).
FC_SDPA_OPS = (FC_SDPA, torch.ops.flashcore._sdpa_inference.default)
FC_ATTN = torch.ops.flashcore.attention_fwd.default
VOCAB = 256
HAS_FAKE = torch._C._dispatch_has_kernel_for_dispatch_key("flashcore::sdpa", "Meta")
needs_fake = pytest.mark.skipif(not HAS_FAKE, reason="flashcore::sdpa has no fake (meta) "
                                "implementation in this build, so torch.compile cannot trace it")
GPU = torch.cuda.is_available()


def make_config(name, head_dim=16, heads=4, kv_heads=2, layers=2, sliding_window=12):
    hidden = head_dim * heads
    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if name == "gpt2":
        return GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=512,
                          initializer_range=0.1, **common)
    kw = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads,
              max_position_embeddings=512, initializer_range=0.1, **common)
    if name == "llama":
        return LlamaConfig(**kw)
    if name == "qwen2":
        return Qwen2Config(**kw)
    if name == "mistral":  # window shorter than prompt + generation: masks carry the window
        return MistralConfig(sliding_window=sliding_window, **kw)
    raise ValueError(name)


MODELS = ["llama", "qwen2", "mistral", "gpt2"]


def build(name, impl="sdpa", dtype=torch.float32, device="cpu", **cfg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(name, **cfg), attn_implementation=impl)
    return model.to(device=device, dtype=dtype).eval()


class Recorder(TorchDispatchMode):
    """Records each top-level flashcore.sdpa call, each flashcore.attention (band) call, and any
    other SDPA reaching dispatch."""

    def __init__(self):
        super().__init__()
        self.fc = []
        self.band = []
        self.other_sdpa = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FC_SDPA_OPS:
            q, k, v, *rest = args
            mask = rest[0] if rest else kwargs.get("attn_mask")
            causal = rest[2] if len(rest) > 2 else kwargs.get("is_causal", False)
            self.fc.append(dict(q=tuple(q.shape), k=tuple(k.shape), mask=mask is not None,
                                causal=causal, gqa=kwargs.get("enable_gqa", False),
                                why=flashcore.explain(*args, **kwargs) if q.is_cuda else None))
        elif func is FC_ATTN:
            q, k, v, mask, causal, scale, gqa, wl, wr, br, *_ = args  # (then sinks)
            self.band.append(dict(q=tuple(q.shape), k=tuple(k.shape), mask=mask is not None,
                                  causal=causal, gqa=gqa, window=(wl, wr), bottom_right=br))
            if q.is_cuda:
                self.band[-1]["why"] = flashcore.explain_attention(
                    q, k, v, mask, is_causal=causal, window_size=(wl, wr), scale=scale,
                    enable_gqa=gqa, causal_alignment="bottom_right" if br else "top_left")
        elif "scaled_dot_product" in func.name() or "_efficient_attention" in func.name():
            self.other_sdpa.append(func.name())
        return func(*args, **kwargs)


def ids_for(batch, length, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g).to(device)


def left_padded(device="cpu", lengths=(20, 13, 7)):
    ids = ids_for(len(lengths), max(lengths), seed=2, device=device)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        mask[i, max(lengths) - n:] = 1
    return ids.masked_fill(mask == 0, 0), mask


@torch.no_grad()
def logits(model, impl, ids, mask=None, record=False):
    model.set_attn_implementation(impl)
    if record:
        with Recorder() as rec:
            out = model(input_ids=ids, attention_mask=mask).logits
        return out, rec
    return model(input_ids=ids, attention_mask=mask).logits


@torch.no_grad()
def generate(model, impl, ids, mask=None, n=32, **kw):
    model.set_attn_implementation(impl)
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, pad_token_id=0, **kw)


@pytest.fixture(scope="module", params=MODELS)
def cpu_model(request):
    return request.param, build(request.param)


# ---- registration -------------------------------------------------------------------------------

def test_registered_with_both_interfaces():
    assert AttentionInterface._global_mapping["flashcore"] is fc_hf.flashcore_attention_forward
    assert AttentionMaskInterface._global_mapping["flashcore"] is fc_hf.flashcore_mask
    fc_hf.register()  # idempotent
    assert AttentionInterface._global_mapping["flashcore"] is fc_hf.flashcore_attention_forward


def test_version_check(monkeypatch):
    from packaging.version import Version
    v = Version(transformers.__version__)
    assert Version("5.17") <= Version(v.base_version) < Version("6"), transformers.__version__
    monkeypatch.setattr(transformers, "__version__", "5.10.0")
    with pytest.warns(UserWarning, match="supports transformers >=5.17,<6"):
        fc_hf._check_version()
    monkeypatch.setattr(transformers, "__version__", "6.0.0")
    with pytest.warns(UserWarning):
        fc_hf._check_version()
    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(ImportError, match="5.x"):
        fc_hf._check_version()
    monkeypatch.setattr(transformers, "__version__", "5.18.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fc_hf._check_version()


def test_flash_name_shim_only_touches_flashcore():
    import transformers.modeling_flash_attention_utils as fa
    assert getattr(fa._lazy_imports, "__flashcore_shim__", False)
    fns = fa._lazy_imports("flashcore")
    assert fns[:3] == (None, None, None)
    assert fa._lazy_imports.__wrapped__ is not fa._lazy_imports


def test_set_from_config_from_pretrained(tmp_path):
    model = build("llama")
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("flashcore")
    assert model.config._attn_implementation == "flashcore"
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation("flashcore")  # and back again
    assert model.config._attn_implementation == "flashcore"
    assert build("qwen2", impl="flashcore").config._attn_implementation == "flashcore"
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="flashcore")
    assert loaded.config._attn_implementation == "flashcore"
    ids = ids_for(1, 9)
    torch.testing.assert_close(logits(loaded, "flashcore", ids), logits(model, "sdpa", ids),
                               rtol=1e-5, atol=1e-5)


# ---- the attention function against transformers' sdpa_attention_forward -----------------------

class FakeModule(torch.nn.Module):
    def __init__(self, groups=1, is_causal=True):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = is_causal


def attn_inputs(b=2, hq=4, hkv=2, sq=10, sk=10, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    # (B, S, H, D) storage viewed as (B, H, S, D): what the models pass
    mk = lambda h, s: torch.randn(b, s, h, d, generator=g).transpose(1, 2)  # noqa: E731
    return mk(hq, sq), mk(hkv, sk), mk(hkv, sk)


FN_CASES = {
    "prefill_causal_gqa": (dict(), dict()),
    "decode": (dict(sq=1, sk=17), dict()),
    "mha": (dict(hkv=4), dict()),
    "bool_mask_gqa": (dict(sk=12), dict(mask="bool")),
    "float_mask": (dict(sk=12), dict(mask="float")),
    "not_causal_module": (dict(), dict(module_causal=False)),
    "is_causal_kwarg_false": (dict(), dict(is_causal=False)),
    "scaling": (dict(), dict(scaling=0.37)),
    "static_cache_prefill": (dict(sq=6, sk=16), dict()),
    "sliding_window_in_mask": (dict(sk=12), dict(mask="bool", sliding_window=4)),
    "sliding_window_not_cutting": (dict(sq=6, sk=6), dict(sliding_window=8)),
    "sliding_window_not_cutting_decode": (dict(sq=1, sk=8), dict(sliding_window=8)),
}


@pytest.mark.parametrize("name", list(FN_CASES))
def test_attention_function_matches_sdpa_attention_forward(name):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    shape, kw = FN_CASES[name]
    kw = dict(kw)
    q, k, v = attn_inputs(**shape)
    hq, hkv = q.shape[1], k.shape[1]
    module = FakeModule(hq // hkv, kw.pop("module_causal", True))
    mask = kw.pop("mask", None)
    if mask is not None:
        g = torch.Generator().manual_seed(5)
        shape4 = (q.shape[0], 1, q.shape[2], k.shape[2])
        mask = (torch.rand(shape4, generator=g) > 0.3) if mask == "bool" else torch.randn(shape4, generator=g)
        mask[..., 0] = True if mask.dtype == torch.bool else mask[..., 0]
    expected, w0 = sdpa_attention_forward(module, q, k, v, mask, **kw)
    with Recorder() as rec:
        out, w1 = fc_hf.flashcore_attention_forward(module, q, k, v, mask, **kw)
    assert w0 is None and w1 is None
    assert out.shape == (q.shape[0], q.shape[2], hq, q.shape[3]) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert len(rec.fc) == 1 and not rec.other_sdpa
    call = rec.fc[0]
    assert call["k"][1] == hkv  # K/V never repeated
    assert call["gqa"] == (hq != hkv)
    assert call["mask"] == (mask is not None)
    expect_causal = (mask is None and q.shape[2] > 1 and module.is_causal
                     and kw.get("is_causal", True) is not False)
    assert call["causal"] == expect_causal
    if name == "static_cache_prefill":
        assert call["k"][2] == q.shape[2]  # keys past the queries dropped, as sdpa does


DELEGATED = {
    "output_attentions": dict(output_attentions=True),
    "position_bias": dict(position_bias=torch.zeros(1, 4, 10, 10)),
    "dropout": dict(dropout=0.1),
}


@pytest.mark.parametrize("name", list(DELEGATED))
def test_uncovered_kwargs_go_to_transformers_sdpa(name, monkeypatch):
    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append(kwargs)
        return "delegated", None

    monkeypatch.setattr(fc_hf, "sdpa_attention_forward", spy)
    q, k, v = attn_inputs()
    with Recorder() as rec:
        out, _ = fc_hf.flashcore_attention_forward(FakeModule(2), q, k, v, None, **DELEGATED[name])
    assert out == "delegated" and len(seen) == 1 and not rec.fc
    for key, val in DELEGATED[name].items():
        assert seen[0][key] is val


# ---- real models on CPU -------------------------------------------------------------------------

def test_logits_match_sdpa(cpu_model):
    name, model = cpu_model
    ids = ids_for(2, 11)
    ref = logits(model, "sdpa", ids)
    out, rec = logits(model, "flashcore", ids, record=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    layers = model.config.num_hidden_layers
    assert len(rec.fc) == layers and not rec.other_sdpa
    kv_heads = 4 if name == "gpt2" else 2
    for call in rec.fc:  # prefill without padding: causal flag, no mask, GQA in the kernel
        assert call["causal"] and not call["mask"] and call["k"][1] == kv_heads
        assert call["gqa"] == (kv_heads != 4)


def test_padded_batch_matches_sdpa(cpu_model):
    name, model = cpu_model
    ids, mask = left_padded()
    ref = logits(model, "sdpa", ids, mask)
    out, rec = logits(model, "flashcore", ids, mask, record=True)
    keep = mask.bool()
    assert torch.isfinite(out[keep]).all()
    torch.testing.assert_close(out[keep], ref[keep], rtol=1e-5, atol=1e-5)
    assert rec.fc and all(c["mask"] and not c["causal"] for c in rec.fc)


def test_greedy_generate_matches_sdpa(cpu_model):
    name, model = cpu_model
    ids = ids_for(1, 10, seed=3)
    ref = generate(model, "sdpa", ids)
    with Recorder() as rec:
        out = generate(model, "flashcore", ids)
    assert out.shape == (1, 42)
    assert torch.equal(out, ref)
    decode = [c for c in rec.fc if c["q"][2] == 1]
    layers = model.config.num_hidden_layers
    assert len(decode) == 31 * layers  # one forward per new token after the first, cache used
    assert all(not c["causal"] for c in decode)
    assert max(c["k"][2] for c in decode) > 10  # attends to the cache


def test_padded_generate_matches_sdpa(cpu_model):
    name, model = cpu_model
    ids, mask = left_padded(lengths=(12, 5))
    ref = generate(model, "sdpa", ids, mask, n=16)
    out = generate(model, "flashcore", ids, mask, n=16)
    assert torch.equal(out, ref)


# ---- torch.compile on CPU -----------------------------------------------------------------------

def compiled_counter():
    from torch._dynamo.testing import CompileCounterWithBackend
    return CompileCounterWithBackend("aot_eager")


def is_fc_sdpa(target: str) -> bool:
    """A graph node calling FlashCore's SDPA op (or its twin for calls without gradients)."""
    return "flashcore.sdpa." in target or "flashcore._sdpa_inference" in target


def graph_targets(cnt):
    return [str(n.target) for gm in cnt.graphs for n in gm.graph.nodes if n.op == "call_function"]


@needs_fake
def test_compile_fullgraph_logits_and_padding(cpu_model):
    name, model = cpu_model
    torch._dynamo.reset()
    ids = ids_for(2, 11)
    pids, pmask = left_padded()
    ref, pref = logits(model, "sdpa", ids), logits(model, "sdpa", pids, pmask)
    model.set_attn_implementation("flashcore")
    cnt = compiled_counter()
    fwd = torch.compile(model, fullgraph=True, backend=cnt)
    with torch.no_grad():
        out = fwd(input_ids=ids).logits
        pout = fwd(input_ids=pids, attention_mask=pmask).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    keep = pmask.bool()
    torch.testing.assert_close(pout[keep], pref[keep], rtol=1e-5, atol=1e-5)
    targets = graph_targets(cnt)
    assert sum(is_fc_sdpa(t) for t in targets) >= model.config.num_hidden_layers
    assert not any("scaled_dot_product" in t for t in targets)
    torch._dynamo.reset()


@needs_fake
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_compile_generate_static_cache(name):
    """Decode steps compiled with fullgraph=True over a static cache (the generate() compile
    path), greedy tokens equal to eager sdpa."""
    torch._dynamo.reset()
    model = build(name)
    ids = ids_for(1, 10, seed=3)
    ref = generate(model, "sdpa", ids)
    model.set_attn_implementation("flashcore")
    cnt = compiled_counter()
    model.forward = torch.compile(model.forward, fullgraph=True, backend=cnt)
    with torch.no_grad():
        out = model.generate(input_ids=ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                             pad_token_id=0, cache_implementation="static", disable_compile=True)
    assert torch.equal(out, ref)
    assert any(is_fc_sdpa(t) for t in graph_targets(cnt))
    assert cnt.frame_count <= 4  # prefill + decode (+ a recompile), not one per token
    torch._dynamo.reset()


# ---- sliding windows ----------------------------------------------------------------------------
#
# transformers' sliding window of W (masking_utils.sliding_window_overlay: kv_idx > q_idx - W, and
# causal) is W keys, the query's own included: flashcore window_size=(W - 1, 0). Where the last
# query is the last key (no cache, or any dynamic cache) it is bottom-right aligned.

from flashcore import _band  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.masking_utils import (causal_mask_function,  # noqa: E402
                                        chunked_causal_mask_function, sdpa_mask,
                                        sliding_window_bidirectional_mask_function,
                                        sliding_window_causal_mask_function,
                                        sliding_window_overlay)

# float64 on these sizes (dots of <= 64 terms, 2 layers) rounds near 1e-14; 1e-10 leaves room for
# different summation orders, while a window off by one key moves logits by > 1e-3 (each model
# test asserts that removing the window changes its reference by more than WINDOW_CUTS).
FP64 = dict(rtol=1e-10, atol=1e-10)
WINDOW_CUTS = 1e-3
W = 8


def band(sq, sk, left, right=0, bottom_right=True):
    b = _band.band_bounds(sq, sk, True, left, right, bottom_right)
    return _band.band_mask(range(sq), sk, b, "cpu")


def test_overlay_is_w_keys_including_the_query():
    for w in (1, 2, 5):
        overlay = sliding_window_overlay(w)
        for q in range(12):
            seen = [k for k in range(12) if overlay(0, 0, q, k) and k <= q]
            assert seen == list(range(max(0, q - w + 1), q + 1))


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("sq,sk,kv_offset", [(12, 12, 0), (1, 20, 0), (5, 20, 0), (1, 8, 13),
                                             (6, 13, 9), (4, 4, 0), (1, 1, 0)])
def test_window_is_transformers_sliding_window(window, sq, sk, kv_offset):
    """transformers' materialized sliding mask (query positions the last sq of the keys) is
    flashcore's bottom-right (W - 1, 0) band, and one key more or less is not."""
    q_offset = kv_offset + sk - sq
    ref = sdpa_mask(batch_size=1, q_length=sq, kv_length=sk, q_offset=q_offset, kv_offset=kv_offset,
                    mask_function=sliding_window_causal_mask_function(window),
                    allow_is_causal_skip=False)[0, 0]
    assert torch.equal(ref, band(sq, sk, window - 1))
    q, k = torch.zeros(1, 1, sq, 4), torch.zeros(1, 1, sk, 4)
    assert torch.equal(fc_hf._window_band(q, k, window)[0, 0], ref)
    if sk > window:  # the window cuts: off by one either way is a different mask
        assert not torch.equal(ref, band(sq, sk, window))
        assert not torch.equal(ref, band(sq, sk, window - 2)) if window > 1 else True


def test_causal_window_of_recognises_only_the_causal_sliding_mask():
    assert fc_hf._causal_window_of(sliding_window_causal_mask_function(W), W) == W
    assert fc_hf._causal_window_of(sliding_window_causal_mask_function(W), W + 1) is None
    assert fc_hf._causal_window_of(sliding_window_causal_mask_function(W), None) is None
    assert fc_hf._causal_window_of(causal_mask_function, W) is None
    chunked = chunked_causal_mask_function(W, torch.zeros(1, dtype=torch.long))
    assert fc_hf._causal_window_of(chunked, W) is None
    assert fc_hf._causal_window_of(sliding_window_bidirectional_mask_function(W), W) is None
    from transformers.masking_utils import and_masks, or_masks
    extra = and_masks(sliding_window_causal_mask_function(W), causal_mask_function)
    assert fc_hf._causal_window_of(extra, W) is None
    assert fc_hf._causal_window_of(or_masks(sliding_window_overlay(W), causal_mask_function),
                                   W) is None


def pad_mask(batch, length, pads=()):
    m = torch.ones(batch, length, dtype=torch.bool)
    for b, n in pads:
        m[b, :n] = False
    return m


# (q_length, kv_length, q_offset, kv_offset, padding (batch, n left pads), tensor offsets?) ->
# whether flashcore_mask leaves the mask out. Offsets as transformers' caches give them.
BUILDER_CASES = {
    "prefill_cuts": ((20, 20, 0, 0, None), True),
    "prefill_no_cut": ((6, 6, 0, 0, None), True),  # transformers' own skip (is_causal)
    "prefill_w_keys": ((W, W, 0, 0, None), True),
    "full_cache_decode": ((1, 40, 39, 0, None), True),
    "full_cache_chunk": ((6, 40, 34, 0, None), True),
    "sliding_cache_decode": ((1, W, 30, 30 - W + 1, None), True),
    "sliding_cache_chunk": ((6, W - 1 + 6, 30, 30 - W + 1, None), True),
    "sliding_cache_filling": ((6, W, 2, 0, None), False),  # Sk == W, 1 < Sq < Sk: a mask
    "static_not_full": ((5, 32, 0, 0, None), False),  # empty slots at the end: top-left
    "static_decode": ((1, 32, 9, 0, None), False),
    "padding_in_window": ((20, 20, 0, 0, [(1, 3)]), False),
    "padding_before_every_window": ((1, 40, 39, 0, [(1, 30)]), True),
    "padding_at_window_edge": ((1, 40, 39, 0, [(1, 40 - W + 1)]), False),
    "no_padding_mask_ones": ((20, 20, 0, 0, []), True),
}


@pytest.mark.parametrize("name", list(BUILDER_CASES))
def test_mask_builder_skips_only_the_band(name):
    (sq, sk, q_off, kv_off, pads), skipped = BUILDER_CASES[name]
    kw = dict(batch_size=2, q_length=sq, kv_length=sk, q_offset=q_off, kv_offset=kv_off,
              mask_function=sliding_window_causal_mask_function(W), local_size=W,
              attention_mask=None if pads is None else pad_mask(2, kv_off + sk, pads))
    out = fc_hf.flashcore_mask(**kw)
    ref = sdpa_mask(**kw)
    dense = sdpa_mask(**dict(kw, allow_is_causal_skip=False))
    if skipped:
        assert out is None
        # what the attention function then applies is transformers' mask exactly
        q, k = torch.zeros(1, 1, sq, 4), torch.zeros(1, 1, sk, 4)
        if sk > W:
            assert torch.equal(dense, fc_hf._window_band(q, k, W).expand_as(dense))
        elif sq == 1:
            assert dense.all()
        else:
            assert sq == sk and torch.equal(dense, band(sq, sk, -1).expand_as(dense))
    else:
        assert out is not None and torch.equal(out, dense)
        assert ref is not None and torch.equal(out, ref)
    # never skipped when transformers asks for the mask, or with offsets as tensors
    assert torch.equal(fc_hf.flashcore_mask(**dict(kw, allow_is_causal_skip=False)), dense)
    if q_off:
        tq = torch.tensor(q_off)
        assert torch.equal(fc_hf.flashcore_mask(**dict(kw, q_offset=tq)),
                           sdpa_mask(**dict(kw, q_offset=tq, allow_is_causal_skip=False)))


def test_mask_builder_other_masks_are_transformers():
    """Full-attention and chunked layers get exactly sdpa_mask's answer."""
    for fn, local in ((causal_mask_function, None),
                      (chunked_causal_mask_function(W, torch.zeros(2, dtype=torch.long)), W)):
        for sq, sk, q_off in ((20, 20, 0), (1, 40, 39), (6, 40, 34)):
            kw = dict(batch_size=2, q_length=sq, kv_length=sk, q_offset=q_off, kv_offset=0,
                      mask_function=fn, local_size=local)
            out, ref = fc_hf.flashcore_mask(**kw), sdpa_mask(**kw)
            assert (out is None) == (ref is None)
            assert out is None or torch.equal(out, ref)


BAND_FN_CASES = {  # (sq, sk, window): the band applied by the attention function, mask None
    "prefill": (20, 20, 5),
    "prefill_window_1": (9, 9, 1),
    "decode_long_cache": (1, 30, W),
    "chunked_prefill": (6, 20, W),
    "sliding_cache_chunk": (6, W - 1 + 6, W),
}


@pytest.mark.parametrize("name", list(BAND_FN_CASES))
@pytest.mark.parametrize("hkv", [2, 4])
def test_attention_function_band(name, hkv):
    """No mask and a window that cuts: flashcore.attention with the bottom-right (W - 1, 0) band,
    equal to transformers' sdpa_attention_forward given transformers' own sliding mask."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    sq, sk, window = BAND_FN_CASES[name]
    q, k, v = (t.double() for t in attn_inputs(hkv=hkv, sq=sq, sk=sk))
    module = FakeModule(4 // hkv)
    mask = sdpa_mask(batch_size=2, q_length=sq, kv_length=sk, q_offset=sk - sq,
                     mask_function=sliding_window_causal_mask_function(window),
                     allow_is_causal_skip=False)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    causal_only = band(sq, sk, -1).expand_as(mask)
    unbanded, _ = sdpa_attention_forward(module, q, k, v, causal_only, scaling=0.3)
    assert (expected - unbanded).abs().max() > WINDOW_CUTS  # the window cuts here
    with Recorder() as rec:
        out, w = fc_hf.flashcore_attention_forward(module, q, k, v, None, scaling=0.3,
                                                   sliding_window=window)
    assert w is None and out.shape == (2, sq, 4, 16) and out.is_contiguous()
    torch.testing.assert_close(out, expected, **FP64)
    assert not rec.fc and not rec.other_sdpa
    assert rec.band == [dict(q=(2, 4, sq, 16), k=(2, hkv, sk, 16), mask=False, causal=True,
                             gqa=hkv != 4, window=(window - 1, 0), bottom_right=True)]


def test_attention_function_window_with_mask_uses_the_mask():
    """A mask (padding) carries the window already: it is used as it is, no band on top."""
    q, k, v = attn_inputs(sq=20, sk=20)
    mask = sdpa_mask(batch_size=2, q_length=20, kv_length=20, allow_is_causal_skip=False,
                     mask_function=sliding_window_causal_mask_function(4),
                     attention_mask=pad_mask(2, 20, [(1, 3)]))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    expected, _ = sdpa_attention_forward(FakeModule(2), q, k, v, mask, sliding_window=4)
    with Recorder() as rec:
        out, _ = fc_hf.flashcore_attention_forward(FakeModule(2), q, k, v, mask, sliding_window=4)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert len(rec.fc) == 1 and rec.fc[0]["mask"] and not rec.band


@pytest.mark.parametrize("extra", [dict(output_attentions=True), dict(dropout=0.1)])
def test_delegated_window_gets_the_band_as_mask(extra, monkeypatch):
    """A delegated call whose mask flashcore_mask left out hands transformers' function the band
    (it ignores sliding_window itself)."""
    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((attention_mask, kwargs))
        return "delegated", None

    monkeypatch.setattr(fc_hf, "sdpa_attention_forward", spy)
    q, k, v = attn_inputs(sq=3, sk=20)
    with Recorder() as rec:
        out, _ = fc_hf.flashcore_attention_forward(FakeModule(2), q, k, v, None, sliding_window=W,
                                                   **extra)
    assert out == "delegated" and not rec.fc and not rec.band
    mask, kwargs = seen[0]
    assert kwargs["sliding_window"] == W
    assert torch.equal(mask[0, 0], band(3, 20, W - 1))
    # a window that does not cut: nothing added
    q, k, v = attn_inputs(sq=3, sk=W)
    fc_hf.flashcore_attention_forward(FakeModule(2), q, k, v, None, sliding_window=W, **extra)
    assert seen[1][0] is None


def sliding_config(name, window=W, layers=2, softcap=False, head_dim=16, heads=4, kv_heads=2):
    common = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  hidden_size=head_dim * heads, intermediate_size=2 * head_dim * heads,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=512,
                  initializer_range=0.1, sliding_window=window)
    mixed = ["sliding_attention", "full_attention"] * (layers // 2)
    if name == "mistral":  # every layer slides
        return MistralConfig(**common)
    if name == "qwen2":
        return Qwen2Config(use_sliding_window=True, layer_types=mixed, **common)
    if name == "gemma2":  # attention softcap: off here, on in its own test
        return transformers.Gemma2Config(head_dim=head_dim, query_pre_attn_scalar=head_dim,
                                         layer_types=mixed,
                                         attn_logit_softcapping=50.0 if softcap else None,
                                         **common)
    if name == "gemma3":
        return transformers.Gemma3TextConfig(head_dim=head_dim, query_pre_attn_scalar=head_dim,
                                             layer_types=mixed, **common)
    raise ValueError(name)


SLIDING_MODELS = ["mistral", "qwen2", "gemma2", "gemma3"]


def build_sliding(name, dtype=torch.float64, device="cpu", **cfg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(sliding_config(name, **cfg),
                                             attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


def sliding_layers(model):
    types = getattr(model.config, "layer_types", None)
    return sum(t == "sliding_attention" for t in types) if types else \
        model.config.num_hidden_layers


class Trace:
    """Each call of the "flashcore" attention function (its window, mask, lengths and the
    flashcore.attention / delegate calls it made) and each mask-builder call (kwargs, result)."""

    def __init__(self):
        self.calls, self.masks = [], []

    def check(self, window=W):
        """Every call with a window, no mask and more keys than the window ran flashcore.attention
        with the bottom-right (W - 1, 0) band; no other call did. Every sliding mask the builder
        left out is transformers' materialized mask exactly. Returns the number of band calls."""
        n = 0
        for c in self.calls:
            if c["window"] is not None and not c["mask"] and c["sk"] > window:
                assert c["band"] == [dict(is_causal=True, causal_alignment="bottom_right",
                                          window_size=(window - 1, 0))], c
                assert not c["delegated"]
                n += 1
            else:
                assert not c["band"], c
        for kw, out in self.masks:
            if out is None and fc_hf._causal_window_of(kw["mask_function"], kw.get("local_size")):
                dense = sdpa_mask(**dict(kw, allow_is_causal_skip=False))
                sq, sk = kw["q_length"], kw["kv_length"]
                if sk > window:
                    want = band(sq, sk, window - 1)
                else:
                    want = band(sq, sk, -1)
                    assert sq in (1, sk)
                assert torch.equal(dense, want.expand_as(dense))
        return n


@pytest.fixture
def trace(monkeypatch):
    t = Trace()
    real_fn, real_band, real_delegate = (fc_hf.flashcore_attention_forward, flashcore.attention,
                                         fc_hf._delegate)

    def band_spy(*args, **kwargs):
        if kwargs.get("window_size", (-1, -1)) != (-1, -1):
            t.calls[-1]["band"].append({k: kwargs[k] for k in
                                        ("is_causal", "causal_alignment", "window_size")})
        t.calls[-1]["variants"].append({k: kwargs.get(k) for k in ("softcap", "sinks")})
        return real_band(*args, **kwargs)

    def delegate_spy(*args, **kwargs):
        t.calls[-1]["delegated"] = True
        return real_delegate(*args, **kwargs)

    def attention_fn(module, query, key, value, attention_mask, **kwargs):
        t.calls.append(dict(window=kwargs.get("sliding_window"), mask=attention_mask is not None,
                            sq=query.shape[2], sk=key.shape[2], band=[], variants=[],
                            delegated=False))
        return real_fn(module, query, key, value, attention_mask, **kwargs)

    def mask_fn(**kwargs):
        out = fc_hf.flashcore_mask(**kwargs)
        t.masks.append((kwargs, out))
        return out

    monkeypatch.setattr(flashcore, "attention", band_spy)
    monkeypatch.setattr(fc_hf, "_delegate", delegate_spy)
    monkeypatch.setitem(AttentionInterface._global_mapping, "flashcore", attention_fn)
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "flashcore", mask_fn)
    return t


def logits_grad(model, impl, ids, mask=None, seed=7):
    """Logits and the gradient of a fixed random projection of them w.r.t. every parameter."""
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask).logits
    g = torch.Generator().manual_seed(seed)
    proj = torch.randn(out.shape, generator=g, dtype=torch.float64).to(device=out.device, dtype=out.dtype)
    if mask is not None:
        proj = proj * mask[..., None].to(proj.dtype)
    (out * proj).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return out.detach(), grads.detach()


@pytest.mark.parametrize("name", SLIDING_MODELS)
def test_sliding_logits_and_grads_match_eager(name, trace):
    """Prompt of 30 tokens, window 8: logits and parameter gradients of "flashcore" (float32) are
    within twice float32 eager's own error of float64 eager (plus 1e-6), and equal float64 sdpa
    in float64."""
    ids = ids_for(2, 30)
    m64, m32 = build_sliding(name), build_sliding(name, dtype=torch.float32)
    hi, hi_g = logits_grad(m64, "eager", ids)
    m64.config.sliding_window = 10_000  # the same weights without the window (eager reads masks)
    no_window, _ = logits_grad(m64, "eager", ids)
    m64.config.sliding_window = W
    assert (hi - no_window).abs().max() > WINDOW_CUTS
    lp, lp_g = logits_grad(m32, "eager", ids)
    out, out_g = logits_grad(m32, "flashcore", ids)
    within(out, lp, hi, atol=1e-6)
    within(out_g, lp_g, hi_g, atol=1e-6)
    assert trace.check() == sliding_layers(m32)
    sd, sd_g = logits_grad(m64, "sdpa", ids)
    out64, out64_g = logits_grad(m64, "flashcore", ids)
    torch.testing.assert_close(out64, sd, **FP64)
    torch.testing.assert_close(out64_g, sd_g, **FP64)
    assert trace.check() == 2 * sliding_layers(m32)  # forward band calls, none for the others


@pytest.mark.parametrize("name", SLIDING_MODELS)
def test_sliding_padded_batch(name, trace):
    """Left padding (30, 21, 9 tokens; window 8): the sliding layers get transformers' mask (padding
    and window), the logits of sdpa (float64) on the real tokens, and in float32 within twice
    float32 eager's error. (Float64 eager is no reference here: its float32 softmax turns the
    padded rows' float64-min scores into -inf, NaN, which reaches the next layer's values.)"""
    ids, mask = left_padded(lengths=(30, 21, 9))
    model, m32 = build_sliding(name), build_sliding(name, dtype=torch.float32)
    ref = logits(model, "sdpa", ids, mask)
    out = logits(model, "flashcore", ids, mask)
    keep = mask.bool()
    torch.testing.assert_close(out[keep], ref[keep], **FP64)
    within(logits(m32, "flashcore", ids, mask)[keep], logits(m32, "eager", ids, mask)[keep],
           ref[keep], atol=1e-6)
    assert trace.check() == 0
    assert all(c["mask"] for c in trace.calls if c["window"] is not None)


@pytest.mark.parametrize("name", SLIDING_MODELS)
@pytest.mark.parametrize("cache", ["sliding", "full"])
def test_sliding_chunked_prefill(name, cache, trace):
    """30 tokens fed as 17 + 13 through a cache (the model's own sliding cache, or a full
    DynamicCache whose keys grow past the window): the second chunk's sliding layers run the
    bottom-right band (Sq < Sk), with the logits of one pass."""
    ids = ids_for(2, 30, seed=4)
    model = build_sliding(name)
    ref = logits(model, "sdpa", ids)
    model.set_attn_implementation("flashcore")
    past = DynamicCache(config=model.config) if cache == "sliding" else DynamicCache()
    with torch.no_grad():
        first = model(input_ids=ids[:, :17], past_key_values=past, use_cache=True).logits
        n_first = trace.check()
        second = model(input_ids=ids[:, 17:], past_key_values=past, use_cache=True).logits
    torch.testing.assert_close(torch.cat([first, second], 1), ref, **FP64)
    layers = sliding_layers(model)
    assert n_first == layers and trace.check() == 2 * layers
    chunk = [c for c in trace.calls[-model.config.num_hidden_layers:] if c["band"]]
    assert len(chunk) == layers and all(c["sq"] == 13 and c["sk"] > 13 for c in chunk)


@pytest.mark.parametrize("name", SLIDING_MODELS)
@pytest.mark.parametrize("cache", ["sliding", "full"])
def test_sliding_generate_matches_sdpa(name, cache, trace):
    """Greedy generate(), prompt 20 > window 8, 32 tokens: the same tokens as sdpa. With the
    model's sliding cache decode sees W keys (no mask built); with a full DynamicCache each
    decode step is Sq = 1 over more keys than the window: the band, no mask."""
    ids = ids_for(1, 20, seed=3)
    model = build_sliding(name, dtype=torch.float32)
    kw = {} if cache == "sliding" else dict(past_key_values=DynamicCache())
    ref = generate(model, "sdpa", ids, **({} if cache == "sliding" else
                                          dict(past_key_values=DynamicCache())))
    out = generate(model, "flashcore", ids, **kw)
    assert out.shape == (1, 52) and torch.equal(out, ref)
    layers = sliding_layers(model)
    n = trace.check()
    decode = [c for c in trace.calls if c["sq"] == 1 and c["window"] is not None]
    assert len(decode) == 31 * layers
    assert not any(c["mask"] for c in decode)  # no mask built for any sliding decode step
    if cache == "sliding":
        assert n == layers and all(c["sk"] == W for c in decode)
    else:
        assert n == 32 * layers and all(c["band"] and c["sk"] > W for c in decode)


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_sliding_padded_generate_matches_sdpa(name, trace):
    ids, mask = left_padded(lengths=(20, 11))
    model = build_sliding(name, dtype=torch.float32)
    ref = generate(model, "sdpa", ids, mask, n=16)
    out = generate(model, "flashcore", ids, mask, n=16)
    assert torch.equal(out, ref)
    trace.check()
    # once the window has passed the padding, sliding decode steps need no mask
    decode = [c for c in trace.calls if c["sq"] == 1 and c["window"] is not None]
    assert decode and not decode[-1]["mask"]


def test_gemma2_softcap_matches_eager(trace, monkeypatch):
    """Gemma 2's attention softcap runs in flashcore.attention (softcap=50) on every layer, the
    sliding ones with their band: logits and gradients equal transformers' "eager" (which applies
    the softcap; its "sdpa" ignores it, so the softcap must matter here)."""
    ids = ids_for(2, 30)
    model = build_sliding("gemma2", softcap=True)
    model.config.attn_logit_softcapping = 0.5  # small enough that it bends these scores
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 0.5
    # Gemma 2's eager takes its softmax in float32 even for a float64 model: in float64 here, so
    # that it is the exact reference.
    real_softmax = torch.nn.functional.softmax
    with monkeypatch.context() as m:
        m.setattr(torch.nn.functional, "softmax",
                  lambda x, dim=None, dtype=None, **kw: real_softmax(x, dim=dim, **kw))
        ref, ref_grads = logits_grad(model, "eager", ids)
    assert (logits(model, "sdpa", ids) - ref).abs().max() > 1e-3
    out, grads = logits_grad(model, "flashcore", ids)
    torch.testing.assert_close(out, ref, **FP64)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-8, atol=1e-10)
    assert all(not c["delegated"] and c["variants"] for c in trace.calls)
    assert all(v["softcap"] == 0.5 for c in trace.calls for v in c["variants"])
    assert sum(bool(c["band"]) for c in trace.calls) == sliding_layers(model)


def gpt_oss_config(window=W, layers=2):
    return transformers.GptOssConfig(
        vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=64,
        intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1,
        max_position_embeddings=512, initializer_range=0.1, sliding_window=window,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2))


def test_gpt_oss_sinks_match_eager(trace):
    """gpt-oss's attention sinks (s_aux, a parameter per head) go to flashcore.attention's sinks:
    logits and gradients (the sinks' included) equal transformers' "eager"; unpadded and
    left-padded; greedy tokens equal eager's."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(gpt_oss_config(), attn_implementation="eager",
                                             experts_implementation="eager")  # (float64: no grouped_mm)
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    ids = ids_for(2, 20)
    ref, ref_grads = logits_grad(model, "eager", ids)
    sinks_grad = model.model.layers[0].self_attn.sinks.grad.clone()
    out, grads = logits_grad(model, "flashcore", ids)
    torch.testing.assert_close(out, ref, **FP64)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-8, atol=1e-10)
    assert sinks_grad.abs().max() > 0  # the sinks' own gradient is among those compared
    assert all(not c["delegated"] and c["variants"] and c["variants"][0]["sinks"] is not None
               for c in trace.calls)
    ids, mask = left_padded(lengths=(20, 11))
    torch.testing.assert_close(logits(model, "flashcore", ids, mask)[mask.bool()],
                               logits(model, "eager", ids, mask)[mask.bool()], **FP64)
    assert torch.equal(generate(model.float(), "flashcore", ids, mask, n=8),
                       generate(model, "eager", ids, mask, n=8))


@needs_fake
def test_compile_fullgraph_sliding_band():
    """Mistral (window 8) compiled with fullgraph over 20 tokens: the band op in the graph, the
    logits of eager sdpa."""
    torch._dynamo.reset()
    model = build_sliding("mistral", dtype=torch.float32)
    ids = ids_for(2, 20)
    ref = logits(model, "sdpa", ids)
    model.set_attn_implementation("flashcore")
    cnt = compiled_counter()
    with torch.no_grad():
        out = torch.compile(model, fullgraph=True, backend=cnt)(input_ids=ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    targets = graph_targets(cnt)
    # (before torch 2.14 compiled code keeps transformers' mask: flashcore.sdpa with it)
    ours = ((lambda t: "flashcore.attention_fwd" in t) if fc_hf.DYNAMO_READS_CLOSURES
            else is_fc_sdpa)
    assert sum(ours(t) for t in targets) == model.config.num_hidden_layers
    assert not any("scaled_dot_product" in t for t in targets)
    torch._dynamo.reset()


# ---- GPU: kernels --------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not GPU, reason="no CUDA device: GPU HF tests skipped")
KERNEL_GPU = GPU and torch.cuda.get_device_capability() in ((8, 9), (9, 0))


def same_tokens_or_near_tie(model, tokens, ref_tokens):
    """Greedy tokens equal to sdpa's, or a first divergence where sdpa's own logits nearly tie
    (the two tokens within 5% of the logits' range, plus 0.01)."""
    assert tokens.shape == ref_tokens.shape, f"{tokens.shape[1]} tokens against sdpa's {ref_tokens.shape[1]}"
    if torch.equal(tokens, ref_tokens):
        return
    step = int((tokens != ref_tokens).int().argmax())
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        lg = model(tokens[:, :step]).logits[0, -1].float()
    gap = (lg.max() - lg[tokens[0, step]]).item()
    assert gap < 0.05 * lg.abs().max().item() + 1e-2, (step, gap)


def within(out, ref_lp, ref_hi, atol):
    """|out - ref_hi| no worse than twice the low-precision sdpa's error, plus atol."""
    err = (out.float() - ref_hi).abs().max().item()
    base = (ref_lp.float() - ref_hi).abs().max().item()
    assert err <= 2 * base + atol, (err, base)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,head_dim", [("llama", 128), ("qwen2", 64), ("mistral", 64),
                                           ("gpt2", 64)])
def test_gpu_models(name, head_dim, dtype):
    kw = dict(head_dim=head_dim, heads=8, kv_heads=2, layers=2, sliding_window=256)
    model = build(name, dtype=dtype, device="cuda", **kw)
    hi = build(name, dtype=torch.float32, device="cuda", **kw)
    ids = ids_for(2, 200, device="cuda")
    ref_hi = logits(hi, "sdpa", ids).float()
    ref_lp = logits(model, "sdpa", ids)
    out, rec = logits(model, "flashcore", ids, record=True)
    within(out, ref_lp, ref_hi, atol=2e-2)
    if KERNEL_GPU:  # no silent fallback on the prefill
        assert rec.fc and all(c["why"].startswith("kernel") for c in rec.fc), rec.fc
    # left-padded batch: same logits on the non-padded positions
    pids, pmask = left_padded(device="cuda", lengths=(300, 211, 57))
    keep = pmask.bool()
    p_hi = logits(hi, "sdpa", pids, pmask).float()
    p_lp = logits(model, "sdpa", pids, pmask)
    p_out = logits(model, "flashcore", pids, pmask)
    within(p_out[keep], p_lp[keep], p_hi[keep], atol=2e-2)
    # greedy generation with a KV cache: same tokens, or a divergence at a near-tie
    gids = ids_for(1, 64, seed=3, device="cuda")
    ref_tokens = generate(model, "sdpa", gids)
    with Recorder() as rec:
        tokens = generate(model, "flashcore", gids)
    if KERNEL_GPU:
        decode = [c for c in rec.fc if c["q"][2] == 1]
        assert decode and all(c["why"].startswith("kernel") for c in decode)
    same_tokens_or_near_tie(model, tokens, ref_tokens)


@gpu
@pytest.mark.parametrize("name,head_dim", [("mistral", 64), ("qwen2", 128), ("gemma3", 128)])
def test_gpu_sliding_window_band(name, head_dim):
    """bf16, window 64 over 200 tokens: the sliding layers run flashcore.attention's band (on
    sm90 in the kernel, not as a mask), within twice bf16 sdpa's error of fp32 sdpa; greedy
    generate() over a full DynamicCache (decode steps Sq = 1 past the window) as in
    test_gpu_models."""
    kw = dict(head_dim=head_dim, heads=8, kv_heads=2, window=64)
    model = build_sliding(name, dtype=torch.bfloat16, device="cuda", **kw)
    hi = build_sliding(name, dtype=torch.float32, device="cuda", **kw)
    ids = ids_for(2, 200, device="cuda")
    ref_hi = logits(hi, "sdpa", ids).float()
    hi.config.sliding_window = 10_000
    assert (logits(hi, "sdpa", ids).float() - ref_hi).abs().max() > 1e-2  # the window cuts
    ref_lp = logits(model, "sdpa", ids)
    out, rec = logits(model, "flashcore", ids, record=True)
    within(out, ref_lp, ref_hi, atol=2e-2)
    assert len(rec.band) == sliding_layers(model)
    assert all(c["window"] == (63, 0) and c["bottom_right"] and not c["mask"] for c in rec.band)
    if torch.cuda.get_device_capability() == (9, 0) and flashcore._built_for(head_dim,
                                                                             torch.bfloat16):
        assert all(c["why"] == "kernel sm90" for c in rec.band), rec.band
    gids = ids_for(1, 100, seed=3, device="cuda")
    ref_tokens = generate(model, "sdpa", gids, past_key_values=DynamicCache())
    with Recorder() as rec:
        tokens = generate(model, "flashcore", gids, past_key_values=DynamicCache())
    assert sum(c["q"][2] == 1 for c in rec.band) == 31 * sliding_layers(model)
    same_tokens_or_near_tie(model, tokens, ref_tokens)


@gpu
def test_gpu_gemma2_d256_training():
    """Gemma 2 at its own head dim (256) with its softcap (50) and a 64-token window, bf16, 200
    tokens: logits and every parameter's gradient within twice bf16 eager's error of fp32 eager
    (its "sdpa" ignores the softcap), and on Hopper each layer's backward in the D=256 sm90
    kernel, the sliding layer's with its band."""
    from kernel_trace import launched_kernels
    kw = dict(head_dim=256, heads=8, kv_heads=4, window=64, softcap=True)
    model = build_sliding("gemma2", dtype=torch.bfloat16, device="cuda", **kw)
    hi = build_sliding("gemma2", dtype=torch.float32, device="cuda", **kw)
    ids = ids_for(2, 200, device="cuda")
    ref_hi, g_hi = logits_grad(hi, "eager", ids)
    ref_lp, g_lp = logits_grad(model, "eager", ids)
    got = {}
    names = [n for n, _ in launched_kernels(lambda: got.update(r=logits_grad(model, "flashcore", ids)))]
    out, g = got["r"]
    within(out, ref_lp, ref_hi.float(), atol=2e-2)
    within(g, g_lp, g_hi.float(), atol=1e-2 * g_hi.abs().max().item())
    if torch.cuda.get_device_capability() == (9, 0) and flashcore._built_for(256, torch.bfloat16):
        assert sum("bwd_kernel_d256" in n for n in names) == model.config.num_hidden_layers, names


@gpu
@needs_fake
def test_gpu_compile_llama():
    torch._dynamo.reset()
    kw = dict(head_dim=128, heads=8, kv_heads=2, layers=2)
    model = build("llama", dtype=torch.bfloat16, device="cuda", **kw)
    hi = build("llama", dtype=torch.float32, device="cuda", **kw)
    ids = ids_for(2, 256, device="cuda")
    ref_hi = logits(hi, "sdpa", ids).float()
    ref_lp = logits(model, "sdpa", ids)
    model.set_attn_implementation("flashcore")
    with torch.no_grad():
        out = torch.compile(model, fullgraph=True)(input_ids=ids).logits
    within(out, ref_lp, ref_hi, atol=2e-2)
    torch._dynamo.reset()


# ---- packed sequences (padding-free training): the tagged mask and flashcore.varlen_attn ----------

from transformers.masking_utils import (and_masks, or_masks,  # noqa: E402
                                        packed_sequence_mask_function)

PACKED_DOCS = [(5, 1, 9, 7), (3, 19)]  # per batch row: document lengths (22 tokens each)


def packed_position_ids(rows=PACKED_DOCS):
    return torch.tensor([[p for n in docs for p in range(n)] for docs in rows])


def packed_document_ids(rows=PACKED_DOCS):
    return torch.tensor([[i for i, n in enumerate(docs) for _ in range(n)] for docs in rows])


def packed_kw(ids, **over):
    b, t = ids.shape
    kw = dict(batch_size=b, q_length=t, kv_length=t, allow_is_causal_skip=False,  # (as transformers)
              mask_function=and_masks(causal_mask_function, packed_sequence_mask_function(ids)))
    kw.update(over)
    return kw


def test_packed_mask_is_transformers_mask_tagged_with_the_documents():
    ids = packed_document_ids()
    kw = packed_kw(ids)
    out = fc_hf.flashcore_mask(**kw)
    assert torch.equal(out, sdpa_mask(**kw))
    docs = getattr(out, fc_hf._TAG)
    # rows flattened: row 0's documents, then row 1's (22 tokens a row)
    assert docs.cu_seq.tolist() == [0, 5, 6, 15, 22, 25, 44] and docs.max_len == 19
    assert docs.cu_seq.dtype == torch.int32 and (docs.batch, docs.length) == (2, 22)


@pytest.mark.parametrize("change", ["padding", "offset", "window", "or_mask", "and_order",
                                    "float_ids", "kv_longer"])
def test_packed_mask_other_forms_are_not_tagged(change):
    """Only transformers' packed causal mask with no padding, no cache offset and no window gets the
    tag; anything else is sdpa_mask's answer, untagged."""
    ids = packed_document_ids()
    wide = packed_document_ids([(5, 1, 9, 10), (3, 22)])  # 25 tokens: room for an offset of 3
    fn = and_masks(causal_mask_function, packed_sequence_mask_function(ids))
    kw = {
        "padding": packed_kw(ids, attention_mask=torch.ones(2, 22, dtype=torch.long)),
        "offset": packed_kw(wide, q_length=22, kv_length=22, q_offset=3, kv_offset=3),
        "window": packed_kw(ids, local_size=4),
        "or_mask": packed_kw(ids, mask_function=or_masks(fn, causal_mask_function)),
        "and_order": packed_kw(ids, mask_function=and_masks(packed_sequence_mask_function(ids),
                                                            causal_mask_function)),
        "float_ids": packed_kw(ids, mask_function=and_masks(
            causal_mask_function, packed_sequence_mask_function(ids.double()))),
        "kv_longer": packed_kw(wide, q_length=22, kv_length=25),
    }[change]
    out = fc_hf.flashcore_mask(**kw)
    assert out is None or not hasattr(out, fc_hf._TAG)


def packed_logits_grad(model, impl, position_ids, ids, seed=7):
    model.set_attn_implementation(impl)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits
    g = torch.Generator().manual_seed(seed)
    (out * torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device, out.dtype)).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return out.detach(), grads.detach()


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_packed_batch_runs_varlen_and_matches_eager(name, monkeypatch):
    """Two rows of packed documents (position_ids restarting, no attention mask, no cache: how
    transformers trains padding-free): every layer's
    attention goes through flashcore.varlen_attn with the documents' offsets, and the logits and
    parameter gradients equal sdpa's (float64; eager's within its float32 softmax); a document's
    logits equal the same document run alone (no attention across documents)."""
    calls = []
    real = flashcore.varlen_attn

    def spy(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
        calls.append((cu_q.tolist(), max_q, kw["window_size"]))
        return real(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    monkeypatch.setattr(flashcore, "varlen_attn", spy)
    model = build(name, dtype=torch.float64)
    pos, ids = packed_position_ids(), ids_for(2, 22, seed=4)
    ref, ref_g = packed_logits_grad(model, "eager", pos, ids)
    sd, sd_g = packed_logits_grad(model, "sdpa", pos, ids)
    calls.clear()
    out, out_g = packed_logits_grad(model, "flashcore", pos, ids)
    assert calls == [([0, 5, 6, 15, 22, 25, 44], 19, (-1, 0))] * model.config.num_hidden_layers
    torch.testing.assert_close(out, sd, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out_g, sd_g, rtol=1e-9, atol=1e-9)
    # eager's softmax runs in float32 whatever the model's dtype: no farther from it than sdpa
    for got, want, yardstick in ((out, ref, sd), (out_g, ref_g, sd_g)):
        assert (got - want).abs().max() <= 1.01 * (yardstick - want).abs().max() + 1e-12
    alone = logits(model, "flashcore", ids[1:, 3:])  # row 1's second document by itself
    torch.testing.assert_close(out[1:, 3:], alone, rtol=1e-9, atol=1e-9)


def test_packed_mask_without_tag_is_used_as_a_mask(monkeypatch):
    """A model whose mask lost the tag (sliced, rebuilt) gets the mask's result: same logits."""
    model = build("llama", dtype=torch.float64)
    pos, ids = packed_position_ids(), ids_for(2, 22, seed=4)
    tagged = logits(model, "flashcore", ids)
    real_builder = fc_hf.flashcore_mask

    def untagged(*args, **kwargs):
        mask = real_builder(*args, **kwargs)
        return None if mask is None else mask.clone()  # (a clone carries no Python attributes)

    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "flashcore", untagged)
    model.set_attn_implementation("flashcore")
    with torch.no_grad():
        out_untagged = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "flashcore", real_builder)
    with torch.no_grad():
        out_tagged = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(out_untagged, out_tagged, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(out_tagged, tagged)  # (the documents did change the logits)


@gpu
def test_gpu_packed_batch_bf16(monkeypatch):
    """On the GPU, bf16, D=128 (the Hopper packed forward for inference; training calls go to
    PyTorch's varlen_attn): logits and gradients of a packed batch within twice bf16 sdpa's error
    of float32 sdpa, every layer through flashcore.varlen_attn."""
    calls = []
    real = flashcore.varlen_attn
    monkeypatch.setattr(flashcore, "varlen_attn",
                        lambda *a, **kw: calls.append(a[3].shape) or real(*a, **kw))
    kw = dict(head_dim=128, heads=8, kv_heads=2, layers=2)
    rows = [(300, 1, 77, 134), (512,)]
    pos = packed_position_ids(rows).cuda()
    ids = ids_for(2, 512, seed=5, device="cuda")
    hi = build("llama", dtype=torch.float32, device="cuda", **kw)
    lp = build("llama", dtype=torch.bfloat16, device="cuda", **kw)
    ref_hi, ref_hi_g = packed_logits_grad(hi, "sdpa", pos, ids)
    ref_lp, ref_lp_g = packed_logits_grad(lp, "sdpa", pos, ids)
    calls.clear()
    out, out_g = packed_logits_grad(lp, "flashcore", pos, ids)
    assert len(calls) == 2
    within(out, ref_lp, ref_hi, atol=2e-2)
    within(out_g, ref_lp_g, ref_hi_g, atol=2e-2)
    with torch.no_grad():  # inference: the fused packed forward on Hopper
        lp.set_attn_implementation("flashcore")
        calls.clear()
        inf = lp(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert len(calls) == 2
    within(inf, ref_lp, ref_hi, atol=2e-2)


# ---- "paged|flashcore": continuous batching --------------------------------------------------------

def _cb_tokens(model, impl, inputs, n=8, **cb_options):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    model.set_attn_implementation(impl)
    gc = GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=256, **cb_options)
    if model.device.type == "cpu":  # (on a machine with CUDA, the defaults would capture graphs
        for name in ("use_cuda_graph", "use_async_batching"):  # and open streams for a CPU model)
            if hasattr(cb, name):
                setattr(cb, name, False)
    out = model.generate_batch(inputs=inputs, generation_config=gc, continuous_batching_config=cb)
    return {k: v.generated_tokens for k, v in out.items()}


@pytest.fixture
def cb_on_cpu(monkeypatch):
    """Continuous batching sizes its cache from the device's free memory, none on the CPU: give it
    1 GiB (the GPU test does without)."""
    from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler
    if not GPU:
        monkeypatch.setattr(PagedAttentionMemoryHandler, "get_available_memory", lambda self: 1 << 30)


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("impl", ["flashcore", "paged|flashcore"])
def test_continuous_batching_matches_paged_sdpa(name, impl, cb_on_cpu, monkeypatch):
    """generate_batch over requests of 5, 17 and 9 prompt tokens (Mistral's window of 12 cuts):
    "flashcore" (switched to "paged|flashcore" by transformers) and "paged|flashcore" generate
    paged|sdpa's greedy tokens, every attention call through flashcore.varlen_attn."""
    calls = []
    real = flashcore.varlen_attn
    monkeypatch.setattr(flashcore, "varlen_attn", lambda *a, **kw: calls.append(kw["window_size"]) or real(*a, **kw))
    model = build(name)
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 9)]
    ref = _cb_tokens(model, "paged|sdpa", inputs)
    assert not calls
    got = _cb_tokens(model, impl, inputs)
    assert got == ref
    assert calls and len(calls) % model.config.num_hidden_layers == 0
    window = getattr(model.config, "sliding_window", None)
    assert set(calls) == {(window - 1, 0) if window else (-1, 0)}


def test_paged_function_needs_the_cache():
    q = torch.zeros(1, 4, 3, 16)
    with pytest.raises(ValueError, match="paged attention cache"):
        fc_hf.flashcore_paged_attention_forward(torch.nn.Module(), q, q, q, None)


@gpu
@pytest.mark.parametrize("graphs", [None, True], ids=["default", "cuda-graphs"])
def test_gpu_continuous_batching_bf16(graphs, monkeypatch):
    """On the GPU (bf16, D=128, GQA 8:2): "paged|flashcore" generates "paged|sdpa"'s greedy tokens
    for each request, or diverges first where sdpa's own logits nearly tie; its decode steps run
    in PyTorch's varlen_attn (_paged_goes_to_torch). By default (the integration's: no CUDA
    graphs) the fresh-prefill steps run FlashCore's packed kernel; with graphs asked for, the
    captured steps read no offset (causal ones run PyTorch's varlen_attn)."""
    from flashcore import varlen as fc_varlen
    calls = []
    real, real_torch = flashcore.varlen_attn, fc_varlen._torch_varlen
    monkeypatch.setattr(flashcore, "varlen_attn", lambda *a, **kw: calls.append("flashcore") or real(*a, **kw))
    monkeypatch.setattr(fc_varlen, "_torch_varlen", lambda *a: calls.append("torch") or real_torch(*a))
    model = build("llama", dtype=torch.bfloat16, device="cuda", head_dim=128, heads=8, kv_heads=2)
    g = torch.Generator().manual_seed(6)
    inputs = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (40, 300, 129, 1)]
    ref = _cb_tokens(model, "paged|sdpa", inputs, n=32)
    options = {} if graphs is None else {"use_cuda_graph": graphs}
    got = _cb_tokens(model, "paged|flashcore", inputs, n=32, **options)
    assert "torch" in calls  # the decode steps (FlashCore would loop over the requests)
    assert sorted(got) == sorted(ref) and all(len(got[r]) == 32 for r in got)
    for rid, prompt in zip(sorted(ref), inputs):
        if got[rid] != ref[rid]:
            prompt_t = torch.tensor([prompt], device="cuda")
            same_tokens_or_near_tie(model, torch.cat([prompt_t, torch.tensor([got[rid]], device="cuda")], 1),
                                    torch.cat([prompt_t, torch.tensor([ref[rid]], device="cuda")], 1))


def test_paged_steps_flashcore_would_loop_go_to_torch(monkeypatch):
    """_paged_goes_to_torch's rule, on CPU tensors posing as CUDA ones (the decision only): a
    prefill step of fresh requests (queries = keys each) stays on FlashCore's packed kernel; a
    decode step (one query against many keys) or a chunked prefill, which FlashCore would loop
    over, goes to PyTorch's varlen_attn; never where PyTorch's function does not take the call
    or a family is forced."""
    from flashcore import varlen as fc_varlen
    monkeypatch.setattr(fc_varlen, "_varlen_fwd_declines", lambda *a: None)  # (as on Hopper)
    monkeypatch.setattr(fc_varlen, "_torch_takes", lambda *a: True)
    monkeypatch.delenv("FLASHCORE_FAMILY", raising=False)
    monkeypatch.setattr(fc_varlen, "_capturing", lambda query: False)  # (this machine may have no CUDA)

    class Cuda(torch.Tensor):  # is_cuda as the rule reads it; everything else a CPU tensor
        @property
        def is_cuda(self):
            return True

    def decide(q_lens, k_lens):
        q = torch.zeros(sum(q_lens), 4, 16).as_subclass(Cuda)
        k = torch.zeros(sum(k_lens), 2, 16)
        cu = [torch.tensor([0] + torch.tensor(x).cumsum(0).tolist(), dtype=torch.int32) for x in (q_lens, k_lens)]
        return fc_hf._paged_goes_to_torch(q, k, k, *cu, max(q_lens), max(k_lens), 0.25, (-1, 0))

    assert not decide([5, 17, 9], [5, 17, 9])  # prefill of new requests: the packed kernel
    assert decide([1, 1, 1], [6, 18, 10])  # decode
    assert decide([4, 1], [20, 7])  # chunked prefill beside a decode
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm90")
    assert not decide([1, 1, 1], [6, 18, 10])
    monkeypatch.delenv("FLASHCORE_FAMILY")
    monkeypatch.setattr(fc_varlen, "_torch_takes", lambda *a: False)
    assert not decide([1, 1, 1], [6, 18, 10])
    # Captured in a CUDA graph (transformers' default on a GPU): the offsets cannot be read, so
    # even a prefill of new requests goes to PyTorch's function (causal is exact in the packed
    # kernel only where queries = keys, which nothing then shows).
    monkeypatch.setattr(fc_varlen, "_torch_takes", lambda *a: True)
    monkeypatch.setattr(fc_varlen, "_capturing", lambda query: True)
    assert decide([5, 17, 9], [5, 17, 9])
    assert decide([1, 1, 1], [6, 18, 10])


def test_imports_without_the_compiled_library(tmp_path):
    """A CPU-only install (no compiled library) imports the integration (nothing in it needs the
    op library at import), registers both names, and the paged route's rule answers without it."""
    import shutil
    import subprocess
    package = os.path.dirname(flashcore.__file__)
    shutil.copytree(package, tmp_path / "flashcore",
                    ignore=shutil.ignore_patterns("*.so", "_build_config.py", "__pycache__"))
    code = """
import torch, flashcore
import flashcore.integrations.hf as fc_hf
from transformers import AttentionInterface
assert flashcore.FALLBACK_ONLY
assert "flashcore" in AttentionInterface._global_mapping and "paged|flashcore" in AttentionInterface._global_mapping
q = torch.randn(6, 4, 8)
k = torch.randn(6, 2, 8)
cu = torch.tensor([0, 2, 6], dtype=torch.int32)
assert not fc_hf._paged_goes_to_torch(q, k, k, cu, cu, 4, 4, 0.3, (-1, 0))
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_given_offsets_attend_within_documents(name, monkeypatch):
    """cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k passed outright (no
    position_ids, so transformers builds no packed mask): "flashcore" attends within the documents
    they mark, as transformers' flash implementations do: each document's logits equal the
    document run alone (RoPE scores depend only on relative positions, up to its float32 tables)."""
    calls = []
    real = flashcore.varlen_attn
    monkeypatch.setattr(flashcore, "varlen_attn", lambda *a, **kw: calls.append(a[3].tolist()) or real(*a, **kw))
    model = build(name, dtype=torch.float64)
    lengths = [7, 1, 12]
    ids = ids_for(1, sum(lengths), seed=8)
    cu = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    model.set_attn_implementation("flashcore")
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                    max_length_q=12, max_length_k=12).logits
    assert calls == [[0, 7, 8, 20]] * model.config.num_hidden_layers
    across = logits(model, "flashcore", ids)  # no offsets: one causal sequence
    for a, b in ((0, 7), (7, 8), (8, 20)):
        alone = logits(model, "flashcore", ids[:, a:b])
        # (RoPE's tables are float32: other absolute positions round differently, ~1e-7)
        torch.testing.assert_close(out[:, a:b], alone, rtol=1e-5, atol=1e-5)
        if a:
            assert (across[:, a:b] - alone).abs().max() > 1e-3  # what attending across would give


def test_continuous_batching_without_cuda_graphs_unless_asked(monkeypatch):
    """transformers' default gives CUDA graphs to names holding "flash" (with CUDA available);
    with FlashCore's names the integration leaves them off unless the config asks (measured:
    0.41x "paged|sdpa" with graphs, 4.3x without; docs/experiments/varlen.md). The user's config
    object is not changed; other implementations keep transformers' choice."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import continuous_api
    resolve = continuous_api.resolve_continuous_batching_config
    assert getattr(resolve, "__flashcore_shim__", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (the decision only)

    def graphs(impl, wrapped=resolve, **options):
        cfg = LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                          num_attention_heads=4, num_key_value_heads=2)
        cfg._attn_implementation = impl
        cb = ContinuousBatchingConfig(**options)
        out = wrapped(config=cfg, cb_config=cb, workload_hints=None, has_logit_processors=False)
        assert cb.use_cuda_graph == options.get("use_cuda_graph")
        return tuple(out.use_cuda_graph)

    assert graphs("paged|flashcore", resolve.__wrapped__) == (True, True)  # transformers' own choice
    assert graphs("paged|flashcore") == (False, False)
    assert graphs("flashcore") == (False, False)
    assert graphs("paged|flashcore", use_cuda_graph=True) == (True, True)
    assert graphs("paged|sdpa", use_cuda_graph=True) == (True, True)
