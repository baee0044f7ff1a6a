#!/usr/bin/env python3
"""etcd rendezvous benchmark: rdrun's etcd-v3 backend vs its c10d backend, same machine, same run.

1. Rendezvous time: for each size N, N agents start at once on loopback (agent i advertising
   127.0.0.(i+1) via --local-addr), `--nnodes N`, one worker each that records when it started.
   Reported: the median over runs of "all agents started -> every worker running" for c10d
   (endpoint 127.0.0.1:<port>, hosted by the agent on 127.0.0.1) and etcd-v3 (a 3-member etcd
   on loopback, started once by scripts/etcd-cluster.sh, a fresh run id per run).
2. Failover: 3 agents, `--nnodes 2:4`, default settings (lease TTL 5 s); once the 3-node round
   runs, the agent hosting the workers' store (group rank 0) is SIGKILLed; reported: the time
   from the SIGKILL to both survivors' workers of the new 2-node round running. (c10d: the job
   ends when the store's host dies, as torchrun's.)

Usage: scripts/bench-etcd.py [--sizes 2,8,32,128] [--runs 3] [--failover-runs 3]
Env: RDRUN (default target/release/rdrun, built with `--features etcd`). Every agent has a hard
bound and is killed by PID when it expires; the etcd members are stopped by PID at the end.
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKER = ('t="$GROUP_WORLD_SIZE.$RANK"; date +%s%N > "$BENCH_DIR/.t.$t" && '
          'mv "$BENCH_DIR/.t.$t" "$BENCH_DIR/t.$t"; '
          'if [ "$GROUP_WORLD_SIZE" = "$BENCH_HOLD_GWS" ]; then exec sleep 120; fi')
BOUND = 600


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(rdrun, args, env):
    return subprocess.Popen([rdrun, *args, "--nproc-per-node", "1", "--no-python", "sh", "-c",
                             WORKER], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def reap(procs, bound):
    deadline = time.monotonic() + bound
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:  # our own children, by pid
            if p.poll() is None:
                p.kill()
                p.wait()
    return [p.returncode for p in procs]


def backend_args(backend, eps, run):
    if backend == "c10d":
        return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                "--rdzv-id", run]
    return ["--rdzv-backend", "etcd-v3", "--rdzv-endpoint", eps, "--rdzv-id", run]


def one_run(rdrun, backend, eps, n, run):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, BENCH_DIR=d, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
        common = backend_args(backend, eps, run)
        t0 = time.time_ns()
        procs = [spawn(rdrun, ["--nnodes", str(n), *common, "--local-addr", f"127.0.0.{i + 1}"],
                       env) for i in range(n)]
        codes = reap(procs, BOUND)
        stamps = [int(f.read_text()) for f in Path(d).glob("t.*")]
        if codes != [0] * n or len(stamps) != n:
            raise RuntimeError(f"{backend} N={n}: exit codes {codes}, {len(stamps)} workers")
        return (max(stamps) - t0) / 1e9


def failover(rdrun, eps, run):
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, BENCH_DIR=d, OMP_NUM_THREADS="1", LOGLEVEL="ERROR",
                   BENCH_HOLD_GWS="3")
        common = backend_args("etcd", eps, run)
        procs = [spawn(rdrun, ["--nnodes", "2:4", *common, "--rdzv-conf", "last_call_timeout=20",
                               "--local-addr", f"127.0.0.{i + 1}"], env) for i in range(3)]
        try:
            deadline = time.monotonic() + 120
            while len(list(Path(d).glob("t.3.*"))) < 3:
                if time.monotonic() > deadline:
                    raise RuntimeError("the 3-node round did not start")
                time.sleep(0.05)
            # Group rank 0 is the first agent of the first round (address order): 127.0.0.1.
            t0 = time.time_ns()
            procs[0].kill()
            procs[0].wait()
            while len(list(Path(d).glob("t.2.*"))) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("the survivors did not regroup")
                time.sleep(0.02)
            stamps = [int(f.read_text()) for f in Path(d).glob("t.2.*")]
        finally:
            codes = reap(procs[1:], 60)
            reap(procs[:1], 1)
        if codes != [0, 0]:
            raise RuntimeError(f"failover: survivors exited {codes}")
        return (max(stamps) - t0) / 1e9


def main():
    # A SIGTERM (e.g. from `timeout`) still runs the clean-up below: agents and etcd by PID.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2,8,32,128")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--failover-runs", type=int, default=3)
    a = ap.parse_args()
    rdrun = os.environ.get("RDRUN") or str(REPO / "target" / "release" / "rdrun")
    with tempfile.TemporaryDirectory() as cd:
        eps = subprocess.run([str(REPO / "scripts" / "etcd-cluster.sh"), "start", cd, "3"],
                             check=True, capture_output=True, text=True).stdout.strip()
        try:
            print(f"{'N':>4} {'c10d rdzv s':>12} {'etcd rdzv s':>12}")
            k = 0
            for n in (int(s) for s in a.sizes.split(",")):
                c, e = [], []
                for _ in range(a.runs):
                    k += 1
                    c.append(one_run(rdrun, "c10d", eps, n, f"c{k}"))
                    e.append(one_run(rdrun, "etcd", eps, n, f"e{k}"))
                print(f"{n:>4} {statistics.median(c):>12.2f} {statistics.median(e):>12.2f}",
                      flush=True)
            f = [failover(rdrun, eps, f"f{i}") for i in range(a.failover_runs)]
            if f:
                    print(f"failover (SIGKILL of the store host -> survivors' workers running): "
                      f"median {statistics.median(f):.2f} s, "
                      f"runs {', '.join(f'{x:.2f}' for x in f)}")
        finally:
            subprocess.run([str(REPO / "scripts" / "etcd-cluster.sh"), "stop", cd])


if __name__ == "__main__":
    main()
