#!/usr/bin/env python3
"""Console benchmark (issue 29): rdrun's own CPU time and the run's wall time with
`--output collapse` against `--output all`, N ranks printing as fast as they can.

Each rank (perl, no Python start-up cost) writes LINES lines to stdout: `same` lines are identical
across ranks (`step <i> loss 0.5`, everything collapses), `differ` lines carry the rank (nothing
collapses: the stage's worst case, every line waits in it for nothing). rdrun's stdout goes to
/dev/null, so the console itself is never the limit. rdrun's CPU time is its own (user + sys of
all its threads, /proc/<pid>/stat fields 14-15, polled every 5 ms until it exits; the workers'
time is not in it). Whether the console slows the workers: each worker times its own writing
(first line to closing stdout, pipe waits included) and the slowest is reported; the run's wall
time also holds the last lines' wait in the window (a flush at a worker's end waits for them).

Usage: scripts/bench-console.py [--rdrun PATH] [--runs 5] [--ranks 8,64] [--lines 100000]
(without --rdrun: target/release/rdrun, built by `cargo build --release --bin rdrun`).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
use Time::HiRes qw(time);
my ($lines, $mode, $dir) = @ARGV;
my $r = $ENV{RANK};
my $t0 = time;
$| = 0;
for my $i (1 .. $lines) {
    if ($mode eq 'same') { print "step $i loss 0.5\n"; }
    else { print "rank $r step $i loss 0.5\n"; }
}
close STDOUT;
open(my $f, '>', "$dir/t.$r") or die;
printf $f "%.6f\n", time - $t0;
"""

TICK = os.sysconf("SC_CLK_TCK")


def own_cpu(pid):
    """User + sys seconds of process pid itself (all threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / TICK


def run_once(rdrun, ranks, lines, mode, output, worker, tdir):
    cmd = [
        rdrun,
        "--standalone",
        f"--nproc-per-node={ranks}",
        f"--output={output}",
        "--no-python",
        "perl",
        worker,
        str(lines),
        mode,
        tdir,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    cpu = 0.0
    while p.poll() is None:
        c = own_cpu(p.pid)
        if c is not None:
            cpu = c
        time.sleep(0.005)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"bench-console: {' '.join(cmd)} exited {p.returncode}")
    # The slowest worker's own time to write all its lines (pipe waits included).
    slowest = max(float(open(os.path.join(tdir, f"t.{r}")).read()) for r in range(ranks))
    return cpu, wall, slowest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rdrun", default="target/release/rdrun")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", default="8,64")
    ap.add_argument("--lines", type=int, default=100000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rdrun-bench-console-") as d:
        worker = os.path.join(d, "burst.pl")
        with open(worker, "w") as f:
            f.write(WORKER)
        print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
        print("medians of", a.runs, "runs")
        print(
            "| ranks | lines/rank | lines | output | rdrun CPU | CPU vs all"
            " | slowest worker's write time | run wall |"
        )
        print("|---:|---:|---|---|---:|---:|---:|---:|")
        for ranks in [int(x) for x in a.ranks.split(",")]:
            lines = a.lines if ranks <= 8 else max(1, a.lines * 8 // ranks)
            for mode in ["same", "differ"]:
                base = None
                for output in ["all", "collapse"]:
                    cpus, walls, works = [], [], []
                    # Interleaved runs would be fairer on a busy machine; the order is kept
                    # simple and the medians of several runs are reported.
                    for _ in range(a.runs):
                        c, w, k = run_once(a.rdrun, ranks, lines, mode, output, worker, d)
                        cpus.append(c)
                        walls.append(w)
                        works.append(k)
                    cpu, wall = statistics.median(cpus), statistics.median(walls)
                    work = statistics.median(works)
                    if output == "all":
                        base = cpu
                    ratio = f"{(cpu / base - 1) * 100:+.0f} %" if base else "-"
                    print(
                        f"| {ranks} | {lines} | {mode} | {output} | {cpu:.2f} s | {ratio}"
                        f" | {work:.2f} s | {wall:.2f} s |",
                        flush=True,
                    )
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
