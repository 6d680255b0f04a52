"""Host time of a training call: forward + backward of flashcore.sdpa (and torch.ops.flashcore.sdpa)
on a small causal call (B=2 H=8 S=256 D=128 bf16), FLASHCORE_TRAINING=auto (the route: aten
below 2048 keys there) and =flashcore (FlashCore's kernels), beside F.scaled_dot_product_attention.
Prints, per callable, microseconds per call of host time (300 calls queued, no sync) and of wall
time (to the end of the GPU work): on so small a call the host is the bottleneck, so the two
agree. Then, unless NO_PROFILE=1, cProfile listings of both routes to $OUT/host_{route,pair}.txt.
    PYTHONPATH=python python3 tools/host_time_training.py"""
import cProfile, io, os, pstats, sys, time, torch, torch.nn.functional as F, flashcore
out = os.environ.get("OUT", "/tmp")
q, k, v = (torch.randn(2, 8, 256, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
g = torch.randn(2, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
def step(fn):
    q.grad = k.grad = v.grad = None
    fn(q, k, v, is_causal=True).backward(g)
def host_us(fn, n=300):
    for _ in range(20): step(fn)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): step(fn)
    t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    return (t1 - t) / n * 1e6, (t2 - t) / n * 1e6
for label, env in (("route", "auto"), ("pair", "flashcore")):
    os.environ["FLASHCORE_TRAINING"] = env
    print(label, "flashcore.sdpa host/wall us per fwd+bwd: %.1f / %.1f" % host_us(flashcore.sdpa), flush=True)
    print(label, "torch.ops.flashcore.sdpa: %.1f / %.1f" % host_us(torch.ops.flashcore.sdpa), flush=True)
print("F.sdpa: %.1f / %.1f" % host_us(F.scaled_dot_product_attention), flush=True)
for label, env in (() if os.environ.get("NO_PROFILE") else (("route", "auto"), ("pair", "flashcore"))):
    os.environ["FLASHCORE_TRAINING"] = env
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): step(flashcore.sdpa)
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    s2 = io.StringIO(); pstats.Stats(pr, stream=s2).sort_stats("cumulative").print_stats(45)
    open(f"{out}/host_{label}.txt", "w").write(s.getvalue() + "\n\n" + s2.getvalue())
