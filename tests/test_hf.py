"""transformers integration: attn_implementation="flashcore" against "sdpa" on real model code.

Tiny random-weight models built from configs (no downloads): Llama (GQA), Qwen2 (GQA, qkv
bias), Mistral (GQA, sliding window), GPT-2 (MHA). On CPU the op falls back to aten's SDPA, so
"flashcore" must reproduce "sdpa" (fp32, tight tolerance): logits, greedy generate() with a KV
cache, a left-padded batch, and the same under torch.compile. The GPU tests (skipped without
CUDA) run bf16/fp16 models with head_dim 64/128, where FlashCore kernels do the work, and
check a kernel ran.

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
    """Records each top-level flashcore.sdpa call (and any other SDPA reaching dispatch)."""

    def __init__(self):
        super().__init__()
        self.fc = []
        self.other_sdpa = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is FC_SDPA:
            q, k, v, *rest = args
            mask = rest[0] if rest else kwargs.get("attn_mask")
            causal = rest[2] if len(rest) > 2 else kwargs.get("is_causal", False)
            self.fc.append(dict(q=tuple(q.shape), k=tuple(k.shape), mask=mask is not None,
                                causal=causal, gqa=kwargs.get("enable_gqa", False),
                                why=flashcore.explain(*args, **kwargs) if q.is_cuda else None))
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
    from transformers.masking_utils import sdpa_mask
    assert fc_hf.flashcore_mask is sdpa_mask
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
    "softcap": dict(softcap=30.0),
    "s_aux": dict(s_aux=torch.zeros(4)),
    "position_bias": dict(position_bias=torch.zeros(1, 4, 10, 10)),
    "dropout": dict(dropout=0.1),
    "sliding_window_cutting": dict(sliding_window=4),
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
    assert sum("flashcore.sdpa" in t for t in targets) >= model.config.num_hidden_layers
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
    assert any("flashcore.sdpa" in t for t in graph_targets(cnt))
    assert cnt.frame_count <= 4  # prefill + decode (+ a recompile), not one per token
    torch._dynamo.reset()


# ---- GPU: kernels --------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not GPU, reason="no CUDA device: GPU HF tests skipped")
KERNEL_GPU = GPU and torch.cuda.get_device_capability() in ((8, 9), (9, 0))


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
    if not torch.equal(tokens, ref_tokens):
        step = int((tokens != ref_tokens).int().argmax())
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            lg = model(tokens[:, :step]).logits[0, -1].float()
        gap = (lg.max() - lg[tokens[0, step]]).item()
        assert gap < 0.05 * lg.abs().max().item() + 1e-2, (step, gap)


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
