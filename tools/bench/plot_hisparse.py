#!/usr/bin/env python3
"""The HiSparse hit-rate sweep of `sparse-mla bench`, as a table and a PNG.

    sparse-mla bench --backend cuda --filter '^model-step/' --json-file model-step.json
    python3 tools/bench/plot_hisparse.py model-step.json --png hisparse-sweep.png

Reads the `model-step/rows=R,hits=P` cases of one or more bench JSON files
(bench --json or --json-file) and prints, per batch size and hit rate, the
decode step's HiSparse time (resolve once per index group, gather per layer),
the time its missed bytes take at the pinned copy ceiling of the same run
(`at_ceiling_us`: the floor) and the difference: the bookkeeping the library
adds to the transfer that no implementation can avoid.

With --png it draws the same figures with matplotlib (Debian's
python3-matplotlib): on the left the step time against the hit rate, one
colour per batch size, the step solid and the floor dashed, on a logarithmic
axis; on the right the bookkeeping per step as bars. The table needs nothing
beyond the standard library.
"""
import argparse
import json
import re
import sys

CASE = re.compile(r"^model-step/rows=(\d+),hits=(\d+)$")
LAYERS, GROUPS = 61, 16  # the model-step cases: DeepSeek-V3.2's layers, a new index group every 4
COLOURS = ["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown"]


def read_cases(paths):
    """{(rows, hits): case} over the files, and the first file's run (device, pinned ceiling)."""
    cases, run = {}, None
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"plot_hisparse: cannot read {path}: {e}")
        if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
            sys.exit(f"plot_hisparse: {path} is not the JSON of sparse-mla bench (no 'cases' list)")
        if run is None:
            device = doc.get("device", {})
            run = {"device": f"{device.get('name', '?')}, {device.get('backend', '?')} backend",
                   "pinned_gbps": doc.get("ceilings_gbps", {}).get("pinned_copy", 0.0)}
        for case in doc["cases"]:
            match = CASE.match(str(case.get("name", "")))
            if match and case.get("timed") and str(case.get("outcome", "")).startswith("ok"):
                cases[(int(match.group(1)), int(match.group(2)))] = case
    if not cases:
        sys.exit("plot_hisparse: no timed model-step case in " + ", ".join(paths) +
                 " (run sparse-mla bench --filter '^model-step/')")
    return cases, run


def table(cases):
    lines = ["| rows | hits | step us | floor us (missed bytes at the pinned ceiling) | bookkeeping us | per index group us |",
             "|---|---|---|---|---|---|"]
    for (rows, hits), c in sorted(cases.items()):
        step, floor = c["median_us"], c.get("at_ceiling_us", 0.0)
        lines.append(f"| {rows} | {hits}% | {step:.1f} | {floor:.1f} | {step - floor:.1f} | {(step - floor) / GROUPS:.2f} |")
    return "\n".join(lines)


def series(cases, rows):
    """[(hits, case)] of one batch size, by hit rate."""
    return sorted((hits, c) for (r, hits), c in cases.items() if r == rows)


def step_panel(ax, cases, x_of, colour):
    """The step and its floor against the hit rate, in ms on a log axis."""
    from matplotlib.ticker import FuncFormatter

    for rows in colour:
        points = series(cases, rows)
        ax.plot([x_of[hits] for hits, _ in points], [c["median_us"] / 1e3 for _, c in points], "-o",
                color=colour[rows], lw=2.4, ms=7)
        floor = [(x_of[hits], c.get("at_ceiling_us", 0.0) / 1e3) for hits, c in points if c.get("at_ceiling_us", 0.0) > 0]
        if floor:
            ax.plot(*zip(*floor), "--s", color=colour[rows], lw=1.8, ms=5, alpha=0.8)
    ax.set_yscale("log")
    for hits in x_of:  # a step without misses has no floor to draw on a log axis
        if all(c.get("at_ceiling_us", 0.0) <= 0 for (_, h), c in cases.items() if h == hits):
            ax.annotate("no misses:\nfloor 0", (x_of[hits], 0.04), xycoords=("data", "axes fraction"), ha="center",
                        fontsize=11, color="0.35")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(-0.3, len(x_of) - 0.7)
    ax.set_ylabel("time per decode step (ms, log scale)")
    ax.set_title("Decode step against its transfer floor")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", axis="y", alpha=0.12)


def overhead_panel(ax, cases, x_of, colour):
    """What the step adds to its floor, in µs, bars grouped by hit rate."""
    width = 0.8 / len(colour)
    for i, rows in enumerate(colour):
        points = series(cases, rows)
        bars = ax.bar([x_of[hits] - 0.4 + width * (i + 0.5) for hits, _ in points],
                      [c["median_us"] - c.get("at_ceiling_us", 0.0) for _, c in points], width * 0.92, color=colour[rows])
        ax.bar_label(bars, fmt="%.0f", fontsize=9, padding=2)
    ax.set_ylabel(f"µs per step ({GROUPS} resolves, {LAYERS} gathers)")
    ax.set_title("Step time above the floor")
    ax.grid(True, axis="y", alpha=0.35)
    ax.set_axisbelow(True)
    ax.margins(y=0.12)


def plot(cases, run, path):
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_hisparse: --png needs matplotlib (Debian: python3-matplotlib; pip: matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    hits_all = sorted({hits for _, hits in cases})
    x_of = {hits: i for i, hits in enumerate(hits_all)}  # hit rates are few and uneven: equal spacing
    colour = {rows: COLOURS[i % len(COLOURS)] for i, rows in enumerate(sorted({rows for rows, _ in cases}))}
    plt.rcParams.update({"font.size": 13, "axes.titlesize": 14, "axes.labelsize": 13, "xtick.labelsize": 12,
                         "ytick.labelsize": 12})
    fig, (left, right) = plt.subplots(1, 2, figsize=(13.5, 5.8), gridspec_kw={"width_ratios": [1.25, 1]})
    step_panel(left, cases, x_of, colour)
    overhead_panel(right, cases, x_of, colour)
    for ax in (left, right):
        ax.set_xticks(range(len(hits_all)), [f"{hits}%" for hits in hits_all])
        ax.set_xlabel("hit rate of the top-k in the device's hot slots")

    handles = [Line2D([], [], color=c, lw=6, label=f"batch of {rows}") for rows, c in colour.items()]
    handles += [Line2D([], [], color="0.3", lw=2.4, marker="o", label="step: resolves + gathers"),
                Line2D([], [], color="0.3", lw=1.8, ls="--", marker="s", ms=5,
                       label="floor: missed rows at the pinned-copy ceiling")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=11.5,
               handlelength=2.4, columnspacing=1.2)
    ceiling = f", pinned-copy ceiling {run['pinned_gbps']:.0f} GB/s" if run["pinned_gbps"] > 0 else ""
    fig.suptitle(f"HiSparse decode step: DeepSeek-V3.2, {LAYERS} layers in {GROUPS} index groups, K = 2048, "
                 f"4096 hot slots\n{run['device']}{ceiling}", fontsize=15)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="sparse-mla bench JSON (--json or --json-file)")
    parser.add_argument("--png", help="write the plot here")
    args = parser.parse_args()
    cases, run = read_cases(args.json)
    print(f"HiSparse per decode step on {run['device']}: {LAYERS} layers in {GROUPS} index groups, K=2048, H=4096")
    print(table(cases))
    if args.png:
        plot(cases, run, args.png)
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
