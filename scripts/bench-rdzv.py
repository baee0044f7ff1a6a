#!/usr/bin/env python3
"""Rendezvous benchmark: N agents (one "node" each) on loopback, rdrun c10d vs torchrun c10d.

For each size N, starts N agents at once (`--nnodes N --rdzv-backend c10d`, agent i advertising
127.0.0.(i+1) via --local-addr), one worker each that records when it started (`date +%s%N`).
Reports the median over runs of: all agents started -> every worker running ("rendezvous"), and
-> every agent exited ("total", which includes the exit barrier). Prints ratios.

Usage: scripts/bench-rdzv.py [--sizes 2,8,32] [--torch-sizes 2,8] [--runs 3]
Env: RDRUN (default target/release/rdrun, build it first), TORCHRUN (default
~/.cache/rdrun/torch-venv/bin/torchrun; skipped when absent). Every agent has a hard bound and is
killed by PID when it expires.
"""

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rdrun"
WORKER = 'date +%s%N > "$BENCH_DIR/t.$RANK"'
BOUND = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(launcher, n):
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, BENCH_DIR=d, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
        t0 = time.time_ns()
        procs = []
        for i in range(n):
            args = [launcher, "--nnodes", str(n), "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                    "--rdzv-id", "bench", "--local-addr", f"127.0.0.{i + 1}",
                    "--no-python", "sh", "-c", WORKER]
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + BOUND
        try:
            for p in procs:
                p.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            for p in procs:  # our own children, by pid
                if p.poll() is None:
                    p.kill()
                    p.wait()
        t_end = time.time_ns()
        codes = [p.returncode for p in procs]
        stamps = [int(f.read_text()) for f in Path(d).glob("t.*")]
        if codes != [0] * n or len(stamps) != n:
            raise RuntimeError(f"{launcher} N={n}: exit codes {codes}, {len(stamps)} workers")
        return (max(stamps) - t0) / 1e9, (t_end - t0) / 1e9


def median_run(launcher, n, runs):
    res = [one_run(launcher, n) for _ in range(runs)]
    return statistics.median(r[0] for r in res), statistics.median(r[1] for r in res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2,8,32")
    ap.add_argument("--torch-sizes", default="2,8")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    rdrun = os.environ.get("RDRUN") or str(REPO / "target" / "release" / "rdrun")
    torchrun = os.environ.get("TORCHRUN") or str(CACHE / "torch-venv" / "bin" / "torchrun")
    have_torch = Path(torchrun).exists()
    torch_sizes = {int(s) for s in a.torch_sizes.split(",") if s} if have_torch else set()
    print(f"{'N':>4} {'rdrun rdzv s':>13} {'rdrun total s':>14} {'torchrun rdzv s':>16} "
          f"{'torchrun total s':>17} {'ratio rdzv':>11}")
    for n in (int(s) for s in a.sizes.split(",")):
        r = median_run(rdrun, n, a.runs)
        if n in torch_sizes:
            t = median_run(torchrun, n, a.runs)
            print(f"{n:>4} {r[0]:>13.2f} {r[1]:>14.2f} {t[0]:>16.2f} {t[1]:>17.2f} "
                  f"{t[0] / r[0]:>10.1f}x", flush=True)
        else:
            print(f"{n:>4} {r[0]:>13.2f} {r[1]:>14.2f} {'-':>16} {'-':>17} {'-':>11}", flush=True)
    if not have_torch:
        print(f"torchrun not found at {torchrun}: rdrun only")


if __name__ == "__main__":
    main()
