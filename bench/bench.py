#!/usr/bin/env python3
"""FlashCore attention-forward benchmark, side by side with PyTorch's SDPA backends.

What it measures
  The forward time of scaled-dot-product attention, per call, for these implementations,
  all in one process on the same inputs:
    flashcore       flashcore.sdpa with FLASHCORE_FAMILY=auto: torch.ops.flashcore.sdpa's
                    kernels; a call without gradients goes through its twin without an
                    Autograd kernel, flashcore::_sdpa_inference (flashcore/_entry.py)
    flashcore-sm80  the same with FLASHCORE_FAMILY=sm80 (forced family)
    cudnn / flash / efficient
                    F.scaled_dot_product_attention inside
                    torch.nn.attention.sdpa_kernel(CUDNN_ATTENTION / FLASH_ATTENTION /
                    EFFICIENT_ATTENTION). A backend that refuses a shape is skipped there.
  Shapes (default set; fp16, bf16 too with --bf16):
    small:  B=1, H=8, S=512, D=64, causal and not; also timed inside a CUDA graph.
    sweep:  16k tokens per batch (B = 16384/S), hidden 2048 (H = 2048/D),
            S in 512 1k 2k 4k 8k 16k, D in 64 128 256, causal and not.
    decode: Sq=1 against Sk = 1k/8k/32k/128k (where K+V fit in 24 GB), B = 1/8/32, Hq=32 over
            Hkv = 32 or 8, D=128
            (memory-bound: compare `us` with the row's `floor_us`, the Q+K+V+O bytes at 3.0 TB/s).
    masked: a HuggingFace-style bool attn_mask of shape (B, 1, S, S) (causal, and each batch
            left-padded by a different amount), 16k tokens, S 4k at D 64/128/256 and S 1k at D 128;
            labels end in "bmask". The same mask goes to every implementation (flash takes none:
            skipped).
            TFLOP/s counts all S*S pairs (no implementation skips masked tiles).
    --extra adds a GQA 32:8 causal prefill shape, two D=96 (Phi-3-mini) prefill shapes, and
            small grids: chunks of 128-512 queries against a 4k-32k cache (GQA 32:8) and a
            B=1 causal prefill, also timed inside a CUDA graph; and backward rows at head dims 32,
            80 and 96 (1k / 4k / 16k keys, 16k tokens, causal or not).
    --quick runs a handful of these (smoke test).
  Backward rows (pass "bwd"; issue 6 and the training issue): the time of the backward alone,
    from a saved forward (torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) after one
    forward under the implementation's backend), for
      flashcore       what a training call of torch.ops.flashcore.sdpa runs: its backward (the
                      fused kernel the C layer picks, or the Python backward for what no kernel
                      covers, e.g. a mask), or aten's where FlashCore's training route sends the
                      call to aten for both passes (the row is then "fallback"; `training`
                      holds flashcore.explain_training()); the forward family does not matter
      flashcore-sm80  the same with FLASHCORE_FAMILY=sm80 around both passes: the sm80-class
                      backward's default (one pass, dQ through fp32 atomics), what Ada runs
      flashcore-det   the same with torch.use_deterministic_algorithms(True, warn_only=True)
                      around the backward call only (restored after), which makes FlashCore run
                      its deterministic sm80-class backward kernel; its forward runs under
                      FLASHCORE_TRAINING=flashcore, so that the training route cannot hand the
                      call to aten; deterministic mode's NaN fill of fresh tensors is turned
                      off there, so the row times the kernels
      cudnn / flash / efficient
                      PyTorch's backward of the forward taken under that backend (skipped where
                      the backend refuses the shape)
    Shapes: 16k tokens per batch (B = 16384/S, H = 2048/D), S in 1k 2k 4k 8k 16k, D in 64 128,
    causal and not; D=256 (H=8) at S 1k-16k, causal and not; GQA 32:8 causal (B=4, S=4k, D=128);
    the masked prefill (the bool mask above, B=4, S=4k: H=16 at D=128, H=8 at D=256); the small shape (B=1, H=8,
    S=512, D=64), causal and not. --quick: S=4k D=128 only, causal and not.
    Checked first: dq, dk, dv vs the reference backend's, max abs diff relative to
    max(1, max|ref|). Each flashcore row records in `path` what flashcore.explain_backward()
    says (or "unknown (...)" where it cannot say), in `training` what
    flashcore.explain_training() says (null where this flashcore has none), and in
    `bitwise_repeat` whether a second backward gave bitwise the same gradients. TFLOP/s counts
    2.5x the forward's FLOPs.
    --no-bwd leaves them out, --bwd-only runs only them.

Method
  * Correctness first: before any timing, every implementation's output on the shape is
    compared with the reference backend's (cuDNN, else flash, else efficient) and the
    max abs diff printed. A flashcore output is produced right after filling the caching
    allocator with NaN, so unwritten elements show up. Rows that are wrong (NaN or diff
    above tolerance) are flagged WRONG and NOT timed (--time-wrong times them anyway, still
    WRONG: for an experiment tree that computes wrong results on purpose, e.g. a kernel with
    a stage left out, timed beside its peers).
  * flashcore.explain() is asked for each flashcore row; a row that does not run a
    FlashCore kernel is timed but marked "fallback".
  * Eager timing: 5 warm-up calls, then 30 timed calls (--warmup/--iters); each timed call
    is bracketed by its own pair of CUDA events, and before each one L2 is flushed by
    writing a 256 MB buffer (not timed). Reported: the median. The impls of a shape take their
    calls in turn (cudnn, flashcore, cudnn, flashcore, ...; backward rows too, each impl's
    backward call inside its own context), so every impl meets the same clocks: the H100 runs
    at its 700 W power cap under these kernels, where the SM clock swings between ~1.2 and
    1.98 GHz over tens of milliseconds, and 30 calls of one impl after another's once moved
    a 16k row's ratio by +-8% from run to run (docs/experiments/sessions-17-23.md,
    eighteenth session).
  * Graph timing (small shape): 20 calls captured in one CUDA graph, replayed --iters
    times, each replay bracketed by events; reported median replay time / 20 (L2 warm:
    the same inputs are reused inside the graph).
  * --rounds N: the interleaved timing above is repeated N times (each impl's graph timing
    after each), and a row reports the median of its N medians (each one in the JSON's
    us_rounds / graph_us_rounds); backward rows likewise. The machine has slow spells of seconds
    that can double one impl's median in a single pass (docs/experiments/sessions-04-09.md,
    sixth session); rounds outvote them.
  * TFLOP/s = 4 * B * Hq * D * pairs / time, pairs = Sq * Sk; causal with Sq == Sk counts
    Sq * Sk / 2 (the FlashAttention convention), other causal shapes the exact number of
    unmasked (query, key) pairs under PyTorch's top-left alignment.
  * "vs cuDNN" = cuDNN time / this time on the same shape in this run (> 1: faster).

Run
  python bench/bench.py                      # default set, JSON to bench/results/<card>_<date>.json
  python bench/bench.py --quick              # smoke test
  python bench/bench.py --json out.json      # explicit JSON path (--out-dir DIR: folder for the default name)
  python bench/bench.py --dry-run            # no GPU: fake timings, exercises shapes/table/JSON only;
                                             # every row it prints starts with "DRY", its JSON has
                                             # dry_run: true; JSON only to an explicit --json PATH,
                                             # and never one inside bench/results/ (refused)
  python bench/bench.py --plot               # also a PNG beside the JSON (bench/plot.py; matplotlib)
  python bench/bench.py --match 'S=4096 D=128'   # only shapes whose label matches (regex): here
                                             # the masked row and its unmasked twin

Progress: after each shape, one line on stderr, "progress 3/58 fwd <shape>: <its time>; <time
so far> elapsed, ~<estimate> left" (the table on stdout is unchanged; `2>&1 | tee log` keeps
both in order).

JSON: {"sha", "dirty", "torch", "card", "date", "method", "rows": [...]}; each row has pass
("fwd" or "bwd"), impl,
dtype, B, Hq, Hkv, Sq, Sk, D, causal, us, tflops, graph_us (null unless graph-timed),
vs_cudnn, maxdiff, status ("ok", "fallback", "WRONG", "skipped: <why>", "unverified"),
path (flashcore.explain() for flashcore rows; flashcore.explain_backward() for backward ones).
Rows not timed have us = null. Masked rows also have mask; flashcore backward rows
training and bitwise_repeat. A dry run's JSON has dry_run: true, and so has each of its rows.
"""

import argparse
import contextlib
import datetime as _dt
import importlib.util
import inspect
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ["cudnn", "flash", "efficient", "flashcore", "flashcore-sm80"]  # cuDNN first: ratios need it
REF_ORDER = ["cudnn", "flash", "efficient"]
RESULTS_DIR = os.path.join(REPO, "bench", "results")  # the measured runs; never a dry run's
TOL = {"fp16": 1e-2, "bf16": 4e-2}  # max abs diff vs the reference backend that counts as WRONG
TIME_WRONG = False  # --time-wrong: WRONG rows are timed too (status "WRONG (timed)"), never NaN ones
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
FLUSH_BYTES = 256 << 20
GRAPH_CALLS = 20


# --------------------------------------------------------------------------- shapes and FLOPs

@dataclass(frozen=True)
class Shape:
    B: int
    Hq: int
    Hkv: int
    Sq: int
    Sk: int
    D: int
    causal: bool
    dtype: str = "fp16"
    graph: bool = False  # also time inside a CUDA graph
    mask: bool = False   # a (B, 1, Sq, Sk) bool attn_mask (HuggingFace's padded causal mask)

    @property
    def label(self):
        h = f"{self.Hq}" if self.Hq == self.Hkv else f"{self.Hq}/{self.Hkv}"
        s = f"{self.Sq}" if self.Sq == self.Sk else f"{self.Sq}x{self.Sk}"
        return f"B={self.B} H={h} S={s} D={self.D}" + (" bmask" if self.mask else "")


def causal_pairs(sq, sk):
    """Unmasked (query, key) pairs with is_causal top-left aligned: query i sees keys 0..i."""
    if sq <= sk:
        return sq * (sq + 1) // 2
    return sk * (sk + 1) // 2 + (sq - sk) * sk


def flops(s):
    if not s.causal:  # masked rows too: every pair is computed, as in every implementation
        pairs = s.Sq * s.Sk
    elif s.Sq == s.Sk:
        pairs = s.Sq * s.Sk / 2
    else:
        pairs = causal_pairs(s.Sq, s.Sk)
    return 4.0 * s.B * s.Hq * s.D * pairs


# Device-to-device copy rate measured on the H100 (bytes read + written; shared/GPU_NOTES.md):
# the byte floor of a memory-bound call (decoding) is its Q + K + V + O bytes over this.
COPY_BYTES_PER_S = 3.0e12


def floor_us(s):
    """Time to move each byte of Q, K, V and O once at the copy rate (2-byte elements)."""
    elems = s.B * (2 * s.Hq * s.Sq + 2 * s.Hkv * s.Sk) * s.D
    return 2.0 * elems / COPY_BYTES_PER_S * 1e6


# Backward impls, cuDNN first (ratios need it). flashcore-det is backward only: the forward rows
# would time the same forward as flashcore's.
BWD_IMPLS = ["cudnn", "flash", "efficient", "flashcore", "flashcore-sm80", "flashcore-det"]
ALL_IMPLS = IMPLS + ["flashcore-det"]
BWD_FLOP_FACTOR = 2.5  # backward = 5 matmuls of the forward's size, 2 (FlashAttention convention)


def bwd_shape_set(quick, bf16, extra=False):
    """The training issue's backward sweep (see the module docstring); --quick: S=4k D=128;
    --extra: head dims 32, 80 and 96 (the sm80-class backward's alone) at 1k / 4k / 16k keys."""
    dtypes = ["fp16", "bf16"] if bf16 else ["fp16"]
    out = []
    for dt in dtypes:
        if quick:
            out += [Shape(4, 16, 16, 4096, 4096, 128, causal, dt) for causal in (False, True)]
            continue
        out += [Shape(1, 8, 8, 512, 512, 64, causal, dt) for causal in (False, True)]
        for D in (64, 128):
            for causal in (False, True):
                for S in (1024, 2048, 4096, 8192, 16384):
                    B, H = 16384 // S, 2048 // D
                    out.append(Shape(B, H, H, S, S, D, causal, dt))
        for causal in (False, True):
            for S in (1024, 2048, 4096, 8192, 16384):
                out.append(Shape(16384 // S, 8, 8, S, S, 256, causal, dt))
        out.append(Shape(4, 32, 8, 4096, 4096, 128, True, dt))  # GQA 32:8, Llama-3-8B's heads
        # HuggingFace's padded prefill mask; causality is in the mask, as in the forward rows.
        out.append(Shape(4, 16, 16, 4096, 4096, 128, False, dt, mask=True))
        out.append(Shape(4, 8, 8, 4096, 4096, 256, False, dt, mask=True))  # Gemma-like heads
        if extra:  # 64 heads of 32; 32 heads of 80 (Phi-2) and of 96 (Phi-3-mini)
            for D, H in ((32, 64), (80, 32), (96, 32)):
                for causal in (False, True):
                    for S in (1024, 4096, 16384):
                        out.append(Shape(16384 // S, H, H, S, S, D, causal, dt))
    return out


def shape_set(quick, bf16, extra):
    dtypes = ["fp16", "bf16"] if bf16 else ["fp16"]
    out = []
    for dt in dtypes:
        for causal in (False, True):
            out.append(Shape(1, 8, 8, 512, 512, 64, causal, dt, graph=True))
        seqs = [512, 4096] if quick else [512, 1024, 2048, 4096, 8192, 16384]
        dims = [128] if quick else [64, 128, 256]
        for D in dims:
            for causal in (False, True):
                for S in seqs:
                    B, H = 16384 // S, 2048 // D
                    out.append(Shape(B, H, H, S, S, D, causal, dt))
        if not quick:
            # Decoding (issue 5): one query against a cache, MHA and GQA 32:8, D=128.
            # Sk = 128k where K + V fit in 24 GB (B=32 MHA would need 69 GB).
            for B in (1, 8, 32):
                for hkv in (32, 8):
                    for sk in (1024, 8192, 32768, 131072):
                        kv_bytes = B * hkv * sk * 128 * 2 * 2
                        if kv_bytes <= 24 << 30:
                            # Up to 256 MB of K and V (~90 us at the copy bound) an eager call
                            # can be bound by the host, so these rows are also timed in a graph.
                            out.append(Shape(B, 32, hkv, 1, sk, 128, False, dt, graph=kv_bytes <= 1 << 28))
        # attn_mask (issue 3): HuggingFace's padded prefill, kept to a few shapes for time.
        for S, D in ((4096, 64), (4096, 128), (1024, 128), (4096, 256)) if not quick else ((4096, 128),):
            B, H = 16384 // S, 2048 // D
            out.append(Shape(B, H, H, S, S, D, False, dt, mask=True))
        if extra:
            # The same mask at Phi-2's and Phi-3-mini's head dims (32 heads of 80 / 96).
            for D in (80, 96):
                out.append(Shape(4, 32, 32, 2048, 2048, D, False, dt, mask=True))
            out.append(Shape(4, 32, 8, 2048, 2048, 128, True, dt))
            # Small grids (issue 5): chunks of queries against a cache (chunked prefill, GQA
            # 32:8, not causal: the chunk sees the whole cache), and a short prefill; one CTA
            # per query block leaves most SMs idle (the sm90 family splits the keys there).
            for sq, sk, d in ((128, 4096, 128), (512, 8192, 128), (256, 32768, 128), (256, 8192, 64)):
                out.append(Shape(1, 32, 8, sq, sk, d, False, dt, graph=True))
            out.append(Shape(1, 16, 16, 1024, 1024, 128, True, dt, graph=True))
            # Head dim 96 (issue 3; Phi-3-mini: 32 heads of 96), sm80 family on every card.
            for causal in (False, True):
                out.append(Shape(4, 32, 32, 4096, 4096, 96, causal, dt))
    if quick:
        out = [s for s in out if s.graph and not s.causal] + [s for s in out if not s.graph]
    return out


# --------------------------------------------------------------------------- environment

def read_git_sha_file():
    try:
        with open(os.path.join(REPO, ".git-sha")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def git_info():
    # The GPU machine gets a copy of the tree whose .git, if any, may name another commit (a
    # bench run there once reported the session's starting commit, "dirty"): the caller passes
    # the commit in FLASHCORE_SHA, or writes it to .git-sha before the tree is sent, and that
    # file wins when present, as in ci/gpu.sh. A tree that is not its own repository's top level
    # (a `git archive` snapshot inside another checkout, as tools/ab.sh times them) without that
    # file reports "unknown": the enclosing repository's HEAD would name another commit.
    if os.environ.get("FLASHCORE_SHA"):
        return os.environ["FLASHCORE_SHA"], None
    from_file = read_git_sha_file()
    if from_file:
        return from_file, None
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(REPO):
            return "unknown", None
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                               text=True, timeout=10)
        s = sha.stdout.strip() if sha.returncode == 0 else ""
        return (s or "unknown"), (bool(dirty.stdout.strip()) if dirty.returncode == 0 else None)
    except Exception:
        return "unknown", None


def inside(path, folder):
    """Whether `path` (a file that may not exist yet) lies in `folder` or below it, links
    resolved, so that ./bench/results/x.json and a symlinked way there count alike."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, top]) == top


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-card"


class env_vars:
    """Set environment variables for the duration (the op reads FLASHCORE_* at every call)."""

    def __init__(self, **values):
        self.values, self.old = values, {}

    def __enter__(self):
        self.old = {name: os.environ.get(name) for name in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for name, old in self.old.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def family_env(value):
    """FLASHCORE_FAMILY=value for the duration."""
    return env_vars(FLASHCORE_FAMILY=value)


class deterministic_mode:
    """torch.use_deterministic_algorithms(True, warn_only=True) for the duration, restored after
    (flashcore-det's backward: FlashCore then runs its deterministic sm80-class backward
    kernel). Deterministic mode also fills every fresh torch.empty with NaN; that fill is turned
    off here so that the row times the backward, not the fill of its outputs."""

    def __enter__(self):
        import torch.utils.deterministic as det
        self.old = (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled(),
                    det.fill_uninitialized_memory)
        torch.use_deterministic_algorithms(True, warn_only=True)
        det.fill_uninitialized_memory = False

    def __exit__(self, *exc):
        import torch.utils.deterministic as det
        enabled, warn_only, fill = self.old
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        det.fill_uninitialized_memory = fill


# --------------------------------------------------------------------------- implementations

class Impl:
    """One implementation: context() wraps every call (backend choice / env var), call() runs it."""

    def __init__(self, name, flashcore_mod=None):
        self.name = name
        self.fc = flashcore_mod

    def context(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if self.name == "flashcore":
            return family_env("auto")
        if self.name == "flashcore-det":
            # FlashCore's training route (FLASHCORE_TRAINING=auto) may send a call whose
            # backward is the sm80-class kernel to aten for both passes; this row exists to
            # time that kernel, so the call stays on FlashCore.
            return env_vars(FLASHCORE_FAMILY="auto", FLASHCORE_TRAINING="flashcore")
        if self.name == "flashcore-sm80":
            return family_env("sm80")
        backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION}[self.name]
        return sdpa_kernel(backend)

    def bwd_context(self):
        """Wraps every backward call (the forward's backend already fixed aten's backward)."""
        if self.name == "flashcore-sm80":
            return family_env("sm80")  # (the family is read at each call, the backward's too)
        return deterministic_mode() if self.name == "flashcore-det" else contextlib.nullcontext()

    def fn(self, q, k, v, s, mask=None):
        gqa = s.Hq != s.Hkv
        if self.name.startswith("flashcore"):
            # The Python entry point users call (flashcore.sdpa, patch(), the HF integration):
            # torch.ops.flashcore.sdpa's kernels, through _sdpa_inference when the call records
            # no gradient (flashcore/_entry.py).
            op = self.fc.sdpa
            if gqa:
                return lambda: op(q, k, v, mask, 0.0, s.causal, enable_gqa=True)
            return lambda: op(q, k, v, mask, 0.0, s.causal)
        if gqa:
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=s.causal,
                                                          enable_gqa=True)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=s.causal)

    def explain(self, q, k, v, s, mask=None):
        if not self.name.startswith("flashcore"):
            return None
        with self.context():
            return self.fc.explain(q, k, v, attn_mask=mask, is_causal=s.causal,
                                   enable_gqa=s.Hq != s.Hkv)


# --------------------------------------------------------------------------- timing

class Timer:
    def __init__(self, warmup, iters):
        self.warmup, self.iters = warmup, iters
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def eager_us(self, calls):
        """Median us of each (context, fn) in `calls`, timed call by call in turn (see the module
        docstring): call i of every impl runs before call i + 1 of any."""
        def run(context, fn):
            with context():
                fn()
        for context, fn in calls:
            for _ in range(self.warmup):
                run(context, fn)
        # Drain the warm-up before timing: queued work (or a previous shape's graph teardown)
        # ahead of the first events once inflated whole rows ~20x (docs/experiments/
        # first-versions.md, sm90 runs).
        torch.cuda.synchronize()
        ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(self.iters)] for _ in calls]
        for i in range(self.iters):
            for (context, fn), pairs in zip(calls, ev):
                start, end = pairs[i]
                with context():  # entered before the events: its host time is not timed
                    self.flush_buf.zero_()  # evict L2 (50 MB on H100); not inside the events
                    start.record()
                    fn()
                    end.record()
        torch.cuda.synchronize()
        return [statistics.median(s.elapsed_time(e) for s, e in pairs) * 1e3 for pairs in ev]

    def graph_us(self, fn):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(GRAPH_CALLS):
                fn()
        for _ in range(self.warmup):
            g.replay()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(self.iters)]
        for start, end in ev:
            start.record()
            g.replay()
            end.record()
        torch.cuda.synchronize()
        us = statistics.median(s.elapsed_time(e) for s, e in ev) * 1e3 / GRAPH_CALLS
        del g
        return us


def poison_allocator(shape, dtype):
    """Fill a block of the output's size with NaN and free it: the op's fresh output likely
    reuses it, so unwritten elements read as NaN."""
    junk = torch.empty(shape, dtype=dtype, device="cuda")
    junk.fill_(float("nan"))
    del junk


def make_inputs(s, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = DTYPES[s.dtype]
    q = torch.randn(s.B, s.Hq, s.Sq, s.D, dtype=dt, device="cuda", generator=g)
    k = torch.randn(s.B, s.Hkv, s.Sk, s.D, dtype=dt, device="cuda", generator=g)
    v = torch.randn(s.B, s.Hkv, s.Sk, s.D, dtype=dt, device="cuda", generator=g)
    return q, k, v


def make_mask(s):
    """HuggingFace's prefill mask for a left-padded batch: (B, 1, Sq, Sk) bool, query i sees
    keys pad_b <= j <= i (bottom-right aligned when Sq != Sk); batch b is padded by b * Sk / (2B)
    keys. A query row inside the padding sees only its own key: HuggingFace leaves such rows
    fully masked, where PyTorch's backends disagree (zeros or NaN) and the check would flag
    the reference itself; their outputs are discarded by the model anyway."""
    if not s.mask:
        return None
    i = torch.arange(s.Sq, device="cuda").view(1, 1, -1, 1) + (s.Sk - s.Sq)
    j = torch.arange(s.Sk, device="cuda").view(1, 1, 1, -1)
    pad = (torch.arange(s.B, device="cuda") * s.Sk // (2 * s.B)).view(-1, 1, 1, 1)
    return (j <= i) & ((j >= pad) | (j == i))


def try_call(impl, fn):
    """Run once under the impl's context; return (output, None) or (None, reason)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sdpa_kernel's "X not used because ..." chatter
            with impl.context():
                out = fn()
        torch.cuda.synchronize()
        return out, None
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, msg[:120]


def base_row(s, pass_, impl_name, path, **extra):
    return dict(**{"pass": pass_}, impl=impl_name, dtype=s.dtype, B=s.B, Hq=s.Hq, Hkv=s.Hkv, Sq=s.Sq, Sk=s.Sk,
                D=s.D, causal=s.causal, us=None, tflops=None, graph_us=None, vs_cudnn=None,
                maxdiff=None, status="ok", path=path, **extra)


def judge(row, nan, ref, what):
    """Set row["status"] from the check against the reference; False: wrong, never time it
    (--time-wrong: time a wrong row without NaN anyway, its status "WRONG (timed)")."""
    if nan or (row["maxdiff"] is not None and not row["maxdiff"] <= TOL[row["dtype"]]):
        timed = TIME_WRONG and not nan
        row["status"] = "WRONG" + (f" (NaN in {what})" if nan else " (timed)" if timed else "")
        return timed
    if ref is None:
        row["status"] = "unverified"
    elif row["path"] is not None and not row["path"].startswith("kernel"):
        row["status"] = "fallback"
    return True


def finish_timed(row, flop_count, cudnn_us):
    """TFLOP/s and the ratio to cuDNN (cudnn_us: its time on this shape, None before it ran)."""
    row["tflops"] = flop_count / row["us"] / 1e6
    if row["impl"] == "cudnn":
        cudnn_us = row["us"]
    if cudnn_us:
        row["vs_cudnn"] = cudnn_us / row["us"]
    return cudnn_us


def run_shape(s, impls, timer, seed, graph, rounds=1):
    """Verify every impl on one shape, then time the ones that are right: `rounds` times, each
    round timing the impls call by call in turn (Timer.eager_us), so that the card's clock
    swings and slow spells land on every impl alike; a row's time is the median of its rounds'
    medians (all of them in `us_rounds`). Returns rows."""
    q, k, v = make_inputs(s, seed)
    mask = make_mask(s)
    f = flops(s)
    rows = []
    outputs, skip = {}, {}
    for impl in impls:
        fn = impl.fn(q, k, v, s, mask)
        if impl.name.startswith("flashcore"):
            poison_allocator((s.B, s.Hq, s.Sq, s.D), q.dtype)
        out, why = try_call(impl, fn)
        if out is None:
            skip[impl.name] = why
        else:
            outputs[impl.name] = out
    ref_name = next((n for n in REF_ORDER if n in outputs), None)
    ref = outputs.get(ref_name)
    timed = []  # (impl, row, fn) of the rows that are right
    for impl in impls:
        row = base_row(s, "fwd", impl.name, impl.explain(q, k, v, s, mask), floor_us=floor_us(s),
                       mask="bool (B,1,S,S) padded causal" if s.mask else None)
        rows.append(row)
        if impl.name in skip:
            row["status"] = f"skipped: {skip[impl.name]}"
            continue
        out = outputs.pop(impl.name) if impl.name != ref_name else ref
        nan = bool(torch.isnan(out).any())
        if ref is not None and impl.name != ref_name:
            row["maxdiff"] = (out.float() - ref.float()).abs().max().item()
        if judge(row, nan, ref, "output"):  # never time garbage
            timed.append((impl, row, impl.fn(q, k, v, s, mask)))
        del out
    eager = {id(row): [] for _, row, _ in timed}
    graphed = {id(row): [] for _, row, _ in timed}
    for _ in range(rounds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if timed:
                times = timer.eager_us([(impl.context, fn) for impl, _, fn in timed])
                for (_, row, _), us in zip(timed, times):
                    eager[id(row)].append(us)
            for impl, row, fn in timed:
                if graph and "graph_note" not in row:
                    with impl.context():
                        try:
                            graphed[id(row)].append(timer.graph_us(fn))
                        except Exception as e:  # report, keep going
                            row["graph_note"] = f"graph capture failed: {str(e).splitlines()[0][:100]}"
    cudnn_us = None
    for row in rows:
        if id(row) in eager:
            row["us"] = statistics.median(eager[id(row)])
            if graphed[id(row)]:
                row["graph_us"] = statistics.median(graphed[id(row)])
            if rounds > 1:
                row["us_rounds"] = [round(t, 2) for t in eager[id(row)]]
                if graphed[id(row)]:
                    row["graph_us_rounds"] = [round(t, 3) for t in graphed[id(row)]]
            cudnn_us = finish_timed(row, f, cudnn_us)
        report(s, row, ref_name)
    return rows


def make_dout(s, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed + 7919)
    return torch.randn(s.B, s.Hq, s.Sq, s.D, dtype=dtype, device="cuda", generator=g)


def explain_bwd_path(impl, s, q, k, v, dout, mask):
    """What flashcore.explain_backward() says about this shape's backward, asked inside the impl's
    backward context (deterministic mode can change the path). Never raises: the function's
    answer is being reworked, so anything it cannot say reads "unknown (<why>)"."""
    fn = getattr(impl.fc, "explain_backward", None)
    if fn is None:
        return "unknown (this flashcore has no explain_backward)"
    gqa = s.Hq != s.Hkv
    try:
        kwargs = dict(grad_lse=None, is_causal=s.causal, scale=None, enable_gqa=gqa)
        if mask is not None:
            if "attn_mask" not in inspect.signature(fn).parameters:
                # Its docstring: "An attn_mask always means python"; it takes no mask to check.
                return "python: attn_mask (explain_backward takes no mask)"
            kwargs["attn_mask"] = mask
        with torch.no_grad():
            out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask, 0.0, s.causal, enable_gqa=gqa)
        with impl.bwd_context():
            return str(fn(dout, q, k, v, out, lse, **kwargs))
    except Exception as e:  # report, keep the row
        msg = (str(e).strip().splitlines() or [""])[0][:100]
        return f"unknown ({type(e).__name__}: {msg})"


def explain_training_route(impl, s, q, k, v, mask):
    """flashcore.explain_training() where this flashcore has it (None otherwise), asked inside the
    impl's forward context, where the route is decided (it reads FLASHCORE_* there)."""
    fn = getattr(impl.fc, "explain_training", None)
    if fn is None:
        return None
    try:
        with impl.context():
            return str(fn(q, k, v, attn_mask=mask, is_causal=s.causal, enable_gqa=s.Hq != s.Hkv))
    except Exception as e:  # report, keep the row
        msg = (str(e).strip().splitlines() or [""])[0][:100]
        return f"unknown ({type(e).__name__}: {msg})"


def run_bwd_shape(s, impls, timer, seed, rounds=1):
    """Backward rows: verify each impl's (dq, dk, dv) against the reference backend's, then time
    the backward alone (autograd.grad on a retained graph of one forward per impl), the impls
    call by call in turn (Timer.eager_us) as in the forward rows, `rounds` times over."""
    q, k, v = (t.requires_grad_() for t in make_inputs(s, seed))
    mask = make_mask(s)
    dout = make_dout(s, seed, q.dtype)
    f = BWD_FLOP_FACTOR * flops(s)
    rows, grads, skip, fns = [], {}, {}, {}
    for impl in impls:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with impl.context():
                    out = impl.fn(q, k, v, s, mask)()
                # Each impl keeps its own forward graph alive (retain_graph) until the timing ends.
                fns[impl.name] = (lambda o: lambda: torch.autograd.grad(o, (q, k, v), dout,
                                                                        retain_graph=True))(out)
                if impl.name.startswith("flashcore"):
                    for t in (q, k, v):
                        poison_allocator(t.shape, t.dtype)
                with impl.bwd_context():
                    grads[impl.name] = fns[impl.name]()
            torch.cuda.synchronize()
        except RuntimeError as e:
            skip[impl.name] = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
            fns.pop(impl.name, None)
    ref_name = next((n for n in REF_ORDER if n in grads), None)
    ref = grads.get(ref_name)
    timed = []  # (impl, row) of the rows that are right
    for impl in impls:
        path = explain_bwd_path(impl, s, q, k, v, dout, mask) if impl.name.startswith("flashcore") else None
        row = base_row(s, "bwd", impl.name, path, floor_us=None,
                       mask="bool (B,1,S,S) padded causal" if s.mask else None)
        if impl.name.startswith("flashcore"):
            row["training"] = explain_training_route(impl, s, q, k, v, mask)
        rows.append(row)
        if impl.name in skip:
            row["status"] = f"skipped: {skip[impl.name]}"
            continue
        got = grads[impl.name]
        nan = any(bool(torch.isnan(t).any()) for t in got)
        if ref is not None and impl.name != ref_name:
            row["maxdiff"] = max(((a.float() - b.float()).abs().max() /
                                  max(1.0, b.float().abs().max().item())).item()
                                 for a, b in zip(got, ref))
        if impl.name.startswith("flashcore"):
            with warnings.catch_warnings(), impl.bwd_context():
                warnings.simplefilter("ignore")
                again = fns[impl.name]()
            row["bitwise_repeat"] = all(torch.equal(a, b) for a, b in zip(got, again))
            del again
        if judge(row, nan, ref, "gradients"):  # never time garbage
            if (row.get("training") or "").startswith("aten"):
                row["status"] = "fallback"  # the training route ran aten's SDPA, both passes
            elif row["status"] == "fallback" and row["path"].startswith("unknown"):
                row["status"] = "ok (path unknown)"
            timed.append((impl, row))
    del grads, ref
    times = {id(row): [] for _, row in timed}
    for _ in range(rounds):
        if timed:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = timer.eager_us([(impl.bwd_context, fns[impl.name]) for impl, _ in timed])
            for (_, row), us in zip(timed, got):
                times[id(row)].append(us)
    cudnn_us = None
    for row in rows:
        if id(row) in times:
            row["us"] = statistics.median(times[id(row)])
            if rounds > 1:
                row["us_rounds"] = [round(t, 2) for t in times[id(row)]]
            cudnn_us = finish_timed(row, f, cudnn_us)
        report(s, row, ref_name)
    return rows


# --------------------------------------------------------------------------- output

HEADER = (f"{'shape':<26} {'dtype':<5} {'causal':<6} {'impl':<15} {'us':>9} {'graph_us':>9} "
          f"{'TFLOP/s':>8} {'vs cuDNN':>8} {'maxdiff':>9}  status")


# Every printed line of a dry run starts with this, so that no line of fake timings, copied out of
# its context (a log, an issue), can pass for a measurement. Real runs print no tag.
DRY_TAG = "DRY "


def dry_tag(row):
    return DRY_TAG if row.get("dry_run") else ""


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def report(s, row, ref_name):
    status = row["status"]
    if row.get("pass") == "bwd":
        status = "[bwd] " + status
    if status.startswith("WRONG"):
        status = f"!!!!!! {status} vs {ref_name} (tol {TOL[s.dtype]:g}) !!!!!!"
    elif status == "fallback":
        to_aten = (row.get("training") or "").startswith("aten")
        status = f"fallback ({row['training'] if to_aten else row['path']})"
    if row.get("graph_note"):
        status += f"; {row['graph_note']}"
    print(f"{dry_tag(row)}{s.label:<26} {s.dtype:<5} {str(s.causal):<6} {row['impl']:<15} "
          f"{fmt(row['us'], '9.1f'):>9} {fmt(row['graph_us'], '9.2f'):>9} "
          f"{fmt(row['tflops'], '8.1f'):>8} {fmt(row['vs_cudnn'], '8.2f'):>8} "
          f"{fmt(row['maxdiff'], '9.2e'):>9}  {status}", flush=True)


def summary(rows, impls):
    """TFLOP/s pivot: one line per shape, one column per impl."""
    names = [i.name for i in impls]
    tag = DRY_TAG if any(r.get("dry_run") for r in rows) else ""
    print(f"\n{tag}TFLOP/s summary (WRONG rows never timed: 'WRONG'; skipped: '-'; fallback: '*'"
          f"{'; timed WRONG rows: !' if TIME_WRONG else ''})")
    print(f"{tag}{'shape':<32} {'dtype':<5} {'causal':<6} " + " ".join(f"{n:>15}" for n in names))
    keyed = {}
    for r in rows:
        key = (r.get("pass", "fwd"), r["dtype"], r["B"], r["Hq"], r["Hkv"], r["Sq"], r["Sk"],
               r["D"], r["causal"], r.get("mask") is not None)
        keyed.setdefault(key, {})[r["impl"]] = r
    for key, by in keyed.items():
        pss, dt, B, Hq, Hkv, Sq, Sk, D, causal, mask = key
        label = (Shape(B, Hq, Hkv, Sq, Sk, D, causal, dt, mask=mask).label
                 + (" bwd" if pss == "bwd" else ""))
        cells = []
        for n in names:
            r = by.get(n)
            if r is None or r["us"] is None:
                cells.append("WRONG" if r is not None and r["status"].startswith("WRONG") else "-")
            else:
                cells.append(f"{r['tflops']:.1f}" + ("*" if r["status"] == "fallback" else
                                                     "!" if r["status"].startswith("WRONG") else ""))
        row_tag = DRY_TAG if any(r.get("dry_run") for r in by.values()) else ""
        print(f"{row_tag}{label:<32} {dt:<5} {str(causal):<6} " + " ".join(f"{c:>15}" for c in cells))


def fmt_duration(seconds):
    """Seconds as a person reads them in a log: "42 s", "3m05s", "1h02m"."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """One line per finished shape, on stderr (the table on stdout stays as it was; a log that
    takes both, `2>&1 | tee`, gets the lines in order): the shape's index / total, its own time,
    the time so far and an estimate of the time left. Whole lines only, no carriage returns,
    so a log file reads like the terminal did.

    The estimate charges each shape still to run with the mean time of the shapes of its pass
    done so far: a backward shape takes several times a forward one, so one mean over both
    would be wrong for the whole forward part of a run. A pass not started yet borrows the
    mean of all shapes done."""

    def __init__(self, counts, stream=None, clock=time.monotonic, tag=""):
        self.tag = tag  # DRY_TAG in a dry run
        self.left = dict(counts)        # pass -> shapes not done yet
        self.total = sum(counts.values())
        self.spent = {p: [0.0, 0] for p in counts}  # pass -> [seconds, shapes done]
        self.stream, self.clock = stream, clock
        self.start = self.last = clock()
        self.done_count = 0

    def shape_done(self, pass_, s):
        """Account for one finished shape of `pass_` and print its line; returns the line."""
        now = self.clock()
        took, self.last = now - self.last, now
        self.done_count += 1
        self.left[pass_] -= 1
        self.spent[pass_][0] += took
        self.spent[pass_][1] += 1
        elapsed = now - self.start
        mean_all = elapsed / self.done_count
        left_s = sum(n * (self.spent[p][0] / self.spent[p][1] if self.spent[p][1] else mean_all)
                     for p, n in self.left.items())
        width = len(str(self.total))
        tail = ("done" if self.done_count == self.total else f"~{fmt_duration(left_s)} left")
        line = (f"{self.tag}progress {self.done_count:>{width}}/{self.total} {pass_} {s.label} {s.dtype} "
                f"{'causal' if s.causal else 'non-causal'}: {took:.1f} s; "
                f"{fmt_duration(elapsed)} elapsed, {tail}")
        print(line, file=self.stream or sys.stderr, flush=True)
        return line


# --------------------------------------------------------------------------- dry run

def dry_run_rows(shapes, impl_names, pass_="fwd"):
    """Fake, deterministic timings (no GPU): exercises FLOPs, table, summary and JSON."""
    rows = []
    speed = {"cudnn": 450, "flash": 300, "efficient": 150, "flashcore": 200, "flashcore-sm80": 190,
             "flashcore-det": 180}
    for s in shapes:
        f = flops(s) * (BWD_FLOP_FACTOR if pass_ == "bwd" else 1.0)
        cudnn_us = None
        for n in impl_names:
            row = base_row(s, pass_, n, None, floor_us=floor_us(s) if pass_ == "fwd" else None,
                           mask="bool (B,1,S,S) padded causal" if s.mask else None)
            row["dry_run"] = True  # fake: the printed line and the JSON row say so
            if n.startswith("flashcore"):
                row["path"] = "kernel: (dry run)"
                row["maxdiff"] = 1e-3
                if pass_ == "bwd":
                    row["bitwise_repeat"] = True
            if n == "flash" and (s.Hq != s.Hkv or s.mask):
                row["status"] = "skipped: (dry run)"
            elif judge(row, False, "cudnn", "output"):
                row["us"] = f / (speed[n] * 1e6) + 5.0
                if s.graph:
                    row["graph_us"] = row["us"] * 0.8
                cudnn_us = finish_timed(row, f, cudnn_us)
            rows.append(row)
            report(s, row, "cudnn")
    return rows


# --------------------------------------------------------------------------- main

def load_plotter():
    """bench/plot.py as a module, found beside this file (bench/ is no package, and this file
    is also loaded by path, as the tests do)."""
    spec = importlib.util.spec_from_file_location(
        "flashcore_bench_plot", os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cpu_demo():
    """Without a GPU there is nothing to time: show the op working and saying it fell back."""
    import flashcore

    print("bench.py: no CUDA device, so nothing to time. A FlashCore call on the CPU instead:")
    torch.manual_seed(0)
    q = torch.randn(1, 8, 512, 64)
    k, v = torch.randn(1, 8, 512, 64), torch.randn(1, 8, 512, 64)
    out = torch.ops.flashcore.sdpa(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f"  torch.ops.flashcore.sdpa(q, k, v, is_causal=True), q {tuple(q.shape)} {q.dtype} on cpu")
    print(f"  path: {flashcore.explain(q, k, v, is_causal=True)}")
    print(f"  equal to F.scaled_dot_product_attention: {torch.equal(out, ref)}")
    print("  (--dry-run exercises the benchmark's tables and JSON with fake timings)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small subset (smoke test)")
    ap.add_argument("--bf16", action="store_true", help="also bf16 (default: fp16 only)")
    ap.add_argument("--extra", action="store_true", help="add GQA prefill, D=96 and small-grid shapes")
    ap.add_argument("--json", metavar="PATH", help="JSON output path (default: OUT_DIR/<card>_<date>.json)")
    ap.add_argument("--out-dir", metavar="DIR", default=RESULTS_DIR)
    ap.add_argument("--no-json", action="store_true", help="do not write JSON")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each shape's impls this many times over; report the "
                         "median of the rounds' medians (default 1)")
    ap.add_argument("--impls", default=",".join(ALL_IMPLS),
                    help=f"comma-separated subset of {','.join(ALL_IMPLS)} (flashcore-det: "
                         f"backward rows only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--match", metavar="REGEX", help="only shapes whose label (as printed) matches")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: fake timings (tests the plumbing)")
    ap.add_argument("--no-bwd", action="store_true", help="leave out the backward rows")
    ap.add_argument("--bwd-only", action="store_true", help="only the backward rows")
    ap.add_argument("--time-wrong", action="store_true",
                    help="time rows that fail the correctness check too (an experiment tree wrong on "
                         "purpose); they stay WRONG, 'WRONG (timed)' in the JSON, '!' in the summary, "
                         "and the exit status stays 1")
    ap.add_argument("--plot", action="store_true",
                    help="after the run, draw the JSON as a PNG beside it (bench/plot.py; needs "
                         "matplotlib, the [bench] extra)")
    args = ap.parse_args(argv)
    global TIME_WRONG
    TIME_WRONG = args.time_wrong

    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1 (got {args.rounds})")
    if args.dry_run and args.json and not args.no_json and inside(args.json, RESULTS_DIR):
        # bench/results/ holds measurements that the README and docs/ (docs/experiments/ too) cite;
        # fake timings there could be committed or compared by mistake. Checked before anything runs.
        ap.error(f"a dry run never writes into bench/results/ (its timings are "
                 f"fake); give --json a path elsewhere, or leave it out to write nothing")
    plotter = None
    if args.plot:
        # Checked before the run, not after minutes of timing; matplotlib itself is imported
        # only when the plot is drawn (bench.py runs without it).
        plotter = load_plotter()
        try:
            plotter.import_matplotlib()
        except plotter.MissingMatplotlib as e:
            print(e, file=sys.stderr)  # one line: what is missing and how to install it
            return 2
    names = [n.strip() for n in args.impls.split(",") if n.strip()]
    bad = [n for n in names if n not in ALL_IMPLS]
    if bad:
        ap.error(f"unknown impl(s) {bad}; choose from {ALL_IMPLS}")
    names = [n for n in ALL_IMPLS if n in names]  # cuDNN first, whatever the order given
    shapes = [] if args.bwd_only else shape_set(args.quick, args.bf16, args.extra)
    bwd_shapes = [] if args.no_bwd else bwd_shape_set(args.quick, args.bf16, args.extra)
    if args.match:
        shapes = [s for s in shapes if re.search(args.match, s.label)]
        bwd_shapes = [s for s in bwd_shapes if re.search(args.match, s.label)]
    sha, dirty = git_info()
    now = _dt.datetime.now()

    if args.dry_run:
        card = "dry-run"
    else:
        if not torch.cuda.is_available():
            cpu_demo()
            return 0
        card = torch.cuda.get_device_name()
    fc = None
    if any(n.startswith("flashcore") for n in names) and not args.dry_run:
        import flashcore as fc  # a failure here is an error: the point is to time it

    method = (f"eager: {args.warmup} warm-up, median of {args.iters} calls, each between its own "
              f"CUDA events, L2 flushed before each call by writing a {FLUSH_BYTES >> 20} MB buffer "
              f"(untimed), the impls' calls interleaved one by one; graph: {GRAPH_CALLS} calls per "
              f"CUDA graph, median of {args.iters} replays / {GRAPH_CALLS}, L2 warm; inputs randn, one "
              f"set per shape"
              + (f"; median of {args.rounds} such medians" if args.rounds > 1 else ""))
    if args.dry_run:
        print("DRY RUN: every timing below is FAKE (no GPU was used); the rows only exercise the "
              "shapes, tables and JSON")
    print(f"FlashCore bench  sha={sha}{' (dirty)' if dirty else ''}  torch={torch.__version__}  "
          f"card={card}  {now:%Y-%m-%d %H:%M}")
    print(f"method: {method}")
    print(f"TFLOP/s: 4*B*Hq*D*pairs (causal Sq==Sk: half the pairs); vs cuDNN = cuDNN us / us; "
          f"maxdiff vs {'/'.join(REF_ORDER)} (first that runs)\n")
    print((DRY_TAG if args.dry_run else "") + HEADER, flush=True)

    t0 = time.time()
    impls = [Impl(n, fc) for n in names]
    fwd_impls = [i for i in impls if i.name in IMPLS]
    bwd_impls = [i for i in impls if i.name in BWD_IMPLS]
    progress = Progress({"fwd": len(shapes), "bwd": len(bwd_shapes)},
                        tag=DRY_TAG if args.dry_run else "")
    rows = []
    if args.dry_run:
        for pass_, shape_list, pass_impls in (("fwd", shapes, fwd_impls), ("bwd", bwd_shapes, bwd_impls)):
            for s in shape_list:
                rows += dry_run_rows([s], [i.name for i in pass_impls], pass_)
                progress.shape_done(pass_, s)
    else:
        timer = Timer(args.warmup, args.iters)
        for i, s in enumerate(shapes):
            rows += run_shape(s, fwd_impls, timer, args.seed + i, s.graph, args.rounds)
            torch.cuda.empty_cache()
            progress.shape_done("fwd", s)
        for i, s in enumerate(bwd_shapes):
            rows += run_bwd_shape(s, bwd_impls, timer, args.seed + 1000 + i, args.rounds)
            torch.cuda.empty_cache()
            progress.shape_done("bwd", s)
    elapsed = time.time() - t0
    summary(rows, impls)
    wrong = [r for r in rows if r["status"].startswith("WRONG")]
    print(f"\n{DRY_TAG if args.dry_run else ''}{len(rows)} rows, {len(shapes)} fwd + "
          f"{len(bwd_shapes)} bwd shapes, {elapsed:.1f} s"
          + (f"; {len(wrong)} WRONG rows ({'timed: --time-wrong' if TIME_WRONG else 'not timed'})"
             if wrong else ""))

    if args.dry_run and not args.json and not args.no_json:
        # Fake timings never land among the results by default: only where --json points.
        print("JSON: not written (a dry run writes one only to an explicit --json PATH)")
    elif not args.no_json:
        path = args.json or os.path.join(args.out_dir, f"{slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__, card=card,
                   date=now.isoformat(timespec="seconds"), method=method,
                   args=vars(args), elapsed_s=round(elapsed, 1), rows=rows)
        if args.dry_run:
            doc["dry_run"] = True  # and card "dry-run", every row dry_run: true
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"JSON: {path}")
        if plotter is not None:
            try:
                print(f"plot: {plotter.plot([path])}")
            except (plotter.MissingMatplotlib, ValueError) as e:  # report; the JSON stands
                print(f"plot: not made: {e}")
    if plotter is not None and (args.no_json or (args.dry_run and not args.json)):
        print("plot: not made (no JSON was written; the plot is drawn from it)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
