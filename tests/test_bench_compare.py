"""bench/compare.py (the A/B table) on committed bench JSON files: CPU only."""
import json
import math
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FINAL = RESULTS / "nvidia-h100-80gb-hbm3_2026-11-26_0350.json"
EARLIER = RESULTS / "nvidia-h100-80gb-hbm3_2026-11-26_0125.json"


def run(*args):
    return subprocess.run([sys.executable, str(REPO / "bench" / "compare.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def us(path, impl, **where):
    rows = json.loads(path.read_text())["rows"]
    (row,) = [r for r in rows if r["impl"] == impl and r.get("pass", "fwd") == "fwd"
              and not r.get("mask") and all(r[k] == v for k, v in where.items())]
    return row["us"]


def test_ratio_is_reference_over_impl_within_each_file():
    shape = dict(B=4, Hq=16, Hkv=16, Sq=4096, Sk=4096, D=128, causal=True)
    want = [us(p, "cudnn", **shape) / us(p, "flashcore", **shape) for p in (EARLIER, FINAL)]
    res = run(EARLIER, FINAL, "--causal", "yes", "--match", r"^B=4 H=16 S=4096 D=128$")
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("B=4 H=16 S=4096 D=128 ")]
    got = [float(x) for x in line.split()[-2:]]
    assert got == [round(w, 3) for w in want]
    geo = [ln for ln in res.stdout.splitlines() if ln.startswith("geomean (1 shapes")]
    assert geo and [float(x) for x in geo[0].split()[-2:]] == got


def test_geomean_over_shapes_in_every_file():
    res = run(FINAL, "--match", "S=1x", "--impl", "flashcore", "--ref", "cudnn")
    assert res.returncode == 0, res.stderr
    rows = json.loads(FINAL.read_text())["rows"]
    ratios = []
    for r in rows:
        if r["impl"] == "flashcore" and r["Sq"] == 1:
            (c,) = [x for x in rows if x["impl"] == "cudnn" and all(
                x[k] == r[k] for k in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "causal"))]
            ratios.append(c["us"] / r["us"])
    want = math.exp(sum(map(math.log, ratios)) / len(ratios))
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith(f"geomean ({len(ratios)} shapes")
    assert abs(float(last.split()[-1]) - want) < 5e-4


def test_missing_file_and_unknown_impl_exit_2():
    assert run(REPO / "no_such.json").returncode == 2
    res = run(FINAL, "--impl", "nonexistent")
    assert res.returncode == 2 and "no rows" in res.stderr


def test_dry_run_json_is_refused_unless_allowed(tmp_path):
    """A dry run's JSON (fake timings) is refused; with --allow-dry its column says DRY."""
    data = json.loads(FINAL.read_text())
    data["dry_run"] = True
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps(data))
    res = run(FINAL, dry)
    assert res.returncode == 2 and "dry run" in res.stderr and "--allow-dry" in res.stderr
    res = run(FINAL, dry, "--allow-dry")
    assert res.returncode == 0, res.stderr
    header = res.stdout.splitlines()[1]
    assert "DRY dry" in header and "DRY nvidia" not in header


def test_timed_wrong_rows_count_only_with_allow_wrong(tmp_path):
    """bench.py --time-wrong's rows ("WRONG (timed)": an experiment tree wrong on purpose) are
    rated only under --allow-wrong; untimed WRONG rows never are."""
    data = json.loads(FINAL.read_text())
    shape = dict(B=4, Hq=16, Hkv=16, Sq=4096, Sk=4096, D=128, causal=True)
    for r in data["rows"]:
        if r["impl"] == "flashcore" and r.get("pass", "fwd") == "fwd" and not r.get("mask") \
                and all(r[k] == v for k, v in shape.items()):
            r["status"] = "WRONG (timed)"
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(data))
    match = ("--causal", "yes", "--match", r"^B=4 H=16 S=4096 D=128$")
    res = run(wrong, *match)
    assert res.returncode == 2 and "no shape left" in res.stderr, res.stderr
    res = run(wrong, *match, "--allow-wrong")
    assert res.returncode == 0, res.stderr
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("B=4 H=16 S=4096 D=128 ")]
    want = us(FINAL, "cudnn", **shape) / us(FINAL, "flashcore", **shape)
    assert float(line.split()[-1]) == round(want, 3)
