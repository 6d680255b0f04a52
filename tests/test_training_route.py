"""CPU tests of the training route and the backward's determinism plumbing
(python/flashcore/_ops.py, torch_op/flashcore_bwd_op.cpp).

A call that records gradients goes either to FlashCore (sdpa_fwd, then sdpa_bwd) or to aten's
differentiable SDPA for both passes, decided once per call from the device's compute capability
and the backward path FlashCore would take (_ops.TRAINING_TABLE). On the CPU there is neither a
CUDA device nor a backward kernel, so these tests fake the two inputs of the decision:
_ops._device_capability (the card) and _ops._EXPLAIN_BWD (what flashcore::explain_bwd answers for
the call), and check

  * the table's decision for each (cc, backward path), a head-dim entry, an edited entry, and
    that the call then really runs where the decision says (aten's autograd node or FlashCore's);
  * FLASHCORE_TRAINING=flashcore / aten / auto (read at each call), a bad value, and a forced
    FLASHCORE_FAMILY keeping training calls on FlashCore;
  * the stand-ins explain_bwd gets before the forward exists (sizes, strides, dtypes, alignment,
    no memory), the flags it gets (deterministic included), and the per-layout cache;
  * flashcore.explain_training's and flashcore.explain_backward's strings;
  * the ops' schemas: explain_bwd / sdpa_bwd_kernel take `deterministic`, explain_bwd returns
    (family, reason) from the C++ kernel and from its fake (explain's order);
  * torch.compile(fullgraph=True, dynamic=True) of a training step on fake tensors: the route is
    decided while tracing (stand-ins are real tensors, not graph nodes), no graph break, one graph
    for several lengths, and the graph holds aten's SDPA or FlashCore's ops as the route says.

A GPU section at the end (skipped without CUDA) checks the stand-ins' answer against explain_bwd
on a real forward's out and lse.
"""
import importlib.util
import inspect
import os
import sys

import pytest
import torch
import torch.nn.functional as F

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402
from flashcore import _ops  # noqa: E402
from attention_block import Attention as _AttentionBlock, compiled_matches_eager  # noqa: E402
from sdpa_layout import has_sdpa_layout  # noqa: E402

EXPLAIN_BWD = torch.ops.flashcore.explain_bwd.default
BWD_KERNEL = torch.ops.flashcore.sdpa_bwd_kernel.default
CPU_FORWARD = "fallback: a tensor is not on a CUDA device"  # explain() of any CPU call

SM80, SM90 = 1, 2  # fc_family values explain_bwd reports


@pytest.fixture(autouse=True)
def _clean_state(monkeypatch):
    """Every test starts from an empty route cache, the default environment and determinism off."""
    monkeypatch.delenv("FLASHCORE_TRAINING", raising=False)
    monkeypatch.delenv("FLASHCORE_FAMILY", raising=False)
    _ops._ROUTES.clear()
    was = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(was)
    _ops._ROUTES.clear()


class FakeCard:
    """Pretend the CPU is a card of compute capability `cc` on which explain_bwd answers
    `answer(deterministic) -> (family, reason)`; records explain_bwd's arguments."""

    def __init__(self, monkeypatch, cc, answer):
        self.calls = []
        self.answer = answer
        monkeypatch.setattr(_ops, "_device_capability", lambda device: cc)
        monkeypatch.setattr(_ops, "_EXPLAIN_BWD", self)
        _ops._ROUTES.clear()  # routes decided for the card before (a real card never changes)

    def __call__(self, grad_out, query, key, value, out, lse, grad_lse, is_causal, scale,
                 enable_gqa, deterministic=False, attn_mask=None):
        self.calls.append(dict(grad_out=grad_out, query=query, key=key, value=value, out=out,
                               lse=lse, grad_lse=grad_lse, is_causal=is_causal, scale=scale,
                               enable_gqa=enable_gqa, deterministic=deterministic,
                               attn_mask=attn_mask))
        return self.answer(deterministic)


def kernel(family):
    """explain_bwd's answer when a kernel of `family` runs (whatever determinism asks)."""
    return lambda deterministic: (family, 0)


def sm90_unless_deterministic(deterministic):
    """The C layer's AUTO on an H100 with both families built: sm80-class when determinism is on."""
    return (SM80 if deterministic else SM90, 0)


def fc_status(prefix):
    """The fc_status whose message (fc_status_string, c_src/flashcore.c) starts with `prefix`."""
    for status in range(64):
        if flashcore._status_string(status).startswith(prefix):
            return status
    raise AssertionError(f"no fc_status message starts with {prefix!r}")


HEAD_DIM = fc_status("no kernel for this head_dim")  # FC_UNSUPPORTED_HEAD_DIM
ARCH = fc_status("no FlashCore kernel for this GPU architecture")  # FC_UNSUPPORTED_ARCH


def no_kernel(status):
    """explain_bwd's answer when no kernel covers the call (100 + an fc_status)."""
    return lambda deterministic: (0, 100 + status)


def inputs(B=2, Hq=4, Hkv=4, Sq=9, Sk=2048, D=128, dtype=torch.float32, requires_grad=True,
           seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def ran_on_aten(out) -> bool:
    """Whether a training call's output came from aten's SDPA rather than flashcore::sdpa_fwd,
    by its autograd node: FlashCore's is _ops._SdpaTraining's (sdpa_fwd and sdpa_bwd below it);
    aten's is its CPU flash-attention kernel's (ScaledDotProductFlashAttentionForCpuBackward),
    or its math path's last op with dropout."""
    assert out.grad_fn is not None
    return type(out.grad_fn).__name__ != "_SdpaTrainingBackward"


def grads_match_aten(q, k, v, **kw):
    """A training call through flashcore.sdpa gives aten's output and gradients (either route)."""
    out = flashcore.sdpa(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(out, ref)
    assert has_sdpa_layout(out, q)
    return out


# ---- the table ---------------------------------------------------------------------------------

TABLE_CASES = {  # name: (cc, explain_bwd's answer, deterministic, to_aten, path)
    "h100_sm90": ((9, 0), kernel(SM90), False, False, "sm90"),
    "h100_sm80": ((9, 0), kernel(SM80), False, True, "sm80"),
    "h100_deterministic": ((9, 0), sm90_unless_deterministic, True, True, "sm80"),
    "h100_not_deterministic": ((9, 0), sm90_unless_deterministic, False, False, "sm90"),
    "h100_python_head_dim": ((9, 0), no_kernel(HEAD_DIM), False, True, "python"),
    # Ada's kernels measured slower than PyTorch's FA2 pair (on an H200, TRAINING_TABLE).
    "ada_sm80": ((8, 9), kernel(SM80), False, True, "sm80"),
    # The Python backward goes to aten on every card (TRAINING_TABLE's (None, "python") entry).
    "ada_python": ((8, 9), no_kernel(HEAD_DIM), False, True, "python"),
    "a100_python": ((8, 0), no_kernel(ARCH), False, True, "python"),
}


@pytest.mark.parametrize("name", list(TABLE_CASES))
def test_table_decision_and_where_the_call_runs(name, monkeypatch):
    cc, answer, deterministic, to_aten, path = TABLE_CASES[name]
    card = FakeCard(monkeypatch, cc, answer)
    torch.use_deterministic_algorithms(deterministic)
    q, k, v = inputs()  # D=128 (D=64 has an entry of its own on the H100)
    route = _ops.training_route(q, k, v, None, False, None, False)
    assert (route.to_aten, route.path) == (to_aten, path)
    assert card.calls and card.calls[-1]["deterministic"] is deterministic
    out = grads_match_aten(q, k, v)
    assert ran_on_aten(out) is to_aten


def test_h100_short_d128_calls_go_to_aten(monkeypatch):
    """Today's table: the sm90 backward takes D=128 training calls of at least 2048 keys; below,
    fwd + bwd measured slower than cuDNN's (the entry's third element)."""
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    assert not _ops.training_route(*inputs(Sk=2048), None, False, None, False).to_aten
    route = _ops.training_route(*inputs(Sk=2047), None, False, None, False)
    assert (route.to_aten, route.path) == (True, "sm90") and "2048 keys" in route.note
    out = flashcore.sdpa(*inputs(Sk=1000))
    assert ran_on_aten(out)


def test_h100_d64_calls_from_1024_keys(monkeypatch):
    """Today's table: on the H100 the sm90 backward takes D=64 training calls from 1024 keys (the
    ((9, 0), "sm90", 64) entry, which wins over the head-dim-free one's 2048)."""
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    assert not _ops.training_route(*inputs(D=64, Sk=1024), None, False, None, False).to_aten
    route = _ops.training_route(*inputs(D=64, Sk=1023), None, False, None, False)
    assert (route.to_aten, route.path) == (True, "sm90") and "1024 keys" in route.note


def test_table_policy():
    """Today's H100 policy (update together with TRAINING_TABLE and docs/experiments/): the sm90
    backward on FlashCore, the sm80-class and Python backwards on aten, each with its reason."""
    assert _ops.TRAINING_TABLE[((9, 0), "sm90")][0] is True
    assert _ops.TRAINING_TABLE[((9, 0), "sm80")][0] is False
    assert "docs/experiments/backward.md" in _ops.TRAINING_TABLE[((9, 0), "sm80")][1]
    assert _ops.TRAINING_TABLE[((9, 0), "python")][0] is False


def test_sm80_only_head_dims_have_their_own_entries():
    """D=32/80/96 (the sm80-class backward alone, measured on the H200): PyTorch's on Hopper,
    each entry saying its own numbers; masked calls too (HuggingFace's padding mask, D=80/96)."""
    for D in (32, 80, 96):
        entry = _ops.training_table_entry((9, 0), "sm80", D)
        assert entry is _ops.TRAINING_TABLE[((9, 0), "sm80", D)] and entry[0] is False
        assert f"D={D}" in entry[1] and "docs/experiments/backward.md" in entry[1]
    for D in (80, 96):
        entry = _ops.training_table_entry((9, 0), "sm80-masked", D)
        assert entry is _ops.TRAINING_TABLE[((9, 0), "sm80-masked", D)] and entry[0] is False
    # other head dims keep the path's entry
    assert _ops.training_table_entry((9, 0), "sm80", 64) is _ops.TRAINING_TABLE[((9, 0), "sm80")]
    assert _ops.training_table_entry((9, 0), "sm80-masked", 64) is _ops.TRAINING_TABLE[(None, "sm80-masked")]


def test_d256_masked_route_by_length(monkeypatch):
    """D=256 with a bool padding mask (both passes in the sm90 family) takes the masked family
    entry, as D=64/128 do (measured 1.05-1.94x PyTorch's step at 512 keys, 1.02-3.85x at
    1024-4096): FlashCore's pair from its length, PyTorch below, saying why; additive masks
    keep their own D=256 entry (the other head dims' stay on PyTorch)."""
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    entry = _ops.training_table_entry((9, 0), "sm90-masked", 256)
    assert entry is _ops.TRAINING_TABLE[((9, 0), "sm90-masked")] and entry[:2] == (True, "")
    fewest = entry[2]
    for keys, takes in ((4096, True), (fewest, True), (fewest - 1, False)):
        q, k, v = inputs(Sq=3, Sk=keys, D=256)
        mask = torch.ones(2, 1, 1, keys, dtype=torch.bool)
        route = _ops.training_route(q, k, v, mask, False, None, False)
        assert (route.to_aten, route.path) == (not takes, "sm90-masked"), keys
        assert takes or f"fewer than {fewest} keys" in route.note
    entry = _ops.training_table_entry((9, 0), "sm90-masked-additive", 256)
    assert entry is _ops.TRAINING_TABLE[((9, 0), "sm90-masked-additive", 256)] and entry[0] is True
    assert _ops.training_table_entry((9, 0), "sm90-masked-additive", 128)[0] is False


def test_d256_unmasked_route_by_length(monkeypatch):
    """D=256 without a mask takes its own entry: FlashCore's pair from its fewest keys (4096 when
    written: causal steps at 2048 keys measured 0.99x PyTorch's), PyTorch below, saying why; the
    entry is D=256's alone (D=128 keeps the sm90 entry)."""
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    entry = _ops.TRAINING_TABLE[((9, 0), "sm90", 256)]
    assert _ops.training_table_entry((9, 0), "sm90", 256) is entry and entry[0] is True
    assert _ops.training_table_entry((9, 0), "sm90", 128) is _ops.TRAINING_TABLE[((9, 0), "sm90")]
    fewest = entry[2]
    for keys, takes in ((2 * fewest, True), (fewest, True), (fewest - 1, False)):
        for causal in (False, True):
            route = _ops.training_route(*inputs(Sq=3, Sk=keys, D=256), None, causal, None, False)
            assert (route.to_aten, route.path) == (not takes, "sm90"), (keys, causal)
            assert takes or f"fewer than {fewest} keys" in route.note


def test_unlisted_device_keeps_flashcore_and_says_so(monkeypatch):
    FakeCard(monkeypatch, (12, 0), kernel(SM80))  # a card the table does not list
    route = _ops.training_route(*inputs(), None, False, None, False)
    assert not route.to_aten
    assert route.note == ("no measurement on compute capability 12.0: FlashCore's own backward, "
                          "as before")


def test_mask_asks_explain_bwd_and_has_its_own_entry(monkeypatch):
    """A mask: explain_bwd is asked with a stand-in of it (the sm90 kernel takes masks), and the
    route reads the "sm90-masked" entry; a mask that requires grad: the Python backward (only it
    gives the mask a gradient), without asking."""
    card = FakeCard(monkeypatch, (9, 0), kernel(SM90))
    entry = _ops.TRAINING_TABLE[((9, 0), "sm90-masked")]
    fewest = entry[2] if len(entry) > 2 else 1
    for keys in (fewest, max(fewest // 2, 1)):
        q, k, v = inputs(Sk=keys)
        mask = torch.rand(2, 1, 9, keys) > 0.3
        mask[..., 0] = True
        route = _ops.training_route(q, k, v, mask, False, None, False)
        takes = entry[0] and keys >= fewest
        assert (route.to_aten, route.path, route.reason, route.family) == (
            not takes, "sm90-masked", 0, SM90)
        seen = card.calls[-1]["attn_mask"]
        assert (seen.shape, seen.stride(), seen.dtype) == (mask.shape, mask.stride(), mask.dtype)
        out = flashcore.sdpa(q, k, v, mask)
        assert ran_on_aten(out) == (not takes)
    assert len(card.calls) == 2
    q, k, v = inputs(Sk=max(fewest, 2048))
    # A bool mask broadcast over the query rows (a key-padding mask, or a row expanded over
    # them) reads the bool entry; an additive mask its own, whatever the length.
    keys = k.shape[2]
    for mask, path in ((torch.ones(2, 1, 1, keys, dtype=torch.bool), "sm90-masked"),
                       (torch.ones(2, 1, 1, keys, dtype=torch.bool).expand(2, 1, 9, keys), "sm90-masked"),
                       (torch.zeros(2, 1, 9, keys), "sm90-masked-additive")):
        route = _ops.training_route(q, k, v, mask, False, None, False)
        entry = _ops.TRAINING_TABLE[((9, 0), path)]
        assert (route.to_aten, route.path, route.family) == (not entry[0], path, SM90), mask.shape
        assert ran_on_aten(flashcore.sdpa(q, k, v, mask)) == (not entry[0])
    q, k, v = inputs()

    additive = torch.zeros(2, 1, 9, 2048, requires_grad=True)
    route = _ops.training_route(q, k, v, additive, False, None, False)
    assert (route.to_aten, route.path, route.reason) == (True, "python", 12)
    assert len(card.calls) == 5  # not asked: the kernels give a mask no gradient


def test_sm80_family_mask_has_its_own_entry(monkeypatch):
    """A mask the sm80-class backward takes (Ada, or the H100 under deterministic algorithms):
    the "sm80-masked" path, whose entry sends it to aten on every card until it is measured
    there (calls that took the Python backward's entry before that kernel existed keep aten);
    FLASHCORE_TRAINING=flashcore runs FlashCore's pair."""
    FakeCard(monkeypatch, (8, 9), kernel(SM80))
    q, k, v = inputs()
    entry = _ops.training_table_entry((8, 9), "sm80-masked", 128)
    assert entry is _ops.TRAINING_TABLE[(None, "sm80-masked")] and entry[0] is False
    keys = k.shape[2]
    bool_mask = torch.rand(2, 1, 9, keys) > 0.3
    bool_mask[..., 0] = True
    for mask in (bool_mask, torch.zeros(2, 1, 9, keys)):
        route = _ops.training_route(q, k, v, mask, False, None, False)
        assert (route.to_aten, route.path, route.family, route.note) == (True, "sm80-masked", SM80, entry[1])
        assert ran_on_aten(flashcore.sdpa(q, k, v, mask))
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    assert not ran_on_aten(flashcore.sdpa(q, k, v, mask))


def test_cpu_goes_to_aten(monkeypatch):
    """No CUDA device: no kernel, so the Python backward's entry of the table applies (an unfused
    fp32 recomputation, several times slower than aten's CPU backward): both passes in aten,
    without asking explain_bwd. FLASHCORE_TRAINING=flashcore still runs FlashCore's pair there
    (the CPU tests of its plumbing do)."""
    q, k, v = inputs()
    route = _ops.training_route(q, k, v, None, False, None, False)
    assert (route.to_aten, route.path, route.reason) == (True, "python", 1)
    assert route.note == _ops.TRAINING_TABLE[(None, "python")][1]
    assert ran_on_aten(grads_match_aten(q, k, v))
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    assert not ran_on_aten(grads_match_aten(q, k, v))


def test_head_dim_entry_wins_over_the_family_entry(monkeypatch):
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    monkeypatch.setitem(_ops.TRAINING_TABLE, ((9, 0), "sm90", 64), (False, "D=64 measured slower"))
    route64 = _ops.training_route(*inputs(D=64), None, False, None, False)
    route128 = _ops.training_route(*inputs(D=128), None, False, None, False)
    assert route64.to_aten and route64.note == "D=64 measured slower"
    assert not route128.to_aten


def test_an_edited_entry_changes_the_route(monkeypatch):
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    monkeypatch.setitem(_ops.TRAINING_TABLE, ((9, 0), "sm90"), (False, "measured slower"))
    q, k, v = inputs()
    assert ran_on_aten(grads_match_aten(q, k, v))


def test_dropout_goes_to_aten_whatever_the_table(monkeypatch):
    FakeCard(monkeypatch, (9, 0), kernel(SM90))
    q, k, v = inputs()
    assert ran_on_aten(flashcore.sdpa(q, k, v, dropout_p=0.2))


def test_no_grad_calls_are_not_routed(monkeypatch):
    card = FakeCard(monkeypatch, (9, 0), kernel(SM80))
    q, k, v = inputs(requires_grad=False)
    out = flashcore.sdpa(q, k, v)
    assert out.grad_fn is None and card.calls == []


# ---- FLASHCORE_TRAINING ------------------------------------------------------------------------

@pytest.mark.parametrize("env,answer,to_aten", [
    ("flashcore", kernel(SM80), False),   # the table says aten; forced FlashCore
    ("aten", kernel(SM90), True),         # the table says FlashCore; forced aten
    ("auto", kernel(SM80), True),
    ("auto", kernel(SM90), False),
    ("", kernel(SM80), True),             # empty means auto
])
def test_flashcore_training_overrides(env, answer, to_aten, monkeypatch):
    FakeCard(monkeypatch, (9, 0), answer)
    monkeypatch.setenv("FLASHCORE_TRAINING", env)
    q, k, v = inputs()
    assert ran_on_aten(grads_match_aten(q, k, v)) is to_aten


def test_flashcore_training_is_read_at_each_call(monkeypatch):
    FakeCard(monkeypatch, (9, 0), kernel(SM80))
    q, k, v = inputs()
    assert ran_on_aten(flashcore.sdpa(q, k, v))
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    assert not ran_on_aten(flashcore.sdpa(q, k, v))
    monkeypatch.setenv("FLASHCORE_TRAINING", "auto")
    assert ran_on_aten(flashcore.sdpa(q, k, v))


def test_flashcore_training_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLASHCORE_TRAINING", "cudnn")
    q, k, v = inputs()
    with pytest.raises(ValueError, match="FLASHCORE_TRAINING must be one of 'auto', 'flashcore', "
                                         "'aten' \\(got 'cudnn'\\)"):
        flashcore.sdpa(q, k, v)
    with pytest.raises(ValueError, match="FLASHCORE_TRAINING"):
        flashcore.explain_training(q, k, v)
    with torch.no_grad():  # a call that records no gradient takes no route
        flashcore.sdpa(q, k, v)


def test_forced_family_keeps_training_on_flashcore(monkeypatch):
    """FLASHCORE_FAMILY forces FlashCore's kernels (for testing and timing them); the training
    route must not quietly hand such calls to aten. FLASHCORE_TRAINING=aten still wins."""
    FakeCard(monkeypatch, (9, 0), kernel(SM80))
    monkeypatch.setenv("FLASHCORE_FAMILY", "sm80")
    q, k, v = inputs()
    assert not ran_on_aten(flashcore.sdpa(q, k, v))
    assert flashcore.explain_training(q, k, v) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm80 "
        "(FLASHCORE_FAMILY=sm80 forces FlashCore's kernels)")
    monkeypatch.setenv("FLASHCORE_TRAINING", "aten")
    assert ran_on_aten(flashcore.sdpa(q, k, v))


# ---- what explain_bwd is asked before the forward ----------------------------------------------

def test_stand_ins_have_the_call_layout_and_cost_no_memory(monkeypatch):
    card = FakeCard(monkeypatch, (9, 0), kernel(SM90))
    # HuggingFace's layout: (B, S, H, D) storage seen as (B, H, S, D); GQA 8:2; fp16.
    B, Hq, Hkv, Sq, Sk, D = 2, 8, 2, 33, 40, 64
    q = torch.randn(B, Sq, Hq, D, dtype=torch.float16).transpose(1, 2)
    k = torch.randn(B, Sk, Hkv, D, dtype=torch.float16).transpose(1, 2)
    v = torch.randn(B, Hkv, Sk, D, dtype=torch.float16)
    _ops.training_route(q, k, v, None, True, 0.25, True, deterministic=True)
    (call,) = card.calls
    for name, real in (("query", q), ("key", k), ("value", v)):
        got = call[name]
        assert type(got) is torch.Tensor
        assert (got.shape, got.stride(), got.dtype) == (real.shape, real.stride(), real.dtype)
    for name in ("out", "grad_out"):  # what the forward and autograd will give: sdpa's layout
        got = call[name]
        assert got.shape == (B, Hq, Sq, D) and got.dtype == torch.float16 and has_sdpa_layout(got, q)
    lse = call["lse"]
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert call["grad_lse"] is None
    assert (call["is_causal"], call["scale"], call["enable_gqa"], call["deterministic"]) == \
           (True, 0.25, True, True)
    # No memory behind them: a made-up, 512-byte-aligned address that nothing reads.
    for name in ("query", "key", "value", "out", "grad_out", "lse"):
        assert call[name].data_ptr() == _ops._STAND_IN_ADDRESS


def test_stand_ins_keep_misalignment(monkeypatch):
    """A view starting 2 bytes past an aligned block fails the kernels' 16-byte rule; its
    stand-in must too (explain_bwd reads the pointer's alignment)."""
    card = FakeCard(monkeypatch, (9, 0), kernel(SM90))
    base = torch.randn(2 * 4 * 9 * 64 + 1, dtype=torch.float16)
    q = base[1:].view(2, 4, 9, 64)
    k = v = torch.randn(2, 4, 9, 64, dtype=torch.float16)
    _ops.training_route(q, k, v, None, False, None, False)
    assert card.calls[-1]["query"].data_ptr() % 16 == q.data_ptr() % 16 == 2
    assert card.calls[-1]["key"].data_ptr() % 16 == 0


def test_broadcast_sizes_do_not_reach_explain_bwd(monkeypatch):
    card = FakeCard(monkeypatch, (9, 0), kernel(SM90))
    q = torch.randn(2, 4, 9, 64)
    k = v = torch.randn(3, 4, 9, 64)  # batch 2 vs 3: the op's own check raises, naming key
    with pytest.raises(RuntimeError, match=r"key must have the same batch size \(dim 0\) as query"):
        _ops.training_route(q, k, v, None, False, None, False)
    assert card.calls == []
    q3 = torch.randn(4, 9, 64)  # not 4-D: no backward kernel
    route = _ops.training_route(q3, q3, q3, None, False, None, False)
    assert (route.path, route.reason, card.calls) == ("python", 2, [])


def test_route_is_cached_per_layout_and_flags(monkeypatch):
    card = FakeCard(monkeypatch, (9, 0), kernel(SM90))
    q, k, v = inputs()
    for _ in range(3):
        _ops.training_route(q, k, v, None, False, None, False)
    _ops.training_route(*inputs(seed=1), None, False, None, False)  # same layout, other data
    assert len(card.calls) == 1
    _ops.training_route(q, k, v, None, True, None, False)  # causal
    _ops.training_route(q, k, v, None, False, None, False, deterministic=True)
    _ops.training_route(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, None, False, None,
                        False)  # another layout of q
    assert len(card.calls) == 4


def test_backward_passes_deterministic_to_the_kernel_choice(monkeypatch):
    """sdpa_bwd's implementation reads torch.are_deterministic_algorithms_enabled() when it runs
    and hands it to explain_bwd / sdpa_bwd_kernel (through _kernel_bwd_covers)."""
    seen = []
    real = _ops._kernel_bwd_covers

    def spy(*args):
        seen.append(inspect.signature(real).bind(*args).arguments["deterministic"])
        return real(*args)

    monkeypatch.setattr(_ops, "_kernel_bwd_covers", spy)
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")  # (the CPU's route is aten)
    q, k, v = inputs()
    for flag in (False, True):
        torch.use_deterministic_algorithms(flag)
        flashcore.sdpa(q, k, v).sum().backward()
    assert seen == [False, True]


# ---- explain_training and explain_backward -----------------------------------------------------

def test_explain_training_strings(monkeypatch):
    q, k, v = inputs()
    assert flashcore.explain_training(q, k, v) == (
        "aten: FlashCore's backward here would be the Python backward (a tensor is not on a CUDA "
        "device), not faster than PyTorch's on this device (an unfused fp32 recomputation)")

    FakeCard(monkeypatch, (9, 0), sm90_unless_deterministic)
    assert flashcore.explain_training(q, k, v) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm90")
    torch.use_deterministic_algorithms(True)
    assert flashcore.explain_training(q, k, v) == (
        "aten: FlashCore's backward here would be the sm80-class kernel (deterministic), not "
        "faster than PyTorch's on this device (0.39-0.74x cuDNN's backward on the H100, "
        "docs/experiments/backward.md)")
    torch.use_deterministic_algorithms(False)

    q5, k5, v5 = inputs(Sk=256)  # 256 keys: fewer than the masked entry's
    assert _ops.TRAINING_TABLE[((9, 0), "sm90-masked")] == (True, "", 512)
    assert flashcore.explain_training(q5, k5, v5, torch.ones(9, 256, dtype=torch.bool)) == (
        "aten: FlashCore's backward here would be the sm90 kernel with a mask, not faster "
        "than PyTorch's on this device (fewer than 512 keys: fwd + bwd not measured faster than "
        "aten's there, docs/experiments/backward.md)")
    mask = torch.ones(9, 2048, dtype=torch.bool)
    assert flashcore.explain_training(q, k, v, mask) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm90")
    # A key-padding mask (broadcast over the query rows) is a bool mask like any; an additive
    # mask has its own entry.
    assert flashcore.explain_training(q, k, v, torch.ones(2, 1, 1, 2048, dtype=torch.bool)) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm90")
    assert flashcore.explain_training(q, k, v, torch.zeros(9, 2048)) == (
        "aten: FlashCore's backward here would be the sm90 kernel with an additive mask, not "
        "faster than PyTorch's on this device (" +
        _ops.TRAINING_TABLE[((9, 0), "sm90-masked-additive")][1] + ")")
    additive = torch.zeros(9, 2048, requires_grad=True)
    assert flashcore.explain_training(q, k, v, additive) == (
        "aten: FlashCore's backward here would be the Python backward (an attn_mask that "
        "requires grad: the backward kernels give it none), not faster than PyTorch's on "
        "this device (an unfused fp32 recomputation)")
    assert flashcore.explain_training(q, k, v, dropout_p=0.1) == (
        "aten: dropout_p > 0 (aten owns the dropout RNG and its backward)")

    monkeypatch.setenv("FLASHCORE_TRAINING", "aten")
    assert flashcore.explain_training(q, k, v) == "aten: FLASHCORE_TRAINING=aten"
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    assert flashcore.explain_training(q, k, v, mask) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm90 (FLASHCORE_TRAINING=flashcore)")
    assert flashcore.explain_training(q, k, v, additive) == (
        f"flashcore: forward {CPU_FORWARD}, backward python: an attn_mask that requires grad: "
        "the backward kernels give it none (FLASHCORE_TRAINING=flashcore)")


def test_explain_training_on_a_device_without_measurements(monkeypatch):
    FakeCard(monkeypatch, (12, 0), kernel(SM80))
    q, k, v = inputs()
    assert flashcore.explain_training(q, k, v, is_causal=True) == (
        f"flashcore: forward {CPU_FORWARD}, backward kernel sm80 (no measurement on compute "
        "capability 12.0: FlashCore's own backward, as before)")


def test_explain_training_on_ada_says_why_aten(monkeypatch):
    FakeCard(monkeypatch, (8, 9), kernel(SM80))
    q, k, v = inputs()
    said = flashcore.explain_training(q, k, v, is_causal=True)
    assert said.startswith("aten:") and "not measured on Ada" in said, said
    assert ran_on_aten(flashcore.sdpa(q, k, v, is_causal=True))


def test_explain_training_python_reason_names_the_status(monkeypatch):
    FakeCard(monkeypatch, (9, 0), no_kernel(HEAD_DIM))
    q, k, v = inputs()
    got = flashcore.explain_training(q, k, v)
    assert got.startswith("aten: FlashCore's backward here would be the Python backward (no "
                          "kernel for this head_dim"), got


def test_explain_training_says_what_the_call_does(monkeypatch):
    """The string and the route agree: "aten:" exactly when the call runs on aten."""
    for answer in (kernel(SM90), kernel(SM80), no_kernel(HEAD_DIM)):
        _ops._ROUTES.clear()
        FakeCard(monkeypatch, (9, 0), answer)
        q, k, v = inputs()
        said = flashcore.explain_training(q, k, v)
        assert said.startswith("aten:") is ran_on_aten(flashcore.sdpa(q, k, v)), said


def test_explain_training_raises_for_bad_inputs():
    q, k, v = inputs()
    with pytest.raises(RuntimeError, match="key must have the same dtype as query"):
        flashcore.explain_training(q, k.double(), v)


def test_explain_backward_strings(monkeypatch):
    q, k, v = inputs(requires_grad=False)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v)
    g = torch.randn_like(out)
    # The real op on the CPU: no kernel.
    assert flashcore.explain_backward(g, q, k, v, out, lse) == \
        "python: a tensor is not on a CUDA device"
    card = FakeCard(monkeypatch, (9, 0), sm90_unless_deterministic)
    assert flashcore.explain_backward(g, q, k, v, out, lse) == "kernel sm90"
    assert card.calls[-1]["deterministic"] is False
    torch.use_deterministic_algorithms(True)
    assert flashcore.explain_backward(g, q, k, v, out, lse) == "kernel sm80 (deterministic)"
    assert flashcore.explain_backward(g, q, k, v, out, lse, deterministic=False) == "kernel sm90"
    FakeCard(monkeypatch, (8, 9), kernel(SM80))  # Ada: sm80 anyway, determinism chose nothing
    assert flashcore.explain_backward(g, q, k, v, out, lse) == "kernel sm80"
    FakeCard(monkeypatch, (9, 0), lambda d: (0, 7))
    assert flashcore.explain_backward(g, q, k, v, out, lse) == \
        "python: dtype is not float16 or bfloat16"


# ---- the ops' schemas and fakes ----------------------------------------------------------------

def _bwd_args(dtype=torch.float32):
    q, k, v = inputs(Hkv=2, dtype=dtype, requires_grad=False)
    out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=True, enable_gqa=True)
    return (torch.randn_like(out), q, k, v, out, lse, None, True, None, True)


def test_bwd_op_schemas_take_deterministic_and_a_mask():
    for op in (EXPLAIN_BWD, BWD_KERNEL):
        # ... deterministic, attn_mask, then flashcore.attention's band and softcap (defaults: none)
        det, mask, *band = op._schema.arguments[-6:]
        assert (det.name, str(det.type), det.default_value) == ("deterministic", "bool", False)
        assert (mask.name, str(mask.type), mask.default_value) == ("attn_mask", "Optional[Tensor]", None)
        assert [(a.name, a.default_value) for a in band] == [
            ("window_left", -1), ("window_right", -1), ("bottom_right", False), ("softcap", 0.0)]
    assert [str(r.type) for r in EXPLAIN_BWD._schema.returns] == ["int", "int"]


@pytest.mark.parametrize("deterministic", [False, True])
def test_explain_bwd_returns_reason_and_family(deterministic):
    args = _bwd_args()
    assert torch.ops.flashcore.explain_bwd(*args, deterministic) == (0, 1)  # CPU: not CUDA
    assert torch.ops.flashcore.explain_bwd(*args, deterministic=deterministic) == (0, 1)
    torch.library.opcheck(EXPLAIN_BWD, args + (deterministic,),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_dynamic"))
    got = torch.ops.flashcore.sdpa_bwd_kernel(*args, deterministic=deterministic)
    expected = torch.ops.flashcore.sdpa_bwd(*args[:7], None, *args[7:], False)[:3]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


def test_bwd_ops_take_a_mask_on_the_cpu():
    """The mask argument: the CPU kernel (the Python reference) applies it as sdpa_bwd does, the
    fake answers, and opcheck passes with it."""
    args = _bwd_args()
    q = args[1]
    mask = torch.rand(q.shape[0], 1, q.shape[2], args[2].shape[2]) < 0.8
    mask[..., 0] = True
    args = args[:7] + (False,) + args[8:]  # masks come without is_causal
    got = torch.ops.flashcore.sdpa_bwd_kernel(*args, attn_mask=mask)
    expected = torch.ops.flashcore.sdpa_bwd(*args[:7], mask, *args[7:], False)[:3]
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert EXPLAIN_BWD(*args, False, mask) == (0, 1)
    torch.library.opcheck(EXPLAIN_BWD, args + (False, mask),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(BWD_KERNEL, args + (False, mask),
                          test_utils=("test_schema", "test_faketensor"))


def test_explain_bwd_fake_returns_a_pair():
    """The fake (and Meta kernel) answers as the C++ kernel does: a (family, reason) pair."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    args = _bwd_args(torch.float16)
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        got = EXPLAIN_BWD(*fake, True)
    assert got == (0, 1) and all(type(x) is int for x in got)
    meta = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    assert _ops._explain_bwd_fake(*meta, True) == (0, 1)


# ---- torch.compile -----------------------------------------------------------------------------

def _compiled_training(lengths, atol=1e-5, rtol=1e-5):
    """torch.compile(fullgraph=True, dynamic=True) of tests/attention_block.py's block at dim 32
    (head dim 8), forward and backward for each length, against eager; returns the compile
    counter and the call_function targets of the traced forward and backward graphs."""
    import torch._dynamo.testing
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.utils import make_boxed_func
    targets = set()

    def compiler(gm, _inputs):
        targets.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    torch.manual_seed(0)
    model = _AttentionBlock(32)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(
        aot_autograd(fw_compiler=compiler, bw_compiler=compiler))
    compiled_matches_eager(model, counter, lengths, atol=atol, rtol=rtol)
    return counter, targets


@pytest.mark.parametrize("answer,to_aten", [(kernel(SM80), True), (kernel(SM90), False)],
                         ids=["aten", "flashcore"])
def test_compile_decides_the_route_while_tracing(answer, to_aten, monkeypatch):
    """The route is decided on fake tensors while tracing, from real stand-ins (no graph node,
    no graph break), once: one graph serves every length (the route reads sizes without guards)."""
    card = FakeCard(monkeypatch, (9, 0), answer)
    # Without the sm90 entry's fewest-keys rule: these lengths are short (the rule itself is
    # decided by the traced length too, see TRAINING_TABLE).
    monkeypatch.setitem(_ops.TRAINING_TABLE, ((9, 0), "sm90"), (True, ""))
    counter, targets = _compiled_training(lengths=(17, 33, 50))
    assert counter.frame_count == 1
    assert card.calls and all(type(card.calls[0][n]) is torch.Tensor
                              for n in ("query", "key", "value", "out", "lse", "grad_out"))
    assert not any("explain" in t for t in targets)
    flashcore_ops = {"flashcore.sdpa_fwd.default", "flashcore.sdpa_bwd.default"}
    if to_aten:
        assert not targets & flashcore_ops
        assert any("scaled_dot_product" in t for t in targets), targets
    else:
        assert flashcore_ops <= targets


def test_compile_no_graph_break_with_route(monkeypatch):
    FakeCard(monkeypatch, (9, 0), kernel(SM80))
    torch._dynamo.reset()
    x = torch.randn(2, 9, 32, requires_grad=True)
    result = torch._dynamo.explain(_AttentionBlock(32))(x)
    assert result.graph_break_count == 0 and result.graph_count == 1


def test_compile_on_cpu(monkeypatch):
    """Without a faked card (the CPU): the compiled training step holds aten's SDPA, and
    FlashCore's ops under FLASHCORE_TRAINING=flashcore."""
    flashcore_ops = {"flashcore.sdpa_fwd.default", "flashcore.sdpa_bwd.default"}
    counter, targets = _compiled_training(lengths=(17, 33))
    assert counter.frame_count == 1
    assert not targets & flashcore_ops and any("scaled_dot_product" in t for t in targets), targets
    monkeypatch.setenv("FLASHCORE_TRAINING", "flashcore")
    counter, targets = _compiled_training(lengths=(17, 33))
    assert counter.frame_count == 1
    assert flashcore_ops <= targets


# ---- on a GPU: the stand-ins' answer equals the real tensors' ----------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_gpu_route_matches_explain_backward(D, dtype, deterministic):
    """What the route asked before the forward (stand-ins) is what explain_bwd says for the real
    forward's out and lse and a contiguous grad_out, and explain_training follows the table."""
    q = torch.randn(2, 256, 8, D, device="cuda", dtype=dtype).transpose(1, 2)  # HF layout
    k = torch.randn(2, 256, 2, D, device="cuda", dtype=dtype).transpose(1, 2)
    v = torch.randn(2, 256, 2, D, device="cuda", dtype=dtype).transpose(1, 2)
    route = _ops.training_route(q, k, v, None, True, None, True, deterministic=deterministic)
    with torch.no_grad():
        out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=True, enable_gqa=True)
    real = torch.ops.flashcore.explain_bwd(torch.randn_like(out), q, k, v, out, lse, None, True,
                                           None, True, deterministic)
    assert (route.family, route.reason) == real
    cc = torch.cuda.get_device_capability()
    torch.use_deterministic_algorithms(deterministic)
    said = flashcore.explain_training(q, k, v, is_causal=True, enable_gqa=True)
    entry = _ops.training_table_entry(cc, route.path, D)
    short = entry is not None and len(entry) > 2 and k.shape[-2] < entry[2]
    assert said.startswith("aten:") is (entry is not None and (not entry[0] or short)), said
    assert route.to_aten is said.startswith("aten:"), (route, said)


def test_mask_inside_causal_reads_each_mask_once():
    """_mask_inside_causal: a bool mask with no kept pair above the top-left diagonal (HuggingFace's
    padded causal mask, Sq != Sk too) is inside; one kept pair above it is not; the answer is kept
    for the same tensor until it is written (its version counter), and other masks are read anew."""
    S, B = 37, 3
    i = torch.arange(S).view(-1, 1)
    j = torch.arange(S).view(1, -1)
    pad = torch.tensor([0, 5, 11]).view(-1, 1, 1, 1)
    hf = ((j <= i) & ((j >= pad) | (j == i))).expand(B, 1, S, S).contiguous()
    assert _ops._mask_inside_causal(hf, S, S)
    assert _ops._last_causal_mask_check[1]() is hf
    hf[1, 0, 3, 20] = True  # a write: the version moves, the mask is read again
    assert not _ops._mask_inside_causal(hf, S, S)
    rect = torch.ones(2, 1, 5, 9, dtype=torch.bool).tril()  # Sq < Sk, top-left: inside
    assert _ops._mask_inside_causal(rect, 5, 9)
    rect2 = rect.clone()
    rect2[0, 0, 4, 5] = True
    assert not _ops._mask_inside_causal(rect2, 5, 9)
    assert not _ops._mask_inside_causal(torch.zeros(2, 2), 2, 2)  # not bool: never
    assert _ops._mask_inside_causal(torch.zeros(4, 4, dtype=torch.bool), 4, 4)  # nothing kept: inside


def test_mask_inside_causal_key_padding_needs_no_read():
    """A mask with one row for every query (key padding, (B, 1, 1, Sk)) keeps keys above row 0's
    diagonal: not inside, answered from its shape (no reduction, no wait for the device), and
    nothing is cached for it."""
    before = _ops._last_causal_mask_check
    keys = torch.ones(3, 1, 1, 40, dtype=torch.bool)
    assert not _ops._mask_inside_causal(keys, 40, 40)
    assert _ops._last_causal_mask_check is before


def test_mask_inside_causal_reads_the_broadcast_mask():
    """A mask broadcast over the keys ((Sq, 1): a kept row keeps every key, those above the
    diagonal too) is not inside, though its own (Sq, 1) shape has nothing above a diagonal; its
    fully masked rows alone would be, but the answer is False without reading it (always safe:
    the call then runs as written)."""
    rows = torch.ones(6, 1, dtype=torch.bool)
    assert not _ops._mask_inside_causal(rows, 6, 6)
    assert _ops._mask_inside_causal(torch.ones(6, 1, dtype=torch.bool), 6, 1)  # one key: key 0 only


def test_forward_mask_as_causal_only_for_eager_cuda_bool_masks():
    """_forward_mask_as_causal (the forward's switch to causal with the mask) declines on the CPU,
    for additive masks, with is_causal set, for short query sequences and other head dims, before
    it would ask explain or read the mask."""
    q = torch.randn(1, 2, 300, 64)
    hf = torch.ones(300, 300, dtype=torch.bool).tril()
    assert not _ops._forward_mask_as_causal(q, q, q, hf, False, None, False)  # CPU
    assert not _ops._forward_mask_as_causal(q, q, q, None, False, None, False)
    assert not _ops._forward_mask_as_causal(q, q, q, hf, True, None, False)
    assert not _ops._forward_mask_as_causal(q, q, q, hf.float(), False, None, False)
    meta = torch.empty(1, 2, 300, 64, device="meta")
    assert not _ops._forward_mask_as_causal(meta, meta, meta, hf.to("meta"), False, None, False)


def test_mask_may_lie_inside_causal_reads_shapes_only():
    """The callers' cheap first question: a bool mask with the call's rows and columns may lie
    inside the causal triangle; one broadcast over either, another dtype or rank, may not."""
    assert _ops._mask_may_lie_inside_causal(torch.ones(2, 1, 5, 9, dtype=torch.bool), 5, 9)
    assert not _ops._mask_may_lie_inside_causal(torch.ones(2, 1, 1, 9, dtype=torch.bool), 5, 9)
    assert not _ops._mask_may_lie_inside_causal(torch.ones(2, 1, 5, 1, dtype=torch.bool), 5, 9)
    assert not _ops._mask_may_lie_inside_causal(torch.ones(5, 9), 5, 9)
    assert not _ops._mask_may_lie_inside_causal(torch.ones(9, dtype=torch.bool), 1, 9)


@pytest.mark.parametrize("bad, message", [
    (dict(key=torch.randn(2, 4, 9, 128, dtype=torch.float64)), r"key must have the same dtype as query"),
    (dict(key=torch.randn(2, 3, 9, 128)), r"key has 3 heads and query has 4"),
    (dict(attn_mask=torch.ones(7, 9, dtype=torch.bool)), r"attn_mask of shape \[7, 9\] does not broadcast"),
    (dict(attn_mask=torch.ones(9, 9, dtype=torch.int32)), r"attn_mask must be bool, float32"),
    (dict(dropout_p=1.5), r"dropout_p: dropout probability has to be between 0 and 1"),
    (dict(dropout_p=0.1, attn_mask=torch.ones(7, 9, dtype=torch.bool)), r"attn_mask of shape \[7, 9\]"),
])
def test_training_calls_raise_the_ops_messages(bad, message):
    """A training call with bad arguments raises the op's message naming the argument, whichever
    route it would take (on the CPU every call goes to aten, whose messages name none)."""
    q = torch.randn(2, 4, 9, 128, requires_grad=True)
    args = dict(key=torch.randn(2, 4, 9, 128), value=torch.randn(2, 4, 9, 128))
    args.update(bad)
    key, value = args.pop("key"), args.pop("value")
    if key.shape[1] != 4:
        value = torch.randn(key.shape)
    with pytest.raises(RuntimeError, match=message):
        flashcore.sdpa(q, key, value, **args)
