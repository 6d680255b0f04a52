"""FlashCore's forward with aten's backward kernels (cuDNN's, FlashAttention-2's): does the pair
work, and would it pay?

Training calls that FlashCore's route sends to aten today (D=256 unmasked, D=128 under 2048 keys,
D=64 under 1024, the sm80-class backward's calls: TRAINING_TABLE in python/flashcore/_ops.py)
run PyTorch's forward and backward, because aten's backward needs what aten's forward saved. But
what cuDNN's backward reads of its forward is the output and the row log-sum-exps, which
FlashCore's forward (sdpa_fwd) also gives; so does FlashAttention-2's (PyTorch's "flash" backend,
which takes GQA). If a backward takes them, those calls could run FlashCore's forward (faster
than cuDNN's on Hopper) with PyTorch's backward: never slower than PyTorch's pair, faster by the
forward's lead. This probe answers, per shape and backend (cuDNN for Hq = Hkv; flash for both):
  * the layout the backend's forward gives its logsumexp (shape, strides) beside FlashCore's
    (B, H, Sq) natural-log LSE, and their largest difference (also as if it were base 2);
  * whether the backend's backward op accepts FlashCore's out and LSE (laid out as its own), and
    its gradients' largest difference from the same backward fed its own forward (and, for
    small shapes, from a float64 reference); and whether the call the prepared hybrid patch
    makes (docs/experiments/prepared/) runs and agrees;
  * times (CUDA-event medians, interleaved): FlashCore's forward, the backend's forward, its
    backward fed either forward, FlashCore's backward kernel; the pairs' sums and ratios.

  PYTHONPATH=python:tools python3 tools/hybrid_bwd_probe.py [--dims 64,128,256] [--lengths 512,1024,2048,4096]
      [--backends cudnn,flash] [--gqa] [--iters 15] [--json F]

Shapes: bf16, 16k tokens (B = 16384 / S), H = 2048 / D (8 at D=256), causal and not; with --gqa
also GQA 4 (32:8 heads at D=64, 16:4 at D=128), causal, flash only. Needs a CUDA card where
PyTorch has cuDNN and flash attention.
"""
import argparse
import json
import math

import torch

import flashcore  # noqa: F401  (registers torch.ops.flashcore)
from interleaved import medians

aten = torch.ops.aten


def cudnn_forward(q, k, v, causal):
    """cuDNN's forward with its log-sum-exps: (out, lse, the rest its backward takes)."""
    (out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _) = aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False)
    return out, lse, (seed, offset, cum_q, cum_k, max_q, max_k)


def cudnn_backward(dout, q, k, v, out, lse, rest, causal):
    seed, offset, cum_q, cum_k, max_q, max_k = rest
    return aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal)


def flash_forward(q, k, v, causal):
    """FlashAttention-2's forward (PyTorch's flash backend; K and V may have fewer heads)."""
    (out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _) = aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False)
    return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)


def flash_backward(dout, q, k, v, out, lse, rest, causal):
    cum_q, cum_k, max_q, max_k, seed, offset = rest
    return aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset)


BACKENDS = {"cudnn": (cudnn_forward, cudnn_backward), "flash": (flash_forward, flash_backward)}


def patch_convention_backward(backend, dout, q, k, v, out, lse, causal):
    """The call docs/experiments/prepared/hybrid-training-route.patch makes (its _aten_backward):
    FlashCore's (B, H, Sq) LSE as is (flash) or with a trailing 1 (cuDNN), no cumulative lengths,
    empty RNG tensors (no dropout), the lengths from the shapes."""
    no_rng = torch.empty(0, dtype=torch.int64, device=q.device)
    sq, sk = q.shape[-2], k.shape[-2]
    if backend == "cudnn":
        return aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1), no_rng, no_rng, None, None, None, sq, sk, 0.0, causal)
    return aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, None, None, sq, sk, 0.0, causal, no_rng, no_rng)


def as_layout_of(lse_fc, lse_theirs):
    """FlashCore's (B, H, Sq) LSE laid out as the backend's logsumexp (same sizes and strides)."""
    return torch.empty_strided(lse_theirs.shape, lse_theirs.stride(), dtype=lse_theirs.dtype,
                               device=lse_theirs.device).copy_(lse_fc.reshape(lse_theirs.shape))


def float64_grads(q, k, v, dout, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal,
                                                           enable_gqa=k.shape[1] != q.shape[1])
    return torch.autograd.grad(out, (q64, k64, v64), dout.double())


def max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def probe(backend, d, s, causal, iters, hkv=None):
    forward, backward = BACKENDS[backend]
    b, h = max(1, 16384 // s), 2048 // d if d < 256 else 8
    hkv = hkv or h
    torch.manual_seed(0)
    q = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    gqa = hkv != h
    row = {"backend": backend, "D": d, "S": s, "B": b, "Hq": h, "Hkv": hkv, "causal": causal}
    out_fc, lse_fc = torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=causal, enable_gqa=gqa)
    try:
        out_b, lse_b, rest = forward(q, k, v, causal)
    except RuntimeError as e:
        row["hybrid"] = f"{backend}'s forward refused: {str(e).splitlines()[0][:200]}"
        return row
    row["lse_layout"] = {"shape": list(lse_b.shape), "stride": list(lse_b.stride()), "dtype": str(lse_b.dtype)}
    if lse_b.numel() != lse_fc.numel():  # (e.g. rows padded): the probe would need the mapping
        row["hybrid"] = f"their logsumexp holds {lse_b.numel()} values, FlashCore's {lse_fc.numel()}"
        return row
    mine = lse_fc.reshape(lse_b.shape).double()
    row["lse_max_diff"] = (mine - lse_b.double()).abs().max().item()
    row["lse_max_diff_if_base2"] = (mine / math.log(2) - lse_b.double()).abs().max().item()
    row["out_max_diff"] = (out_fc.double() - out_b.double()).abs().max().item()
    lse_fc_b = as_layout_of(lse_fc, lse_b)
    try:
        grads_hybrid = backward(dout, q, k, v, out_fc, lse_fc_b, rest, causal)
    except RuntimeError as e:
        row["hybrid"] = f"refused: {str(e).splitlines()[0][:200]}"
        return row
    grads_theirs = backward(dout, q, k, v, out_b, lse_b, rest, causal)
    row["hybrid"] = "ran"
    row["grad_max_diff_vs_their_pair"] = max_diff(grads_hybrid, grads_theirs)
    try:
        grads_patch = patch_convention_backward(backend, dout, q, k, v, out_fc, lse_fc, causal)
        row["patch_convention"] = f"ran, grads vs their pair {max_diff(grads_patch, grads_theirs):.1e}"
    except RuntimeError as e:
        row["patch_convention"] = f"refused: {str(e).splitlines()[0][:200]}"
    if b * h * s * s <= 2 ** 27:
        ref = float64_grads(q, k, v, dout, causal)
        row["grad_max_diff_hybrid_vs_f64"] = max_diff(grads_hybrid, ref)
        row["grad_max_diff_theirs_vs_f64"] = max_diff(grads_theirs, ref)
    fns = {
        "fc_fwd": lambda: torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=causal, enable_gqa=gqa),
        "their_fwd": lambda: forward(q, k, v, causal),
        "their_bwd": lambda: backward(dout, q, k, v, out_b, lse_b, rest, causal),
        "their_bwd_fed_fc": lambda: backward(dout, q, k, v, out_fc, lse_fc_b, rest, causal),
        "fc_bwd": lambda: torch.ops.flashcore.sdpa_bwd_kernel(dout, q, k, v, out_fc, lse_fc, None, causal, None, gqa),
    }
    us = dict(zip(fns, medians(list(fns.values()), iters)))
    row["us"] = us
    their_pair = us["their_fwd"] + us["their_bwd"]
    row["their_pair_us"] = their_pair
    row["hybrid_pair_us"] = us["fc_fwd"] + us["their_bwd_fed_fc"]
    row["fc_pair_us"] = us["fc_fwd"] + us["fc_bwd"]
    row["hybrid_speedup"] = their_pair / row["hybrid_pair_us"]
    row["fc_pair_speedup"] = their_pair / row["fc_pair_us"]
    return row


def report(row):
    head = (f"{row['backend']:5s} D={row['D']:3d} S={row['S']:5d} {row['Hq']}:{row['Hkv']} "
            f"causal={row['causal']!s:5}")
    if row["hybrid"] != "ran":
        print(f"{head}: {row['hybrid']} (their lse {row.get('lse_layout')})")
        return
    us = row["us"]
    print(f"{head}  lse diff {row['lse_max_diff']:.1e}  grads vs their pair {row['grad_max_diff_vs_their_pair']:.1e}  "
          f"hybrid {row['hybrid_speedup']:.3f}  FlashCore pair {row['fc_pair_speedup']:.3f}  "
          f"(us: fc fwd {us['fc_fwd']:.0f}, their fwd {us['their_fwd']:.0f}, their bwd {us['their_bwd']:.0f} / "
          f"fed fc {us['their_bwd_fed_fc']:.0f}, fc bwd {us['fc_bwd']:.0f}); the patch's call: {row['patch_convention']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="512,1024,2048,4096")
    ap.add_argument("--backends", default="cudnn,flash")
    ap.add_argument("--gqa", action="store_true", help="also GQA 4 at D 64 and 128, causal (flash)")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; speedups: their pair's time / the pair's")
    lengths = [int(x) for x in args.lengths.split(",")]
    for backend in args.backends.split(","):
        for d in (int(x) for x in args.dims.split(",")):
            for s in lengths:
                for causal in (False, True):
                    rows.append(probe(backend, d, s, causal, args.iters))
                    report(rows[-1])
    if args.gqa:
        for d in (64, 128):
            for s in lengths:
                rows.append(probe("flash", d, s, True, args.iters, hkv=2048 // d // 4))
                report(rows[-1])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"card": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
