"""Paged decoding against contiguous decoding of the same cache (issue 35's bar).

One query row per sequence, N sequences of S keys each, GQA Hq:Hkv, head dim D, bf16. The cache
is a pool of pages (num_pages, page_size, Hkv, D) with each sequence's pages scattered at random
(a shuffled block table); the contiguous equivalent is (N, S, Hkv, D) viewed as (N, Hkv, S, D).
Timed call by call in turn (CUDA events, median of --iters; each K/V set is several times the L2):
  paged       torch.ops.flashcore._paged_decode (the kernel path flashcore.varlen_attn takes)
  varlen      flashcore.varlen_attn with block_table + seqused_k (adds its host-side checks)
  contiguous  flashcore.sdpa on the contiguous cache (FlashCore's decode route)
  aten        F.scaled_dot_product_attention on it (PyTorch's default choice)
Prints one line per shape and page size; --json writes the rows.
  PYTHONPATH=python python3 bench/bench_paged.py [--iters 30] [--json out.json]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import flashcore


def timed(fns, iters):
    times = {k: [] for k in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def case(n, hq, hkv, s, d, page, iters, dtype=torch.bfloat16):
    dev = "cuda"
    pages_per_seq = (s + page - 1) // page
    num_pages = n * pages_per_seq
    kp = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dtype)
    vp = torch.randn(num_pages, page, hkv, d, device=dev, dtype=dtype)
    table = torch.randperm(num_pages, device=dev, dtype=torch.int64).to(torch.int32).view(n, pages_per_seq)
    used = torch.full((n,), s, device=dev, dtype=torch.int32)
    # The same cache, contiguous: sequence i's keys in order.
    kc = kp[table.long()].reshape(n, pages_per_seq * page, hkv, d)[:, :s].contiguous()
    vc = vp[table.long()].reshape(n, pages_per_seq * page, hkv, d)[:, :s].contiguous()
    q = torch.randn(n, hq, d, device=dev, dtype=dtype)
    scale = d ** -0.5
    q4, k4, v4 = q.unsqueeze(2), kc.transpose(1, 2), vc.transpose(1, 2)
    cu_q = torch.arange(n + 1, device=dev, dtype=torch.int32)
    fns = {
        "paged": lambda: torch.ops.flashcore._paged_decode(q, kp, vp, table, used, scale),
        "varlen": lambda: flashcore.varlen_attn(q, kp, vp, cu_q, None, 1, s, enable_gqa=True,
                                                seqused_k=used, block_table=table),
        "contiguous": lambda: flashcore.sdpa(q4, k4, v4, enable_gqa=True),
        "aten": lambda: F.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True),
    }
    ref = fns["contiguous"]().squeeze(2)
    out = fns["paged"]()[0]
    err = (out.float() - ref.float()).abs().max().item()
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    t = timed(fns, iters)
    gb = 2 * n * s * hkv * d * kp.element_size() / 1e9
    row = dict(N=n, Hq=hq, Hkv=hkv, S=s, D=d, page=page, max_err_vs_contiguous=err,
               us={k: round(v, 1) for k, v in t.items()},
               paged_vs_contiguous=round(t["paged"] / t["contiguous"], 3),
               aten_vs_paged=round(t["aten"] / t["paged"], 3),
               paged_TBps=round(gb / (t["paged"] * 1e-6) / 1e3, 2),
               explain_contiguous=flashcore.explain(q4, k4, v4, enable_gqa=True))
    print(f"N={n} Hq={hq}:{hkv} S={s} D={d} page={page:3d}: paged {t['paged']:8.1f} us "
          f"({row['paged_TBps']} TB/s)  varlen {t['varlen']:8.1f}  contiguous {t['contiguous']:8.1f}  "
          f"aten {t['aten']:8.1f}  paged/contiguous {row['paged_vs_contiguous']:.3f}  "
          f"aten/paged {row['aten_vs_paged']:.2f}  err {err:.1e}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="one shape, three page sizes")
    args = ap.parse_args()
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    shapes = [(8, 32, 8, 16384, 128)] if args.quick else [
        (8, 32, 8, 4096, 128), (8, 32, 8, 16384, 128), (1, 32, 8, 131072, 128),
        (32, 32, 8, 4096, 128), (8, 32, 8, 16384, 64), (64, 32, 8, 2048, 128)]
    rows = []
    for n, hq, hkv, s, d in shapes:
        for page in (16, 64, 256):
            rows.append(case(n, hq, hkv, s, d, page, args.iters))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
