#!/usr/bin/env python3
"""End-to-end HuggingFace benchmark: a ~1B-parameter Llama, attn_implementation "flashcore" vs "sdpa".

What it measures
  A Llama-3.2-1B-shaped model (hidden 2048, 16 layers, 32 query heads, 8 key/value heads,
  head dim 64, MLP 8192, vocab 128256, tied embeddings: 1.24B parameters) built from a config
  with random bf16 weights on the GPU (nothing is downloaded), one model object switched
  between implementations with model.set_attn_implementation(). For each implementation:
    prefill  one forward of --prefill tokens (default 4096) per sequence into an empty
             DynamicCache (logits of the last position only, as generate() does);
             tokens/s = batch * prefill / time; median of --iters runs after one warm-up.
    decode   --decode greedy steps (default 256) after that prefill, one token per sequence
             per forward with the KV cache (a plain loop: argmax of the last logits fed back);
             tokens/s = batch * decode / time; median of --iters runs after one warm-up.
  Timing: torch.cuda.synchronize() around each run, wall clock (time.perf_counter).
  Checks, untimed: the prefill's last logits of each implementation against "sdpa" (max abs
  diff), whether the greedy tokens match sdpa's, and for "flashcore" which path
  flashcore.explain() reports for the attention calls of one prefill and one decode step
  (a "fallback" there means the numbers time PyTorch's SDPA, not a FlashCore kernel).

Run (GPU; well under 3 minutes on an H100)
  python bench/bench_hf.py                        # JSON to bench/results/hf_<card>_<date>.json
  python bench/bench_hf.py --json out.json --batch 1 --prefill 4096 --decode 256
Without a CUDA device it prints a note and exits 0 (--cpu-smoke runs a tiny fp32 model on the
CPU instead, to test the script's plumbing; its numbers mean nothing).

JSON: {"sha", "dirty", "torch", "transformers", "card", "date", "model", "method", "args",
"rows": [...]}; each row: impl, phase ("prefill" | "decode"), batch, tokens (per sequence),
seconds (median), seconds_all, tokens_per_s, vs_sdpa (this tokens/s / sdpa's), path,
maxdiff_vs_sdpa (prefill only), tokens_match_sdpa and tokens_same_prefix (decode only: whether
all greedy tokens equal sdpa's, and how many leading steps do).
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
if os.path.isdir(os.path.join(REPO, "python", "flashcore")) and \
        os.path.exists(os.path.join(REPO, "python", "flashcore", "libflashcore_op.so")):
    sys.path.insert(0, os.path.join(REPO, "python"))  # a CMake build in the tree wins

IMPLS = ("sdpa", "flashcore")
MODEL = dict(  # Llama-3.2-1B's shape
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
    num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
    rope_theta=500000.0, tie_word_embeddings=True, initializer_range=0.02,
    pad_token_id=0, bos_token_id=1, eos_token_id=2)


def git_info():
    from bench import git_info as _git_info  # same SHA logic as bench.py (FLASHCORE_SHA first)
    return _git_info()


def slug(name):
    from bench import slug as _slug
    return _slug(name)


class PathRecorder:
    """TorchDispatchMode collecting flashcore.explain() of every flashcore.sdpa call."""

    def __new__(cls):
        from torch.utils._python_dispatch import TorchDispatchMode
        import flashcore

        class _Rec(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.paths = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                # (inference calls reach sdpa's twin without an Autograd kernel: _entry.py)
                if func in (torch.ops.flashcore.sdpa.default,
                            torch.ops.flashcore._sdpa_inference.default):
                    self.paths.append(flashcore.explain(*args, **kwargs))
                return func(*args, **kwargs)

        return _Rec()


def summarize_paths(paths):
    if not paths:
        return "no flashcore.sdpa call"
    counts = {}
    for p in paths:
        counts[p] = counts.get(p, 0) + 1
    return "; ".join(f"{p} x{n}" for p, n in counts.items())


@torch.no_grad()
def prefill(model, ids):
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], cache


@torch.no_grad()
def decode(model, first_logits, cache, steps):
    token = first_logits.argmax(-1, keepdim=True)
    tokens = [token]
    for _ in range(steps - 1):
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def same_prefix(tokens, ref):
    """How many leading greedy steps agree in every sequence (random weights give near-tied
    logits, so one rounding difference can change an argmax and everything after it)."""
    differs = (tokens != ref).any(dim=0).nonzero()
    return int(differs[0]) if differs.numel() else int(tokens.shape[1])


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    result = fn()
    sync()
    return time.perf_counter() - t0, result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", type=int, default=4096, help="prompt tokens per sequence")
    ap.add_argument("--decode", type=int, default=256, help="generated tokens per sequence")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3, help="timed runs per phase (median)")
    ap.add_argument("--layers", type=int, default=MODEL["num_hidden_layers"])
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--json", metavar="PATH",
                    help="JSON output path (default: bench/results/hf_<card>_<date>.json)")
    ap.add_argument("--no-json", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny fp32 model on the CPU: tests the plumbing, times nothing useful")
    args = ap.parse_args(argv)

    model_cfg, device, dtype = dict(MODEL), "cuda", torch.bfloat16
    if args.cpu_smoke:
        model_cfg.update(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32)
        args.layers, args.prefill, args.decode, args.iters = 2, 64, 8, 1
        device, dtype = "cpu", torch.float32
    elif not torch.cuda.is_available():
        print("bench_hf.py: no CUDA device, nothing to time (this benchmark runs a ~1B-parameter "
              "bf16 Llama on a GPU). See tests/test_hf.py for the CPU checks of the integration.")
        return 0

    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig
    import flashcore
    import flashcore.integrations.hf  # noqa: F401  registers "flashcore"

    impls = [n.strip() for n in args.impls.split(",") if n.strip()]
    if "sdpa" not in impls:
        impls.insert(0, "sdpa")
    impls = ["sdpa"] + [n for n in impls if n != "sdpa"]
    sha, dirty = git_info()
    card = "cpu-smoke" if args.cpu_smoke else torch.cuda.get_device_name()
    now = _dt.datetime.now()

    cfg = LlamaConfig(**{**model_cfg, "num_hidden_layers": args.layers})
    torch.manual_seed(args.seed)
    t0 = time.time()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype,
                                                 attn_implementation="sdpa")
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.prefill), generator=g).to(device)

    method = (f"wall clock between torch.cuda.synchronize() calls; median of {args.iters} runs after "
              f"1 warm-up; prefill = one forward of {args.prefill} tokens into an empty DynamicCache "
              f"(last logits only); decode = {args.decode} greedy one-token forwards with the cache")
    print(f"FlashCore HF bench  sha={sha}{' (dirty)' if dirty else ''}  torch={torch.__version__}  "
          f"transformers={transformers.__version__}  card={card}  {now:%Y-%m-%d %H:%M}")
    print(f"model: Llama, {n_params / 1e9:.2f}B params, {dtype} random weights, {cfg.num_hidden_layers} "
          f"layers, {cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, head dim "
          f"{cfg.head_dim} (built in {time.time() - t0:.1f} s)")
    print(f"method: {method}")
    print(f"FLASHCORE_FAMILY={os.environ.get('FLASHCORE_FAMILY', 'auto')}\n")

    rows, ref_logits, ref_tokens = [], None, None
    for impl in impls:
        model.set_attn_implementation(impl)
        # untimed checks: logits, path
        logits, cache = prefill(model, ids)
        path_prefill = path_decode = None
        if impl != "sdpa":
            rec = PathRecorder()
            with rec:
                prefill(model, ids[:, :256])
            path_prefill = summarize_paths(rec.paths)
            rec = PathRecorder()
            with rec:
                decode(model, logits, cache, 2)
            path_decode = summarize_paths(rec.paths)
        maxdiff = None if ref_logits is None else (logits.float() - ref_logits).abs().max().item()
        if ref_logits is None:
            ref_logits = logits.float()
        del cache

        # prefill: warm-up + timed
        times = []
        for i in range(args.iters + 1):
            dt, (logits, cache) = timed(lambda: prefill(model, ids))
            del cache
            if i:
                times.append(dt)
        t = statistics.median(times)
        rows.append(dict(impl=impl, phase="prefill", batch=args.batch, tokens=args.prefill,
                         seconds=t, seconds_all=times, tokens_per_s=args.batch * args.prefill / t,
                         path=path_prefill, maxdiff_vs_sdpa=maxdiff))

        # decode: warm-up (short) + timed, each after an untimed prefill
        logits, cache = prefill(model, ids)
        decode(model, logits, cache, min(args.decode, 16))
        times, tokens = [], None
        for _ in range(args.iters):
            logits, cache = prefill(model, ids)
            dt, tokens = timed(lambda: decode(model, logits, cache, args.decode))
            del cache
            times.append(dt)
        if ref_tokens is None:
            ref_tokens = tokens
        t = statistics.median(times)
        rows.append(dict(impl=impl, phase="decode", batch=args.batch, tokens=args.decode,
                         seconds=t, seconds_all=times, tokens_per_s=args.batch * args.decode / t,
                         path=path_decode, tokens_match_sdpa=bool(torch.equal(tokens, ref_tokens)),
                         tokens_same_prefix=same_prefix(tokens, ref_tokens)))
        if device == "cuda":
            torch.cuda.empty_cache()

    base = {r["phase"]: r["tokens_per_s"] for r in rows if r["impl"] == "sdpa"}
    for r in rows:
        r["vs_sdpa"] = r["tokens_per_s"] / base[r["phase"]]

    print(f"{'impl':<10} {'phase':<8} {'batch':>5} {'tokens':>6} {'ms':>9} {'tokens/s':>10} "
          f"{'vs sdpa':>8}  check / path")
    for r in rows:
        check = ""
        if r["phase"] == "prefill" and r["maxdiff_vs_sdpa"] is not None:
            check = f"last-logits maxdiff {r['maxdiff_vs_sdpa']:.3g}"
        if r["phase"] == "decode" and r["impl"] != "sdpa":
            check = (f"tokens match sdpa" if r["tokens_match_sdpa"] else
                     f"tokens match sdpa for the first {r['tokens_same_prefix']} of {r['tokens']}")
        if r["path"]:
            check += f"; {r['path']}"
        print(f"{r['impl']:<10} {r['phase']:<8} {r['batch']:>5} {r['tokens']:>6} "
              f"{r['seconds'] * 1e3:>9.1f} {r['tokens_per_s']:>10.1f} {r['vs_sdpa']:>7.3f}x  {check}")
    fallback = [r for r in rows if r["path"] and "fallback" in r["path"]]
    if fallback:
        print("\nNOTE: some flashcore attention calls fell back to PyTorch's SDPA (see path).")

    if not args.no_json:
        path = args.json or os.path.join(REPO, "bench", "results",
                                         f"hf_{slug(card)}_{now:%Y-%m-%d_%H%M}.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        doc = dict(sha=sha, dirty=dirty, torch=torch.__version__,
                   transformers=transformers.__version__, card=card,
                   date=now.isoformat(timespec="seconds"),
                   model=dict(cfg.to_diff_dict(), params=n_params, dtype=str(dtype)),
                   method=method, args=vars(args), rows=rows)
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
        print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
