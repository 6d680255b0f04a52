"""bench/bench_cp.py's bookkeeping on the CPU: the layer's FLOPs, how the ranks' rows are merged
(the slowest rank's time, TFLOP/s, the ratio to PyTorch's CP, the scaling from one GPU), the
table, the arguments, and the one line it prints where it cannot run. The timed runs need two
GPUs (the nvidia-h200-x2 machine); `--device cpu` runs its plumbing on CPU processes."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "bench_cp.py"


@pytest.fixture(scope="module")
def bench_cp():
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_cp_under_test", BENCH)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH.parent))


def row(impl, gpus, ms, s=1024, causal=True, pass_="fwd"):
    return {"S": s, "causal": causal, "pass": pass_, "impl": impl, "gpus": gpus, "ms": ms,
            "maxdiff": 0.0, "status": "ok", "path": ""}


def test_layer_flops(bench_cp):
    s = 1024
    fwd = 4 * s * (s + 1) // 2 * bench_cp.D * bench_cp.HQ
    assert bench_cp.layer_flops(s, True, "fwd") == fwd
    assert bench_cp.layer_flops(s, False, "fwd") == 4 * s * s * bench_cp.D * bench_cp.HQ
    assert bench_cp.layer_flops(s, True, "fwd+bwd") == pytest.approx(3.5 * fwd)


def test_merge_takes_the_slowest_rank_and_derives_ratios(bench_cp):
    rank0 = [row("flashcore-1gpu", 1, 10.0), row("torch-1gpu", 1, 12.0),
             row("flashcore-cp", 2, 6.0), row("torch-cp", 2, 8.0), row("torch-cp:flash", 2, None)]
    rank1 = [row("flashcore-1gpu", 1, 11.0), row("torch-1gpu", 1, 13.0),
             row("flashcore-cp", 2, 5.0), row("torch-cp", 2, 9.0), row("torch-cp:flash", 2, None)]
    rank0[-1]["status"] = rank1[-1]["status"] = "skipped: refused"
    rows = bench_cp.merge_ranks([rank0, rank1], 2)
    by = {r["impl"]: r for r in rows}
    assert by["flashcore-1gpu"]["ms"] == 10.0  # one-GPU rows: rank 0's own
    assert by["flashcore-cp"]["ms"] == 6.0 and by["torch-cp"]["ms"] == 9.0  # the slower rank
    assert by["flashcore-cp"]["vs_torch_cp"] == pytest.approx(9.0 / 6.0)
    assert by["torch-cp"]["vs_torch_cp"] == pytest.approx(1.0)
    assert by["flashcore-cp"]["scaling"] == pytest.approx(10.0 / (2 * 6.0))
    assert by["torch-cp"]["scaling"] == pytest.approx(12.0 / (2 * 9.0))
    assert by["flashcore-1gpu"]["vs_torch_cp"] is None and by["flashcore-1gpu"]["scaling"] is None
    skipped = by["torch-cp:flash"]
    assert skipped["ms"] is None and skipped["tflops"] is None and skipped["vs_torch_cp"] is None
    flops = bench_cp.layer_flops(1024, True, "fwd")
    assert by["flashcore-cp"]["tflops"] == pytest.approx(flops / 6e-3 / 1e12)


def test_table_prints_every_row(bench_cp, capsys):
    rows = bench_cp.merge_ranks([[row("flashcore-cp", 2, 6.0), row("torch-cp", 2, None)]] * 2, 2)
    rows[1]["status"] = "skipped: NotImplementedError: no strategy"
    bench_cp.print_rows(rows)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and "flashcore-cp" in out[1] and "skipped: NotImplementedError" in out[2]


def test_profiles_of_every_rank_are_kept_and_printed(bench_cp, capsys):
    def profiled(rank):
        r = row("flashcore-cp", 2, 6.0 + rank)
        r["profile"] = {"gpu_ms": 5.0 + rank, "nccl_ms": 0.5,
                        "top": [[f"attention_kernel_rank{rank}", 4.0, 2], ["nccl_allgather", 0.5, 1]]}
        return [r, row("torch-cp", 2, 8.0)]
    rows = bench_cp.merge_ranks([profiled(0), profiled(1)], 2)
    assert [p["gpu_ms"] for p in rows[0]["profile"]] == [5.0, 6.0]
    assert "profile" not in rows[1]
    bench_cp.print_rows(rows)
    out = capsys.readouterr().out
    assert "rank 1: kernels 6.00 ms, NCCL 0.50 ms" in out and "attention_kernel_rank1" in out


def test_flashcore_ring_rows_scale_against_flashcore_on_one_gpu(bench_cp):
    ranks = [[row("flashcore-1gpu", 1, 10.0), row("flashcore-cp:ring", 2, 5.0 + r),
              row("torch-cp", 2, 8.0)] for r in range(2)]
    by = {r["impl"]: r for r in bench_cp.merge_ranks(ranks, 2)}
    assert by["flashcore-cp:ring"]["scaling"] == pytest.approx(10.0 / (2 * 6.0))
    assert by["flashcore-cp:ring"]["vs_torch_cp"] == pytest.approx(8.0 / 6.0)


def test_arguments(bench_cp):
    args = bench_cp.parse_args(["--seqs", "8k,16k", "--both"])
    assert args.seqs == [8192, 16384] and args.causal == [True, False] and args.device == "cuda"
    assert args.forced == bench_cp.FORCED_BACKENDS and not args.profile
    assert bench_cp.parse_args(["--forced", "none"]).forced == ()
    assert bench_cp.parse_args(["--forced", "cudnn,flash"]).forced == ("cudnn", "flash")
    for bad in (["--gpus", "0"], ["--iters", "0"], ["--warmup", "-1"], ["--seqs", "x"]):
        with pytest.raises(SystemExit):
            bench_cp.parse_args(bad)


def test_without_two_gpus_it_says_so_and_exits_0():
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs: the bench would run")
    done = subprocess.run([sys.executable, str(BENCH), "--no-json"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "needs 2 CUDA GPUs" in done.stdout and "nothing run" in done.stdout
