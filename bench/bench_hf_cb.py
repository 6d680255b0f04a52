#!/usr/bin/env python3
"""Continuous batching with HuggingFace transformers (issue 35): generate_batch over many
requests of mixed prompt lengths, "paged|flashcore" against "paged|sdpa", in one run.

What it measures
  A Llama-3.2-1B-shaped model (hidden 2048, 32 query / 8 key-value heads, head dim 64, --layers
  of its 16, --vocab tokens) with random bf16 weights on the GPU, one model object switched
  between implementations. --requests prompts with lengths drawn log-uniformly in [--shortest,
  --longest] (--seed), each generating --new tokens greedily (no end-of-sequence stop), through
  model.generate_batch with ContinuousBatchingConfig(max_batch_tokens=--batch-tokens) and
  transformers' defaults otherwise. One untimed warm-up run per implementation, then --iters
  timed runs in turn (A B A B ...); tokens/s = generated tokens / wall time of a run (median).
  transformers' defaults differ by implementation: it takes "flashcore" for a flash implementation
  (the name holds "flash"), so "paged|flashcore" gets CUDA graphs and async batching on a GPU and
  "paged|sdpa" neither (it needs a mask); --cuda-graphs on / off sets both alike. Inside a captured
  graph FlashCore's causal steps run PyTorch's varlen_attn (no offset can be read there).
  Checks, untimed: every request's greedy tokens against "paged|sdpa"'s (the share of requests
  equal over all --new tokens, and the shortest common prefix; bf16 rounding may let a near-tie
  diverge).

Run (GPU)
  python bench/bench_hf_cb.py                    # JSON to bench/results/hf_cb_<card>_<date>.json
  python bench/bench_hf_cb.py --requests 64 --new 128 --layers 4 --json out.json
  python bench/bench_hf_cb.py --cpu-smoke        # tiny fp32 model on the CPU (the cache sized by
                                                 # hand): the plumbing; times mean nothing
Without a CUDA device (and without --cpu-smoke) it prints one line and exits 0.
JSON: {sha, dirty, torch, transformers, card, date, method, args, prompts, rows}; each row: impl,
requests, new_tokens, s (median), s_all, tokens_per_s, vs_paged_sdpa, same_tokens (share of
requests), shortest_prefix, not_near_tie (requests that diverge where sdpa's logits do not nearly
tie: wrong results).
"""
import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
if os.path.exists(os.path.join(REPO, "python", "flashcore", "libflashcore_op.so")):
    sys.path.insert(0, os.path.join(REPO, "python"))  # a CMake build in the tree wins

from bench_hf_packed import MODEL, SMOKE, check_lengths  # noqa: E402
from bench_varlen import card_slug, git_sha, loguniform_lengths  # noqa: E402

IMPLS = ("paged|sdpa", "paged|flashcore")


def prompts(n, shortest, longest, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = loguniform_lengths(seed, shortest, longest)
    return [torch.randint(3, vocab, (next(lengths),), generator=g).tolist() for _ in range(n)]


def run(model, impl, inputs, new, batch_tokens, cuda_graphs="default"):
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    model.set_attn_implementation(impl)
    gc = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=-1,
                          pad_token_id=0)
    cb = ContinuousBatchingConfig(max_batch_tokens=batch_tokens)
    if cuda_graphs != "default":
        cb.use_cuda_graph = cuda_graphs == "on"
    if not torch.cuda.is_available():
        cb.num_blocks = 256  # (the CPU has no free-memory query: a cache sized by hand)
    out = model.generate_batch(inputs=inputs, generation_config=gc, continuous_batching_config=cb)
    return [out[k].generated_tokens for k in sorted(out, key=lambda r: int(r.split("_")[-1]))]


def divergences_beyond_ties(model, inputs, tokens, ref):
    """Requests whose greedy tokens leave "paged|sdpa"'s where sdpa's own logits (the unpaged
    "sdpa" forward over the prompt and the shared prefix) do not nearly tie: the token taken is
    more than 5% of the logits' range (plus 0.01) below the best. bf16 rounding may flip a near
    tie; anything else is a wrong result."""
    model.set_attn_implementation("sdpa")
    bad = 0
    with torch.no_grad():
        for prompt, got, want in zip(inputs, tokens, ref):
            step = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
            if step is None:
                continue
            ids = torch.tensor([prompt + want[:step]], device=model.device)
            lg = model(ids).logits[0, -1].float()
            gap = (lg.max() - lg[got[step]]).item()
            bad += gap >= 0.05 * lg.abs().max().item() + 1e-2
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--shortest", type=int, default=32)
    ap.add_argument("--longest", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128, help="generated tokens per request")
    ap.add_argument("--batch-tokens", type=int, default=4096, help="ContinuousBatchingConfig.max_batch_tokens")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--cuda-graphs", choices=("default", "on", "off"), default="default",
                    help="ContinuousBatchingConfig.use_cuda_graph for both (default: transformers' "
                         "choice, which differs by implementation)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    check_lengths(ap, args, ("requests", "shortest", "longest", "new", "batch_tokens", "layers", "vocab", "iters"))
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("bench_hf_cb: no CUDA device; nothing run (--cpu-smoke runs the plumbing on the CPU)")
        return 0
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    if smoke:
        args.requests, args.shortest, args.longest = min(args.requests, 4), 3, 20
        args.new, args.batch_tokens, args.layers, args.vocab, args.iters = 4, 64, 2, 128, 1
        from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler
        PagedAttentionMemoryHandler.get_available_memory = lambda self: 1 << 30

    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    import flashcore.integrations.hf  # noqa: F401  (registers "flashcore" and "paged|flashcore")

    cfg = dict(MODEL, **(SMOKE if smoke else {}))
    cfg.update(num_hidden_layers=args.layers, vocab_size=args.vocab)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa")
    model = model.to(device=device, dtype=dtype).eval()
    inputs = prompts(args.requests, args.shortest, args.longest, args.vocab, args.seed)
    card = "cpu (smoke)" if smoke else torch.cuda.get_device_name()
    sha, dirty = git_sha()
    print(f"HF continuous batching  sha={sha}{' (dirty)' if dirty else ''}  torch {torch.__version__}  "
          f"transformers {transformers.__version__}  {card}\n{args.requests} requests, prompts "
          f"{min(map(len, inputs))}-{max(map(len, inputs))} tokens, {args.new} new each, "
          f"{args.layers} layers", flush=True)
    started = time.time()
    tokens = {impl: run(model, impl, inputs, args.new, args.batch_tokens, args.cuda_graphs) for impl in IMPLS}  # warm-up + check
    times = {impl: [] for impl in IMPLS}
    for _ in range(args.iters):
        for impl in IMPLS:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(model, impl, inputs, args.new, args.batch_tokens, args.cuda_graphs)
            if device == "cuda":
                torch.cuda.synchronize()
            times[impl].append(time.perf_counter() - t0)
    ref = tokens["paged|sdpa"]
    generated = args.requests * args.new
    rows = []
    for impl in IMPLS:
        s = statistics.median(times[impl])
        same = sum(a == b for a, b in zip(tokens[impl], ref)) / len(ref)
        prefix = min(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(b))
                     for a, b in zip(tokens[impl], ref))
        rows.append(dict(impl=impl, requests=args.requests, new_tokens=args.new, s=s, s_all=times[impl],
                         tokens_per_s=generated / s, same_tokens=same, shortest_prefix=prefix,
                         not_near_tie=divergences_beyond_ties(model, inputs, tokens[impl], ref)))
    base = rows[0]["tokens_per_s"]
    print(f"{'impl':<16} {'s':>8} {'tokens/s':>10} {'vs paged|sdpa':>13} {'same tokens':>11} {'prefix':>6} "
          f"{'not near tie':>12}")
    for r in rows:
        r["vs_paged_sdpa"] = r["tokens_per_s"] / base
        print(f"{r['impl']:<16} {r['s']:8.3f} {r['tokens_per_s']:10.0f} {r['vs_paged_sdpa']:13.3f} "
              f"{r['same_tokens']:11.2f} {r['shortest_prefix']:6d} {r['not_near_tie']:12d}")
    if not args.no_json and not (smoke and not args.json):
        now = _dt.datetime.now()
        path = args.json or os.path.join(REPO, "bench", "results",
                                         f"hf_cb_{card_slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__, transformers=transformers.__version__,
                   card=card, date=now.isoformat(timespec="seconds"), method="bench/bench_hf_cb.py docstring",
                   args=vars(args), prompts=[len(p) for p in inputs],
                   elapsed_s=round(time.time() - started, 1), rows=rows)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
