"""What the learned preload's worker-side audit hook costs a worker (docs/warm-start.md,
"Learned preload"): `_worker_hook` of src/supervisor/group/warm/learn.py, loaded from the source as
the template sends it (its template.py globals stubbed: the learn directory is a temporary
one), in a fresh interpreter per measurement, interleaved with the same measurement without it:

  (a) importing N small generated modules (their .pyc written by an untimed run first): the
      cost per import in microseconds;
  (b) `import torch._dynamo` (torch included): wall time, medians of REPS fresh interpreters;
  (c) a CPU training loop (a small nn.Linear model, one thread, 200 steps after 20 untimed):
      the mean step time, and the audit events of any kind raised during the timed steps
      (counted by a second hook in the hooked run only, so its number is an upper bound; no
      import is expected there).

Run with the PyTorch venv's python (scripts/torch-venv.sh makes it; by default
~/.cache/rdrun/torch-venv/bin/python), from anywhere:
    python scripts/bench-learn-hook.py [--modules 300] [--reps 5]
"""
import argparse
import ast
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = os.path.join(ROOT, "src", "supervisor", "warm")


def install_hook(learn_dir):
    """exec learn.py as the template would and install `_worker_hook` in this process."""
    with open(os.path.join(WARM, "template.py")) as f:
        m = re.search(r"^_LOAD_TIME_PREFIXES = (\(.*?\))\n", f.read(), re.S | re.M)
    g = {"__name__": "rdrun_learn"}
    path = os.path.join(WARM, "learn.py")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), g)
    g.update(
        _LEARN_DIR=learn_dir,
        _READ_AT_IMPORT=set(),
        _LOAD_TIME_PREFIXES=ast.literal_eval(m.group(1)),
        _PATH0=os.getcwd(),
        _OPTS={},
    )
    g["_worker_hook"](dict(os.environ))


def reported(learn_dir):
    n = 0
    for name in os.listdir(learn_dir):
        with open(os.path.join(learn_dir, name)) as f:
            n += sum(1 for line in f if line.strip())
    return n


def child(what, hook, arg):
    """One measurement in this (fresh) interpreter; prints a JSON object."""
    learn_dir = tempfile.mkdtemp(prefix="learn-hook.")
    if hook:
        install_hook(learn_dir)
    out = {}
    if what == "imports":
        n = int(arg[1])
        sys.path.insert(0, arg[0])
        t = time.perf_counter()
        for i in range(n):
            __import__("genmod_%d" % i)
        out["us"] = (time.perf_counter() - t) / n * 1e6
    elif what == "dynamo":
        t = time.perf_counter()
        import torch._dynamo  # noqa: F401

        out["s"] = time.perf_counter() - t
    elif what == "train":
        import torch
        import torch.nn as nn

        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 256), torch.randn(32, 10)

        def step():
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        for _ in range(20):
            step()
        events, counting = {}, [False]
        if hook:
            def counter(event, args):
                if counting[0]:
                    events[event] = events.get(event, 0) + 1

            sys.addaudithook(counter)
        counting[0] = True
        t = time.perf_counter()
        for _ in range(200):
            step()
        out["ms"] = (time.perf_counter() - t) / 200 * 1e3
        counting[0] = False
        out["events"] = events
    sys.stdout.flush()
    if hook:
        # The hook's own remainder is written at exit; count what it reported so far.
        import atexit

        atexit._run_exitfuncs()
        out["reported"] = reported(learn_dir)
    print(json.dumps(out))
    for name in os.listdir(learn_dir):
        os.unlink(os.path.join(learn_dir, name))
    os.rmdir(learn_dir)


def run(what, hook, *arg):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", what, str(int(hook))] + list(arg)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def interleaved(reps, what, *arg):
    """{False: [results], True: [results]}, the two alternating (which goes first too)."""
    got = {False: [], True: []}
    for r in range(reps):
        for hook in ((False, True) if r % 2 == 0 else (True, False)):
            got[hook].append(run(what, hook, *arg))
    return got


def row(name, got, key, fmt):
    a = statistics.median(g[key] for g in got[False])
    b = statistics.median(g[key] for g in got[True])
    print("%-38s %12s %12s %12s %8s" % (name, fmt % a, fmt % b, ("%+" + fmt[1:]) % (b - a), "%.3fx" % (b / a)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", type=int, default=300, help="generated modules imported in (a)")
    p.add_argument("--reps", type=int, default=5, help="fresh interpreters per measurement and side")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child[0], a.child[1] == "1", a.child[2:])
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    print("python %s; %d CPUs; load average %s; %d reps each" % (sys.version.split()[0], os.cpu_count(), " ".join(load), a.reps))
    with tempfile.TemporaryDirectory(prefix="learn-hook-mods.") as d:
        for i in range(a.modules):
            with open(os.path.join(d, "genmod_%d.py" % i), "w") as f:
                f.write("X = %d\n\n\ndef f():\n    return X\n" % i)
        run("imports", False, d, str(a.modules))  # writes the .pyc files
        imports = interleaved(a.reps, "imports", d, str(a.modules))
    run("dynamo", False)  # the page cache
    dynamo = interleaved(a.reps, "dynamo")
    train = interleaved(a.reps, "train")
    print()
    print("%-38s %12s %12s %12s %8s" % ("median of %d fresh interpreters" % a.reps, "no hook", "hook", "hook-none", "ratio"))
    row("(a) import of a small module (us)", imports, "us", "%.1f")
    row("(b) import torch._dynamo (s)", dynamo, "s", "%.3f")
    row("(c) CPU training step (ms)", train, "ms", "%.3f")
    print()
    print("(a) names the hook reported: %d per run (%d modules imported)" % (imports[True][0]["reported"], a.modules))
    print("(b) names the hook reported: %d per run" % statistics.median(g["reported"] for g in dynamo[True]))
    ev = {}
    for g in train[True]:
        for k, v in g["events"].items():
            ev[k] = ev.get(k, 0) + v
    total = sum(ev.values()) / len(train[True])
    print(
        "(c) audit events during 200 timed steps: %g per run (imports: %g)%s"
        % (total, ev.get("import", 0) / len(train[True]), "; " + ", ".join("%s %d" % kv for kv in sorted(ev.items())) if ev else "")
    )


if __name__ == "__main__":
    main()
