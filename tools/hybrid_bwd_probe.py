"""FlashCore's forward with aten's cuDNN backward kernel: does the pair work, and would it pay?

Training calls that FlashCore's route sends to aten today (D=256 unmasked, D=128 under 2048 keys,
D=64 under 1024, the sm80-class backward's calls: TRAINING_TABLE in python/flashcore/_ops.py)
run PyTorch's forward and backward, because aten's backward needs what aten's forward saved. But
what cuDNN's backward reads of its forward is the output and the row log-sum-exps, which
FlashCore's forward (sdpa_fwd) also gives. If cuDNN's backward takes them, those calls could run
FlashCore's forward (faster than cuDNN's on Hopper) with cuDNN's backward: never slower than
PyTorch's pair, faster by the forward's lead. This probe answers, per shape:
  * the layout cuDNN's forward gives its logsumexp (shape, strides, natural log or base 2) beside
    FlashCore's (B, H, Sq) natural-log LSE, and their largest difference;
  * whether aten::_scaled_dot_product_cudnn_attention_backward accepts FlashCore's out and LSE
    (laid out as cuDNN's), and its gradients' largest difference from the same backward fed
    cuDNN's own forward (and, for small shapes, from a float64 reference);
  * times (CUDA-event medians, interleaved): FlashCore's forward, cuDNN's forward, cuDNN's
    backward fed either forward, FlashCore's backward kernel; the pairs' sums and ratios.

  PYTHONPATH=python:tools python3 tools/hybrid_bwd_probe.py [--dims 64,128,256] [--lengths 512,1024,2048,4096]
      [--iters 15] [--json F]

Shapes: bf16, 16k tokens (B = 16384 / S), H = 2048 / D (8 at D=256), causal and not, Hq = Hkv
(cuDNN's GQA support varies by release). Needs a CUDA card where PyTorch has cuDNN attention.
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


def as_layout_of(lse_fc, lse_cudnn):
    """FlashCore's (B, H, Sq) LSE laid out as cuDNN's logsumexp (same sizes and strides)."""
    return torch.empty_strided(lse_cudnn.shape, lse_cudnn.stride(), dtype=lse_cudnn.dtype,
                               device=lse_cudnn.device).copy_(lse_fc.reshape(lse_cudnn.shape))


def float64_grads(q, k, v, dout, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=causal)
    return torch.autograd.grad(out, (q64, k64, v64), dout.double())


def max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def probe(d, s, causal, iters):
    b, h = max(1, 16384 // s), 2048 // d if d < 256 else 8
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dout = torch.randn_like(q)
    row = {"D": d, "S": s, "B": b, "H": h, "causal": causal}
    out_fc, lse_fc = torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=causal)
    out_c, lse_c, rest = cudnn_forward(q, k, v, causal)
    row["cudnn_lse"] = {"shape": list(lse_c.shape), "stride": list(lse_c.stride()), "dtype": str(lse_c.dtype)}
    row["lse_max_diff"] = (lse_fc.reshape(lse_c.shape).double() - lse_c.double()).abs().max().item()
    row["lse_max_diff_if_base2"] = (lse_fc.reshape(lse_c.shape).double() / math.log(2) - lse_c.double()).abs().max().item()
    row["out_max_diff"] = (out_fc.double() - out_c.double()).abs().max().item()
    lse_fc_c = as_layout_of(lse_fc, lse_c)
    try:
        grads_hybrid = cudnn_backward(dout, q, k, v, out_fc, lse_fc_c, rest, causal)
    except RuntimeError as e:
        row["hybrid"] = f"refused: {str(e).splitlines()[0][:200]}"
        return row
    grads_cudnn = cudnn_backward(dout, q, k, v, out_c, lse_c, rest, causal)
    row["hybrid"] = "ran"
    row["grad_max_diff_vs_cudnn_pair"] = max_diff(grads_hybrid, grads_cudnn)
    if b * h * s * s <= 2 ** 27:
        ref = float64_grads(q, k, v, dout, causal)
        row["grad_max_diff_hybrid_vs_f64"] = max_diff(grads_hybrid, ref)
        row["grad_max_diff_cudnn_vs_f64"] = max_diff(grads_cudnn, ref)
    fns = {
        "fc_fwd": lambda: torch.ops.flashcore.sdpa_fwd(q, k, v, is_causal=causal),
        "cudnn_fwd": lambda: cudnn_forward(q, k, v, causal),
        "cudnn_bwd": lambda: cudnn_backward(dout, q, k, v, out_c, lse_c, rest, causal),
        "cudnn_bwd_fed_fc": lambda: cudnn_backward(dout, q, k, v, out_fc, lse_fc_c, rest, causal),
        "fc_bwd": lambda: torch.ops.flashcore.sdpa_bwd_kernel(dout, q, k, v, out_fc, lse_fc, None, causal, None, False),
    }
    us = dict(zip(fns, medians(list(fns.values()), iters)))
    row["us"] = us
    aten_pair = us["cudnn_fwd"] + us["cudnn_bwd"]
    row["aten_pair_us"] = aten_pair
    row["hybrid_pair_us"] = us["fc_fwd"] + us["cudnn_bwd_fed_fc"]
    row["fc_pair_us"] = us["fc_fwd"] + us["fc_bwd"]
    row["hybrid_speedup"] = aten_pair / row["hybrid_pair_us"]
    row["fc_pair_speedup"] = aten_pair / row["fc_pair_us"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--lengths", default="512,1024,2048,4096")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; pairs: aten's time / the pair's")
    for d in (int(x) for x in args.dims.split(",")):
        for s in (int(x) for x in args.lengths.split(",")):
            for causal in (False, True):
                row = probe(d, s, causal, args.iters)
                rows.append(row)
                if row["hybrid"] != "ran":
                    print(f"D={d} S={s} causal={causal}: {row['hybrid']} (cuDNN lse {row['cudnn_lse']})")
                    continue
                print(f"D={d:3d} S={s:5d} causal={causal!s:5}  lse diff {row['lse_max_diff']:.1e}  "
                      f"grads vs cuDNN's pair {row['grad_max_diff_vs_cudnn_pair']:.1e}  "
                      f"hybrid {row['hybrid_speedup']:.3f}  FlashCore pair {row['fc_pair_speedup']:.3f}  "
                      f"(us: fc fwd {row['us']['fc_fwd']:.0f}, cudnn fwd {row['us']['cudnn_fwd']:.0f}, "
                      f"cudnn bwd {row['us']['cudnn_bwd']:.0f} / fed fc {row['us']['cudnn_bwd_fed_fc']:.0f}, "
                      f"fc bwd {row['us']['fc_bwd']:.0f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"card": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
