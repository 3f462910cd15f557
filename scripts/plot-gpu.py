#!/usr/bin/env python3
"""Draws scripts/bench-gpu.sh's JSON (JSON_OUT) as a PNG: time per call of
Ferrite and upstream's cuda driver for each case (log scale), each round as
a dot, the median as a bar, the ratio Ferrite/upstream above each pair.

Usage: scripts/plot-gpu.py RESULTS.json OUT.png [--title TEXT]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("png")
    ap.add_argument("--title", default="GPU: time per call, Ferrite vs upstream's cuda driver")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot-gpu: needs matplotlib (pip install matplotlib)")
    cases = json.load(open(args.json))["cases"]
    if not cases:
        sys.exit(f"plot-gpu: no cases in {args.json}")
    fig, ax = plt.subplots(figsize=(2.2 * len(cases) + 2, 4.5))
    names = list(cases)
    width = 0.38
    for i, name in enumerate(names):
        c = cases[name]
        for j, (label, color) in enumerate((("ferrite", "tab:blue"), ("upstream", "tab:orange"))):
            x = i + (j - 0.5) * width
            ax.bar(x, c[f"{label}_ns"] / 1e3, width, color=color, alpha=0.75,
                   label=label if i == 0 else None)
            ax.plot([x] * len(c[f"{label}_all"]), [v / 1e3 for v in c[f"{label}_all"]], "k.", ms=3)
        top = max(c["ferrite_ns"], c["upstream_ns"]) / 1e3
        ax.text(i, top * 1.25, f"{c['ferrite_ns'] / c['upstream_ns']:.2f}x", ha="center", fontsize=9)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names)
    ax.set_ylabel("us per call (log)")
    ax.set_ylim(top=ax.get_ylim()[1] * 2)
    ax.set_title(args.title, fontsize=10)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
