#!/usr/bin/env python3
"""Training-step benchmark: a Llama-shaped decoder, attention by PyTorch's SDPA vs FlashCore.

What it measures
  The time of one training step of a small Llama-shaped model built here in plain PyTorch (no
  transformers): token embedding; N decoder layers of RMSNorm, q/k/v/o projections with
  grouped-query attention, rotary position embeddings, attention, RMSNorm, SwiGLU MLP (each
  sublayer with its residual); final RMSNorm; LM head; cross-entropy loss. Weights are random
  (normal, std 0.02; norms 1) in bf16 (--dtype fp16 for fp16), on the GPU; nothing is downloaded.
    1b   hidden 2048, 32 query / 8 key-value heads of 64, MLP 8192, 4 layers (Llama-3.2-1B's
         layer shape, fewer layers)
    8b   hidden 4096, 32 / 8 heads of 128, MLP 14336, 2 layers (Llama-3-8B's layer shape)
  Both with a 32000-token vocabulary (--vocab; the LM head's logits are B*S*vocab, so its
  memory grows with it) and --layers to change the depth.
  A step is: gradients set to None (untimed), forward, loss, backward, and with --adamw an
  AdamW step (fused where torch has it, else foreach). The attention of every layer is one of
    sdpa       torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
               is_causal=mask is None, enable_gqa=True): PyTorch's own choice of backend (the
               `path` column names the backend aten picks, from torch._fused_sdp_choice)
    flashcore  torch.ops.flashcore.sdpa with the same arguments (`path`: flashcore.explain()
               of the forward and flashcore.explain_backward() of the backward). Where
               FlashCore's training route sends a call to aten's SDPA for both passes (its
               backward would be slower there, e.g. with a mask on an H100), the row times aten
               and says so (`route`, flashcore.explain_training(); "ROUTED TO ATEN" in the
               table); FLASHCORE_TRAINING=flashcore in the environment keeps it on FlashCore.
  Batches: 8k and 16k tokens per step (--tokens): B=2 S=4096 and B=1 S=8192 (8k), B=4 S=4096
  and B=2 S=8192 (16k); --shapes BxS,... names others. Each batch runs
    unpadded     is_causal=True, no mask; positions 0..S-1
    left-padded  row b is left-padded by b*S/(2B) tokens (row 0, the batch's longest sequence,
                 by none; a batch of one by S/4), as a batch padded to its longest sequence
                 for a decoder; the mask is HuggingFace's (B, 1, S, S) bool mask, True =
                 attend, causal AND not a padding key. A query inside the padding has no key
                 left to attend to; such fully masked rows give zeros in PyTorch's math path but
                 other values (V's mean) in some fused backends, so here each of them attends
                 to itself only (finite everywhere, whatever the backend). Positions count from
                 the first real token (cumsum of the padding mask - 1, as transformers'
                 generate() makes them), and the loss ignores every padded position (labels
                 -100 where the query or its target token is padding).
  Tokens/s = B * S / step time: padded positions count, since they are computed.

Method
  * One model per config and one batch per row: both implementations run the SAME model on the
    SAME inputs, switched by setting the model's attention function.
  * Correctness first: one step of each implementation (without the optimizer, so the weights
    stay as they were), and the loss and a few parameter gradients (layer 0's q/k/v/o
    projections and input norm, the last layer's o projection) of flashcore compared with
    sdpa's: max relative diff, max|a - b| / max|b| over each tensor (the loss: |a - b| / |b|).
    Out of tolerance (bf16: loss 1e-2, gradients 5e-2; fp16: 5e-3, 2e-2) the row is flagged
    "CHECK FAILED" (still timed); a NaN or Inf loss or gradient is flagged "WRONG", and a step
    that raises (e.g. out of memory) "error", neither of them timed; a flashcore row with no
    sdpa step to compare with is "unverified" (timed). Any flag makes the script exit 1.
  * Timing: the implementations take their steps in turn (sdpa, flashcore, sdpa, flashcore,
    ...), --warmup steps each (default 3), then --iters timed steps each (default 10), each
    step between its own pair of CUDA events (the zeroing of gradients outside them), so that
    the GPU's clock swings land on both alike. Reported: the median step time in ms, tokens/s,
    and vs_sdpa = sdpa's median ms / flashcore's median ms (> 1: flashcore's step is faster).

Run (GPU)
  python bench/bench_train.py                       # JSON to bench/results/train_<card>_<date>.json
  python bench/bench_train.py --models 8b --tokens 16k --adamw
  python bench/bench_train.py --dry-run             # no GPU: tiny model on the CPU, FAKE timings
Progress (one line per measurement) goes to stderr, the table to stdout.
Without a CUDA device it says so and exits 0; when flashcore cannot be imported it says so and
exits 1, except with --dry-run, which then uses F.scaled_dot_product_attention in its place.
--dry-run builds tiny versions of the configs (same structure; sequence lengths, from --tokens or
--shapes, / 128), runs one checked step and one untimed step per implementation on the CPU, and
fills in fake timings, to exercise the model, the masks and the table / JSON code; it writes JSON
only where --json says, never into bench/results/.

JSON: {"sha", "dirty", "torch", "card", "date", "method", "dry_run", "args", "elapsed_s",
"rows": [...]}; each row: impl, model, B, S, padded, ms (median step time; null if not timed),
tokens_per_s, vs_sdpa, and also dtype, layers, vocab, adamw, ms_steps (every timed step), loss,
status ("ok", "CHECK FAILED: ...", "unverified: ...", "WRONG: ...", "error: ..."), path;
flashcore rows add
loss_rel_diff and grad_rel_diff (the largest over the checked gradients), grad_rel_diffs, and
route: flashcore.explain_training() (null where this flashcore has none).
"""

import argparse
import inspect
import datetime as _dt
import importlib.util
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.exists(os.path.join(REPO, "python", "flashcore", "libflashcore_op.so")):
    sys.path.insert(0, os.path.join(REPO, "python"))  # a CMake build in the tree wins

IMPLS = ("sdpa", "flashcore")  # sdpa first: vs_sdpa needs its time
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Max relative diffs of flashcore's step vs sdpa's that still count as agreeing: (loss, grads).
# Loose on purpose: the two differ by the rounding of each layer's attention output, which
# the layers after it carry on; a wrong kernel is off by O(1).
TOL = {"bf16": (1e-2, 5e-2), "fp16": (5e-3, 2e-2)}
PAD_ID = 0
IGNORE = -100  # F.cross_entropy's ignore_index
TOKEN_SHAPES = {"8k": ((2, 4096), (1, 8192)), "16k": ((4, 4096), (2, 8192))}
DRY_SEQ_DIV = 128  # dry run: sequence lengths / this
ADAMW_LR = 1e-6  # small, so that the weights (and the step's work) stay about where they start


def load_bench_helpers():
    """bench/bench.py as a module (git_info, slug), loaded by path: `import bench` could find the
    bench/ folder itself as a namespace package, depending on sys.path."""
    spec = importlib.util.spec_from_file_location("flashcore_bench_py",
                                                  os.path.join(REPO, "bench", "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class ModelConfig:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int = 32000
    rope_theta: float = 500000.0
    eps: float = 1e-5


CONFIGS = {
    "1b": ModelConfig("1b", hidden=2048, heads=32, kv_heads=8, head_dim=64, intermediate=8192,
                      layers=4),
    "8b": ModelConfig("8b", hidden=4096, heads=32, kv_heads=8, head_dim=128,
                      intermediate=14336, layers=2),
}


def tiny_config(cfg):
    """The dry run's stand-in for `cfg`: GQA 4:1 and the MLP's ratio kept, head dim / 8,
    a 256-token vocabulary; small enough for a CPU step in milliseconds."""
    head_dim = max(4, cfg.head_dim // 8)
    heads, kv_heads = 8, 2
    hidden = heads * head_dim
    return replace(cfg, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   intermediate=cfg.intermediate * hidden // cfg.hidden, vocab=256)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps, device, dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x):
        # The mean square in fp32 (a bf16 sum over 4096 features loses digits), as Llama does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(positions, head_dim, theta, dtype):
    """cos and sin of each (position, frequency), (B, 1, S, head_dim), for q and k of all heads."""
    exponent = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    angles = positions.float()[..., None] * inv_freq  # (B, S, head_dim / 2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


class Attention(nn.Module):
    def __init__(self, cfg, device, dtype):
        super().__init__()
        self.cfg = cfg

        def linear(n_in, n_out):
            return nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype)
        self.q_proj = linear(cfg.hidden, cfg.heads * cfg.head_dim)
        self.k_proj = linear(cfg.hidden, cfg.kv_heads * cfg.head_dim)
        self.v_proj = linear(cfg.hidden, cfg.kv_heads * cfg.head_dim)
        self.o_proj = linear(cfg.heads * cfg.head_dim, cfg.hidden)

    def forward(self, x, cos, sin, mask, attend):
        B, S, _ = x.shape
        D = self.cfg.head_dim
        # (B, S, H, D) projections seen as (B, H, S, D), the layout HuggingFace hands to SDPA.
        q = self.q_proj(x).view(B, S, self.cfg.heads, D).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.cfg.kv_heads, D).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.cfg.kv_heads, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = attend(q, k, v, mask)  # (B, H, S, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.cfg.heads * D))


class SwiGLU(nn.Module):
    def __init__(self, cfg, device, dtype):
        super().__init__()

        def linear(n_in, n_out):
            return nn.Linear(n_in, n_out, bias=False, device=device, dtype=dtype)
        self.gate_proj = linear(cfg.hidden, cfg.intermediate)
        self.up_proj = linear(cfg.hidden, cfg.intermediate)
        self.down_proj = linear(cfg.intermediate, cfg.hidden)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg, device, dtype):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.attn = Attention(cfg, device, dtype)
        self.post_attn_norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.mlp = SwiGLU(cfg, device, dtype)

    def forward(self, x, cos, sin, mask, attend):
        x = x + self.attn(self.input_norm(x), cos, sin, mask, attend)
        return x + self.mlp(self.post_attn_norm(x))


class LlamaShaped(nn.Module):
    """The decoder; `attend(q, k, v, mask)` is the attention every layer calls (set per impl)."""

    def __init__(self, cfg, device, dtype):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, device=device, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, device, dtype) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps, device, dtype)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, device=device, dtype=dtype)
        self.attend = sdpa_attend

    def forward(self, batch):
        """Mean cross-entropy over the batch's labelled positions (labels already shifted)."""
        x = self.embed(batch.input_ids)
        cos, sin = rope_tables(batch.positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, batch.mask, self.attend)
        logits = self.lm_head(self.norm(x))
        # fp32 softmax over the vocabulary, as transformers' loss does.
        return F.cross_entropy(logits.float().view(-1, self.cfg.vocab), batch.labels.view(-1),
                               ignore_index=IGNORE)


def build_model(cfg, device, dtype, seed=0):
    """Random weights: projections and embeddings normal(0, 0.02), norms 1 (none on 'meta')."""
    model = LlamaShaped(cfg, device, dtype)
    if torch.device(device).type != "meta":
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, 0.02, generator=g)
    return model


def make_optimizer(model):
    """AdamW, fused where this torch has it for these parameters, else foreach; and its name."""
    try:
        return torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, fused=True), "AdamW (fused)"
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(model.parameters(), lr=ADAMW_LR, foreach=True), "AdamW (foreach)"


# --------------------------------------------------------------------------- attention impls

def sdpa_attend(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                          enable_gqa=True)


def flashcore_attend(q, k, v, mask):
    return torch.ops.flashcore.sdpa(q, k, v, mask, 0.0, mask is None, enable_gqa=True)


class FirstCallRecorder:
    """Wraps an attention function and keeps the first call's inputs (layer 0's), so that the
    path taken can be asked about those exact tensors afterwards."""

    def __init__(self, attend):
        self.attend, self.args = attend, None

    def __call__(self, q, k, v, mask):
        if self.args is None:
            self.args = (q.detach(), k.detach(), v.detach(), mask)
        return self.attend(q, k, v, mask)


def first_line(e):
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:120]


def sdpa_path(args):
    """The backend aten's SDPA picks for these inputs (its own dispatch decision)."""
    from torch.nn.attention import SDPBackend
    q, k, v, mask = args
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, mask is None, enable_gqa=True)
        return f"aten {SDPBackend(choice).name.lower()}"
    except Exception as e:  # a private function: may change between torch versions
        return f"unknown ({first_line(e)})"


def flashcore_route(fc, args):
    """flashcore.explain_training(): whether FlashCore's training route keeps these calls on
    FlashCore or hands both passes to aten's SDPA ("aten: <why>"); None where this flashcore
    has no such route."""
    explain_training = getattr(fc, "explain_training", None)
    if explain_training is None:
        return None
    q, k, v, mask = args
    try:
        return str(explain_training(q, k, v, attn_mask=mask, is_causal=mask is None,
                                    enable_gqa=True))
    except Exception as e:
        return f"unknown ({first_line(e)})"


def flashcore_path(fc, args):
    """flashcore.explain() of the forward and explain_backward() of the backward, guarded:
    explain_backward's answer is being reworked, and it takes no attn_mask."""
    q, k, v, mask = args
    causal = mask is None
    try:
        fwd = fc.explain(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    except Exception as e:
        fwd = f"unknown ({first_line(e)})"
    explain_backward = getattr(fc, "explain_backward", None)
    if explain_backward is None:
        bwd = "unknown (this flashcore has no explain_backward)"
    elif mask is not None and "attn_mask" not in inspect.signature(explain_backward).parameters:
        bwd = "python: attn_mask (this explain_backward takes no mask)"
    else:
        try:
            kwargs = {} if mask is None else {"attn_mask": mask}
            with torch.no_grad():
                out, lse = torch.ops.flashcore.sdpa_fwd(q, k, v, mask, 0.0, causal, enable_gqa=True)
                dout = torch.ones_like(out)
            bwd = str(explain_backward(dout, q, k, v, out, lse, None, causal, None, True, **kwargs))
        except Exception as e:
            bwd = f"unknown ({first_line(e)})"
    return f"fwd: {fwd}; bwd: {bwd}"


# --------------------------------------------------------------------------- batches

@dataclass
class Batch:
    input_ids: torch.Tensor   # (B, S) int64
    positions: torch.Tensor   # (B, S) int64, RoPE positions
    mask: object              # None (is_causal) or a (B, 1, S, S) bool mask, True = attend
    labels: torch.Tensor      # (B, S) int64, the next token or IGNORE
    pads: list                # left padding of each row


def pad_lengths(B, S):
    """Left padding per row: b*S/(2B) (row 0 unpadded, as the longest sequence of a batch padded
    to its longest); a batch of one gets S/4, so that its mask masks something."""
    if B == 1:
        return [S // 4]
    return [b * S // (2 * B) for b in range(B)]


def padded_causal_mask(pads, S, device):
    """HuggingFace's bool mask for a left-padded batch, (B, 1, S, S), True = attend: query i sees
    keys j with pad_b <= j <= i. A query inside the padding (i < pad_b) would see no key; it sees
    itself instead, so that no backend meets a fully masked row (the loss ignores those rows)."""
    i = torch.arange(S, device=device).view(1, 1, S, 1)
    j = torch.arange(S, device=device).view(1, 1, 1, S)
    pad = torch.tensor(pads, device=device).view(-1, 1, 1, 1)
    return (j <= i) & ((j >= pad) | (j == i))


def make_batch(B, S, vocab, padded, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    ids = torch.randint(1, vocab, (B, S), generator=g, device=device)  # 0 is the pad token
    if padded:
        pads = pad_lengths(B, S)
        real = torch.arange(S, device=device)[None] >= torch.tensor(pads, device=device)[:, None]
        ids = ids.masked_fill(~real, PAD_ID)
        # Positions count from each row's first real token, as transformers' generate() numbers
        # them (the padding gets 0 here; its outputs are never used).
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        mask = padded_causal_mask(pads, S, device)
    else:
        pads = [0] * B
        real = torch.ones(B, S, dtype=torch.bool, device=device)
        positions = torch.arange(S, device=device).expand(B, S)
        mask = None
    # Position t predicts token t + 1; a padded query or target is not a training example.
    labels = torch.full((B, S), IGNORE, dtype=torch.long, device=device)
    labels[:, :-1] = torch.where(real[:, :-1] & real[:, 1:], ids[:, 1:], IGNORE)
    return Batch(ids, positions, mask, labels, pads)


# --------------------------------------------------------------------------- steps and checks

CHECKED_PARAMS = ("layers.0.attn.q_proj.weight", "layers.0.attn.k_proj.weight",
                  "layers.0.attn.v_proj.weight", "layers.0.attn.o_proj.weight",
                  "layers.0.input_norm.weight", "layers.{last}.attn.o_proj.weight")


def train_step(model, batch, attend, optimizer=None):
    """Forward, loss, backward (and the optimizer's step); gradients must be zeroed before."""
    model.attend = attend
    loss = model(batch)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return loss


def rel_diff(a, b):
    """max|a - b| / max|b| in fp32 (0 when both are all zeros)."""
    a, b = a.float(), b.float()
    scale = b.abs().max().item()
    err = (a - b).abs().max().item()
    return err / scale if scale > 0 else err


def check_step(model, batch, attends):
    """One step of each impl on the same weights (no optimizer): loss, chosen gradients and the
    first attention call's inputs per impl, or the error that stopped its step (out of memory:
    PyTorch's math backend, if aten picks it, keeps a (B, H, S, S) matrix per layer)."""
    names = [p.replace("{last}", str(model.cfg.layers - 1)) for p in CHECKED_PARAMS]
    out = {}
    for impl, attend in attends.items():
        recorder = FirstCallRecorder(attend)
        model.zero_grad(set_to_none=True)
        try:
            loss = train_step(model, batch, recorder).detach().float()
            grads = {n: model.get_parameter(n).grad.detach().float().clone() for n in names}
            out[impl] = dict(loss=loss, grads=grads, attn_args=recorder.args)
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            out[impl] = dict(error=f"{type(e).__name__}: {first_line(e)}")
    model.zero_grad(set_to_none=True)
    return out


def judge(dtype, checked):
    """Each impl's status from its check step, flashcore's against sdpa's: ({impl: status},
    flashcore's diffs or None). "ok", "CHECK FAILED: ..." (out of TOL), "unverified: ..." (sdpa
    gave nothing to compare with), "WRONG: ..." (NaN/Inf) or "error: ..." (the step raised)."""
    status = {}
    for impl, c in checked.items():
        if "error" in c:
            status[impl] = f"error: {c['error']}"
        elif not (bool(torch.isfinite(c["loss"]))
                  and all(bool(torch.isfinite(g).all()) for g in c["grads"].values())):
            status[impl] = "WRONG: NaN/Inf in the loss or gradients"
        else:
            status[impl] = "ok"
    if status["flashcore"] != "ok":
        return status, None
    if status["sdpa"] != "ok":
        status["flashcore"] = "unverified: sdpa's step gave nothing to compare with"
        return status, None
    ref, got = checked["sdpa"], checked["flashcore"]
    grad_diffs = {n: rel_diff(got["grads"][n], ref["grads"][n]) for n in ref["grads"]}
    numbers = dict(loss_rel_diff=rel_diff(got["loss"], ref["loss"]),
                   grad_rel_diff=max(grad_diffs.values()), grad_rel_diffs=grad_diffs)
    loss_tol, grad_tol = TOL[dtype]
    if not (numbers["loss_rel_diff"] <= loss_tol and numbers["grad_rel_diff"] <= grad_tol):
        status["flashcore"] = (f"CHECK FAILED: loss rel {numbers['loss_rel_diff']:.2e} "
                               f"(tol {loss_tol:g}), grads rel {numbers['grad_rel_diff']:.2e} "
                               f"(tol {grad_tol:g}) vs sdpa")
    return status, numbers


def timeable(status):
    """Rows worth timing: right, or only suspect (a loose tolerance can misjudge)."""
    return status == "ok" or status.startswith(("CHECK FAILED", "unverified"))


class CudaStepTimer:
    """Times steps of several impls taken in turn, each between its own pair of CUDA events."""

    def __init__(self, warmup, iters):
        self.warmup, self.iters = warmup, iters

    def step_ms(self, model, batch, steps):
        """steps: {impl: fn()} each running one full step on `batch`. Returns {impl: [ms of each
        step]}."""
        for _ in range(self.warmup):
            for fn in steps.values():
                model.zero_grad(set_to_none=True)
                fn()
        torch.cuda.synchronize()  # the warm-up's queued work must not land inside the events
        events = {impl: [] for impl in steps}
        for _ in range(self.iters):
            for impl, fn in steps.items():
                model.zero_grad(set_to_none=True)  # outside the events: not part of the step
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events[impl].append((start, end))
        torch.cuda.synchronize()
        return {impl: [s.elapsed_time(e) for s, e in pairs] for impl, pairs in events.items()}


class FakeStepTimer:
    """Dry run: runs each step once (untimed, to exercise it) and hands out made-up times,
    deterministic, in proportion to the step's size; flashcore's 10% below sdpa's."""

    def __init__(self, iters):
        self.iters = iters

    def step_ms(self, model, batch, steps):
        for fn in steps.values():
            model.zero_grad(set_to_none=True)
            fn()
        cfg = model.cfg
        B, S = batch.input_ids.shape
        base = 1e-6 * B * S * cfg.layers * (cfg.hidden + cfg.intermediate) + 1.0
        fake = {"sdpa": base, "flashcore": base / 1.1}
        return {impl: [fake[impl] * (1 + 0.01 * (i % 3)) for i in range(self.iters)] for impl in steps}


# --------------------------------------------------------------------------- one measurement

def base_row(impl, cfg, B, S, padded, dtype_name, adamw):
    return dict(impl=impl, model=cfg.name, B=B, S=S, padded=padded, ms=None, tokens_per_s=None,
                vs_sdpa=None, dtype=dtype_name, layers=cfg.layers, vocab=cfg.vocab, adamw=adamw,
                ms_steps=None, loss=None, status="ok", path=None)


def measure(model, cfg, B, S, padded, attends, fc, timer, optimizer, args, device, seed):
    """Check, then time, both impls on one batch. Returns (rows, progress line)."""
    rows = {impl: base_row(impl, cfg, B, S, padded, args.dtype, bool(args.adamw)) for impl in IMPLS}
    rows["flashcore"]["route"] = None
    batch = make_batch(B, S, cfg.vocab, padded, device, seed)
    times = {}
    try:
        checked = check_step(model, batch, attends)
        status, numbers = judge(args.dtype, checked)
        for impl in IMPLS:
            rows[impl]["status"] = status[impl]
            if "loss" in checked[impl]:
                rows[impl]["loss"] = checked[impl]["loss"].item()
        if numbers is not None:
            rows["flashcore"].update(numbers)
        if "attn_args" in checked["sdpa"]:
            rows["sdpa"]["path"] = sdpa_path(checked["sdpa"]["attn_args"])
        if fc is None:
            rows["flashcore"]["path"] = ("substituted: F.scaled_dot_product_attention (dry run, "
                                         "flashcore not importable)")
        elif "attn_args" in checked["flashcore"]:
            rows["flashcore"]["path"] = flashcore_path(fc, checked["flashcore"]["attn_args"])
            rows["flashcore"]["route"] = flashcore_route(fc, checked["flashcore"]["attn_args"])
        del checked
        steps = {impl: (lambda a: lambda: train_step(model, batch, a, optimizer))(attends[impl])
                 for impl in IMPLS if timeable(rows[impl]["status"])}
        if steps:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                times = timer.step_ms(model, batch, steps)
    except RuntimeError as e:  # out of memory while timing: report, go on with the next row
        for impl in IMPLS:
            if timeable(rows[impl]["status"]):
                rows[impl]["status"] = f"error while timing: {type(e).__name__}: {first_line(e)[:100]}"
        times = {}
    finally:
        model.zero_grad(set_to_none=True)
    for impl, ms in times.items():
        row = rows[impl]
        row["ms_steps"] = [round(t, 3) for t in ms]
        row["ms"] = statistics.median(ms)
        row["tokens_per_s"] = B * S / (row["ms"] / 1e3)
    if rows["sdpa"]["ms"] is not None:
        for row in rows.values():
            if row["ms"] is not None:
                row["vs_sdpa"] = rows["sdpa"]["ms"] / row["ms"]
    fc_row = rows["flashcore"]
    check = (f"check loss rel {fc_row['loss_rel_diff']:.1e} grads rel {fc_row['grad_rel_diff']:.1e}"
             if "loss_rel_diff" in fc_row else "no comparison")
    timing = ", ".join(f"{impl} {fmt(rows[impl]['ms'], '.1f')} ms" for impl in IMPLS)
    flags = "; ".join(f"{impl}: {rows[impl]['status']}" for impl in IMPLS
                      if rows[impl]["status"] != "ok")
    to_aten = routed_to_aten(fc_row)
    line = (f"{cfg.name} B={B} S={S} {'padded' if padded else 'unpadded'}: {check}; {timing}; "
            f"vs_sdpa {fmt(fc_row['vs_sdpa'], '.3f')}"
            + (" (flashcore's training route ran aten's SDPA)" if to_aten else "")
            + (f"  !!! {flags}" if flags else ""))
    return [rows[impl] for impl in IMPLS], line


# --------------------------------------------------------------------------- output

def routed_to_aten(row):
    return (row.get("route") or "").startswith("aten")


def fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def print_table(rows, fake):
    title = ("Training step, median per step" +
             ("  (DRY RUN: FAKE TIMINGS, numbers mean nothing)" if fake else ""))
    print(f"\n{title}")
    print(f"{'model':<6} {'B':>2} {'S':>6} {'padded':<7} {'impl':<10} {'ms':>9} {'tokens/s':>11} "
          f"{'vs_sdpa':>8}  {'loss':>8}  status / path")
    for r in rows:
        status = r["status"] if r["status"] != "ok" else ""
        path = r["path"] or ""
        if routed_to_aten(r):  # then the row timed aten's SDPA, not FlashCore's kernels
            path = f"ROUTED TO ATEN ({r['route']}); {path}"
        print(f"{r['model']:<6} {r['B']:>2} {r['S']:>6} {str(r['padded']):<7} {r['impl']:<10} "
              f"{fmt(r['ms'], '9.2f'):>9} {fmt(r['tokens_per_s'], '11.0f'):>11} "
              f"{fmt(r['vs_sdpa'], '8.3f'):>8}  {fmt(r['loss'], '8.4f'):>8}  "
              + "  ".join(x for x in (status, path) if x), flush=True)


# --------------------------------------------------------------------------- main

def load_flashcore(dry_run):
    """The flashcore module, or None in a dry run that cannot import it (F.sdpa stands in).
    Outside a dry run a failed import ends the script with a message, not a traceback."""
    try:
        import flashcore
        return flashcore
    except (ImportError, OSError) as e:
        why = first_line(e)
        if dry_run:
            print(f"note: flashcore cannot be imported ({why}); this dry run uses "
                  f"F.scaled_dot_product_attention in its place", file=sys.stderr)
            return None
        raise SystemExit(f"bench_train.py: flashcore cannot be imported: {why}\n"
                         "  Build and install it first (bash ci/install.sh), or run with --dry-run.")


def parse_shapes(text, ap):
    shapes = []
    for part in text.split(","):
        try:
            b, s = (int(x) for x in part.lower().split("x"))
        except ValueError:
            ap.error(f"--shapes: '{part}' is not BxS (e.g. 2x4096)")
        if b < 1 or s < 2:
            ap.error(f"--shapes: '{part}' needs B >= 1 and S >= 2")
        shapes.append((b, s))
    return shapes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="1b,8b", help="comma-separated configs: 1b, 8b (default both)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: 4 for 1b, 2 for 8b)")
    ap.add_argument("--vocab", type=int, default=32000,
                    help="vocabulary size (default 32000; the logits take B*S*vocab elements)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                    help="weights and activations (default bf16)")
    ap.add_argument("--tokens", default="8k,16k",
                    help="tokens per step: 8k (B=2 S=4096, B=1 S=8192), 16k (B=4 S=4096, "
                         "B=2 S=8192), or both (default)")
    ap.add_argument("--shapes", metavar="BxS,...",
                    help="explicit batch shapes instead of --tokens, e.g. 1x16384,8x2048")
    ap.add_argument("--padding", choices=("both", "none", "left"), default="both",
                    help="unpadded batches (is_causal), left-padded ones (bool mask), or both")
    ap.add_argument("--adamw", action="store_true", help="include an AdamW step (fused if available)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per impl (default 3)")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per impl (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and token ids")
    ap.add_argument("--json", metavar="PATH",
                    help="JSON output path (default: bench/results/train_<card>_<date>.json)")
    ap.add_argument("--no-json", action="store_true", help="write no JSON")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: tiny models on the CPU (sequence lengths / 128), a checked "
                         "and an untimed step per impl, FAKE timings; writes JSON only to an "
                         "explicit --json PATH")
    args = ap.parse_args(argv)

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in CONFIGS]
    if bad or not models:
        ap.error(f"--models: unknown {bad}; choose from {sorted(CONFIGS)}")
    if args.shapes:
        shapes = parse_shapes(args.shapes, ap)
    else:
        keys = [t.strip() for t in args.tokens.split(",") if t.strip()]
        bad = [t for t in keys if t not in TOKEN_SHAPES]
        if bad or not keys:
            ap.error(f"--tokens: unknown {bad}; choose from {sorted(TOKEN_SHAPES)}")
        shapes = [bs for t in keys for bs in TOKEN_SHAPES[t]]
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be at least 1")
    if args.vocab < 2 or args.iters < 1 or args.warmup < 0:
        ap.error("--vocab needs >= 2, --iters >= 1, --warmup >= 0")
    paddings = {"both": (False, True), "none": (False,), "left": (True,)}[args.padding]
    results_dir = os.path.realpath(os.path.join(REPO, "bench", "results"))
    if args.dry_run and args.json and not args.no_json and \
            os.path.realpath(os.path.abspath(args.json)).startswith(results_dir + os.sep):
        ap.error("a dry run never writes into bench/results/ (its timings are fake); "
                 "give --json a path elsewhere")

    if not args.dry_run and not torch.cuda.is_available():
        print("bench_train.py: no CUDA device, so nothing to time. --dry-run runs a tiny model on "
              "the CPU with fake timings.")
        return 0
    fc = load_flashcore(args.dry_run)
    helpers = load_bench_helpers()
    sha, dirty = helpers.git_info()
    now = _dt.datetime.now()
    dtype = DTYPES[args.dtype]
    if args.dry_run:
        device, card = "cpu", "dry-run"
        # One thread: the tiny matmuls gain nothing from more, and on a busy machine OpenMP's
        # threads waiting on each other made each CPU step ~30x slower (0.6 s instead of 20 ms).
        torch.set_num_threads(1)
        shapes = [(b, max(2, s // DRY_SEQ_DIV)) for b, s in shapes]
        timer = FakeStepTimer(args.iters)
    else:
        device, card = "cuda", torch.cuda.get_device_name()
        timer = CudaStepTimer(args.warmup, args.iters)
    attends = {"sdpa": sdpa_attend, "flashcore": flashcore_attend if fc is not None else sdpa_attend}

    cfgs = []
    for m in models:
        cfg = replace(CONFIGS[m], vocab=args.vocab, layers=args.layers or CONFIGS[m].layers)
        cfgs.append(tiny_config(cfg) if args.dry_run else cfg)
    opt_name = None  # the optimizer actually built (fused or foreach), for the JSON's method
    method = (f"train step = forward, cross-entropy loss, backward"
              + (", AdamW step" if args.adamw else "")
              + f"; impls interleaved step by step on one model and batch (sdpa, flashcore, ...); "
              f"{args.warmup} warm-up steps each, then median of {args.iters} steps each, each "
              f"step between its own CUDA events (gradient zeroing outside); tokens/s = B*S / "
              f"median ms; {args.dtype}; random weights")
    if args.dry_run:
        method = ("DRY RUN, FAKE TIMINGS (tiny model on the CPU, sequence lengths / "
                  f"{DRY_SEQ_DIV}): " + method)
    banner = "=" * 78
    if args.dry_run:
        print(f"{banner}\nDRY RUN: tiny model on the CPU; every time below is FAKE (made up to "
              f"exercise the code)\n{banner}")
    print(f"FlashCore training bench  sha={sha}{' (dirty)' if dirty else ''}  "
          f"torch={torch.__version__}  card={card}  {now:%Y-%m-%d %H:%M}")
    print(f"models: " + "; ".join(f"{c.name}: hidden {c.hidden}, heads {c.heads}/{c.kv_heads} x "
                                  f"{c.head_dim}, MLP {c.intermediate}, {c.layers} layers, vocab "
                                  f"{c.vocab}" for c in cfgs))
    print(f"method: {method}", flush=True)

    t0 = time.time()
    rows, flagged = [], False
    total = len(cfgs) * len(shapes) * len(paddings)
    n = 0
    for cfg in cfgs:
        model = build_model(cfg, device, dtype, seed=args.seed)
        optimizer = None
        if args.adamw:
            optimizer, opt_name = make_optimizer(model)
        for B, S in shapes:
            for padded in paddings:
                n += 1
                got, line = measure(model, cfg, B, S, padded, attends, fc, timer, optimizer,
                                    args, device, args.seed + n)
                rows += got
                flagged |= any(r["status"] != "ok" for r in got)
                print(f"[{n}/{total}] {line}" + ("  (FAKE timing)" if args.dry_run else ""),
                      file=sys.stderr, flush=True)
        del model, optimizer
        if device == "cuda":
            torch.cuda.empty_cache()
    if opt_name:
        method = method.replace("AdamW step", f"{opt_name} step (lr {ADAMW_LR:g})")
    elapsed = time.time() - t0
    print_table(rows, args.dry_run)
    print(f"\n{len(rows)} rows, {elapsed:.1f} s"
          + ("; some rows flagged (see status)" if flagged else "")
          + ("  [DRY RUN: fake timings]" if args.dry_run else ""))

    path = args.json
    if not args.no_json and path is None and not args.dry_run:
        path = os.path.join(REPO, "bench", "results",
                            f"train_{helpers.slug(card)}_{now:%Y-%m-%d_%H%M}.json")
    if args.no_json or path is None:
        if args.dry_run and not args.no_json:
            print("dry run: no JSON written (a dry run writes one only to --json PATH)")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__, card=card,
                   date=now.isoformat(timespec="seconds"), method=method, dry_run=args.dry_run,
                   args=vars(args), elapsed_s=round(elapsed, 1), rows=rows)
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"JSON: {path}" + ("  (DRY RUN: fake timings)" if args.dry_run else ""))
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
