"""bench/bench_train.py (the training-step benchmark) on the CPU: the model, the padded batches
and their mask, the correctness verdict, the interleaved timer (fake CUDA events) and the dry
run's JSON. No GPU needed; where flashcore cannot be imported, the dry run substitutes PyTorch's
SDPA, so these tests run either way."""
import importlib.util
import json
import math
import pathlib
import sys
import types

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
ROW_KEYS = {"impl", "model", "B", "S", "padded", "ms", "tokens_per_s", "vs_sdpa"}


@pytest.fixture(scope="module")
def bt():
    spec = importlib.util.spec_from_file_location("bench_train_under_test",
                                                  REPO / "bench" / "bench_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # One thread, as the dry run uses: tiny matmuls on a busy 2-core machine ran ~30x slower
    # with OpenMP's threads waiting on each other. Restored for the tests after these.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield mod
    torch.set_num_threads(threads)


def expected_params(cfg):
    """Parameter count of the decoder described in the module docstring, written out apart."""
    q_out, kv_out = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    attn = cfg.hidden * q_out + 2 * cfg.hidden * kv_out + q_out * cfg.hidden
    mlp = 3 * cfg.hidden * cfg.intermediate
    per_layer = attn + mlp + 2 * cfg.hidden  # two RMSNorm weights
    return 2 * cfg.vocab * cfg.hidden + cfg.layers * per_layer + cfg.hidden  # embed, head, norm


def test_full_size_configs_match_the_issue(bt):
    """The 1b and 8b shapes, built on the meta device (no memory): every projection's shape."""
    want = {"1b": (2048, 32, 8, 64, 8192, 4), "8b": (4096, 32, 8, 128, 14336, 2)}
    for name, (hidden, heads, kv, hd, inter, layers) in want.items():
        cfg = bt.CONFIGS[name]
        assert (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate,
                cfg.layers, cfg.vocab) == (hidden, heads, kv, hd, inter, layers, 32000)
        model = bt.build_model(cfg, "meta", torch.bfloat16)
        attn, mlp = model.layers[0].attn, model.layers[0].mlp
        assert attn.q_proj.weight.shape == (heads * hd, hidden)
        assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (kv * hd, hidden)
        assert attn.o_proj.weight.shape == (hidden, heads * hd)
        assert mlp.gate_proj.weight.shape == (inter, hidden)
        assert mlp.down_proj.weight.shape == (hidden, inter)
        assert len(model.layers) == layers
        assert sum(p.numel() for p in model.parameters()) == expected_params(cfg)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())


@pytest.mark.parametrize("name", ["1b", "8b"])
def test_tiny_models_train_one_step(bt, name):
    """Tiny versions keep GQA 4:1; a step gives the loss of near-uniform logits and a finite
    gradient for every parameter."""
    cfg = bt.tiny_config(bt.CONFIGS[name])
    assert cfg.heads == 4 * cfg.kv_heads and cfg.hidden == cfg.heads * cfg.head_dim
    model = bt.build_model(cfg, "cpu", torch.float32, seed=1)
    batch = bt.make_batch(2, 24, cfg.vocab, False, "cpu", seed=2)
    loss = bt.train_step(model, batch, bt.sdpa_attend)
    # Weights of std 0.02 give logits near 0: the loss is close to log(vocab).
    assert abs(loss.item() - math.log(cfg.vocab)) < 0.1
    for name_, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name_
    assert model.layers[0].attn.q_proj.weight.grad.abs().max() > 0


def test_padded_mask_is_causal_and_left_padded(bt):
    B, S = 3, 8
    pads = bt.pad_lengths(B, S)
    assert pads == [0, 1, 2]  # b * S / (2B): row 0 is the batch's longest sequence
    assert bt.pad_lengths(1, 8) == [2]  # a batch of one is padded too
    mask = bt.padded_causal_mask(pads, S, "cpu")
    assert mask.shape == (B, 1, S, S) and mask.dtype == torch.bool
    for b in range(B):
        for i in range(S):
            for j in range(S):
                if i < pads[b]:
                    want = i == j  # a query inside the padding sees itself only
                else:
                    want = pads[b] <= j <= i
                assert bool(mask[b, 0, i, j]) == want, (b, i, j)
    assert mask.any(-1).all()  # no fully masked row, whatever the backend does with one


def test_padded_batch_loss_equals_the_rows_alone(bt):
    """The left-padded batch's loss is the loss of each row's real tokens run on their own,
    unpadded (positions from 0, is_causal): the mask, the positions and the labels together
    keep the padding out. No NaN anywhere."""
    cfg = bt.tiny_config(bt.CONFIGS["1b"])
    model = bt.build_model(cfg, "cpu", torch.float32, seed=3)
    B, S = 3, 16
    batch = bt.make_batch(B, S, cfg.vocab, True, "cpu", seed=4)
    assert batch.pads == [0, 2, 5]
    assert (batch.input_ids[1, :2] == bt.PAD_ID).all() and (batch.input_ids[1, 2:] != bt.PAD_ID).all()
    assert (batch.labels[2, :5] == bt.IGNORE).all() and (batch.labels[:, -1] == bt.IGNORE).all()
    assert batch.positions[2, 5] == 0 and batch.positions[2, -1] == S - 6
    with torch.no_grad():
        padded_loss = model(batch)
        total, count = 0.0, 0
        for b, pad in enumerate(batch.pads):
            ids = batch.input_ids[b:b + 1, pad:]
            n = ids.shape[1]
            labels = torch.full_like(ids, bt.IGNORE)
            labels[:, :-1] = ids[:, 1:]
            row = bt.Batch(ids, torch.arange(n)[None], None, labels, [0])
            total += model(row).item() * (n - 1)
            count += n - 1
    assert torch.isfinite(padded_loss)
    assert padded_loss.item() == pytest.approx(total / count, rel=1e-5)


def test_padded_step_gives_no_nan_in_bf16(bt):
    cfg = bt.tiny_config(bt.CONFIGS["8b"])
    model = bt.build_model(cfg, "cpu", torch.bfloat16, seed=5)
    batch = bt.make_batch(1, 32, cfg.vocab, True, "cpu", seed=6)
    loss = bt.train_step(model, batch, bt.sdpa_attend)
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def checked(loss, grad):
    return dict(loss=torch.tensor(loss), grads={"w": torch.tensor(grad)})


def test_verdict_flags_disagreement_and_nan(bt):
    ref = checked(10.0, [1.0, -2.0])
    status, _ = bt.judge("bf16", {"sdpa": ref, "flashcore": checked(10.001, [1.0, -2.01])})
    assert status == {"sdpa": "ok", "flashcore": "ok"}
    status, numbers = bt.judge("bf16", {"sdpa": ref, "flashcore": checked(10.0, [1.0, -2.4])})
    assert status["sdpa"] == "ok" and status["flashcore"].startswith("CHECK FAILED")
    assert numbers["grad_rel_diff"] == pytest.approx(0.2)
    status, _ = bt.judge("bf16", {"sdpa": ref, "flashcore": checked(float("nan"), [1.0, -2.0])})
    assert status["flashcore"].startswith("WRONG")
    status, _ = bt.judge("bf16", {"sdpa": {"error": "OutOfMemoryError: x"}, "flashcore": ref})
    assert status["sdpa"].startswith("error") and status["flashcore"].startswith("unverified")


def measure_tiny(bt, attends, seed):
    cfg = bt.tiny_config(bt.CONFIGS["1b"])
    model = bt.build_model(cfg, "cpu", torch.float32, seed=seed)
    args = types.SimpleNamespace(dtype="bf16", adamw=False)
    return bt.measure(model, cfg, 2, 16, True, attends, None, bt.FakeStepTimer(3), None, args,
                      "cpu", seed=seed)


def test_wrong_impl_is_not_timed(bt):
    """A flashcore step that gives NaN is flagged and never timed; sdpa still is."""
    nan_attend = lambda q, k, v, mask: bt.sdpa_attend(q, k, v, mask) * float("nan")  # noqa: E731
    (sdpa, fc), line = measure_tiny(bt, {"sdpa": bt.sdpa_attend, "flashcore": nan_attend}, 7)
    assert sdpa["ms"] is not None and sdpa["status"] == "ok"
    assert fc["ms"] is None and fc["status"].startswith("WRONG") and "WRONG" in line


def test_a_failing_baseline_leaves_flashcore_timed(bt):
    """sdpa's step raising (as out of memory would) flags its row, untimed; flashcore's row is
    still timed, marked unverified, with no ratio."""
    def oom(q, k, v, mask):
        raise RuntimeError("CUDA out of memory (simulated)")
    (sdpa, fc), _ = measure_tiny(bt, {"sdpa": oom, "flashcore": bt.sdpa_attend}, 9)
    assert sdpa["status"].startswith("error") and "out of memory" in sdpa["status"]
    assert sdpa["ms"] is None and sdpa["loss"] is None
    assert fc["status"].startswith("unverified") and fc["ms"] is not None and fc["vs_sdpa"] is None


def test_timer_interleaves_impls_step_by_step(bt, monkeypatch):
    """CudaStepTimer on fake CUDA events: after the warm-up, every impl's step i runs before any
    impl's step i + 1, gradients are zeroed outside the events, and each impl gets its own times."""
    log = []

    class FakeEvent:
        clock = 0.0

        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            log.append("event")
            self.t = FakeEvent.clock

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(bt.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(bt.torch.cuda, "synchronize", lambda: log.append("sync"))
    model = types.SimpleNamespace(zero_grad=lambda set_to_none: log.append("zero"))

    def step(name, ms):
        def fn():
            log.append(name)
            FakeEvent.clock += ms
        return fn

    times = bt.CudaStepTimer(warmup=2, iters=3).step_ms(
        model, None, {"sdpa": step("sdpa", 5.0), "flashcore": step("flashcore", 4.0)})
    assert times == {"sdpa": [5.0] * 3, "flashcore": [4.0] * 3}
    assert log[:9] == ["zero", "sdpa", "zero", "flashcore"] * 2 + ["sync"]
    one = ["zero", "event", "sdpa", "event", "zero", "event", "flashcore", "event"]
    assert log[9:] == one * 3 + ["sync"]


def run_main(bt, argv, capsys):
    rc = bt.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_dry_run_writes_the_documented_json(bt, tmp_path, capsys):
    path = tmp_path / "train.json"
    rc, out, err = run_main(bt, ["--dry-run", "--json", str(path), "--shapes", "2x2048"], capsys)
    assert rc == 0
    assert "FAKE" in out and "FAKE" in err  # the table and the progress lines both say so
    doc = json.loads(path.read_text())
    assert {"sha", "dirty", "torch", "card", "date", "method", "rows"} <= doc.keys()
    assert doc["card"] == "dry-run" and doc["dry_run"] is True and "FAKE" in doc["method"]
    rows = doc["rows"]
    assert len(rows) == 2 * 2 * 2  # 2 models x (unpadded, padded) x 2 impls
    assert {(r["model"], r["padded"], r["impl"]) for r in rows} == {
        (m, p, i) for m in ("1b", "8b") for p in (False, True) for i in ("sdpa", "flashcore")}
    for r in rows:
        assert ROW_KEYS <= r.keys()
        assert (r["B"], r["S"]) == (2, 2048 // bt.DRY_SEQ_DIV)
        assert r["tokens_per_s"] == pytest.approx(r["B"] * r["S"] / (r["ms"] / 1e3))
        assert r["status"] == "ok" and math.isfinite(r["loss"])
    for m in ("1b", "8b"):
        for p in (False, True):
            sdpa, fc = ([r for r in rows if (r["model"], r["padded"], r["impl"]) == (m, p, i)][0]
                        for i in ("sdpa", "flashcore"))
            assert sdpa["vs_sdpa"] == 1.0
            assert fc["vs_sdpa"] == pytest.approx(sdpa["ms"] / fc["ms"])
            assert fc["loss_rel_diff"] < 1e-2 and fc["grad_rel_diff"] < 5e-2


def results_listing():
    return sorted((p.name, p.stat().st_mtime_ns) for p in RESULTS.iterdir()) if RESULTS.exists() else []


def test_default_dry_run_writes_nothing_under_results(bt, capsys):
    before = results_listing()
    rc, out, _ = run_main(bt, ["--dry-run", "--models", "1b", "--shapes", "1x2048",
                               "--padding", "left", "--adamw"], capsys)
    assert rc == 0
    assert "no JSON written" in out and "JSON:" not in out
    assert results_listing() == before
    with pytest.raises(SystemExit) as exc:  # not even when asked to
        bt.main(["--dry-run", "--json", str(RESULTS / "train_dry.json")])
    assert exc.value.code == 2 and "never writes into bench/results" in capsys.readouterr().err
    assert results_listing() == before


def test_without_flashcore(bt, monkeypatch, tmp_path, capsys):
    """An import failure is a clear message (exit, no traceback), except in a dry run, which
    substitutes F.scaled_dot_product_attention and says so."""
    monkeypatch.setitem(sys.modules, "flashcore", None)  # makes `import flashcore` fail
    with pytest.raises(SystemExit) as exc:
        bt.load_flashcore(dry_run=False)
    assert "flashcore cannot be imported" in str(exc.value.code) and "--dry-run" in str(exc.value.code)
    assert bt.load_flashcore(dry_run=True) is None
    assert "uses F.scaled_dot_product_attention" in capsys.readouterr().err
    path = tmp_path / "substituted.json"
    rc, _, _ = run_main(bt, ["--dry-run", "--models", "8b", "--shapes", "1x1024", "--json",
                             str(path), "--padding", "none"], capsys)
    assert rc == 0
    fc_row = [r for r in json.loads(path.read_text())["rows"] if r["impl"] == "flashcore"][0]
    assert fc_row["path"].startswith("substituted") and fc_row["loss_rel_diff"] == 0.0
