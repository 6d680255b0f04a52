"""Training calls with a logit softcap and an attn_mask (Gemma-2-like models trained on padded
batches, the calls the Hopper family's backward does not take): forward + backward through
flashcore.attention(..., attn_mask=mask, softcap=C) with the backward as it runs now (the
sm80-class kernel where it covers the call) against the same call with the fp32 Python backward
forced (what ran before that kernel took softcaps), and F.scaled_dot_product_attention with the
same mask and no softcap (the price of the softcap itself). Same inputs and gradient, CUDA-event
medians interleaved call by call; B = 16k tokens / S, H = 2048 / D, bf16. Mask forms as
tools/masked_step_vs_aten.py (hf: left-padded causal; keys: key padding). --json writes the rows."""
import json
import torch
import torch.nn.functional as F
import flashcore
from flashcore import _ops
from interleaved import medians  # tools/interleaved.py
from masked_step_vs_aten import keep_mask, step_arguments, step_cases  # tools/masked_step_vs_aten.py


def python_backward(fn):
    """fn with sdpa_bwd's kernel check answering no: the Python backward runs."""
    def run():
        covers = _ops._kernel_bwd_covers
        _ops._kernel_bwd_covers = lambda *a, **k: False
        try:
            return fn()
        finally:
            _ops._kernel_bwd_covers = covers
    return run


def main():
    ap = step_arguments(__doc__)
    ap.add_argument("--softcap", type=float, default=50.0)
    args = ap.parse_args()
    dtype = torch.bfloat16
    print(torch.cuda.get_device_name(), "torch", torch.__version__, f"bf16, fwd + bwd, softcap={args.softcap:g}")
    print(f"{'case':30s} {'kernel us':>10s} {'python us':>10s} {'sdpa us':>9s} {'py/kern':>8s} {'kern/sdpa':>9s}")
    rows = []
    for D, S, B, H, q, k, v, g, form in step_cases(args, dtype):
        m = keep_mask(B, S, form)

        def step(fn):
            def run():
                q.grad = k.grad = v.grad = None
                fn().backward(g)
            return run
        capped = step(lambda: flashcore.attention(q, k, v, attn_mask=m, softcap=args.softcap))
        plain = step(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
        t_kernel, t_python, t_sdpa = medians([capped, python_backward(capped), plain], args.iters, args.queue)
        name = f"{form} B={B} H={H} S={S} D={D}"
        print(f"{name:30s} {t_kernel:10.1f} {t_python:10.1f} {t_sdpa:9.1f} {t_python / t_kernel:8.2f}"
              f" {t_kernel / t_sdpa:9.2f}")
        rows.append(dict(form=form, B=B, H=H, S=S, D=D, softcap=args.softcap, kernel_us=t_kernel,
                         python_us=t_python, sdpa_no_softcap_us=t_sdpa))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(), torch=torch.__version__, queue=args.queue,
                           layout=args.layout, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
