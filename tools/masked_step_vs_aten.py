"""Training calls with an attn_mask: forward + backward through flashcore.sdpa (its training route
decides FlashCore's pair or PyTorch's) against F.scaled_dot_product_attention (PyTorch's default)
on the same inputs and gradient, per mask form, head dim and length; and FlashCore's pair forced
(FLASHCORE_TRAINING=flashcore) to see what the route weighs. Forms: HuggingFace's left-padded
causal mask (B, 1, S, S), bool and additive; a key-padding mask (B, 1, 1, S), bool and additive;
"dense": a (B, 1, S, S) mask with 10% of its entries masked at random (no tile left empty);
"full" and "causal": no mask (is_causal False / True), the unmasked calls the route weighs too.
CUDA-event medians, interleaved call by call; B = 16k tokens / S. --json writes the rows.
--aten-backend pins PyTorch's side to one SDPA backend (e.g. efficient, the masked backward a
card without cuDNN's runs); FLASHCORE_FAMILY=sm80 in the environment times the sm80-class pair."""
import argparse, json, os
import contextlib
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import flashcore
from interleaved import medians  # tools/interleaved.py


def keep_mask(B, S, form):
    if form in ("full", "causal"):
        return None
    pad = (torch.arange(B, device="cuda") * S // (2 * B)).view(-1, 1, 1, 1)
    j = torch.arange(S, device="cuda").view(1, 1, 1, -1)
    if form == "keys":
        return j >= pad
    i = torch.arange(S, device="cuda").view(1, 1, -1, 1)
    if form == "dense":  # a row per query, no structure: 10% of keys masked at random
        g = torch.Generator(device="cuda").manual_seed(0)
        return (torch.rand(B, 1, S, S, device="cuda", generator=g) > 0.1) | (j == i)
    return (j <= i) & ((j >= pad) | (j == i))


def with_env(name, value, fn):
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return run


def step_arguments(description):
    """The options of the masked-step tools (this one, softcap_masked_step.py): head dims,
    lengths, mask forms, timed rounds, JSON output."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--forms", default="hf,keys")
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--queue", type=int, default=1,
                    help="steps issued back to back per timed sample (1: call by call, each step's "
                         "host time exposed; e.g. 8: as in a model, where the host runs ahead)")
    ap.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd",
                    help="q, k, v and the output's gradient: contiguous (B, H, S, D) tensors, or "
                         "(B, S, H, D) storage seen as (B, H, S, D), as models pass them")
    ap.add_argument("--json")
    return ap


def step_cases(args, dtype):
    """(D, S, B, H, q, k, v, g, form) for each head dim, length and mask form of the options:
    B = 16k tokens / S, H = 2048 / D; q, k, v require grad, g is the output's gradient; all four
    in the layout --layout names."""
    def tensor(B, H, S, D):
        if args.layout == "bshd":
            return torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(B, H, S, D, device="cuda", dtype=dtype)
    for D in (int(d) for d in args.dims.split(",")):
        for S in (int(s) for s in args.lengths.split(",")):
            H, B = 2048 // D, max(1, 16384 // S)
            q, k, v = (tensor(B, H, S, D).requires_grad_() for _ in range(3))
            g = tensor(B, H, S, D)
            for form in args.forms.split(","):
                yield D, S, B, H, q, k, v, g, form


def main():
    ap = step_arguments(__doc__)
    ap.add_argument("--aten-backend", choices=["default", "cudnn", "efficient", "math"], default="default")
    args = ap.parse_args()
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "math": SDPBackend.MATH}.get(args.aten_backend)
    dtype = torch.bfloat16
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "bf16, fwd + bwd, aten backend",
          args.aten_backend, "FLASHCORE_FAMILY", os.environ.get("FLASHCORE_FAMILY", "auto"), "layout", args.layout)
    print(f"{'case':34s} {'mask':8s} {'route us':>9s} {'fc pair':>9s} {'sdpa us':>9s} {'route':>6s} {'pair':>6s}  path")
    rows = []
    for D, S, B, H, q, k, v, g, form in step_cases(args, dtype):
        keep = keep_mask(B, S, form)
        causal = form == "causal"
        for kind in ("bool", "additive") if keep is not None else ("none",):
            m = None if keep is None else keep if kind == "bool" else torch.zeros(
                keep.shape, dtype=dtype, device="cuda").masked_fill(~keep, torch.finfo(dtype).min)

            def step(fn, backend=None):
                def run():
                    q.grad = k.grad = v.grad = None
                    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                        fn(q, k, v, attn_mask=m, is_causal=causal).backward(g)
                return run
            route = step(flashcore.sdpa)
            pair = with_env("FLASHCORE_TRAINING", "flashcore", step(flashcore.sdpa))
            aten = step(F.scaled_dot_product_attention, backend)
            t_route, t_pair, t_aten = medians([route, pair, aten], args.iters, args.queue)
            path = flashcore.explain_training(q, k, v, attn_mask=m, is_causal=causal)
            name = f"{form} B={B} H={H} S={S} D={D}"
            print(f"{name:34s} {kind:8s} {t_route:9.1f} {t_pair:9.1f} {t_aten:9.1f}"
                  f" {t_aten / t_route:6.3f} {t_aten / t_pair:6.3f}  {path[:70]}")
            rows.append(dict(form=form, B=B, H=H, S=S, D=D, mask=kind, route_us=t_route, pair_us=t_pair,
                             sdpa_us=t_aten, path=path))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(), torch=torch.__version__, aten_backend=args.aten_backend,
                           family=os.environ.get("FLASHCORE_FAMILY", "auto"), queue=args.queue,
                           layout=args.layout, commit=os.environ.get("FLASHCORE_SHA", "unknown"),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
