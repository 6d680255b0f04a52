"""The HF benches' plumbing on the CPU (--cpu-smoke: a tiny fp32 Llama). bench_hf_packed.py: every
row checked and timed, the packed rows' loss equal to the padded batch's (the same documents and
targets: the packed layouts attend within each document only). bench_hf_cb.py: both
implementations' greedy tokens equal."""
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
REPO = pathlib.Path(__file__).resolve().parents[1]


def test_cpu_smoke_rows_and_losses():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_hf_packed.py"), "--cpu-smoke",
                           "--no-json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout.split("status\n", 1)[1].strip().splitlines()
    assert len(table) == 4
    for line in table:
        impl, layout, *_ = line.split()
        assert impl in ("sdpa", "flashcore") and layout in ("packed", "padded")
        assert line.endswith("ok"), line
    losses = {float(x) for x in re.findall(r"loss (\d+\.\d+)", done.stdout)}
    assert len(losses) == 1, done.stdout  # the four layouts' losses agree (fp32, 4 decimals)


def test_without_cuda_says_so():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the bench would run")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_hf_packed.py"), "--no-json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and "nothing run" in done.stdout


def test_continuous_batching_bench_cpu_smoke():
    """bench/bench_hf_cb.py --cpu-smoke: both implementations run generate_batch and give the
    same greedy tokens."""
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_hf_cb.py"), "--cpu-smoke",
                           "--no-json"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("paged|")]
    assert [r[0] for r in rows] == ["paged|sdpa", "paged|flashcore"]
    assert all(float(r[4]) == 1.0 for r in rows), done.stdout  # same tokens for every request
