#!/usr/bin/env python3
"""Runs the slow test programs as one pool of small jobs, longest first.

`scripts/test.sh` hands this script the launcher test program (one job per test), the etcd
tests (one job per test, one at a time: each starts its own etcd cluster) and the PyTorch
suite (one job per file). Why not libtest's own threads: libtest starts tests in name order, so
the slow ones that happen to sort last leave one thread busy while the others idle, and it can
run no Python. Here every job is its own process, the pool keeps `--jobs` of them running, and
jobs start longest first by the times the last run recorded (a job never seen before counts as
long), which keeps the tail short. Why not an existing runner (cargo-nextest): it runs Rust test
programs only, and it would be one more tool to install on every CI machine for the sake of a
scheduling rule this file holds in a few lines.

Every job has a hard bound (`--job-timeout`); a job that runs past it is killed with its process
group and counts as failed. The script kills only the process groups it started.

Prints one line per finished job, then every failed job's output whole, the slowest jobs and
the totals; exits 1 if any job failed, 0 otherwise. The times go to `--times` (JSON) for the
next run.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

DEFAULT_ESTIMATE = 30.0  # seconds; an unknown job starts early rather than last


def launcher_jobs(binary, only_prefix=None, skip_prefix=None):
    """One job per test of a libtest program (ignored tests are left to libtest's own count)."""
    listed = subprocess.run(
        [binary, "--list", "--format", "terse"], capture_output=True, text=True, check=True
    ).stdout
    ignored = subprocess.run(
        [binary, "--list", "--format", "terse", "--ignored"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    skip = {line.rsplit(": ", 1)[0] for line in ignored.splitlines() if line.endswith(": test")}
    names = [line.rsplit(": ", 1)[0] for line in listed.splitlines() if line.endswith(": test")]
    jobs = []
    for name in names:
        if name in skip:
            continue
        if only_prefix and not name.startswith(only_prefix):
            continue
        if skip_prefix and name.startswith(skip_prefix):
            continue
        jobs.append(name)
    return jobs, len(skip)


class Job:
    def __init__(self, key, argv, group):
        self.key = key
        self.argv = argv
        self.group = group
        self.proc = None
        self.out = None
        self.started = 0.0
        self.elapsed = 0.0
        self.rc = None
        self.timed_out = False


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launcher", required=True, help="the launcher test program")
    ap.add_argument("--serial-prefix", default="etcd::",
                    help="tests with this prefix run one at a time")
    ap.add_argument("--torch-python", help="the PyTorch venv's python: run the PyTorch suite")
    ap.add_argument("--torch-dir", default="launcher-tests/torch")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--torch-jobs", type=int, default=1,
                    help="PyTorch suite files at once (each runs multi-rank torch jobs)")
    ap.add_argument("--job-timeout", type=float, default=900.0)
    ap.add_argument("--times", help="JSON file of job times, read and rewritten")
    args = ap.parse_args()

    times = {}
    if args.times and os.path.exists(args.times):
        try:
            with open(args.times) as f:
                times = json.load(f)
        except (OSError, ValueError):
            times = {}

    jobs = []
    names, ignored = launcher_jobs(args.launcher)
    for name in names:
        group = "serial" if name.startswith(args.serial_prefix) else "launcher"
        jobs.append(Job("launcher " + name,
                        [args.launcher, "--exact", name, "--test-threads=1"], group))
    if args.torch_python:
        files = sorted(f for f in os.listdir(args.torch_dir)
                       if f.startswith("test_") and f.endswith(".py"))
        for f in files:
            path = os.path.join(args.torch_dir, f)
            jobs.append(Job("torch " + path,
                            [args.torch_python, "-m", "pytest", path, "-v", "-rs",
                             "-p", "no:cacheprovider", "--durations=5"], "torch"))
    jobs.sort(key=lambda j: -times.get(j.key, DEFAULT_ESTIMATE))
    limits = {"serial": 1, "torch": max(1, args.torch_jobs), "launcher": args.jobs}

    pending = list(jobs)
    running = []
    done = []
    started = time.monotonic()

    def stop_all(signum=None, frame=None):
        for j in running:
            try:
                os.killpg(j.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if signum is not None:
            sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)

    env = dict(os.environ)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    try:
        while pending or running:
            # Start what fits: the longest pending job whose group has room.
            while len(running) < args.jobs:
                busy = {}
                for j in running:
                    busy[j.group] = busy.get(j.group, 0) + 1
                pick = next((j for j in pending if busy.get(j.group, 0) < limits[j.group]), None)
                if pick is None:
                    break
                pending.remove(pick)
                pick.out = tempfile.TemporaryFile()
                pick.started = time.monotonic()
                pick.proc = subprocess.Popen(pick.argv, stdout=pick.out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env,
                                             start_new_session=True)
                running.append(pick)
            time.sleep(0.05)
            now = time.monotonic()
            for j in list(running):
                rc = j.proc.poll()
                if rc is None and now - j.started > args.job_timeout:
                    j.timed_out = True
                    try:
                        os.killpg(j.proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    rc = j.proc.wait()
                if rc is None:
                    continue
                j.rc = rc
                j.elapsed = now - j.started
                running.remove(j)
                done.append(j)
                verdict = "ok" if rc == 0 else ("TIMEOUT" if j.timed_out else "FAILED")
                print(f"{verdict:7} {j.elapsed:7.1f}s  {j.key}", flush=True)
    finally:
        stop_all()

    wall = time.monotonic() - started
    failed = [j for j in done if j.rc != 0]
    for j in failed:
        j.out.seek(0)
        print(f"\n======== {j.key}: {'timed out after %.0fs' % args.job_timeout if j.timed_out else 'exit %d' % j.rc} ========")
        sys.stdout.write(j.out.read().decode(errors="replace"))
    print("\nslowest jobs:")
    for j in sorted(done, key=lambda j: -j.elapsed)[:12]:
        print(f"  {j.elapsed:7.1f}s  {j.key}")
    work = sum(j.elapsed for j in done)
    print(f"\n{len(done) - len(failed)} passed, {len(failed)} failed, {ignored} ignored "
          f"(launcher program); {wall:.0f} s wall, {work:.0f} s of jobs, {args.jobs} at once")
    if args.times:
        for j in done:
            if j.rc == 0:
                times[j.key] = round(j.elapsed, 2)
        os.makedirs(os.path.dirname(os.path.abspath(args.times)), exist_ok=True)
        tmp = args.times + ".tmp"
        with open(tmp, "w") as f:
            json.dump(times, f, indent=0, sort_keys=True)
        os.replace(tmp, args.times)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
