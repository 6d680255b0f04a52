#!/usr/bin/env python3
"""Draw bench/bench.py's results as one PNG.

Panels
  * TFLOP/s against S, one line per implementation, for each head dim (rows of panels) and
    causal flag: the forward sweep's panels on the left, the backward sweep's beside them on
    the right. The sweeps are bench.py's 16k-token shapes (B * S = 16384, H * D = 2048, no
    mask); other shapes (the small one, masked rows, the --extra grids) are left out, since on
    one line they would mix different batch and head counts.
  * Decoding (forward rows with Sq = 1), where the JSON has them: the time per call against
    the bytes of Q, K, V and O, log-log, with the copy floor the JSON records (`floor_us`:
    those bytes at the card's device-to-device copy rate) as a dashed line. Eager times
    (`us`), as in the tables.
  Points whose row is a fallback (the op handed the call to PyTorch) are drawn hollow.

Run
  python bench/plot.py bench/results/<file>.json            # writes bench/results/<file>.png
  python bench/plot.py FWD.json BWD.json -o out.png         # each pass from the last file that
                                                            # has rows of that pass
  python bench/bench.py --plot ...                          # the same after a run, beside its JSON

matplotlib is an optional dependency (`pip install 'flashcore[bench]'`); it is imported only
here, when a plot is drawn, so that the benchmark and the package run without it.
"""

import argparse
import json
import os
import sys

SWEEP_TOKENS, SWEEP_HIDDEN = 16384, 2048  # bench.py's sweeps: B = 16384 / S, H = 2048 / D
# Known implementations in bench.py's order, each with a fixed colour so that a backend looks
# the same in every panel and every plot; FlashCore's own rows are drawn heavier.
STYLE = {
    "cudnn": ("tab:blue", "o"),
    "flash": ("tab:orange", "s"),
    "efficient": ("tab:green", "^"),
    "flashcore": ("tab:red", "D"),
    "flashcore-sm80": ("tab:purple", "v"),
    "flashcore-det": ("tab:brown", "P"),
}
MISSING_MPL = ("plot: matplotlib is not installed; install the bench extra "
               "(pip install 'flashcore[bench]', or pip install matplotlib)")


class MissingMatplotlib(RuntimeError):
    pass


def import_matplotlib():
    """The Figure class, without pyplot (no GUI backend, no global figure state); raises
    MissingMatplotlib with a one-line message where matplotlib is absent."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingMatplotlib(MISSING_MPL) from None
    return Figure


# --------------------------------------------------------------------------- rows

def load(paths):
    """Rows to plot and the files they came from. For each pass, the rows come from the last
    file given that has rows of that pass: one pass's lines never mix two runs (their clocks,
    commits and interleaving differ), and a later run of one pass replaces an earlier one."""
    docs = []
    for p in paths:
        with open(p) as fh:
            docs.append((p, json.load(fh)))
    chosen = {}  # pass -> (path, doc)
    for p, doc in docs:
        for pass_ in {r.get("pass", "fwd") for r in doc.get("rows", [])}:
            chosen[pass_] = (p, doc)
    rows, sources = [], []
    for pass_ in sorted(chosen):  # "bwd" before "fwd"; order does not matter for the rows
        p, doc = chosen[pass_]
        rows += [r for r in doc["rows"] if r.get("pass", "fwd") == pass_]
        sources.append((pass_, p, doc))
    return rows, sources


def timed(r):
    return r.get("us") is not None and r.get("tflops") is not None


def is_sweep(r):
    return (r["Sq"] == r["Sk"] and r["Hq"] == r["Hkv"] and r["B"] * r["Sq"] == SWEEP_TOKENS
            and r["Hq"] * r["D"] == SWEEP_HIDDEN and not r.get("mask") and timed(r))


def is_decode(r):
    return r.get("pass", "fwd") == "fwd" and r["Sq"] == 1 and r.get("us") is not None


def moved_bytes(r):
    """Bytes of Q, K, V and O (2-byte elements, as fp16 and bf16): what the copy floor moves."""
    return 2 * r["B"] * (2 * r["Hq"] * r["Sq"] + 2 * r["Hkv"] * r["Sk"]) * r["D"]


def impl_order(rows):
    names = {r["impl"] for r in rows}
    return [n for n in STYLE if n in names] + sorted(names - set(STYLE))


def style(name, index):
    color, marker = STYLE.get(name, (f"C{index % 10}", "x"))
    heavy = name == "flashcore"
    return dict(color=color, marker=marker, linewidth=2.4 if heavy else 1.3,
                markersize=6 if heavy else 4.5, zorder=3 if heavy else 2)


def s_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


# --------------------------------------------------------------------------- drawing

def draw_points(ax, xs, ys, rows, name, st, label):
    """One implementation's line, filled markers where its row ran, hollow where it fell back."""
    ax.plot(xs, ys, color=st["color"], linewidth=st["linewidth"], zorder=st["zorder"],
            marker=None, label=None)
    for x, y, r in zip(xs, ys, rows):
        hollow = r.get("status") == "fallback"
        ax.plot([x], [y], linestyle="none", marker=st["marker"], markersize=st["markersize"],
                color=st["color"], markerfacecolor="white" if hollow else st["color"],
                zorder=st["zorder"] + 1)
    # A proxy for the legend: line and filled marker together.
    ax.plot([], [], color=st["color"], linewidth=st["linewidth"], marker=st["marker"],
            markersize=st["markersize"], label=label)


def sweep_panel(ax, rows, names, title, ylabel):
    xs_all = sorted({r["Sq"] for r in rows})
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r["impl"] == name), key=lambda r: r["Sq"])
        if mine:
            draw_points(ax, [r["Sq"] for r in mine], [r["tflops"] for r in mine], mine, name,
                        style(name, i), name)
    ax.set_title(title, fontsize=10)
    ax.set_xscale("log", base=2)
    if xs_all:
        ax.set_xticks(xs_all)
        ax.set_xticklabels([s_label(s) for s in xs_all])
        ax.minorticks_off()
    else:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    if ylabel:
        ax.set_ylabel("TFLOP/s", fontsize=9)


def decode_panel(ax, rows, names):
    for i, name in enumerate(names):
        mine = sorted((r for r in rows if r["impl"] == name), key=moved_bytes)
        if mine:
            st = style(name, i)
            for r in mine:
                hollow = r.get("status") == "fallback"
                ax.plot([moved_bytes(r)], [r["us"]], linestyle="none", marker=st["marker"],
                        markersize=st["markersize"], color=st["color"], alpha=0.85,
                        markerfacecolor="white" if hollow else st["color"], zorder=st["zorder"])
    floor = sorted({(moved_bytes(r), r["floor_us"]) for r in rows if r.get("floor_us")})
    if floor:
        # The rate the floor was computed with, read back from the rows (bytes / floor time).
        rate = floor[-1][0] / (floor[-1][1] * 1e-6) / 1e12
        ax.plot([b for b, _ in floor], [f for _, f in floor], "k--", linewidth=1.2,
                label=f"copy floor (Q+K+V+O at {rate:.1f} TB/s)")
        ax.legend(fontsize=8, loc="upper left")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes of Q, K, V and O", fontsize=9)
    ax.set_ylabel("us per call (eager median)", fontsize=9)
    ax.set_title("decode: Sq = 1, time against bytes moved", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.tick_params(labelsize=8)


def source_line(pass_, path, doc):
    what = {"fwd": "forward and decode", "bwd": "backward"}.get(pass_, pass_)
    sha = (doc.get("sha") or "unknown")[:7]
    return (f"{what}: {os.path.basename(path)}\n    commit {sha}, torch {doc.get('torch', '?')}, "
            f"{doc.get('date', '?')}")


def figure(paths, dtype=None):
    """The figure of the rows of `paths` (bench.py JSON files); see the module docstring."""
    Figure = import_matplotlib()
    rows, sources = load(paths)
    if dtype is None:  # fp16 where the run has it (bench.py's default), else its only dtype
        dtypes = sorted({r["dtype"] for r in rows})
        dtype = "fp16" if "fp16" in dtypes else (dtypes[0] if dtypes else "fp16")
    rows = [r for r in rows if r["dtype"] == dtype]
    sweep = [r for r in rows if is_sweep(r)]
    decode = [r for r in rows if is_decode(r)]
    if not sweep and not decode:
        raise ValueError(f"no sweep or decode rows ({dtype}) to plot in {', '.join(paths)}")
    names = impl_order(sweep + decode)
    passes = [p for p in ("fwd", "bwd") if any(r.get("pass", "fwd") == p for r in sweep)]
    dims = sorted({r["D"] for r in sweep})
    ncols = 2 * max(1, len(passes))
    nrows = len(dims) + (1 if decode else 0)
    height = 3.1 * nrows + 0.8
    fig = Figure(figsize=(4.0 * ncols, height))
    # The panels start 0.8 inch below the top: room for the title, no more.
    grid = fig.add_gridspec(nrows, ncols, hspace=0.45, wspace=0.22, top=1 - 0.8 / height)
    for row, D in enumerate(dims):
        for pi, pass_ in enumerate(passes):
            for ci, causal in enumerate((False, True)):
                col = 2 * pi + ci
                ax = fig.add_subplot(grid[row, col])
                cell = [r for r in sweep if r.get("pass", "fwd") == pass_ and r["D"] == D
                        and r["causal"] == causal]
                what = "forward" if pass_ == "fwd" else "backward"
                title = f"{what}, D={D}, {'causal' if causal else 'non-causal'}"
                sweep_panel(ax, cell, names, title, ylabel=col == 0)
                if row == len(dims) - 1:
                    ax.set_xlabel("S (B = 16k / S, H = 2048 / D)", fontsize=9)
    if decode:
        half = max(1, ncols // 2)
        decode_panel(fig.add_subplot(grid[nrows - 1, :half]), decode, names)
        legend_ax = fig.add_subplot(grid[nrows - 1, half:]) if half < ncols else None
    else:
        legend_ax = None
    # One legend for every panel (each backend has one colour throughout).
    handles = []
    for i, name in enumerate(names):
        st = style(name, i)
        (h,) = fig.axes[0].plot([], [], color=st["color"], marker=st["marker"],
                                linewidth=st["linewidth"], label=name)
        handles.append(h)
    note = "hollow marker: a fallback row (the op ran PyTorch's SDPA)"
    if legend_ax is not None:
        legend_ax.axis("off")
        legend_ax.legend(handles=handles, loc="upper left", fontsize=10, frameon=False, ncol=2,
                         title="implementation", title_fontsize=10, alignment="left")
        legend_ax.text(0.02, 0.0, note + "\n" + "\n".join(source_line(*s) for s in sources),
                       transform=legend_ax.transAxes, fontsize=9, va="bottom")
    else:
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9,
                   frameon=False)
        fig.text(0.01, -0.02, note + "\n" + "\n".join(source_line(*s) for s in sources),
                 fontsize=8, va="top")
    cards = sorted({doc.get("card", "?") for _, _, doc in sources})
    title = f"FlashCore bench on {', '.join(cards)}, {dtype}"
    if any(doc.get("dry_run") or doc.get("card") == "dry-run" for _, _, doc in sources):
        title = "DRY RUN, FAKE TIMINGS: " + title  # a plot of a dry run says so too
    fig.suptitle(title, fontsize=13, y=1 - 0.2 / height, va="top")
    return fig


def plot(paths, out=None, dtype=None):
    """Draw the rows of `paths` into one PNG; returns its path (default: the first file's name
    with .png, beside it). Small: about 200 KB for a full run at 72 dpi."""
    fig = figure(paths, dtype)
    if out is None:
        out = os.path.splitext(paths[0])[0] + ".png"
    fig.savefig(out, dpi=72, bbox_inches="tight")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Plot bench/bench.py JSON results into one PNG.")
    ap.add_argument("json", nargs="+", help="bench.py JSON file(s); for each pass the last "
                                            "file with rows of that pass is used")
    ap.add_argument("-o", "--out", help="PNG path (default: the first JSON's path with .png)")
    ap.add_argument("--dtype", help="fp16 or bf16 (default: fp16 where present)")
    args = ap.parse_args(argv)
    try:
        out = plot(args.json, args.out, args.dtype)
    except MissingMatplotlib as e:
        print(e, file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:  # a missing or unreadable file, nothing to plot
        print(f"plot: {e}", file=sys.stderr)
        return 2
    print(f"plot: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
