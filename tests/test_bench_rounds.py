"""bench/bench.py's run_shape with --rounds: CPU only (fake impls and a fake timer stand in for
the GPU backends and CUDA events), so the bookkeeping is checked where CI runs."""
import contextlib
import importlib.util
import pathlib

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_under_test", REPO / "bench" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def cpu_inputs(s, seed):
        g = torch.Generator().manual_seed(seed)
        return tuple(torch.randn(s.B, h, n, s.D, generator=g)
                     for h, n in ((s.Hq, s.Sq), (s.Hkv, s.Sk), (s.Hkv, s.Sk)))

    monkeypatch.setattr(mod, "make_inputs", cpu_inputs)
    monkeypatch.setattr(mod, "make_mask", lambda s: None)
    monkeypatch.setattr(mod, "poison_allocator", lambda shape, dtype: None)
    monkeypatch.setattr(mod.torch.cuda, "synchronize", lambda: None)
    return mod


class FakeImpl:
    """Returns the exact attention (or garbage, or raises), and logs each timing call's order."""

    def __init__(self, name, kind="right"):
        self.name, self.kind = name, kind

    def context(self):
        return contextlib.nullcontext()

    def explain(self, q, k, v, s, mask):
        return "kernel fake" if self.name.startswith("flashcore") else None

    def fn(self, q, k, v, s, mask=None):
        def call():
            if self.kind == "raises":
                raise RuntimeError("no kernel for this shape")
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s.causal)
            return out + 1.0 if self.kind == "wrong" else out
        call.impl_name = self.name
        return call


class FakeTimer:
    """eager_us hands out each impl's next time from its script; records the order of calls
    (one entry per interleaved timing: the impls it was given, in order)."""

    def __init__(self, scripts):
        self.scripts = {n: list(ts) for n, ts in scripts.items()}
        self.order = []

    def eager_us(self, calls):
        names = []
        for context, fn in calls:
            with context():
                names.append(fn.impl_name)
        self.order.append(names)
        return [self.scripts[n].pop(0) for n in names]

    def graph_us(self, fn):
        return 1.0


def test_rounds_time_the_impls_together_and_rows_report_the_median(bench):
    s = bench.Shape(1, 2, 2, 16, 16, 8, False)
    impls = [FakeImpl("cudnn"), FakeImpl("flashcore")]
    # One slow spell (flashcore's second round) must not decide the row.
    timer = FakeTimer({"cudnn": [10.0, 11.0, 12.0], "flashcore": [8.0, 30.0, 9.0]})
    rows = bench.run_shape(s, impls, timer, seed=0, graph=False, rounds=3)
    assert timer.order == [["cudnn", "flashcore"]] * 3
    cudnn, fc = rows
    assert cudnn["us"] == 11.0 and cudnn["us_rounds"] == [10.0, 11.0, 12.0]
    assert fc["us"] == 9.0 and fc["us_rounds"] == [8.0, 30.0, 9.0]
    assert fc["vs_cudnn"] == pytest.approx(11.0 / 9.0)
    assert fc["tflops"] == pytest.approx(bench.flops(s) / 9.0 / 1e6)


def test_timer_interleaves_the_impls_call_by_call(bench, monkeypatch):
    """Timer.eager_us on fake CUDA events: every impl's call i runs (inside its own context)
    before any impl's call i + 1, and each impl gets the median of its own event pairs."""
    log = []

    class FakeEvent:
        clock = 0.0

        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = FakeEvent.clock

        def elapsed_time(self, end):  # as torch's: from this event to `end`, in ms
            return (end.t - self.t) / 1e3

    monkeypatch.setattr(bench.torch.cuda, "Event", FakeEvent)

    class FakeFlush:
        def zero_(self):
            log.append("flush")

    timer = object.__new__(bench.Timer)
    timer.warmup, timer.iters, timer.flush_buf = 2, 3, FakeFlush()

    def impl(name, us):
        @contextlib.contextmanager
        def context():
            log.append(f"enter {name}")
            yield
            log.append(f"exit {name}")

        def fn():
            log.append(name)
            FakeEvent.clock += us
        return context, fn

    times = timer.eager_us([impl("a", 5.0), impl("b", 7.0)])
    assert times == [pytest.approx(5.0), pytest.approx(7.0)]
    timed = log[2 * 3 * 2:]  # after the warm-up: 2 impls x 2 calls x (enter, call, exit)
    assert log[:6] == ["enter a", "a", "exit a"] * 2
    assert timed == ["enter a", "flush", "a", "exit a", "enter b", "flush", "b", "exit b"] * 3


def test_one_round_keeps_the_old_rows(bench):
    s = bench.Shape(1, 2, 2, 16, 16, 8, True)
    timer = FakeTimer({"cudnn": [10.0], "flashcore": [5.0]})
    rows = bench.run_shape(s, [FakeImpl("cudnn"), FakeImpl("flashcore")], timer, seed=1,
                           graph=False, rounds=1)
    assert [r["us"] for r in rows] == [10.0, 5.0]
    assert all("us_rounds" not in r for r in rows)


def test_wrong_and_skipped_rows_are_never_timed(bench):
    s = bench.Shape(1, 2, 2, 16, 16, 8, False)
    impls = [FakeImpl("cudnn"), FakeImpl("flash", "raises"), FakeImpl("flashcore", "wrong")]
    timer = FakeTimer({"cudnn": [10.0, 10.0]})
    rows = bench.run_shape(s, impls, timer, seed=2, graph=False, rounds=2)
    assert timer.order == [["cudnn"], ["cudnn"]]
    cudnn, flash, fc = rows
    assert cudnn["us"] == 10.0
    assert flash["status"].startswith("skipped") and flash["us"] is None
    assert fc["status"].startswith("WRONG") and fc["us"] is None


def test_rounds_below_one_is_an_error():
    import subprocess
    import sys
    res = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--dry-run", "--quick",
                          "--no-json", "--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--rounds must be at least 1" in res.stderr


def test_git_info_prefers_the_sent_commit(bench, monkeypatch, tmp_path):
    """The commit a bench JSON names: FLASHCORE_SHA, then the tree's .git-sha (written before a
    tree is sent to the GPU machine, whose copy's .git may name another commit), then git; a
    tree that is not a repository's top level and has no .git-sha says "unknown"."""
    import subprocess
    monkeypatch.delenv("FLASHCORE_SHA", raising=False)
    monkeypatch.setattr(bench, "REPO", str(tmp_path))
    assert bench.git_info() == ("unknown", None)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert bench.git_info() == (head, False)  # a repository of its own, clean
    (tmp_path / ".git-sha").write_text("abc123\n")  # a stale .git beside the sent commit's file
    assert bench.git_info() == ("abc123", None)
    monkeypatch.setenv("FLASHCORE_SHA", "def456")
    assert bench.git_info() == ("def456", None)


def test_dry_run_says_fake_and_writes_json_only_where_asked(tmp_path):
    """A dry run's timings are fake: it says so, writes no JSON by default (so nothing lands in
    bench/results/), and writes one where --json points."""
    import json
    import subprocess
    import sys
    results = REPO / "bench" / "results"
    before = set(results.iterdir()) if results.exists() else set()
    cmd = [sys.executable, str(REPO / "bench" / "bench.py"), "--dry-run", "--quick",
           "--out-dir", str(results)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "DRY RUN" in res.stdout and "FAKE" in res.stdout
    assert "JSON: not written" in res.stdout
    assert (set(results.iterdir()) if results.exists() else set()) == before
    out = tmp_path / "dry.json"
    res = subprocess.run(cmd + ["--json", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["card"] == "dry-run"
