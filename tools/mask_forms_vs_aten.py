"""Inference calls with masks of several forms and lengths: torch.ops.flashcore.sdpa as it is,
the same call on a copy of a bool mask whose rows are padded to 16 bytes (the copy made inside
the timed call, as the op would make it), the sm80-class family forced, and PyTorch's default
F.scaled_dot_product_attention, all on the same inputs. CUDA-event medians, interleaved call by
call. Forms: HuggingFace's (B, 1, Sq, Sk) left-padded causal mask, bool and additive; a key
padding mask (B, 1, 1, Sk); decoding (Sq = 1) against a padded cache with GQA. Prints one row per
case; --json writes them with the card."""
import argparse, json, os
import torch
import torch.nn.functional as F
import flashcore  # noqa: F401  (registers torch.ops.flashcore)
from interleaved import medians  # tools/interleaved.py


def keep_mask(B, Sq, Sk, form):
    """bool (B, 1, Sq or 1, Sk): True = attend. Row b's first b * Sk / (2B) keys are padding."""
    pad = (torch.arange(B, device="cuda") * Sk // (2 * B)).view(-1, 1, 1, 1)
    j = torch.arange(Sk, device="cuda").view(1, 1, 1, -1)
    if form == "keys":
        return j >= pad
    i = torch.arange(Sk - Sq, Sk, device="cuda").view(1, 1, -1, 1)
    return (j <= i) & ((j >= pad) | (j == i))


def padded_copy(mask):
    """The mask in (B, H, Sq, Sk) form with rows of a 16-byte multiple (a view into a wider
    buffer): the layout the Hopper family's mask tiles read."""
    B, H, Sq, Sk = mask.shape
    wide = torch.empty(B, H, Sq, (Sk + 15) // 16 * 16, dtype=torch.bool, device=mask.device)
    view = wide[..., :Sk]
    view.copy_(mask)
    return view


def forced_sm80(fn):
    def run():
        os.environ["FLASHCORE_FAMILY"] = "sm80"
        try:
            return fn()
        finally:
            del os.environ["FLASHCORE_FAMILY"]
    return run


CASES = [  # (form, B, Hq, Hkv, Sq, Sk)
    ("hf", 16, None, None, 1000, 1000), ("hf", 4, None, None, 4000, 4000),
    ("hf", 16, None, None, 1024, 1024), ("hf", 4, None, None, 4096, 4096),
    ("keys", 16, None, None, 1000, 1000), ("keys", 4, None, None, 4000, 4000),
    ("keys", 4, None, None, 4096, 4096),
    ("decode", 8, 32, 8, 1, 1000), ("decode", 8, 32, 8, 1, 4000), ("decode", 32, 32, 8, 1, 4000),
    ("decode", 8, 32, 8, 1, 4096), ("decode", 1, 32, 8, 1, 32768), ("decode", 32, 32, 32, 1, 2000),
    ("chunk", 4, 32, 8, 128, 4000),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--forms", default="hf,keys,decode,chunk", help="which forms of CASES to run")
    ap.add_argument("--json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, args.dtype)
    print(f"{'case':44s} {'mask':8s} {'auto us':>9s} {'copy us':>9s} {'sm80 us':>9s} {'sdpa us':>9s}"
          f" {'auto':>6s} {'copy':>6s} {'sm80':>6s}  path")
    rows = []
    for D in (int(d) for d in args.dims.split(",")):
        for form, B, Hq, Hkv, Sq, Sk in CASES:
            if form not in args.forms.split(","):
                continue
            Hq = Hq or 2048 // D
            Hkv = Hkv or Hq
            q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dtype)
            k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dtype) for _ in range(2))
            gqa = Hq != Hkv
            keep = keep_mask(B, Sq, Sk, "keys" if form in ("keys", "decode") else "causal")
            for kind in ("bool", "additive"):
                m = keep if kind == "bool" else torch.zeros(keep.shape, dtype=dtype, device="cuda").masked_fill(
                    ~keep, torch.finfo(dtype).min)
                with torch.no_grad():
                    fns = [lambda: torch.ops.flashcore.sdpa(q, k, v, m, enable_gqa=gqa)]
                    if kind == "bool":
                        fns.append(lambda: torch.ops.flashcore.sdpa(q, k, v, padded_copy(m.expand(B, 1, Sq, Sk)),
                                                                    enable_gqa=gqa))
                    fns.append(forced_sm80(lambda: torch.ops.flashcore.sdpa(q, k, v, m, enable_gqa=gqa)))
                    fns.append(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa))
                    ts = medians(fns, args.iters)
                    if kind != "bool":
                        ts.insert(1, float("nan"))
                    path = flashcore.explain(q, k, v, attn_mask=m, enable_gqa=gqa)
                    copy_path = flashcore.explain(q, k, v, attn_mask=padded_copy(m.expand(B, 1, Sq, Sk)),
                                                  enable_gqa=gqa) if kind == "bool" else ""
                t_auto, t_copy, t_sm80, t_at = ts
                name = f"{form} B={B} Hq={Hq} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D}"
                print(f"{name:44s} {kind:8s} {t_auto:9.1f} {t_copy:9.1f} {t_sm80:9.1f} {t_at:9.1f}"
                      f" {t_at / t_auto:6.3f} {t_at / t_copy:6.3f} {t_at / t_sm80:6.3f}  {path[:40]} | {copy_path[:30]}")
                rows.append(dict(form=form, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, dtype=args.dtype, mask=kind,
                                 auto_us=t_auto, copy_us=t_copy, sm80_us=t_sm80, sdpa_us=t_at, path=path,
                                 copy_path=copy_path))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(card=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
