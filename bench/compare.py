#!/usr/bin/env python3
"""Side-by-side ratios from several bench.py JSON files: the A/B table of an experiment.

Each file is one bench pass (for an A/B, run bench.py once per variant on the same machine,
alternating them, e.g. A B A B). For every shape and file this prints

    time(reference) / time(impl)     (> 1: impl is faster; the reference comes from the same
                                      file, so each ratio is within one pass)

and per file the geometric mean over the shapes that every file has. Rows are matched on
(pass, B, Hq, Hkv, Sq, Sk, D, causal, dtype, mask).

  python bench/compare.py a.json b.json c.json            # flashcore vs cudnn
  python bench/compare.py --impl flashcore-sm80 --ref flash runs/*.json
  python bench/compare.py --match 'S=1x' --causal yes a.json b.json

Exit status 2 when a file cannot be read or has no rows for the implementations asked. A dry
run's JSON (bench.py --dry-run: fake timings, `dry_run: true`) is refused unless --allow-dry, and
then its column is named with a DRY tag, so fake numbers are never read as a result.
"""
import argparse
import json
import math
import re
import sys


def row_key(r):
    return (r.get("pass", "fwd"), r["B"], r["Hq"], r["Hkv"], r["Sq"], r["Sk"], r["D"], r["causal"],
            r["dtype"], bool(r.get("mask")))


def label(key):
    pas, B, Hq, Hkv, Sq, Sk, D, causal, dtype, mask = key
    h = f"{Hq}" if Hq == Hkv else f"{Hq}/{Hkv}"
    s = f"{Sq}" if Sq == Sk else f"{Sq}x{Sk}"
    text = f"B={B} H={h} S={s} D={D}" + (" bmask" if mask else "") + (" bwd" if pas == "bwd" else "")
    return text, dtype, "yes" if causal else "no"


def load(path):
    """(rows, dry): a bench.py JSON's rows, and whether it came from a dry run."""
    with open(path) as f:
        data = json.load(f)
    rows = data["rows"]
    return rows, bool(data.get("dry_run")) or any(r.get("dry_run") for r in rows)


def ratios(rows, impl, ref, allow_wrong=False):
    """{row key: ref_us / impl_us} for the rows where both ran and were timed (allow_wrong: also
    rows bench.py --time-wrong timed though they failed its check)."""
    times = {}
    for r in rows:
        if (r.get("status") == "ok" or (allow_wrong and r.get("status") == "WRONG (timed)")) and r.get("us"):
            times[(row_key(r), r["impl"])] = r["us"]
    out = {}
    for (key, name), us in times.items():
        if name == impl and (key, ref) in times:
            out[key] = times[(key, ref)] / us
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="bench.py JSON files (one per pass)")
    ap.add_argument("--impl", default="flashcore", help="implementation to rate (default flashcore)")
    ap.add_argument("--ref", default="cudnn", help="reference implementation (default cudnn)")
    ap.add_argument("--match", metavar="REGEX", help="only shapes whose label matches")
    ap.add_argument("--causal", choices=["yes", "no"], help="only causal (yes) or non-causal (no) rows")
    ap.add_argument("--allow-dry", action="store_true",
                    help="accept dry-run JSONs (fake timings; their columns are tagged DRY)")
    ap.add_argument("--allow-wrong", action="store_true",
                    help="also rate rows that bench.py --time-wrong timed though they failed its "
                         "correctness check (an experiment tree wrong on purpose)")
    args = ap.parse_args(argv)

    per_file, dry_files = [], set()
    for path in args.files:
        try:
            rows, dry = load(path)
            r = ratios(rows, args.impl, args.ref, args.allow_wrong)
        except (OSError, ValueError, KeyError) as e:
            print(f"compare: cannot read {path}: {e}", file=sys.stderr)
            return 2
        if dry and not args.allow_dry:
            print(f"compare: {path} is a dry run (fake timings); pass --allow-dry to compare it "
                  "anyway", file=sys.stderr)
            return 2
        if dry:
            dry_files.add(path)
        if not r:
            print(f"compare: {path} has no rows where both {args.impl} and {args.ref} ran",
                  file=sys.stderr)
            return 2
        per_file.append(r)

    keys = sorted(set().union(*per_file), key=lambda k: (k[0], k[6], k[7], k[8], k[4], k[5], k[1], k[2], k[3]))
    if args.match:
        keys = [k for k in keys if re.search(args.match, label(k)[0])]
    if args.causal:
        keys = [k for k in keys if label(k)[2] == args.causal]
    if not keys:
        print("compare: no shape left after the filters", file=sys.stderr)
        return 2

    names = [("DRY " if p in dry_files else "") + p.rsplit("/", 1)[-1].removesuffix(".json")
             for p in args.files]
    width = max(10, *(len(n) for n in names))
    print(f"{args.ref} time / {args.impl} time, per pass (> 1: {args.impl} faster)")
    print(f"{'shape':<30} {'dtype':<5} {'causal':<6} " + " ".join(f"{n:>{width}}" for n in names))
    common = [k for k in keys if all(k in r for r in per_file)]
    for k in keys:
        text, dtype, causal = label(k)
        cells = [f"{r[k]:>{width}.3f}" if k in r else f"{'-':>{width}}" for r in per_file]
        print(f"{text:<30} {dtype:<5} {causal:<6} " + " ".join(cells))
    if common:
        geo = [math.exp(sum(math.log(r[k]) for k in common) / len(common)) for r in per_file]
        print(f"{f'geomean ({len(common)} shapes in every file)':<43} " +
              " ".join(f"{g:>{width}.3f}" for g in geo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
