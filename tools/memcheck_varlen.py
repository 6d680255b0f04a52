"""Packed-sequence calls for compute-sanitizer: one short process that runs what a pytest run of
tests/test_varlen.py would take minutes to run under a sanitizer.

For each head dim (64 causal, 128 not, 256 causal and not, GQA 2): a training call of
flashcore.varlen_attn over ragged sequences (an empty one, one of a single row, rows past the
last offset) forward and backward (on Hopper the fused packed forward and backward, whatever the
card runs otherwise), then the forward op with offsets that are not monotone and point past the
tensors (clamped by the kernels, never read out of bounds).

  compute-sanitizer --tool memcheck  python3 tools/memcheck_varlen.py
  compute-sanitizer --tool racecheck python3 tools/memcheck_varlen.py
  compute-sanitizer --tool synccheck python3 tools/memcheck_varlen.py

Prints one line per call and "memcheck script done"; the sanitizer's summary says the rest.
"""
import torch

import flashcore
from flashcore.varlen import varlen_attn


def offsets(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")


def main():
    torch.manual_seed(0)
    for d, causal in ((64, True), (128, False), (256, True), (256, False)):
        q_lens = [1, 130, 0, 7, 257]
        k_lens = q_lens if causal else [3, 0, 5, 400, 129]
        cq, ck = offsets(q_lens), offsets(k_lens)
        q = torch.randn(sum(q_lens) + 2, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(sum(k_lens), 2, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn_like(k, requires_grad=True)
        out = varlen_attn(q, k, v, cq, ck, max(q_lens), max(k_lens),
                          window_size=(-1, 0) if causal else (-1, -1), enable_gqa=True)
        out.backward(torch.randn_like(out))
        torch.cuda.synchronize()
        print(f"D={d} causal={causal}: forward and backward ran")
        # Bad offsets straight into the forward op: clamped, never out of bounds.
        bad = torch.tensor([5, 2, 10**6, -7, 3, 9], dtype=torch.int32, device="cuda")
        with torch.no_grad():
            torch.ops.flashcore._varlen_fwd(q, k, v, bad, bad, 300, 300, causal, 0.1)
        torch.cuda.synchronize()
    print("memcheck script done")


if __name__ == "__main__":
    main()
