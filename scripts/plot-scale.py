#!/usr/bin/env python3
"""Draws the scale benchmark results (scripts/bench-scale.sh's results.txt) as log-log PNGs, one
per measure, rdrun and the anchor (PyTorch's libuv TCPStore measured in the same run, and its
published 96K-rank initialisation time) on the same axes, with the fitted growth exponent."""
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# PyTorch's published figure for its libuv TCPStore: about 100 s to initialise 96K ranks.
ANCHOR = (96_000, 100.0)


def parse(path):
    rows = []
    for line in open(path):
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        if not line.startswith("#"):
            rows.append(kv)
    return rows


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def fit(xs, ys):
    """Least-squares slope and intercept of log y against log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    n = len(lx)
    mx, my = sum(lx) / n, sum(ly) / n
    den = sum((a - mx) ** 2 for a in lx)
    if n < 2 or den == 0:
        return None
    k = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / den
    return k, my - k * mx


def series(rows, kind, who_key, who, x_key, y_key, scale=1.0):
    pts = []
    for r in rows:
        if r.get("kind") != kind or r.get(who_key) != who:
            continue
        x, y = num(r.get(x_key)), num(r.get(y_key))
        if x and y and y > 0:
            pts.append((x, y * scale))
    return sorted(pts)


def plot(path, title, ylabel, lines, anchor=None, extrapolate_to=None):
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, pts, style in lines:
        if not pts:
            continue
        xs, ys = zip(*pts)
        f = fit(xs, ys)
        lab = label if f is None else f"{label} (slope {f[0]:.2f})"
        ax.plot(xs, ys, style, label=lab)
        if f and extrapolate_to:
            k, c = f
            x2 = extrapolate_to
            ax.plot([xs[-1], x2], [ys[-1], math.exp(c) * x2**k], style[0] + ":",
                    label=f"{label}, extrapolated: {math.exp(c) * x2**k:.3g} at {x2:,.0f}")
    if anchor:
        ax.plot([anchor[0]], [anchor[1]], "k*", markersize=12,
                label=f"PyTorch libuv, published: {anchor[1]:.0f} s at {anchor[0]:,}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main():
    # plot-scale.py RESULTS... OUTDIR: rows of every results file together.
    rows = [r for path in sys.argv[1:-1] for r in parse(path)]
    out = sys.argv[-1]
    rd = series(rows, "store", "server", "rdrun", "clients", "wall_s")
    pt = series(rows, "store", "server", "torch", "clients", "wall_s")
    plot(f"{out}/store_startup_wall.png", "Store: PyTorch start-up pattern, wall time",
         "seconds (all clients through every phase)",
         [("rdrun", rd, "o-"),
          ("rdrun, generators niced",
           series(rows, "store", "server", "rdrun-nice", "clients", "wall_s"), "d:"),
          ("rdrun before", series(rows, "store", "server", "rdrun-before", "clients", "wall_s"),
           "^--"),
          ("PyTorch libuv (this VM)", pt, "s-"),
          ("PyTorch libuv, DNS lookup failing at once",
           series(rows, "store", "server", "torch-nodns", "clients", "wall_s"), "s--")],
         anchor=ANCHOR, extrapolate_to=100_000)
    plot(f"{out}/store_server_cpu.png", "Store: server CPU for the start-up pattern",
         "CPU seconds",
         [("rdrun", series(rows, "store", "server", "rdrun", "clients", "server_cpu_s"), "o-"),
          ("rdrun before", series(rows, "store", "server", "rdrun-before", "clients",
                                  "server_cpu_s"), "^--"),
          ("PyTorch libuv", series(rows, "store", "server", "torch", "clients", "server_cpu_s"),
           "s-"),
          ("PyTorch libuv, no DNS",
           series(rows, "store", "server", "torch-nodns", "clients", "server_cpu_s"), "s--")])
    plot(f"{out}/store_rss.png", "Store: server peak RSS with every client connected",
         "KiB per connection",
         [("rdrun", series(rows, "store", "server", "rdrun", "clients", "per_conn_kib"), "o-"),
          ("rdrun before", series(rows, "store", "server", "rdrun-before", "clients",
                                  "per_conn_kib"), "^--"),
          ("PyTorch libuv", series(rows, "store", "server", "torch", "clients", "per_conn_kib"),
           "s-"),
          ("PyTorch libuv, no DNS",
           series(rows, "store", "server", "torch-nodns", "clients", "per_conn_kib"), "s--")])
    plot(f"{out}/store_probe.png", "Store: worst fresh-client answer during the storm",
         "milliseconds",
         [("rdrun", series(rows, "store", "server", "rdrun", "clients", "probe_worst_ms"), "o-"),
          ("rdrun, generators niced",
           series(rows, "store", "server", "rdrun-nice", "clients", "probe_worst_ms"), "d:"),
          ("rdrun before", series(rows, "store", "server", "rdrun-before", "clients",
                                  "probe_worst_ms"), "^--"),
          ("PyTorch libuv", series(rows, "store", "server", "torch", "clients",
                                   "probe_worst_ms"), "s-"),
          ("PyTorch libuv, no DNS",
           series(rows, "store", "server", "torch-nodns", "clients", "probe_worst_ms"), "s--"),
          ("PyTorch libuv, no DNS, generators niced",
           series(rows, "store", "server", "torch-nodns-nice", "clients", "probe_worst_ms"),
           "x:")])
    sim = lambda key: series(rows, "rdzv", "impl", "rdrun-sim", "nodes", key)  # noqa: E731
    before = lambda key: series(rows, "rdzv", "impl", "rdrun-sim-before", "nodes",  # noqa: E731
                                key)
    # The per-node-keys join while every node still read the whole roster (issue 16, pass 1).
    roster = lambda key: series(rows, "rdzv", "impl", "rdrun-sim-roster", "nodes",  # noqa: E731
                                key)
    plot(f"{out}/rdzv_join.png", "c10d rendezvous: one round (join), by node count", "seconds",
         [("rdrun, simulated nodes (join)", sim("join_s"), "o-"),
          ("rdrun, per-node keys, roster read by all", roster("join_s"), "d:"),
          ("rdrun before (one JSON state, CAS)", before("join_s"), "^--"),
          ("rdrun, real agents (start to exit)",
           series(rows, "agents", "impl", "rdrun", "nodes", "wall_s"), "^-"),
          ("torchrun, real agents (start to exit)",
           series(rows, "agents", "impl", "torchrun", "nodes", "wall_s"), "s-")])
    plot(f"{out}/rdzv_steady_cpu.png", "c10d rendezvous: store CPU at steady state",
         "% of one core", [("rdrun (simulated)", sim("steady_cpu_pct"), "o-"),
                           ("rdrun, roster read by all", roster("steady_cpu_pct"), "d:"),
                           ("rdrun before", before("steady_cpu_pct"), "^--")])
    plot(f"{out}/rdzv_bytes_per_join.png", "c10d rendezvous: store bytes moved per join",
         "bytes per node (read + written)", [("rdrun (simulated)", sim("bytes_per_join"), "o-"),
                                             ("rdrun, roster read by all",
                                              roster("bytes_per_join"), "d:"),
                                             ("rdrun before", before("bytes_per_join"), "^--")])
    plot(f"{out}/rdzv_detect.png", "c10d rendezvous: one lost node, last survivor told",
         "seconds", [("rdrun (simulated)", sim("detect_all_s"), "o-"),
                     ("rdrun (simulated), budget", sim("dead_after_s"), "k:"),
                     ("rdrun, roster read by all", roster("detect_all_s"), "d:"),
                     ("rdrun before", before("detect_all_s"), "^--")])


if __name__ == "__main__":
    main()
