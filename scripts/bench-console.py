#!/usr/bin/env python3
"""Console benchmark (issue 29): rdrun's own CPU time and the run's wall time with
`--output collapse` against `--output all`, N ranks printing as fast as they can.

Each rank (perl, no Python start-up cost) writes LINES lines to stdout: `same` lines are identical
across ranks (`step <i> loss 0.5`, everything collapses), `differ` lines carry the rank (nothing
collapses: the stage's worst case, every line waits in it for nothing). rdrun's stdout goes to
/dev/null, so the console itself is never the limit. rdrun's CPU time is its own: the run time of
each of its threads (/proc/<pid>/task/<tid>/schedstat, in ns, polled every 5 ms until it exits;
/proc/<pid>/stat would count 10 ms ticks); the workers' time is not in it. Whether the console
slows the workers: each worker times its own writing (first line to closing stdout, pipe waits
included) and the slowest is reported; the run's wall time also holds the last lines' wait in the
window (a flush at a worker's end waits for them).

Usage: scripts/bench-console.py [--rdrun PATH]... [--runs 5] [--ranks 8,64] [--lines 100000]
       [--rate N] [--flush-each-line] [--floor]
(--rate N: each rank prints N lines a second, one write per line, as training logs do; without
it they print as fast as they can, block-buffered, or one write per line with --flush-each-line.
--floor: also what hashing each line and one index slot cost, scripts/collapse-floor.rs.)
(without --rdrun: target/release/rdrun, built by `cargo build --release --bin rdrun`). With
several --rdrun binaries (a build before a change and after it) the runs are interleaved: each
round runs every binary with both outputs before the next round, so a machine whose load
changes meanwhile (other builds) weighs on all of them alike; each row names its binary.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
use Time::HiRes qw(time sleep);
my ($lines, $mode, $dir, $rate, $flush) = @ARGV;
my $r = $ENV{RANK};
my $t0 = time;
# Flood: block-buffered, or one write per line with --flush-each-line (python -u,
# PYTHONUNBUFFERED). Paced (a rate): one write per line, as `print(..., flush=True)` or a logging
# handler does, sleeping whenever ahead of the rate.
$| = ($rate > 0 || $flush) ? 1 : 0;
for my $i (1 .. $lines) {
    if ($mode eq 'same') { print "step $i loss 0.5\n"; }
    else { print "rank $r step $i loss 0.5\n"; }
    if ($rate > 0) {
        my $ahead = $t0 + $i / $rate - time;
        sleep($ahead) if $ahead > 0.002;
    }
}
close STDOUT;
open(my $f, '>', "$dir/t.$r") or die;
printf $f "%.6f\n", time - $t0;
"""

def thread_cpu(pid, seen):
    """Records in `seen` (thread id -> (nanoseconds, name)) each live thread of process pid's
    time on a CPU so far (/proc/<pid>/task/<tid>/schedstat, first field: exact, where
    /proc/<pid>/stat counts 10 ms ticks); a thread that ends keeps what it had at the last
    poll."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        seen[tid] = (max(seen.get(tid, (0, ""))[0], ns), name)


def run_once(rdrun, ranks, lines, mode, output, worker, tdir, rate=0, flush=False):
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
        str(rate),
        str(int(flush)),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    seen = {}
    while p.poll() is None:
        thread_cpu(p.pid, seen)
        time.sleep(0.005)
    cpu = sum(ns for ns, _ in seen.values()) / 1e9
    # The console writer's thread alone: where the collapse stage runs (the rest is the
    # forwarders, whose cost moves with how many lines each pipe read happens to carry).
    console = sum(ns for ns, name in seen.values() if name == "rdrun-console") / 1e9
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"bench-console: {' '.join(cmd)} exited {p.returncode}")
    # The slowest worker's own time to write all its lines (pipe waits included).
    slowest = max(float(open(os.path.join(tdir, f"t.{r}")).read()) for r in range(ranks))
    return cpu, wall, slowest, console


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rdrun", action="append", help="binary to run (repeat to compare)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", default="8,64")
    ap.add_argument("--lines", type=int, default=100000)
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also build and run scripts/collapse-floor.rs (rustc) and set its per-line cost"
        " beside --output all's",
    )
    ap.add_argument(
        "--flush-each-line",
        action="store_true",
        help="a flood of one write per line (python -u) instead of block-buffered",
    )
    ap.add_argument(
        "--rate",
        type=int,
        default=0,
        help="lines per second per rank, one write each (0: as fast as they can)",
    )
    a = ap.parse_args()
    binaries = a.rdrun or ["target/release/rdrun"]
    outputs = ["all", "collapse"]
    with tempfile.TemporaryDirectory(prefix="rdrun-bench-console-") as d:
        worker = os.path.join(d, "burst.pl")
        with open(worker, "w") as f:
            f.write(WORKER)
        print(f"load average before: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
        pace = f"{a.rate} lines/s per rank" if a.rate else "flood"
        if a.flush_each_line or a.rate:
            pace += ", one write per line"
        print("medians of", a.runs, "runs, interleaved;", pace)
        print(
            "| binary | ranks | lines/rank | lines | output | rdrun CPU | CPU vs all"
            " | console thread | slowest worker's write time | run wall |"
        )
        print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|")
        floors = []
        for ranks in [int(x) for x in a.ranks.split(",")]:
            # A flood keeps the lines per case fixed; a paced run keeps each rank's rate.
            lines = a.lines if ranks <= 8 or a.rate else max(1, a.lines * 8 // ranks)
            for mode in ["same", "differ"]:
                got = {(b, o): [] for b in binaries for o in outputs}
                # Rounds: every binary and output once per round, so that a change of the
                # machine's load between rounds weighs on all of them alike.
                for _ in range(a.runs):
                    for b in binaries:
                        for o in outputs:
                            r = run_once(b, ranks, lines, mode, o, worker, d, a.rate, a.flush_each_line)
                            got[(b, o)].append(r)
                if a.floor:
                    all_cpu = statistics.median(r[0] for r in got[(binaries[0], "all")])
                    floors.append((ranks, lines, mode, all_cpu / (ranks * lines) * 1e9))
                for b in binaries:
                    base = None
                    for o in outputs:
                        runs = got[(b, o)]
                        cpu = statistics.median(r[0] for r in runs)
                        wall = statistics.median(r[1] for r in runs)
                        work = statistics.median(r[2] for r in runs)
                        console = statistics.median(r[3] for r in runs)
                        if o == "all":
                            base = cpu
                        ratio = f"{(cpu / base - 1) * 100:+.0f} %" if base else "-"
                        print(
                            f"| {os.path.basename(b)} | {ranks} | {lines} | {mode} | {o}"
                            f" | {cpu:.3f} s | {ratio} | {console:.3f} s | {work:.2f} s"
                            f" | {wall:.2f} s |",
                            flush=True,
                        )
        if floors:
            floor_table(floors, d)
        print(f"load average after: {os.getloadavg()[0]:.2f}")


# Bytes the collapse stage holds at most (`PENDING_CAP` in src/supervisor/output/collapse.rs).
PENDING_CAP = 2 << 20


def floor_table(floors, d):
    """What hashing each line, and one access to an index slot, cost per line (the floor of any
    stage that finds copies by text), beside `all`'s own rdrun CPU per line from this run."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "collapse-floor.rs")
    exe = os.path.join(d, "collapse-floor")
    subprocess.run(["rustc", "--edition", "2021", "-O", "-o", exe, src], check=True)
    print()
    print("floor (scripts/collapse-floor.rs; `all` per line: the first --rdrun binary's median)")
    print(
        "| ranks | lines | all: rdrun CPU per line | hash | vs all"
        " | hash + index slot, pending at the cap | vs all"
        " | hash + index slot, 2048 pending | vs all |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for ranks, lines, mode, all_ns in floors:
        line_len = len("rank 0 step 100000 loss 0.5\n" if mode == "differ" else "step 100000 loss 0.5\n")
        got = []
        for pending in [PENDING_CAP // line_len, 2048]:
            out = subprocess.run(
                [exe, str(lines), str(ranks), mode, str(pending)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            # "hash X ns/line, hash+index Y ns/line (...)"
            got.append((float(out[1]), float(out[4])))
        h = min(g[0] for g in got)
        cells = [f"{h:.1f} ns", f"{h / all_ns * 100:.0f} %"]
        for _, hi in got:
            cells += [f"{hi:.1f} ns", f"{hi / all_ns * 100:.0f} %"]
        print(f"| {ranks} | {mode} | {all_ns:.0f} ns | " + " | ".join(cells) + " |", flush=True)



if __name__ == "__main__":
    main()
