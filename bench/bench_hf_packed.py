#!/usr/bin/env python3
"""Padding-free training with HuggingFace transformers (issue 35): a training step of a ~1B
Llama on documents of mixed lengths, packed into one row (position_ids restarting per document,
what DataCollatorWithFlattening makes) against the same documents as a padded batch,
attn_implementation "flashcore" vs "sdpa", in one run.

What it measures
  A Llama-3.2-1B-shaped model (hidden 2048, 32 query / 8 key-value heads, head dim 64, MLP 8192;
  --layers of its 16, --vocab tokens: the LM head's logits are tokens x vocab) with random
  weights in bf16 on the GPU, one model object switched between implementations. Content: the
  documents of bench_varlen.py's log-uniform mix (--shortest to --longest tokens, --tokens in
  all, --seed). Layouts of the same documents:
    packed   one row of all documents, position_ids restarting at each, no attention mask,
             use_cache=False: transformers builds a causal mask that keeps each document to
             itself ("flashcore": the attention runs flashcore.varlen_attn over the documents;
             "sdpa": PyTorch's SDPA with that mask over the whole row)
    padded   one row per document, right-padded to the longest, attention_mask marking the
             padding (what a collator with padding makes)
  A step: gradients set to None (untimed), forward with labels (the loss over every real
  token's next-token prediction; padding and the documents' first tokens are not targets in
  both layouts), backward. Median of --iters steps after --warmup, each between
  torch.cuda.synchronize() calls (wall clock). Tokens/s counts the documents' tokens only (the
  same content in every row); vs_sdpa_padded = this row's tokens/s / sdpa padded's (issue 35
  asks >= 1.3 of flashcore packed).
  Checks, untimed: each row's loss against sdpa padded's (the same documents and targets: equal
  up to bf16 rounding; WRONG above --tol, and a WRONG row is not timed).

Run (GPU)
  python bench/bench_hf_packed.py                   # JSON to bench/results/hf_packed_<card>_<date>.json
  python bench/bench_hf_packed.py --tokens 8192 --layers 4 --json out.json
  python bench/bench_hf_packed.py --cpu-smoke       # tiny fp32 model on the CPU: the plumbing
                                                    # and the checks; times mean nothing
Without a CUDA device (and without --cpu-smoke) it prints one line and exits 0.
JSON: {sha, dirty, torch, transformers, card, date, method, args, documents, rows}; each row:
impl, layout, tokens (content), row_tokens (computed positions), loss, loss_diff, ms, tokens_per_s,
vs_sdpa_padded, status ("ok", "WRONG ...", "skipped: <why>").
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

from bench_varlen import card_slug, cut_to_total, first_line, git_sha, loguniform_lengths  # noqa: E402

IMPLS = ("sdpa", "flashcore")
LAYOUTS = ("padded", "packed")
MODEL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
             initializer_range=0.02, pad_token_id=0, bos_token_id=1, eos_token_id=2)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16)


def documents(total, shortest, longest, seed):
    return cut_to_total(loguniform_lengths(seed, shortest, longest), total)


def make_layouts(lengths, vocab, device, seed):
    """{layout: model kwargs} holding the same documents: token ids drawn once per document."""
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(3, vocab, (n,), generator=g) for n in lengths]
    ids = torch.cat(docs)
    pos = torch.cat([torch.arange(n) for n in lengths])
    labels = ids.clone()
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    labels[starts] = -100  # (HF shifts labels: a document's first token is no target of the last)
    packed = dict(input_ids=ids[None], position_ids=pos[None], labels=labels[None], use_cache=False)
    width = max(lengths)
    pad_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    pad_mask = torch.zeros_like(pad_ids)
    pad_labels = torch.full_like(pad_ids, -100)
    for i, d in enumerate(docs):
        pad_ids[i, :len(d)] = d
        pad_mask[i, :len(d)] = 1
        pad_labels[i, :len(d)] = d
    padded = dict(input_ids=pad_ids, attention_mask=pad_mask, labels=pad_labels, use_cache=False)
    return {name: {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in kw.items()}
            for name, kw in (("packed", packed), ("padded", padded))}


def step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed_steps(model, batch, warmup, iters, device):
    for _ in range(warmup):
        step(model, batch)
    times = []
    for _ in range(iters):
        model.zero_grad(set_to_none=True)
        sync(device)
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def check_lengths(ap, args, positive):
    """ap.error unless each option in `positive` is at least 1 and --shortest <= --longest (the
    HF benches' shared checks)."""
    for name in positive:
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.shortest > args.longest:
        ap.error("--shortest must not exceed --longest")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--tokens", type=int, default=16384, help="content tokens per step (16384)")
    ap.add_argument("--shortest", type=int, default=64)
    ap.add_argument("--longest", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=4, help="of the model's 16 (default 4)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tol", type=float, default=2e-2, help="largest |loss - sdpa padded's|")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args(argv)
    check_lengths(ap, args, ("tokens", "shortest", "longest", "layers", "vocab", "iters"))
    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("bench_hf_packed: no CUDA device; nothing run (--cpu-smoke runs the plumbing on the CPU)")
        return 0
    device, dtype = ("cpu", torch.float32) if smoke else ("cuda", torch.bfloat16)
    if smoke:
        args.tokens, args.shortest, args.longest = min(args.tokens, 96), 4, 40
        args.vocab, args.iters, args.warmup = min(args.vocab, 128), 1, 0

    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    import flashcore
    import flashcore.integrations.hf  # noqa: F401  (registers "flashcore")

    lengths = documents(args.tokens, args.shortest, args.longest, args.seed)
    cfg = dict(MODEL, **(SMOKE if smoke else {}))
    cfg.update(num_hidden_layers=args.layers, vocab_size=args.vocab)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**cfg), attn_implementation="sdpa")
    model = model.to(device=device, dtype=dtype).train()
    layouts = make_layouts(lengths, args.vocab, device, args.seed)
    card = "cpu (smoke)" if smoke else torch.cuda.get_device_name()
    sha, dirty = git_sha()
    print(f"HF padding-free training step  sha={sha}{' (dirty)' if dirty else ''}  torch "
          f"{torch.__version__}  transformers {transformers.__version__}  {card}\n"
          f"{len(lengths)} documents, {sum(lengths)} tokens (longest {max(lengths)}), "
          f"{args.layers} layers, vocab {args.vocab}", flush=True)
    started = time.time()
    rows = []
    for layout in LAYOUTS:
        for impl in IMPLS:
            batch = layouts[layout]
            row_tokens = batch["input_ids"].numel()
            rows.append(dict(impl=impl, layout=layout, tokens=sum(lengths), row_tokens=row_tokens,
                             loss=None, loss_diff=None, ms=None, tokens_per_s=None,
                             vs_sdpa_padded=None, status="ok"))
    reference = None
    for row in rows:  # checks first, untimed
        model.set_attn_implementation(row["impl"])
        try:
            row["loss"] = step(model, layouts[row["layout"]]).float().item()
        except Exception as e:  # a release or layout an impl refuses: say why, go on
            row["status"] = f"skipped: {type(e).__name__}: {first_line(e)}"
            continue
        if (row["impl"], row["layout"]) == ("sdpa", "padded"):
            reference = row["loss"]
    for row in rows:
        if row["loss"] is None or reference is None:
            continue
        row["loss_diff"] = abs(row["loss"] - reference)
        if not row["loss_diff"] <= args.tol:
            row["status"] = f"WRONG (loss {row['loss']:.4f} against {reference:.4f})"
    for row in rows:
        if row["status"] != "ok":
            continue
        model.set_attn_implementation(row["impl"])
        row["ms"] = timed_steps(model, layouts[row["layout"]], args.warmup, args.iters, device)
        row["tokens_per_s"] = row["tokens"] / (row["ms"] * 1e-3)
        print(f"  {row['impl']:<10} {row['layout']:<7} {row['ms']:9.2f} ms  "
              f"{row['tokens_per_s']:10.0f} tokens/s  loss {row['loss']:.4f}", flush=True)
    base = next((r["tokens_per_s"] for r in rows
                 if (r["impl"], r["layout"]) == ("sdpa", "padded") and r["tokens_per_s"]), None)
    print(f"{'impl':<10} {'layout':<7} {'ms':>9} {'tokens/s':>10} {'vs sdpa padded':>14} {'|dloss|':>8}  status")
    for r in rows:
        r["vs_sdpa_padded"] = r["tokens_per_s"] / base if base and r["tokens_per_s"] else None
        print(f"{r['impl']:<10} {r['layout']:<7} "
              f"{'-' if r['ms'] is None else format(r['ms'], '.2f'):>9} "
              f"{'-' if r['tokens_per_s'] is None else format(r['tokens_per_s'], '.0f'):>10} "
              f"{'-' if r['vs_sdpa_padded'] is None else format(r['vs_sdpa_padded'], '.3f'):>14} "
              f"{'-' if r['loss_diff'] is None else format(r['loss_diff'], '.1e'):>8}  {r['status']}")
    if not args.no_json:
        now = _dt.datetime.now()
        path = args.json or os.path.join(REPO, "bench", "results",
                                         f"hf_packed_{card_slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        if smoke and not args.json:
            path = None  # smoke numbers never land in bench/results
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            doc = dict(sha=sha, dirty=dirty, torch=torch.__version__,
                       transformers=transformers.__version__, card=card,
                       date=now.isoformat(timespec="seconds"),
                       method="bench/bench_hf_packed.py docstring", args=vars(args),
                       documents=lengths, elapsed_s=round(time.time() - started, 1), rows=rows)
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
            print(f"wrote {path}")
    return 1 if any(r["status"].startswith("WRONG") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
