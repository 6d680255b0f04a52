"""Streams, threads, devices and determinism of torch.ops.flashcore.sdpa (GPU only).

  * stream ordering: the op is queued on the caller's current stream, after the work already on
    it, and returns without synchronizing (a side stream that is still busy stays busy);
  * threads: concurrent calls from several threads (each on its own stream, or all on the
    default stream) give the same bits as the same calls made one at a time; and in a fresh
    process, threads that all make their first call at once (the one-time per-device setup:
    compute capability cache, shared-memory attribute) get right answers;
  * determinism: the same inputs give bitwise the same output on repeated calls, on any stream;
  * two GPUs (skipped with fewer): tensors on cuda:1 run on cuda:1, on cuda:1's current stream,
    while cuda:0 is the current device, and give right answers; mixing cuda:0 and cuda:1 is an
    error naming the argument.

Run:  python -m pytest tests/test_streams_devices.py -q         (one GPU; the 2-GPU tests skip)
On a 2-GPU machine (e.g. kind nvidia-h100-x2) the same command runs the cuda:1 tests too.
Without a CUDA device each test skips (tests/gpu_gate.py); FLASHCORE_REQUIRE_GPU=1 makes that an
error.
"""
import importlib.util
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from gpu_gate import gpu_gate  # noqa: E402

GPU, pytestmark = gpu_gate(
    "no CUDA device: stream, thread and multi-GPU tests of flashcore.sdpa skipped")

_REPO_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if importlib.util.find_spec("flashcore") is None:
    sys.path.insert(0, _REPO_PYTHON)
import flashcore  # noqa: E402  (a failed import is an error, not a skip)

KERNEL_CCS = ((8, 9), (9, 0))
TWO_GPUS = torch.cuda.device_count() >= 2
needs_two_gpus = pytest.mark.skipif(not TWO_GPUS, reason="needs 2 CUDA devices")

# (B, Hq, Hkv, Sq, Sk, D, causal): kernel shapes, ragged and not, GQA, decode, long keys.
SHAPES = [
    (2, 4, 4, 200, 200, 64, False),
    (2, 8, 2, 130, 77, 128, True),
    (1, 16, 16, 1, 8192, 128, False),
    (1, 4, 1, 333, 4099, 64, True),
]


def _inputs(shape, device="cuda", dtype=torch.float16, seed=0):
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=gen, device=device, dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=gen, device=device, dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=gen, device=device, dtype=dtype)
    return (q, k, v), dict(is_causal=causal, enable_gqa=Hq != Hkv)


def _assert_close_to_aten(out, args, kwargs):
    """Within the low-precision tolerance of a float64 reference (as tests/test_gpu_sdpa.py)."""
    q, k, v = args
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)
    lowp = F.scaled_dot_product_attention(q, k, v, **kwargs).double()
    bound = 2 * (lowp - ref).abs().max().item() + (1e-3 if q.dtype == torch.float16 else 1e-2)
    err = (out.double() - ref).abs().max().item()
    assert out.shape == ref.shape and out.device == q.device
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"


def _busy(stream, ms=50):
    """Queue ~ms of GPU-side sleep on `stream` (nothing after it on that stream can start)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * 1e-3 * 2e9))  # cycles; generous at any clock


# ---- streams ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES[:2], ids=["d64", "d128_gqa_causal"])
def test_ordered_on_current_nondefault_stream(shape):
    args, kwargs = _inputs(shape)
    q, k, v = args
    expected = flashcore.sdpa(q, k, v, **kwargs)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    q_late = torch.zeros_like(q)
    # Warm-up on `side` first: the caching allocator's first blocks for a new stream come from
    # cudaMalloc, which can block the host; that is PyTorch's cost, not something the op does.
    with torch.cuda.stream(side):
        (flashcore.sdpa(q, k, v, **kwargs).float() + 1.0).sum()
    torch.cuda.synchronize()
    _busy(side, ms=200)
    with torch.cuda.stream(side):
        q_late.copy_(q)  # only after the sleep: an op not on `side` would read zeros
        t0 = time.perf_counter()
        out = flashcore.sdpa(q_late, k, v, **kwargs)
        host_ms = (time.perf_counter() - t0) * 1e3
        out_plus = out.float() + 1.0  # consumer on the same stream
    # The op queued its work and returned: the side stream is still sleeping (no sync inside).
    assert not side.query(), (f"flashcore.sdpa synchronized the stream (the call took {host_ms:.1f} ms "
                              "on the host while a 200 ms sleep was queued)")
    side.synchronize()
    assert torch.equal(out, expected), "result differs: the op did not run after the copy on its stream"
    assert torch.equal(out_plus, expected.float() + 1.0)


def test_default_stream_not_used_when_side_stream_current():
    """While a side stream is current, the default stream stays free: a sleep queued on the
    default stream must not delay the op's work on the side stream."""
    args, kwargs = _inputs(SHAPES[0])
    expected = flashcore.sdpa(*args, **kwargs)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    _busy(torch.cuda.default_stream(), ms=200)
    with torch.cuda.stream(side):
        out = flashcore.sdpa(*args, **kwargs)
        done = torch.cuda.Event()
        done.record(side)
    done.synchronize()  # returns once the side stream's work is done
    still_sleeping = not torch.cuda.default_stream().query()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert still_sleeping, "the op's work waited for the default stream"


# ---- threads ------------------------------------------------------------------------------------

@pytest.mark.parametrize("own_streams", [True, False], ids=["stream_per_thread", "default_stream"])
def test_concurrent_threads_match_serial_results(own_streams):
    n_threads, iters = 8, 6
    jobs = [_inputs(SHAPES[i % len(SHAPES)], seed=i) for i in range(n_threads)]
    expected = [flashcore.sdpa(*a, **kw) for a, kw in jobs]
    torch.cuda.synchronize()
    results = [[None] * iters for _ in range(n_threads)]
    errors = []
    barrier = threading.Barrier(n_threads)

    def worker(i):
        try:
            args, kwargs = jobs[i]
            stream = torch.cuda.Stream() if own_streams else torch.cuda.default_stream()
            barrier.wait()
            with torch.cuda.stream(stream):
                for it in range(iters):
                    results[i][it] = flashcore.sdpa(*args, **kwargs)
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for i in range(n_threads):
        for it in range(iters):
            assert torch.equal(results[i][it], expected[i]), f"thread {i} call {it} differs"


_FRESH_PROCESS = r"""
import sys, threading
import torch, torch.nn.functional as F
import flashcore
n = 8
gen = torch.Generator(device="cuda").manual_seed(0)
jobs = []
for i in range(n):
    D = (64, 128)[i % 2]
    dtype = (torch.float16, torch.bfloat16)[(i // 2) % 2]
    q, k, v = (torch.randn(2, 4, 150, D, generator=gen, device="cuda", dtype=dtype) for _ in range(3))
    jobs.append((q, k, v, bool(i % 3 == 0)))
torch.cuda.synchronize()
out = [None] * n
errors = []
barrier = threading.Barrier(n)
def work(i):
    try:
        q, k, v, causal = jobs[i]
        s = torch.cuda.Stream()
        barrier.wait()  # every thread makes its first call at once
        with torch.cuda.stream(s):
            out[i] = flashcore.sdpa(q, k, v, is_causal=causal)
        s.synchronize()
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(i,)) for i in range(n)]
[t.start() for t in ts]
[t.join() for t in ts]
torch.cuda.synchronize()
if errors:
    print("ERRORS", errors); sys.exit(2)
worst = 0.0
for (q, k, v, causal), o in zip(jobs, out):
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    lowp = F.scaled_dot_product_attention(q, k, v, is_causal=causal).double()
    bound = 2 * (lowp - ref).abs().max().item() + (1e-3 if q.dtype == torch.float16 else 1e-2)
    err = (o.double() - ref).abs().max().item()
    if not err <= bound:
        print("WRONG", q.shape, q.dtype, causal, err, bound); sys.exit(3)
print("OK", flashcore.explain(*jobs[1][:3]))
"""


def test_first_calls_from_many_threads_in_fresh_process():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (os.path.dirname(os.path.dirname(flashcore.__file__)),
                     env.get("PYTHONPATH")) if p])
    r = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


# ---- determinism ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=["d64", "d128_gqa_causal", "decode", "mqa_long_k"])
def test_bitwise_deterministic(shape, dtype):
    args, kwargs = _inputs(shape, dtype=dtype, seed=7)
    first = flashcore.sdpa(*args, **kwargs)
    _assert_close_to_aten(first, args, kwargs)
    side = torch.cuda.Stream()
    for i in range(10):
        # interleave other work so allocations and scheduling differ between calls
        junk = torch.randn(1 << 20, device="cuda") if i % 3 == 0 else None
        if i % 2:
            with torch.cuda.stream(side):
                again = flashcore.sdpa(*args, **kwargs)
            side.synchronize()
        else:
            again = flashcore.sdpa(*args, **kwargs)
        assert torch.equal(again, first), f"call {i} differs from the first"
        del junk


@pytest.mark.parametrize("family", ["sm80", "sm90"])
@pytest.mark.parametrize("shape", SHAPES, ids=["d64", "d128_gqa_causal", "decode", "mqa_long_k"])
def test_bitwise_deterministic_each_family(shape, family, monkeypatch):
    cc = torch.cuda.get_device_capability()
    if cc not in KERNEL_CCS or (family == "sm90" and cc != (9, 0)):
        pytest.skip(f"no {family} kernel family on this GPU")
    monkeypatch.setenv("FLASHCORE_FAMILY", family)
    args, kwargs = _inputs(shape, seed=8)
    assert flashcore.explain(*args, **kwargs) == f"kernel {family}"
    outs = [flashcore.sdpa(*args, **kwargs) for _ in range(5)]
    _assert_close_to_aten(outs[0], args, kwargs)
    assert all(torch.equal(o, outs[0]) for o in outs)


# ---- two GPUs -------------------------------------------------------------------------------------

@needs_two_gpus
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=["fp16", "bf16", "fp32_fallback"])
def test_tensors_on_cuda1_run_on_cuda1(dtype):
    prev = torch.cuda.current_device()
    torch.cuda.set_device(0)
    try:
        args, kwargs = _inputs(SHAPES[1], device="cuda:1", dtype=dtype, seed=9)
        why = flashcore.explain(*args, **kwargs)
        if dtype != torch.float32 and torch.cuda.get_device_capability(1) in KERNEL_CCS:
            assert why.startswith("kernel"), why
        out = flashcore.sdpa(*args, **kwargs)
        assert torch.cuda.current_device() == 0, "the op changed the caller's current device"
        torch.cuda.synchronize(1)
        assert out.device == torch.device("cuda:1")
        if dtype == torch.float32:
            assert torch.equal(out, F.scaled_dot_product_attention(*args, **kwargs))
        else:
            _assert_close_to_aten(out, args, kwargs)
            # same bits as the same call made with cuda:1 current
            with torch.cuda.device(1):
                assert torch.equal(out, flashcore.sdpa(*args, **kwargs))
    finally:
        torch.cuda.set_device(prev)


@needs_two_gpus
def test_cuda1_uses_cuda1_current_stream_while_cuda0_is_current():
    prev = torch.cuda.current_device()
    try:
        args, kwargs = _inputs(SHAPES[0], device="cuda:1", seed=10)
        q, k, v = args
        with torch.cuda.device(1):
            expected = flashcore.sdpa(q, k, v, **kwargs)
            torch.cuda.synchronize()
            s1 = torch.cuda.Stream()
            q_late = torch.zeros_like(q)
            torch.cuda.synchronize()
        _busy(s1)  # switches to cuda:1 for the sleep
        with torch.cuda.stream(s1):
            q_late.copy_(q)
            torch.cuda.set_device(0)  # cuda:0 current; cuda:1's current stream stays s1
            out = flashcore.sdpa(q_late, k, v, **kwargs)
            assert torch.cuda.current_device() == 0
        s1.synchronize()
        assert out.device == torch.device("cuda:1")
        assert torch.equal(out, expected), "the op did not run on cuda:1's current stream after the copy"
    finally:
        torch.cuda.set_device(prev)


@needs_two_gpus
def test_kernel_launched_on_cuda1_per_profiler():
    if torch.cuda.get_device_capability(1) not in KERNEL_CCS:
        pytest.skip("no FlashCore kernel on cuda:1")
    prev = torch.cuda.current_device()
    torch.cuda.set_device(0)
    try:
        args, kwargs = _inputs(SHAPES[0], device="cuda:1", seed=11)
        flashcore.sdpa(*args, **kwargs)  # warm-up outside the profiler
        torch.cuda.synchronize(1)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            flashcore.sdpa(*args, **kwargs)
            torch.cuda.synchronize(1)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        if not kernels:
            pytest.skip("the profiler recorded no CUDA kernels here (CUPTI unavailable)")
        ours = [e for e in kernels if "flashcore" in e.name or "fwd_kernel" in e.name]
        assert ours, f"no FlashCore kernel among {[e.name for e in kernels][:10]}"
        assert {e.device_index for e in ours} == {1}, [(e.name, e.device_index) for e in ours]
    finally:
        torch.cuda.set_device(prev)


@needs_two_gpus
def test_mixing_cuda0_and_cuda1_is_an_error_naming_the_argument():
    q = torch.randn(2, 4, 64, 64, device="cuda:1", dtype=torch.float16)
    k = torch.randn(2, 4, 64, 64, device="cuda:0", dtype=torch.float16)
    v = torch.randn(2, 4, 64, 64, device="cuda:1", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"key must be on the same device as query "
                                           r"\(query: cuda:1, key: cuda:0\)"):
        flashcore.sdpa(q, k, v)
    with pytest.raises(RuntimeError, match=r"value must be on the same device as query "
                                           r"\(query: cuda:1, value: cuda:0\)"):
        flashcore.sdpa(q, v, k)
