"""bench/bench.py's user-facing output on the CPU: the per-shape progress line (index / total,
time left), the dry run's marks (every printed row, the JSON, never bench/results/), and
bench/plot.py's figure from a small synthetic JSON (skipped where matplotlib, an optional
`[bench]` dependency, is not installed)."""
import importlib.util
import io
import json
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


def test_dry_run_prints_one_progress_line_per_shape_on_stderr():
    res = run_bench("--dry-run", "--quick", "--no-json")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    total = len(lines)
    assert total >= 4
    for i, line in enumerate(lines, 1):
        assert re.match(rf"DRY progress {i:>{len(str(total))}}/{total} (fwd|bwd) B=\d+ .*: \d+\.\d s; ", line), line
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
