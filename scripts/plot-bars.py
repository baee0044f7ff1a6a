#!/usr/bin/env python3
"""Draws a benchmark's results as a grouped horizontal bar chart (PNG): one group per line
prefix (e.g. "4 ranks: process started"), one bar per series (rdrun warm, cold, torchrun),
each bar labelled with its value. Input lines: GROUP<TAB>SERIES<TAB>VALUE ("nan": not
reached, drawn as a gap). Used by scripts/bench-torch-lib.sh's `plot`.
Usage: plot-bars.py RESULTS OUT.png TITLE UNIT   (UNIT: s, or MiB, ...)"""
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    path, out, title, unit = sys.argv[1:5]
    groups, series, val = [], [], {}
    for line in open(path):
        g, s, v = line.rstrip("\n").split("\t")
        if g not in groups:
            groups.append(g)
        if s not in series:
            series.append(s)
        val[(g, s)] = float(v)
    h = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.35 * len(groups) * len(series)))
    top = max((v for v in val.values() if not math.isnan(v)), default=1.0)
    for j, s in enumerate(series):
        ys = [len(groups) - 1 - i + 0.4 - (j + 0.5) * h for i in range(len(groups))]
        xs = [val.get((g, s), math.nan) for g in groups]
        bars = ax.barh(ys, [0 if math.isnan(x) else x for x in xs], height=h * 0.9, label=s)
        for b, x in zip(bars, xs):
            text = "not reached" if math.isnan(x) else ("%.2f %s" % (x, unit) if unit == "s" else "%d %s" % (x, unit))
            ax.text(b.get_width() + top * 0.01, b.get_y() + b.get_height() / 2, text,
                    va="center", fontsize=7)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels(list(reversed(groups)), fontsize=8)
    ax.set_xlabel("seconds (median)" if unit == "s" else unit)
    ax.set_xlim(0, top * 1.18)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
