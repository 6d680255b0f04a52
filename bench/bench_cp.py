#!/usr/bin/env python3
"""Context parallelism (issue 37): one Llama-8B-like attention layer sharded along the sequence
over the GPUs of one host, FlashCore as the ring's local kernel against PyTorch's context
parallelism with its own kernels, in one run; and the same calls on one GPU for the scaling.

What it measures
  q (1, 32, S, 128), k and v (1, 8, S, 128) bf16, causal by default (GQA 32:8, enable_gqa=True),
  S from --seqs (64k and 128k by default). Every rank makes the same full tensors (one seed).
  Implementations, each the code a user writes:
    flashcore-cp   flashcore.integrations.context_parallel.enable() (its default way, "gather":
                   K and V all-gathered, one FlashCore call per run of a rank's queries, no
                   merges), flashcore.patched(), then
                   torch.distributed.tensor.experimental.context_parallel(mesh, buffers=[q, k, v,
                   grad_out]) around F.scaled_dot_product_attention.
    flashcore-cp:ring  the same with enable(local="ring"): PyTorch's ring, FlashCore's forward
                   and backward per ring step.
    torch-cp       the same context without FlashCore: PyTorch's ring with the kernel SDPA picks
                   (the row's path names it: torch._fused_sdp_choice on the local shards).
    torch-cp:<b>   the same with torch.nn.attention.sdpa_kernel(<b>) for b in flash, cudnn,
                   efficient, where SDPA takes the local shards with that backend (else the row
                   says "skipped: <why>").
  And on one GPU, the whole sequence (each rank runs it alone on its own GPU; rank 0's times):
    flashcore-1gpu flashcore.sdpa;   torch-1gpu  F.scaled_dot_product_attention (its default).
  PyTorch's context-parallel options stay at their defaults (load balancing for causal calls,
  the all-gather rotation); the row's "cp_options" records them.
  Passes: fwd (no autograd) and fwd+bwd (the forward, then torch.autograd.grad of q, k, v for a
  fixed random grad_out).

Method
  * Correctness first: each sharded call's output and gradients, gathered back
    (context_parallel_unshard), against the one-GPU PyTorch default on the same inputs; max abs
    diff over max(1, max|ref|); WRONG above 2e-2 (bf16 in two summation orders; the ring merges in
    float32) or on a NaN, and a WRONG row is not timed (exit status 1).
  * --rounds rounds; in each, every implementation in turn opens its context, runs --warmup
    untimed calls, then --iters timed ones per pass. Each timed call: a barrier, then CUDA events
    around the call on every rank. A rank's time is its median; the row's ms is the largest over
    the ranks (the layer is done when the slowest rank is).
  * TFLOP/s of the whole layer (all ranks together): forward 4 * pairs * D * Hq, causal pairs
    S (S + 1) / 2, non-causal S^2; fwd+bwd 3.5x the forward.
  * vs_torch_cp = this row's TFLOP/s / torch-cp's (same S and pass); scaling (flashcore-cp rows and
    torch-cp rows) = the same library's one-GPU ms / (GPUs x this row's ms): 1.0 is perfect.

Run (needs 2 CUDA GPUs and NCCL; elsewhere it prints one line saying so and exits 0)
  PYTHONPATH=python python3 bench/bench_cp.py                      # 64k and 128k, causal
  PYTHONPATH=python python3 bench/bench_cp.py --seqs 64k --both    # causal and not
  PYTHONPATH=python python3 bench/bench_cp.py --forced none --profile  # no forced backends; where
                                                                   # each call's GPU time goes
  PYTHONPATH=python python3 bench/bench_cp.py --device cpu --seqs 256 --no-json  # debug on CPU
  Output: a line per row as it is done; JSON (default bench/results/cp_<card>_<date>.json;
  --no-json for none): {sha, dirty, torch, card, gpus, date, method, args, elapsed_s, rows}; each
  row: S, causal, pass, impl, gpus, ms, tflops, vs_torch_cp, scaling, maxdiff, status, path.
"""
import argparse
import contextlib
import datetime as _dt
import json
import os
import socket
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_varlen import RESULTS_DIR, card_slug, first_line, git_sha, inside, parse_tokens  # noqa: E402

D, HQ, HKV = 128, 32, 8
TOL = 2e-2
BWD_FLOP_FACTOR = 2.5
PASSES = ("fwd", "fwd+bwd")
FORCED_BACKENDS = ("flash", "cudnn", "efficient")
# NVLink multicast stays off on shared hosts (the device machines' rule): set here too, for
# programs started with their own environment.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def layer_flops(s, causal, pass_):
    pairs = s * (s + 1) // 2 if causal else s * s
    fwd = 4 * pairs * D * HQ
    return fwd * (1 + BWD_FLOP_FACTOR) if pass_ == "fwd+bwd" else fwd


def relative_max_diff(got, ref):
    return max(((a.float() - b.float()).abs().max() / max(1.0, b.float().abs().max().item())).item()
               for a, b in zip(got, ref))


def sdpa_backend(name):
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def default_backend_name(q, k, v, causal):
    """The backend SDPA's default picks for these tensors (torch._fused_sdp_choice)."""
    try:
        from torch.nn.attention import SDPBackend
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, causal, enable_gqa=True)
        return SDPBackend(choice).name.lower()
    except Exception as e:  # a diagnostic only
        return f"unknown ({first_line(e)})"


# ------------------------------------------------------------------------------ one rank

class RankTimer:
    """CUDA-event times of calls on this rank, each call after a barrier across the ranks (on the
    CPU, --device cpu: wall-clock times, which mean nothing)."""

    def __init__(self, dist, device):
        self.dist, self.cuda = dist, device == "cuda"

    def times_ms(self, fn, warmup, iters, barrier=True):
        for _ in range(warmup):
            fn()
        got = []
        for _ in range(iters):
            if barrier:
                self.dist.barrier()
            if not self.cuda:
                t0 = time.perf_counter()
                fn()
                got.append((time.perf_counter() - t0) * 1e3)
                continue
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            got.append(start.elapsed_time(end))
        return got


def make_inputs(s, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(h):
        return torch.randn((1, h, s, D), generator=g, device=device, dtype=torch.bfloat16)
    return rand(HQ), rand(HKV), rand(HKV), rand(HQ)


def one_gpu_calls(flashcore, F, q, k, v, g, causal):
    """{impl: {pass: fn}} of the one-GPU implementations; fn returns the tensors it computes."""
    def attend_fn(attend):
        def fwd():
            with torch.no_grad():
                return (attend(q, k, v),)

        def fwd_bwd():
            inputs = [t.detach().requires_grad_() for t in (q, k, v)]
            out = attend(*inputs)
            return (out.detach(), *torch.autograd.grad(out, inputs, g))
        return {"fwd": fwd, "fwd+bwd": fwd_bwd}
    return {
        "flashcore-1gpu": attend_fn(lambda a, b, c: flashcore.sdpa(a, b, c, is_causal=causal,
                                                                  enable_gqa=True)),
        "torch-1gpu": attend_fn(lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, is_causal=causal, enable_gqa=True)),
    }


def cp_impls(flashcore, F, local_q, local_k, local_v, causal, forced=FORCED_BACKENDS):
    """{impl: (context factory, path) or reason skipped} of the sharded implementations."""
    from torch.nn.attention import sdpa_kernel
    def flashcore_way(local):
        @contextlib.contextmanager
        def context():
            from flashcore.integrations import context_parallel as fc_cp
            fc_cp.enable(local=local)
            with flashcore.patched():
                yield
        return context
    impls = {"flashcore-cp": (flashcore_way("gather"),
                              "flashcore.patched() + context_parallel, local='gather'"),
             "flashcore-cp:ring": (flashcore_way("ring"),
                                   "flashcore.patched() + context_parallel, local='ring'"),
             "torch-cp": (contextlib.nullcontext,
                          "default: " + default_backend_name(local_q, local_k, local_v, causal))}
    for name in forced:
        try:  # does SDPA take the local shards with this backend? (same answer on every rank)
            with sdpa_kernel(sdpa_backend(name)), torch.no_grad():
                F.scaled_dot_product_attention(local_q, local_k, local_v, is_causal=causal,
                                               enable_gqa=True)
            impls[f"torch-cp:{name}"] = ((lambda b=name: sdpa_kernel(sdpa_backend(b))),
                                         f"sdpa_kernel({name})")
        except Exception as e:
            impls[f"torch-cp:{name}"] = f"skipped: {type(e).__name__}: {first_line(e)}"
    return impls


def sharded_run(mesh, context_parallel, F, q, k, v, g, causal, impl_context, pass_, calls):
    """Open the implementation's context and context_parallel over copies of q, k, v, g; run
    `calls(step)` with step() one sharded call of the pass returning its local results."""
    cq, ck, cv, cg = (t.clone() for t in (q, k, v, g))
    with impl_context(), context_parallel(mesh, buffers=[cq, ck, cv, cg], buffer_seq_dims=[2] * 4):
        def step():
            if pass_ == "fwd":
                with torch.no_grad():
                    return (F.scaled_dot_product_attention(cq, ck, cv, is_causal=causal,
                                                           enable_gqa=True),)
            inputs = [t.detach().requires_grad_() for t in (cq, ck, cv)]
            out = F.scaled_dot_product_attention(*inputs, is_causal=causal, enable_gqa=True)
            return (out.detach(), *torch.autograd.grad(out, inputs, cg))
        return calls(step)


PROFILED = ("flashcore-cp", "flashcore-cp:ring", "torch-cp")
PROFILE_TOP = 8


def kernel_profile(step):
    """One call of step() under torch.profiler: {"gpu_ms": total kernel time, "nccl_ms": the
    collectives' part, "top": [[kernel name (shortened), ms, calls], ...]} on this rank. Where
    the sharded call's time goes: the attention kernels, the ring's merges and copies, NCCL."""
    from torch.profiler import ProfilerActivity, profile
    step()  # (warm: no first-call work in the profile)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        ms, n = kernels.get(ev.name, (0.0, 0))
        kernels[ev.name] = (ms + ev.device_time_total / 1e3, n + 1)
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    return {"gpu_ms": sum(ms for ms, _ in kernels.values()),
            "nccl_ms": sum(ms for name, (ms, _) in kernels.items() if "nccl" in name.lower()),
            "top": [[name[:90], ms, n] for name, (ms, n) in ranked[:PROFILE_TOP]]}


def worker(rank, world, port, args, results):
    os.environ.update(SAFE_ENV)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

    import flashcore
    from flashcore.integrations import context_parallel as fc_cp

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=args.nccl_timeout))
    rows = []
    try:
        mesh = init_device_mesh(args.device, (world,))
        timer = RankTimer(dist, args.device)
        fc_cp.enable()
        for s in args.seqs:
            for causal in args.causal:
                if s % (2 * world):
                    raise SystemExit(f"S={s} must be a multiple of {2 * world} (the ring's shards)")
                _cp_options.enable_load_balance = causal  # PyTorch's rule: head-tail for causal
                options = {k: str(v) for k, v in vars(_cp_options).items()}
                q, k, v, g = make_inputs(s, args.seed, args.device)
                base = {"S": s, "causal": causal, "cp_options": options}

                # One GPU: the reference (PyTorch's default), then the timings.
                single = one_gpu_calls(flashcore, F, q, k, v, g, causal)
                refs = {p: single["torch-1gpu"][p]() for p in PASSES}
                one_gpu_ms = {}
                for impl, fns in single.items():
                    for pass_ in PASSES:
                        got = fns[pass_]()
                        diff = relative_max_diff(got, refs[pass_])
                        del got
                        row = dict(base, impl=impl, gpus=1, **{"pass": pass_}, maxdiff=diff,
                                   status="ok", path="")
                        if impl == "flashcore-1gpu":
                            explain = (flashcore.explain if pass_ == "fwd"
                                       else flashcore.explain_training)
                            row["path"] = explain(q, k, v, is_causal=causal, enable_gqa=True)
                        if not diff <= TOL:
                            row["status"] = "WRONG"
                        else:
                            samples = []
                            for _ in range(args.rounds):
                                samples += timer.times_ms(fns[pass_], args.warmup, args.iters,
                                                          barrier=False)
                            row["ms"] = statistics.median(samples)
                            one_gpu_ms[(impl, pass_)] = row["ms"]
                        rows.append(row)

                # Sharded: each implementation checked once, then timed round by round.
                local = [t.chunk(world, dim=2)[rank] for t in (q, k, v)]
                impls = cp_impls(flashcore, F, *local, causal, args.forced)
                samples = {(impl, p): [] for impl in impls for p in PASSES}
                status = {}
                for impl, spec in impls.items():
                    for pass_ in PASSES:
                        if isinstance(spec, str):
                            status[(impl, pass_)] = (spec, None, "")
                            continue
                        before = dict(fc_cp.calls)
                        try:  # (the same shapes on every rank: a refusal is the same everywhere)
                            got = sharded_run(mesh, context_parallel, F, q, k, v, g, causal,
                                              spec[0], pass_, lambda step: step())
                        except Exception as e:
                            status[(impl, pass_)] = (f"skipped: {type(e).__name__}: {first_line(e)}",
                                                     None, spec[1])
                            continue
                        ran = {op: n - before[op] for op, n in fc_cp.calls.items() if n > before[op]}
                        path = spec[1]
                        if impl.startswith("flashcore-cp"):  # which of FlashCore's handlers ran
                            path += f"; FlashCore's handlers run: {ran or 'none'}"

                        full = context_parallel_unshard(mesh, list(got), [2] * len(got))
                        diff = relative_max_diff(full, refs[pass_])
                        del got, full
                        nan_or_off = not diff <= TOL
                        status[(impl, pass_)] = ("WRONG" if nan_or_off else "ok", diff, path)
                for _ in range(args.rounds):
                    for impl, spec in impls.items():
                        for pass_ in PASSES:
                            if status[(impl, pass_)][0] != "ok":
                                continue
                            samples[(impl, pass_)] += sharded_run(
                                mesh, context_parallel, F, q, k, v, g, causal, spec[0], pass_,
                                lambda step: timer.times_ms(step, args.warmup, args.iters))
                profiles = {}
                if args.profile and cuda:
                    for impl in PROFILED:
                        for pass_ in PASSES:
                            if status.get((impl, pass_), ("",))[0] == "ok":
                                profiles[(impl, pass_)] = sharded_run(
                                    mesh, context_parallel, F, q, k, v, g, causal,
                                    impls[impl][0], pass_, kernel_profile)
                for impl, spec in impls.items():
                    for pass_ in PASSES:
                        state, diff, path = status[(impl, pass_)]
                        ms = statistics.median(samples[(impl, pass_)]) if state == "ok" else None
                        row = dict(base, impl=impl, gpus=world, **{"pass": pass_}, ms=ms,
                                   maxdiff=diff, status=state, path=path)
                        if (impl, pass_) in profiles:
                            row["profile"] = profiles[(impl, pass_)]
                        rows.append(row)
                del q, k, v, g, refs
                if cuda:
                    torch.cuda.empty_cache()
                if rank == 0:
                    print(f"  S={s} causal={causal}: done", file=sys.stderr, flush=True)
        results[rank] = rows
    finally:
        fc_cp.disable()
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ main

def merge_ranks(per_rank, world):
    """The rows of rank 0 with ms the largest over the ranks (sharded rows), TFLOP/s, ratios."""
    rows = per_rank[0]
    for i, row in enumerate(rows):
        if row["gpus"] > 1 and row.get("ms") is not None:
            row["ms"] = max(per_rank[r][i]["ms"] for r in range(world))
        if "profile" in row:  # every rank's, in rank order
            row["profile"] = [per_rank[r][i].get("profile") for r in range(world)]
        row.setdefault("ms", None)
        row["tflops"] = (layer_flops(row["S"], row["causal"], row["pass"]) / (row["ms"] * 1e-3) / 1e12
                         if row["ms"] else None)
    def find(s, causal, pass_, impl):
        return next((r for r in rows if (r["S"], r["causal"], r["pass"], r["impl"]) ==
                     (s, causal, pass_, impl)), None)
    for row in rows:
        key = (row["S"], row["causal"], row["pass"])
        torch_cp = find(*key, "torch-cp")
        row["vs_torch_cp"] = (row["tflops"] / torch_cp["tflops"]
                              if row["gpus"] > 1 and row["tflops"] and torch_cp and torch_cp["tflops"]
                              else None)
        single = {"flashcore-cp": "flashcore-1gpu", "flashcore-cp:ring": "flashcore-1gpu",
                  "torch-cp": "torch-1gpu"}.get(row["impl"])
        one = find(*key, single) if single else None
        row["scaling"] = (one["ms"] / (row["gpus"] * row["ms"])
                          if one and one["ms"] and row["ms"] else None)
    return rows


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_rows(rows):
    print(f"{'S':>7} {'causal':>6} {'pass':<8} {'impl':<20} {'gpus':>4} {'ms':>9} {'TFLOP/s':>8} "
          f"{'vs torch-cp':>11} {'scaling':>7} {'maxdiff':>8}  status / path")
    for r in rows:
        print(f"{r['S']:>7} {str(r['causal']):>6} {r['pass']:<8} {r['impl']:<20} {r['gpus']:>4} "
              f"{fmt(r['ms'], '.2f'):>9} {fmt(r['tflops'], '.0f'):>8} {fmt(r['vs_torch_cp'], '.3f'):>11} "
              f"{fmt(r['scaling'], '.3f'):>7} {fmt(r['maxdiff'], '.1e'):>8}  {r['status']}"
              f"{'  ' + r['path'] if r['path'] else ''}")
    for r in rows:
        for rank, prof in enumerate(r.get("profile") or []):
            if not prof:
                continue
            print(f"profile S={r['S']} causal={r['causal']} {r['pass']} {r['impl']} rank {rank}: "
                  f"kernels {prof['gpu_ms']:.2f} ms, NCCL {prof['nccl_ms']:.2f} ms")
            for name, ms, n in prof["top"]:
                print(f"    {ms:9.3f} ms {n:4d}x  {name}")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog="The module docstring says what is measured and how.")
    ap.add_argument("--seqs", type=parse_tokens, default=[65536, 131072], metavar="S[,S...]",
                    help="sequence lengths, e.g. 64k,128k (the default)")
    ap.add_argument("--both", action="store_true", help="non-causal rows too (default: causal)")
    ap.add_argument("--gpus", type=int, default=2, help="ranks, one GPU each (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the implementations (2)")
    ap.add_argument("--iters", type=int, default=3, help="timed calls per round and pass (3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls per round and pass (1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nccl-timeout", type=int, default=300, help="seconds (300)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: debug the calls, checks and JSON on CPU processes (gloo); give a "
                         "small --seqs (e.g. 256); times mean nothing")
    ap.add_argument("--forced", type=lambda x: tuple(b for b in x.split(",") if b and b != "none"),
                    default=FORCED_BACKENDS, metavar="B[,B...]",
                    help="PyTorch's CP with these SDPA backends forced too (default flash,cudnn,"
                         "efficient; none for only its default)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one call of flashcore-cp (both ways) and torch-cp per pass (torch.profiler "
                         "on every rank): GPU time per kernel, the top kernels kept in the row")
    ap.add_argument("--json", default=None, help="output path (default bench/results/cp_<card>_<date>.json)")
    ap.add_argument("--no-json", action="store_true")
    args = ap.parse_args(argv)
    args.causal = [True, False] if args.both else [True]
    for name in ("gpus", "rounds", "iters"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not (torch.cuda.is_available() and torch.cuda.device_count() >= args.gpus
            and torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        print(f"bench_cp: needs {args.gpus} CUDA GPUs and NCCL (found {found} GPUs); nothing run")
        return 0
    from flashcore.integrations import context_parallel as fc_cp
    if not fc_cp.available():
        print(f"bench_cp: torch {torch.__version__} has no context-parallel internals; nothing run")
        return 0
    os.environ.update(SAFE_ENV)
    import torch.multiprocessing as mp
    sha, dirty = git_sha()
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"FlashCore context-parallel bench  sha={sha}{' (dirty)' if dirty else ''}  "
          f"torch={torch.__version__}  {args.gpus} x {card}", flush=True)
    started = time.time()
    results = mp.Manager().dict()
    mp.spawn(worker, args=(args.gpus, free_port(), args, results), nprocs=args.gpus, join=True)
    rows = merge_ranks([results[r] for r in range(args.gpus)], args.gpus)
    print_rows(rows)
    if not args.no_json:
        now = _dt.datetime.now()
        path = args.json or os.path.join(RESULTS_DIR, f"cp_{card_slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__, card=card, gpus=args.gpus,
                   date=now.isoformat(timespec="seconds"),
                   method="bench/bench_cp.py docstring",
                   args={k: v for k, v in vars(args).items()},
                   elapsed_s=round(time.time() - started, 1), rows=rows)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        where = os.path.relpath(path, os.path.dirname(RESULTS_DIR)) if inside(path, RESULTS_DIR) else path
        print(f"wrote {where}")
    return 1 if any(r["status"] == "WRONG" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
