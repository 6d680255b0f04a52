"""bench/bench.py's user-facing output on the CPU: the per-shape progress line (index / total,
time left), the dry run's marks (every printed row, the JSON, never bench/results/), and
bench/plot.py's figure from a small synthetic JSON (skipped where matplotlib, an optional
`[bench]` dependency, is not installed)."""
import importlib.util
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "bench.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return load("bench_ux_under_test", BENCH)


def run_bench(*args):
    return subprocess.run([sys.executable, str(BENCH), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_progress_line_counts_shapes_and_estimates_per_pass(bench):
    clock, out = FakeClock(), io.StringIO()
    p = bench.Progress({"fwd": 2, "bwd": 2}, stream=out, clock=clock)
    fwd = bench.Shape(4, 16, 16, 4096, 4096, 128, True)
    bwd = bench.Shape(1, 8, 8, 512, 512, 64, False, "bf16")
    clock.t += 10
    p.shape_done("fwd", fwd)
    clock.t += 20
    p.shape_done("fwd", fwd)
    clock.t += 125
    p.shape_done("bwd", bwd)
    clock.t += 3725
    p.shape_done("bwd", bwd)
    assert out.getvalue().splitlines() == [
        # 3 shapes left, none of bwd's done: each at the mean so far (10 s).
        "progress 1/4 fwd B=4 H=16 S=4096 D=128 fp16 causal: 10.0 s; 10 s elapsed, ~30 s left",
        # fwd's mean is 15 s; the 2 bwd shapes borrow the mean of all (15 s).
        "progress 2/4 fwd B=4 H=16 S=4096 D=128 fp16 causal: 20.0 s; 30 s elapsed, ~30 s left",
        # The last bwd shape at bwd's own mean (125 s), not the mean of all three.
        "progress 3/4 bwd B=1 H=8 S=512 D=64 bf16 non-causal: 125.0 s; 2m35s elapsed, ~2m05s left",
        "progress 4/4 bwd B=1 H=8 S=512 D=64 bf16 non-causal: 3725.0 s; 1h04m elapsed, done",
    ]


def test_fmt_duration(bench):
    assert [bench.fmt_duration(s) for s in (0, 59.4, 60, 3599, 3600, 7322)] == \
        ["0 s", "59 s", "1m00s", "59m59s", "1h00m", "2h02m"]


def test_measured_run_prints_progress_after_each_shape(bench, monkeypatch, capsys):
    """main()'s timing loop (not the dry run's) with the GPU parts stubbed: a progress line
    follows each shape's rows, and none of them carries the dry run's tag."""
    cuda = bench.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "get_device_name", lambda: "Stub Card")
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "Timer", lambda warmup, iters: None)

    def stub_rows(pass_):
        def run(s, impls, *args):
            print(f"rows of {s.label}")
            return [bench.base_row(s, pass_, i.name, None) for i in impls]
        return run
    monkeypatch.setattr(bench, "run_shape", stub_rows("fwd"))
    monkeypatch.setattr(bench, "run_bwd_shape", stub_rows("bwd"))
    assert bench.main(["--quick", "--impls", "cudnn", "--no-json"]) == 0
    out, err = capsys.readouterr()
    fwd, bwd = bench.shape_set(True, False, False), bench.bwd_shape_set(True, False)
    total = len(fwd) + len(bwd)
    progress = err.splitlines()
    assert len(progress) == total
    assert [ln.split()[1] for ln in progress] == [f"{i}/{total}" for i in range(1, total + 1)]
    assert [ln.split()[2] for ln in progress] == ["fwd"] * len(fwd) + ["bwd"] * len(bwd)
    assert all(ln.startswith("progress ") for ln in progress)
    assert "DRY" not in out and "rows of" in out


def test_dry_run_prints_one_progress_line_per_shape_on_stderr():
    res = run_bench("--dry-run", "--quick", "--no-json")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    total = len(lines)
    assert total >= 4
    for i, line in enumerate(lines, 1):
        pattern = rf"DRY progress {i:>{len(str(total))}}/{total} (fwd|bwd) B=\d+ .*: \d+\.\d s; "
        assert re.match(pattern, line), line
    assert lines[-1].endswith(", done")
    assert "\r" not in res.stderr and "progress" not in res.stdout  # the table stays as it was


def test_dry_run_marks_every_row_it_prints():
    """Past the run's preamble, every table line of a dry run (rows, summary, totals) starts
    with "DRY", so that no line of fake timings reads as a measurement on its own."""
    res = run_bench("--dry-run", "--quick", "--no-json")
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    start = next(i for i, ln in enumerate(out) if ln.startswith("DRY shape "))
    table = [ln for ln in out[start:] if ln.strip() and not ln.startswith("JSON: ")]
    assert len(table) > 10 and all(ln.startswith("DRY ") for ln in table), table
    assert any("[bwd]" in ln for ln in table) and any("TFLOP/s summary" in ln for ln in table)


def test_dry_run_json_is_marked_and_never_lands_in_results(tmp_path):
    results = REPO / "bench" / "results"
    before = set(results.iterdir())
    # Asked to write into bench/results/ (here through a path that climbs back in): refused
    # before anything runs.
    sneaky = REPO / "bench" / "results" / ".." / "results" / "dry.json"
    res = run_bench("--dry-run", "--quick", "--json", sneaky)
    assert res.returncode == 2 and "never writes into bench/results/" in res.stderr
    assert "progress" not in res.stderr and set(results.iterdir()) == before
    # With no --json (and --out-dir pointing there too): nothing written.
    res = run_bench("--dry-run", "--quick", "--out-dir", results)
    assert res.returncode == 0 and "JSON: not written" in res.stdout
    assert set(results.iterdir()) == before
    # Elsewhere: written, and marked at both levels.
    path = tmp_path / "dry.json"
    res = run_bench("--dry-run", "--quick", "--json", path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(path.read_text())
    assert doc["dry_run"] is True and doc["card"] == "dry-run"
    assert doc["rows"] and all(r["dry_run"] is True for r in doc["rows"])


def test_real_rows_carry_no_dry_tag(bench, capsys):
    """The tag comes from the row alone: a measured row prints as it always did."""
    s = bench.Shape(1, 8, 8, 512, 512, 64, False)
    row = bench.base_row(s, "fwd", "cudnn", None, floor_us=None, mask=None)
    bench.report(s, row, "cudnn")
    assert capsys.readouterr().out.startswith("B=1 H=8 S=512 D=64 ")


# --------------------------------------------------------------------------- plot

PLOT = REPO / "bench" / "plot.py"


def synthetic_row(pass_, impl, S, D, causal, tflops, B=None, Hq=None, Hkv=None, Sq=None,
                  status="ok", **extra):
    B = 16384 // S if B is None else B
    Hq = 2048 // D if Hq is None else Hq
    row = dict({"pass": pass_}, impl=impl, dtype="fp16", B=B, Hq=Hq,
               Hkv=Hq if Hkv is None else Hkv, Sq=S if Sq is None else Sq, Sk=S, D=D,
               causal=causal, us=100.0, tflops=tflops, graph_us=None, vs_cudnn=None,
               maxdiff=None, status=status, path=None, floor_us=None, mask=None)
    row.update(extra)
    return row


def write_json(path, rows, **doc):
    base = dict(sha="0123456789abcdef", dirty=False, torch="2.14.1", card="Test Card",
                date="2026-11-27T12:00:00", method="synthetic")
    base.update(doc)
    path.write_text(json.dumps(dict(base, rows=rows)))
    return path


def synthetic_files(tmp_path):
    """A forward file (sweep at D=64, decode rows, one masked and one small shape that the plot
    leaves out, stale backward rows) and a later backward file."""
    fwd = []
    for causal in (False, True):
        for S in (1024, 2048, 4096):
            fwd.append(synthetic_row("fwd", "cudnn", S, 64, causal, 400.0 + S / 100))
            fwd.append(synthetic_row("fwd", "flashcore", S, 64, causal, 450.0 + S / 100))
    fwd.append(synthetic_row("fwd", "flashcore", 4096, 64, False, 1.0, mask="bool"))  # left out
    fwd.append(synthetic_row("fwd", "flashcore", 512, 64, False, 2.0, B=1, Hq=8))    # left out
    for sk, us in ((1024, 12.0), (8192, 30.0)):
        for impl in ("cudnn", "flashcore"):
            r = synthetic_row("fwd", impl, sk, 128, False, 0.5, B=8, Hq=32, Hkv=8, Sq=1)
            r["us"] = us
            r["floor_us"] = 2.0 * 8 * (2 * 32 + 2 * 8 * sk) * 128 / 3.0e12 * 1e6
            fwd.append(r)
    fwd.append(synthetic_row("bwd", "flashcore", 1024, 64, False, 1.0))  # replaced by bwd.json
    bwd = [synthetic_row("bwd", impl, S, D, False, t, status=st)
           for D in (64, 128) for S in (1024, 4096)
           for impl, t, st in (("cudnn", 300.0, "ok"), ("flashcore", 320.0, "fallback"))]
    return (write_json(tmp_path / "fwd.json", fwd),
            write_json(tmp_path / "bwd.json", bwd, sha="fedcba9876543210"))


@pytest.fixture(scope="module")
def plot_mod():
    return load("plot_under_test", PLOT)


def test_each_pass_comes_from_the_last_file_that_has_it(tmp_path, plot_mod):
    fwd, bwd = synthetic_files(tmp_path)
    rows, sources = plot_mod.load([fwd, bwd])
    assert {(p, pathlib.Path(f).name) for p, f, _ in sources} == {("fwd", "fwd.json"),
                                                                  ("bwd", "bwd.json")}
    bwd_rows = [r for r in rows if r["pass"] == "bwd"]
    assert len(bwd_rows) == 8 and all(r["tflops"] >= 300 for r in bwd_rows)  # none from fwd.json
    sweep = [r for r in rows if plot_mod.is_sweep(r)]
    assert all(not r["mask"] and r["B"] * r["Sq"] == 16384 for r in sweep)
    assert len([r for r in rows if plot_mod.is_decode(r)]) == 4
    # Same decode shape, same bytes: Q, K, V and O at 2 bytes an element.
    r = next(r for r in rows if plot_mod.is_decode(r) and r["Sk"] == 1024)
    assert plot_mod.moved_bytes(r) == 2 * 8 * (2 * 32 * 1 + 2 * 8 * 1024) * 128


def test_plot_draws_forward_backward_and_decode_panels(tmp_path, plot_mod):
    pytest.importorskip("matplotlib", reason="matplotlib (the [bench] extra) is not installed")
    fwd, bwd = synthetic_files(tmp_path)
    fig = plot_mod.figure([fwd, bwd])
    titles = {ax.get_title(): ax for ax in fig.axes}
    want = {f"{p}, D={D}, {c}" for p in ("forward", "backward") for D in (64, 128)
            for c in ("non-causal", "causal")}
    assert want <= set(titles)
    decode = titles["decode: Sq = 1, time against bytes moved"]
    (floor,) = [ln for ln in decode.get_lines() if ln.get_label().startswith("copy floor")]
    assert "3.0 TB/s" in floor.get_label() and len(floor.get_xdata()) == 2
    # The forward D=64 non-causal panel: one line per impl over S = 1k, 2k, 4k, values as given.
    panel = titles["forward, D=64, non-causal"]
    lines = [ln for ln in panel.get_lines() if len(ln.get_xdata()) > 1]
    assert sorted(list(ln.get_ydata()) for ln in lines) == [[410.24, 420.48, 440.96],
                                                            [460.24, 470.48, 490.96]]
    assert not [ln for ln in titles["forward, D=128, causal"].get_lines() if len(ln.get_xdata())]
    assert "Test Card" in fig._suptitle.get_text() and "DRY" not in fig._suptitle.get_text()
    # The command line: the PNG lands beside the first JSON.
    res = subprocess.run([sys.executable, str(PLOT), fwd, bwd], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    png = tmp_path / "fwd.png"
    assert res.stdout.strip() == f"plot: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 300_000


def test_bench_plot_after_a_dry_run(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the [bench] extra) is not installed")
    path = tmp_path / "dry.json"
    res = run_bench("--dry-run", "--quick", "--json", path, "--plot")
    assert res.returncode == 0, res.stderr
    assert f"plot: {tmp_path / 'dry.png'}" in res.stdout and (tmp_path / "dry.png").exists()
    res = run_bench("--dry-run", "--quick", "--plot")  # no JSON, so no plot; says why
    assert res.returncode == 0 and "plot: not made (no JSON was written" in res.stdout


def test_missing_matplotlib_is_one_clear_line(tmp_path):
    """Where matplotlib cannot be imported (a stand-in package that refuses, put first on the
    path), plot.py and bench.py --plot say so in one line, before any run."""
    blocker = tmp_path / "blocked" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('blocked for this test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "blocked")] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    fwd, _ = synthetic_files(tmp_path)
    bench_cmd = [BENCH, "--dry-run", "--quick", "--json", tmp_path / "d.json", "--plot"]
    for cmd in ([PLOT, fwd], bench_cmd):
        res = subprocess.run([sys.executable, *map(str, cmd)], capture_output=True, text=True,
                             timeout=120, env=env)
        assert res.returncode == 2
        assert res.stderr.splitlines() == [
            "plot: matplotlib is not installed; install the bench extra "
            "(pip install 'flashcore[bench]', or pip install matplotlib)"]
    assert not (tmp_path / "fwd.png").exists() and not (tmp_path / "d.json").exists()


def test_time_wrong_times_wrong_rows_and_keeps_them_wrong(bench, monkeypatch):
    """judge: a row past the tolerance is WRONG and not timed; under --time-wrong it is timed
    ("WRONG (timed)"); a NaN row is never timed."""
    def row(maxdiff):
        return dict(dtype="fp16", maxdiff=maxdiff, path="kernel sm90", status="ok")
    monkeypatch.setattr(bench, "TIME_WRONG", False)
    r = row(1.0)
    assert bench.judge(r, False, "ref", "output") is False and r["status"] == "WRONG"
    monkeypatch.setattr(bench, "TIME_WRONG", True)
    r = row(1.0)
    assert bench.judge(r, False, "ref", "output") is True and r["status"] == "WRONG (timed)"
    r = row(None)
    assert bench.judge(r, True, "ref", "output") is False and r["status"] == "WRONG (NaN in output)"
    r = row(1e-3)
    assert bench.judge(r, False, "ref", "output") is True and r["status"] == "ok"
