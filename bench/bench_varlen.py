#!/usr/bin/env python3
"""Packed variable-length attention (issue 35): flashcore.varlen_attn, PyTorch's varlen_attn and
FlashCore's dense SDPA at about the same FLOPs, forward and forward+backward, in one run.

What it measures
  Causal bf16 attention over documents packed along dim 0: query, key, value (total_tokens, H, D),
  contiguous, one int32 offset tensor cu_seq for both sides (Sq == Sk in every document).
  Implementations, on the same inputs:
    flashcore-varlen  flashcore.varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len,
                      window_size=(-1, 0)) (enable_gqa=True for GQA). Its time includes its host
                      work (today a host loop over the documents that first reads the offsets,
                      python/flashcore/varlen.py): the GPU waits for it between the events.
    torch-varlen      torch.nn.attention.varlen.varlen_attn where this torch has it, causal passed
                      the way its signature takes it (inspect: window_size=(-1, 0), else
                      is_causal=True; enable_gqa only where it takes one). Absent, or raising for a
                      shape: the row says "skipped: <why>", the run goes on.
    flashcore-dense   flashcore.sdpa(q, k, v, is_causal=True) on ONE sequence (1, H, S, D) (a
                      transposed (1, S, H, D) tensor, the layout of varlen's per-document views),
                      S = sqrt(sum L_i^2) rounded to a multiple of 128: about the causal pairs of
                      the mix, so it tells what the same work costs as one long sequence.
  Mixes, for each --tokens total (16k and 64k by default):
    loguniform   document lengths drawn log-uniformly in [64, 8192] (Python's random, --seed),
                 the last document cut so the total is exact
    all-1024     documents of 1024 tokens
    8k+64s       one document of 8192 tokens, then documents of 64
  Heads: D=128 with 16:16 (query:kv) heads, D=64 with 32:32, and GQA D=128 with 32:8 (--heads
  names others, e.g. 256:8:4 for a Gemma-like D=256).
  Passes: fwd (under no_grad) and fwd+bwd (the forward, then torch.autograd.grad of the output
  with respect to (q, k, v) for a fixed random grad_out).

Method (bench/bench.py's; docs/experiments/method.md)
  * Correctness first: every impl's output (fwd) or (dq, dk, dv) (fwd+bwd) is compared with
    PyTorch's SDPA run document by document on the same tensors (the dense row: on its one
    sequence); max abs diff over max(1, max|ref|). WRONG above 4e-2 (bf16) or on a NaN, and a
    WRONG row is not timed (exit status 1).
  * --warmup calls of each impl, then --iters rounds in which every impl takes one call in turn
    (drift and clock swings hit all alike); each call between its own pair of CUDA events, L2
    flushed before it by writing a 256 MB buffer (outside the events). Reported: the median, ms.
  * FLOPs: forward 4 * sum_i L_i (L_i + 1) / 2 * D * Hq (each document's causal pairs); the dense
    row S (S + 1) / 2 pairs; fwd+bwd counts the forward plus a backward of 2.5x it (3.5x).
  * vs_torch_varlen = this row's TFLOP/s / torch-varlen's, vs_dense = this row's TFLOP/s /
    flashcore-dense's, same mix, heads and pass (> 1: this row does more per second; between the
    two varlen impls, whose FLOPs are the same, it is their time ratio).

Run
  PYTHONPATH=python python3 bench/bench_varlen.py               # 16k and 64k tokens, all heads
  PYTHONPATH=python python3 bench/bench_varlen.py --quick       # 16k, D=128 only, 10 iterations
  PYTHONPATH=python python3 bench/bench_varlen.py --tokens 32k --iters 50 --json out.json
  PYTHONPATH=python python3 bench/bench_varlen.py --device cpu  # debug: the calls, checks and
                             # JSON on the CPU, 1k tokens (one document per mix at that size; a
                             # larger --tokens is slow there), wall-clock times that mean nothing;
                             # torch-varlen rows say why they are skipped (its kernel needs CUDA)
  Without CUDA (and without --device cpu) it prints one line saying so and exits 0.
  Output: the table on stdout, a line per row as it is done; a progress line per mix and heads
  on stderr. JSON (default bench/results/varlen_<card-slug>_<YYYY-MM-DD_HHMM>.json; --no-json
  for none): {sha (FLASHCORE_SHA, .git-sha or git), dirty, torch, card, date, method,
  torch_varlen (how causal was passed, or why skipped), args, elapsed_s, mixes (each mix's
  document lengths), rows}; each row: mix, tokens, docs, max_len, D, Hq, Hkv, causal, dtype,
  pass ("fwd" / "fwd+bwd"), impl, dense_S, ms, tflops, vs_torch_varlen, vs_dense, maxdiff,
  status ("ok", "fallback", "WRONG ...", "skipped: <why>"), path (flashcore-varlen:
  explain_varlen(); flashcore-dense: explain() /
  explain_training(); torch-varlen: how causal was passed).
"""
import argparse
import datetime as _dt
import inspect
import itertools
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "bench", "results")
FLUSH_BYTES = 256 << 20
DTYPE = torch.bfloat16
TOL = 4e-2                  # max relative abs diff against the reference that counts as WRONG
BWD_FLOP_FACTOR = 2.5       # the backward's FLOPs over the forward's
DENSE_MULTIPLE = 128        # the dense row's S is a multiple of this
SHORTEST_DOC, LONGEST_DOC = 64, 8192
MIXES = ("loguniform", "all-1024", "8k+64s")
HEAD_CONFIGS = ((128, 16, 16), (64, 32, 32), (128, 32, 8))   # (D, Hq, Hkv)
PASSES = ("fwd", "fwd+bwd")


# --------------------------------------------------------------------------- mixes and FLOPs

def parse_heads(text):
    """"D:Hq:Hkv[,D:Hq:Hkv...]" -> ((D, Hq, Hkv), ...)."""
    configs = []
    for part in text.split(","):
        try:
            d, hq, hkv = (int(x) for x in part.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--heads wants D:Hq:Hkv[,...], got {part!r}") from None
        if min(d, hq, hkv) < 1 or hq % hkv:
            raise argparse.ArgumentTypeError(f"--heads {part!r}: sizes must be positive and Hq a multiple of Hkv")
        configs.append((d, hq, hkv))
    return tuple(configs)


def parse_tokens(text):
    """'16k,64k' or '16384,65536' -> [16384, 65536]."""
    totals = []
    for word in text.split(","):
        word = word.strip().lower()
        if not word:
            continue
        match = re.fullmatch(r"(\d+)(k?)", word)
        if not match:
            raise argparse.ArgumentTypeError(f"token count {word!r}: a number, e.g. 16384 or 16k")
        n = int(match.group(1)) * (1024 if match.group(2) else 1)
        if n < 1:
            raise argparse.ArgumentTypeError("token counts must be positive")
        totals.append(n)
    if not totals:
        raise argparse.ArgumentTypeError("no token count given")
    return totals


def cut_to_total(lengths, total):
    """The first lengths of the iterable `lengths` that reach `total` tokens, the last one cut so
    that they sum to exactly `total`."""
    docs, covered = [], 0
    for n in lengths:
        if covered >= total:
            break
        n = min(n, total - covered)
        docs.append(n)
        covered += n
    if covered != total:
        raise ValueError(f"the lengths ran out at {covered} of {total} tokens")
    return docs


def loguniform_lengths(seed, shortest=SHORTEST_DOC, longest=LONGEST_DOC):
    """Endless document lengths drawn log-uniformly in [shortest, longest] from a fixed seed."""
    rng = random.Random(seed)
    lo, hi = math.log(shortest), math.log(longest)
    while True:
        yield min(longest, max(shortest, round(math.exp(rng.uniform(lo, hi)))))


def document_lengths(mix, total, seed):
    """The document lengths of mix `mix` (MIXES) at `total` tokens."""
    if mix == "loguniform":
        source = loguniform_lengths(seed)
    elif mix == "all-1024":
        source = itertools.repeat(1024)
    elif mix == "8k+64s":
        source = itertools.chain([8192], itertools.repeat(64))
    else:
        raise ValueError(f"unknown mix {mix!r}; one of {MIXES}")
    return cut_to_total(source, total)


def cu_seq_offsets(lengths, device):
    """int32 (N + 1,) offsets of the documents: 0, L_0, L_0 + L_1, ..."""
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32,
                        device=device)


def causal_pairs(n):
    """(query, key) pairs a causal document of n tokens computes (Sq == Sk)."""
    return n * (n + 1) // 2


def forward_flops(lengths, d, hq):
    """4 * sum of the documents' causal pairs * D * Hq (QK^T and PV, 2 FLOPs per multiply-add)."""
    return 4 * sum(causal_pairs(n) for n in lengths) * d * hq


def pass_flops(fwd_flops, pass_):
    return fwd_flops * (1 + BWD_FLOP_FACTOR) if pass_ == "fwd+bwd" else fwd_flops


def dense_length(lengths, multiple=DENSE_MULTIPLE):
    """S of the one dense sequence with about the mix's causal pairs: sqrt(sum L_i^2) rounded to
    a multiple of `multiple` (at least one multiple)."""
    root = math.sqrt(sum(n * n for n in lengths))
    return max(multiple, multiple * round(root / multiple))


# --------------------------------------------------------------------------- implementations

def torch_varlen_function():
    """(call, how, None) for PyTorch's varlen_attn, call(q, k, v, cu_seq, max_len, gqa) running it
    causal the way this release's signature takes it, how saying which; (None, None, why) where
    this torch has none that can be called causal."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, None, f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn"
    try:
        params = inspect.signature(varlen_attn).parameters
    except (TypeError, ValueError) as e:
        return None, None, f"cannot read the signature of torch's varlen_attn ({e})"
    if "window_size" in params:
        causal, how = {"window_size": (-1, 0)}, "window_size=(-1, 0)"
    elif "is_causal" in params:
        causal, how = {"is_causal": True}, "is_causal=True"
    else:
        return None, None, (f"torch {torch.__version__}'s varlen_attn takes neither window_size "
                            f"nor is_causal (signature {inspect.signature(varlen_attn)})")
    takes_gqa = "enable_gqa" in params

    def call(q, k, v, cu_seq, max_len, gqa):
        extra = {"enable_gqa": True} if gqa and takes_gqa else {}
        return varlen_attn(q, k, v, cu_seq, cu_seq, max_len, max_len, **causal, **extra)

    return call, how, None


def per_document_sdpa(q, k, v, lengths, gqa):
    """The reference: F.scaled_dot_product_attention, causal, on each document's (1, H, L, D)
    view, concatenated back to (total, Hq, D). Differentiable."""
    outs, start = [], 0
    for n in lengths:
        views = [t[start:start + n].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*views, is_causal=True, enable_gqa=gqa)
        outs.append(out[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


def run_pass(attend, inputs, grad_out, pass_):
    """A zero-argument call running `attend` for one pass: the output (fwd, under no_grad), or
    the gradients of (q, k, v) for grad_out (fwd+bwd). Returns a tuple of tensors."""
    if pass_ == "fwd":
        def call():
            with torch.no_grad():
                return (attend(),)
    else:
        def call():
            return torch.autograd.grad(attend(), inputs, grad_out)
    return call


def relative_max_diff(got, ref):
    """max over the tensors of max|got - ref| / max(1, max|ref|)."""
    return max(((a.float() - b.float()).abs().max() / max(1.0, b.float().abs().max().item())).item()
               for a, b in zip(got, ref))


def first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def dense_path(flashcore, q, k, v, gqa, pass_):
    """What FlashCore says the dense call runs: explain() for fwd, explain_training() for
    fwd+bwd. Never raises."""
    try:
        if pass_ == "fwd":
            return flashcore.explain(q, k, v, is_causal=True, enable_gqa=gqa)
        return flashcore.explain_training(q, k, v, is_causal=True, enable_gqa=gqa)
    except Exception as e:  # a diagnostic: its failure must not stop the bench
        return f"unknown ({first_line(e)})"


def varlen_path(flashcore, q, k, v, cu_seq, max_len, gqa, pass_):
    """What flashcore.explain_varlen says the packed call runs (fwd: without autograd, as it is
    timed; fwd+bwd: a training call). Never raises; "" where this flashcore has no explain_varlen."""
    explain = getattr(flashcore, "explain_varlen", None)
    if explain is None:
        return ""
    try:
        with torch.set_grad_enabled(pass_ != "fwd"):
            return explain(q, k, v, cu_seq, cu_seq, max_len, max_len, window_size=(-1, 0), enable_gqa=gqa)
    except Exception as e:  # a diagnostic: its failure must not stop the bench
        return f"unknown ({first_line(e)})"


# --------------------------------------------------------------------------- timing

class Timer:
    """Median ms of several calls, timed call by call in turn (CUDA events, L2 flushed before each
    call); on the CPU (--device cpu, debugging only) wall-clock times."""

    def __init__(self, device, warmup, iters):
        self.device, self.warmup, self.iters = device, warmup, iters
        self.flush_buf = (torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
                          if device == "cuda" else None)

    def median_ms(self, calls):
        """{name: median ms} of the calls {name: fn}: round i of every call before round i + 1
        of any."""
        for fn in calls.values():
            for _ in range(self.warmup):
                fn()
        if self.device != "cuda":
            times = {name: [] for name in calls}
            for _ in range(self.iters):
                for name, fn in calls.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append((time.perf_counter() - t0) * 1e3)
            return {name: statistics.median(ms) for name, ms in times.items()}
        torch.cuda.synchronize()  # the warm-up's queued work must not land inside the events
        def event():
            return torch.cuda.Event(enable_timing=True)
        events = {name: [(event(), event()) for _ in range(self.iters)] for name in calls}
        for i in range(self.iters):
            for name, fn in calls.items():
                start, end = events[name][i]
                self.flush_buf.zero_()  # evict L2; before the start event, so not timed
                start.record()
                fn()
                end.record()
        torch.cuda.synchronize()
        return {name: statistics.median(s.elapsed_time(e) for s, e in pairs)
                for name, pairs in events.items()}


# ------------------------------------------------------------------- one mix, one head config

def random_tensor(shape, generator, device):
    return torch.randn(shape, generator=generator, device=device, dtype=DTYPE)


def base_row(mix, lengths, d, hq, hkv, pass_, impl, dense_s):
    return {"mix": mix, "tokens": sum(lengths), "docs": len(lengths), "max_len": max(lengths),
            "D": d, "Hq": hq, "Hkv": hkv, "causal": True, "dtype": "bf16", "pass": pass_,
            "impl": impl, "dense_S": dense_s, "ms": None, "tflops": None, "vs_torch_varlen": None,
            "vs_dense": None, "maxdiff": None, "status": "ok", "path": None}


def run_mix(mix, lengths, d, hq, hkv, timer, torch_varlen, flashcore, device, seed, on_row):
    """The rows of one mix and head config, both passes: check every impl, time the right ones
    in turn, call on_row(row) for each row as it is done, and return the rows."""
    tv_call, tv_how, tv_missing = torch_varlen
    gqa = hq != hkv
    total, max_len = sum(lengths), max(lengths)
    s = dense_length(lengths)
    g = torch.Generator(device=device).manual_seed(seed)
    # Packed (total, H, D) and dense (1, H, S, D) (transposed (1, S, H, D)) inputs.
    q, k, v = (random_tensor((total, h, d), g, device).requires_grad_() for h in (hq, hkv, hkv))
    grad_out = random_tensor((total, hq, d), g, device)
    dq, dk, dv = (random_tensor((1, s, h, d), g, device).transpose(1, 2).requires_grad_()
                  for h in (hq, hkv, hkv))
    dense_grad_out = random_tensor((1, s, hq, d), g, device).transpose(1, 2)
    cu_seq = cu_seq_offsets(lengths, device)

    attends = {  # impl: (attend, its inputs, its grad_out) or the reason it cannot run
        "flashcore-varlen": (lambda: flashcore.varlen_attn(q, k, v, cu_seq, cu_seq, max_len,
                                                           max_len, window_size=(-1, 0),
                                                           enable_gqa=gqa),
                             (q, k, v), grad_out),
        "torch-varlen": ((lambda: tv_call(q, k, v, cu_seq, max_len, gqa), (q, k, v), grad_out)
                         if tv_call is not None else tv_missing),
        "flashcore-dense": (lambda: flashcore.sdpa(dq, dk, dv, is_causal=True, enable_gqa=gqa),
                            (dq, dk, dv), dense_grad_out),
    }
    references = {
        "packed": (lambda: per_document_sdpa(q, k, v, lengths, gqa), (q, k, v), grad_out),
        "dense": (lambda: F.scaled_dot_product_attention(dq, dk, dv, is_causal=True,
                                                         enable_gqa=gqa),
                  (dq, dk, dv), dense_grad_out),
    }
    fwd_flops = {"packed": forward_flops(lengths, d, hq), "dense": 4 * causal_pairs(s) * d * hq}

    rows = []
    for pass_ in PASSES:
        refs = {name: run_pass(*spec, pass_)() for name, spec in references.items()}
        pass_rows, calls = {}, {}
        for impl, spec in attends.items():
            side = "dense" if impl == "flashcore-dense" else "packed"
            row = base_row(mix, lengths, d, hq, hkv, pass_, impl, s)
            pass_rows[impl] = row
            if impl == "torch-varlen":
                row["path"] = tv_how
            elif impl == "flashcore-dense":
                row["path"] = dense_path(flashcore, dq, dk, dv, gqa, pass_)
            else:
                row["path"] = varlen_path(flashcore, q, k, v, cu_seq, max_len, gqa, pass_)
            if isinstance(spec, str):
                row["status"] = f"skipped: {spec}"
                continue
            call = run_pass(*spec, pass_)
            try:
                got = call()
            except Exception as e:  # a release or shape the impl refuses: say why, go on
                row["status"] = f"skipped: {type(e).__name__}: {first_line(e)}"
                continue
            if device == "cuda":
                torch.cuda.synchronize()
            nan = any(bool(torch.isnan(t).any()) for t in got)
            row["maxdiff"] = relative_max_diff(got, refs[side])
            del got
            if nan or not row["maxdiff"] <= TOL:
                row["status"] = "WRONG" + (" (NaN)" if nan else "")
                continue
            path = row["path"] or ""
            if impl == "flashcore-dense" and path.startswith(("fallback", "aten", "unknown")):
                row["status"] = "fallback"
            calls[impl] = call
        del refs
        ms = timer.median_ms(calls) if calls else {}
        for impl, row in pass_rows.items():
            if impl in ms:
                side = "dense" if impl == "flashcore-dense" else "packed"
                row["ms"] = ms[impl]
                row["tflops"] = pass_flops(fwd_flops[side], pass_) / (ms[impl] * 1e-3) / 1e12
        torch_tflops = pass_rows["torch-varlen"]["tflops"]
        dense_tflops = pass_rows["flashcore-dense"]["tflops"]
        for row in pass_rows.values():
            if row["tflops"] is not None:
                row["vs_torch_varlen"] = row["tflops"] / torch_tflops if torch_tflops else None
                row["vs_dense"] = row["tflops"] / dense_tflops if dense_tflops else None
            rows.append(row)
            on_row(row)
    return rows


# --------------------------------------------------------------------------- output

TABLE_HEADER = (f"{'mix':<10} {'tokens':>6} {'docs':>5} {'D':>4} {'Hq:Hkv':>6} {'pass':<7} "
                f"{'impl':<16} {'ms':>9} {'TFLOP/s':>8} {'vs torch':>8} {'vs dense':>8} "
                f"{'maxdiff':>8}  status")


def fmt(value, spec):
    """value in format spec, or "-" as wide as the spec's width where there is none."""
    if value is None:
        return "-".rjust(int(re.match(r"\d*", spec).group() or 0))
    return format(value, spec)


def print_row(row):
    print(f"{row['mix']:<10} {row['tokens']:>6} {row['docs']:>5} {row['D']:>4} "
          f"{str(row['Hq']) + ':' + str(row['Hkv']):>6} {row['pass']:<7} {row['impl']:<16} "
          f"{fmt(row['ms'], '9.3f')} {fmt(row['tflops'], '8.1f')} "
          f"{fmt(row['vs_torch_varlen'], '8.3f')} {fmt(row['vs_dense'], '8.3f')} "
          f"{fmt(row['maxdiff'], '8.1e')}  {row['status']}"
          + (f"  [{row['path']}]" if row["impl"] != "torch-varlen" and row["path"] else ""),
          flush=True)


def print_summary(rows):
    """Geometric means of flashcore-varlen's ratios, per pass."""
    print("\nflashcore-varlen, geometric mean over the rows timed:")
    for pass_ in PASSES:
        mine = [r for r in rows if r["impl"] == "flashcore-varlen" and r["pass"] == pass_]
        parts = []
        for key, words in (("vs_torch_varlen", "vs torch-varlen"), ("vs_dense", "vs dense")):
            values = [r[key] for r in mine if r[key]]
            if values:
                geo = math.exp(sum(math.log(x) for x in values) / len(values))
                parts.append(f"{words} {geo:.3f} (min {min(values):.3f}, max {max(values):.3f}, "
                             f"{len(values)} rows)")
            else:
                parts.append(f"{words} -")
        print(f"  {pass_:<7} " + "; ".join(parts))


def git_sha():
    """(sha, dirty): FLASHCORE_SHA, else the .git-sha file (the tree sent to a GPU machine), else
    git where this tree is its repository's top level; ("unknown", None) otherwise."""
    if os.environ.get("FLASHCORE_SHA"):
        return os.environ["FLASHCORE_SHA"], None
    try:
        with open(os.path.join(REPO, ".git-sha")) as f:
            sha = f.read().strip()
        if sha:
            return sha, None
    except OSError:
        pass

    def git(*args):
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else None
    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or os.path.realpath(top) != os.path.realpath(REPO):
            return "unknown", None
        status = git("status", "--porcelain")
        return git("rev-parse", "HEAD") or "unknown", (None if status is None else bool(status))
    except Exception:
        return "unknown", None


def card_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-card"


def inside(path, folder):
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, top]) == top


# --------------------------------------------------------------------------- main

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="The module docstring (top of the file) says what is measured and how.")
    ap.add_argument("--quick", action="store_true",
                    help="16k tokens, D=128 only (16:16 and GQA 32:8), 2 warm-up calls and 10 "
                         "iterations unless given (under a minute on an H100)")
    ap.add_argument("--tokens", type=parse_tokens, default=None, metavar="N[,N...]",
                    help="tokens per batch, e.g. 16k,64k (the default; --quick: 16k; "
                         "--device cpu: 1k)")
    ap.add_argument("--heads", type=parse_heads, default=None, metavar="D:Hq:Hkv[,...]",
                    help="head configs (default 128:16:16,64:32:32,128:32:8; --quick: the D=128 ones)")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed rounds (default 30; --quick 10; --device cpu 2)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed calls of each impl first (default 5; --quick 2; --device cpu 0)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the log-uniform mix's lengths and of the inputs (default 0)")
    ap.add_argument("--json", metavar="PATH",
                    help="JSON output (default bench/results/varlen_<card>_<YYYY-MM-DD_HHMM>.json)")
    ap.add_argument("--no-json", action="store_true", help="write no JSON")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: debugging only, runs the calls and the JSON on tiny sizes (times "
                         "mean nothing; JSON only to an explicit --json outside bench/results)")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if args.tokens is None:
        args.tokens = [1024] if cpu else [16384] if args.quick else [16384, 65536]
    if args.iters is None:
        args.iters = 2 if cpu else 10 if args.quick else 30
    if args.warmup is None:
        args.warmup = 0 if cpu else 2 if args.quick else 5
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters must be at least 1 and --warmup at least 0")
    if cpu and args.json and not args.no_json and inside(args.json, RESULTS_DIR):
        ap.error("a --device cpu run never writes into bench/results/ (its times mean nothing)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_varlen.py: needs a CUDA GPU (torch.cuda.is_available() is False); nothing "
              "measured (--device cpu runs the calls on tiny sizes, for debugging)", flush=True)
        return 0
    import flashcore  # after the CUDA check: a failure here is an error, the point is to time it

    configs = list(args.heads) if args.heads else [c for c in HEAD_CONFIGS if not args.quick or c[0] == 128]
    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    sha, dirty = git_sha()
    now = _dt.datetime.now()
    torch_varlen = torch_varlen_function()
    method = (f"{args.warmup} warm-up calls per impl, then median of {args.iters} rounds, the "
              f"impls taking one call each in turn per round, "
              + (f"each call between its own CUDA events, L2 flushed before it by writing a "
                 f"{FLUSH_BYTES >> 20} MB buffer (untimed)" if args.device == "cuda"
                 else "wall-clock on the CPU (debugging, not a measurement)")
              + f"; bf16 randn inputs, causal; FLOPs 4*sum(L(L+1)/2)*D*Hq forward, "
                f"x{1 + BWD_FLOP_FACTOR} fwd+bwd; checked first against per-document "
                f"F.scaled_dot_product_attention (relative max diff, WRONG above {TOL})")
    print(f"FlashCore varlen bench  sha={sha}{' (dirty)' if dirty else ''}  "
          f"torch={torch.__version__}  card={card}  {now:%Y-%m-%d %H:%M}")
    print(f"method: {method}")
    tv_call, tv_how, tv_missing = torch_varlen
    print(f"torch-varlen: {'causal as ' + tv_how if tv_call else 'skipped: ' + tv_missing}")
    print("vs torch / vs dense: this row's TFLOP/s over torch-varlen's / flashcore-dense's "
          "(> 1: ahead); flashcore-dense runs one (1, H, S, D) sequence, S = sqrt(sum L^2) "
          f"rounded to {DENSE_MULTIPLE}\n")
    print(TABLE_HEADER, flush=True)

    timer = Timer(args.device, args.warmup, args.iters)
    jobs = [(tokens, mix, config) for tokens in args.tokens for mix in MIXES for config in configs]
    mixes = {f"{mix}@{tokens}": document_lengths(mix, tokens, args.seed)
             for tokens in args.tokens for mix in MIXES}
    rows, t0 = [], time.time()
    for i, (tokens, mix, (d, hq, hkv)) in enumerate(jobs):
        lengths = mixes[f"{mix}@{tokens}"]
        rows += run_mix(mix, lengths, d, hq, hkv, timer, torch_varlen, flashcore, args.device,
                        args.seed + i, print_row)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        elapsed = time.time() - t0
        left = elapsed / (i + 1) * (len(jobs) - i - 1)
        print(f"progress {i + 1}/{len(jobs)} {mix} tokens={tokens} D={d} {hq}:{hkv}: "
              f"{elapsed:.1f} s elapsed, ~{left:.0f} s left", file=sys.stderr, flush=True)
    elapsed = time.time() - t0
    print_summary(rows)
    wrong = [r for r in rows if r["status"].startswith("WRONG")]
    print(f"\n{len(rows)} rows, {elapsed:.1f} s" + (f"; {len(wrong)} WRONG (not timed)" if wrong
                                                    else ""))

    if args.no_json or (args.device == "cpu" and not args.json):
        print("JSON: not written" + ("" if args.no_json else
                                     " (a --device cpu run writes one only to --json PATH)"))
    else:
        path = args.json or os.path.join(RESULTS_DIR,
                                         f"varlen_{card_slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__, card=card,
                   date=now.isoformat(timespec="seconds"), method=method,
                   torch_varlen=tv_how or f"skipped: {tv_missing}",
                   args={k: v for k, v in vars(args).items()}, elapsed_s=round(elapsed, 1),
                   mixes=mixes, rows=rows)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"JSON: {path}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
