#!/usr/bin/env python3
"""Which environment variables torch (and given modules) read at import time, and which only at
first use (issue 27, docs/warm-start.md "What is fixed at import time").

Two recorders run in one interpreter:
- C reads: a small LD_PRELOAD library (compiled here with `cc`) interposes getenv(3) and
  secure_getenv(3) and writes each name read to a pipe: libtorch, libgomp, OpenBLAS, MKL and the
  loader's users read the environment this way (CPython's os.environ is a copy taken at start);
- Python reads: os.environ's item lookup (os.environ.get, os.getenv, `in`, [...]) is wrapped to
  write the same way; a whole-environment copy (iteration) is written as `*`.
The interpreter then goes through phases, each announced on the same pipe: `import` (import
torch, then every module named with --preload), `first-use` (CPU tensor ops, autograd, an nn
module, a DataLoader without workers, a gloo process group of one over a TCPStore, destroyed),
and `end` (interpreter exit). Printed: per variable, the phases that read it, C and/or Python.

Usage: import-env-vars.py [--python PY] [--preload mod1,mod2] [--json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int log_fd = -2;
static char *(*real_getenv)(const char *);
static char *(*real_secure)(const char *);
static void note(char kind, const char *name) {
    if (!real_getenv) real_getenv = (char *(*)(const char *))dlsym(RTLD_NEXT, "getenv");
    if (log_fd == -2) {
        const char *v = real_getenv("RDRUN_ENVLOG_FD");
        log_fd = v ? atoi(v) : -1;
    }
    if (log_fd < 0 || !name) return;
    char buf[300];
    size_t n = strlen(name);
    if (n > 256) n = 256;
    buf[0] = kind; buf[1] = ' ';
    memcpy(buf + 2, name, n);
    buf[n + 2] = '\n';
    (void)!write(log_fd, buf, n + 3);
}
char *getenv(const char *name) {
    note('c', name);
    return real_getenv(name);
}
char *secure_getenv(const char *name) {
    note('c', name);
    if (!real_secure) real_secure = (char *(*)(const char *))dlsym(RTLD_NEXT, "secure_getenv");
    return real_secure(name);
}
"""

CHILD = r"""
import os, sys
FD = int(os.environ["RDRUN_ENVLOG_FD"])
def say(line):
    os.write(FD, (line + "\n").encode())
_get = os._Environ.__getitem__
def getitem(self, key):
    say("p " + str(key))
    return _get(self, key)
os._Environ.__getitem__ = getitem
_iter = os._Environ.__iter__
def iterate(self):
    say("p *")
    return _iter(self)
os._Environ.__iter__ = iterate

say("P import")
import torch
for name in [m for m in sys.argv[1].split(",") if m]:
    __import__(name)

say("P first-use")
a = torch.randn(64, 64, requires_grad=True)
(a @ a).relu().sum().backward()
m = torch.nn.Linear(8, 8)
torch.optim.SGD(m.parameters(), lr=0.1).step()
from torch.utils.data import DataLoader, TensorDataset
for _ in DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4):
    pass
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                  LOCAL_RANK="0")
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
say("P end")
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--preload", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, lib = os.path.join(tmp, "shim.c"), os.path.join(tmp, "envlog.so")
        with open(src, "w") as f:
            f.write(SHIM)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", lib, src, "-ldl"], check=True)
        r, w = os.pipe()
        env = dict(os.environ, LD_PRELOAD=lib, RDRUN_ENVLOG_FD=str(w))
        # Interpreter start-up (before the child's first line) is its own phase.
        os.write(w, b"P startup\n")
        child = subprocess.Popen(
            [args.python, "-c", CHILD, args.preload], env=env, pass_fds=(w,),
            stdout=subprocess.DEVNULL,
        )
        os.close(w)
        data = b""
        with os.fdopen(r, "rb") as f:
            data = f.read()
        if child.wait() != 0:
            sys.exit(f"import-env-vars: the measuring interpreter failed (exit {child.returncode})")
    phase, seen = "?", {}
    for line in data.decode(errors="replace").splitlines():
        kind, _, name = line.partition(" ")
        if kind == "P":
            phase = name
            continue
        if name in ("RDRUN_ENVLOG_FD", "LD_PRELOAD") and kind == "c":
            continue
        entry = seen.setdefault(name, {})
        entry.setdefault(phase, set()).add("C" if kind == "c" else "Python")
    if args.json:
        json.dump({k: {p: sorted(v) for p, v in ph.items()} for k, ph in seen.items()}, sys.stdout,
                  indent=1, sort_keys=True)
        print()
        return
    order = ["startup", "import", "first-use", "end"]
    print(f"{'variable':40} {'first read':10} read in")
    for name in sorted(seen, key=lambda n: (min(order.index(p) if p in order else 9 for p in seen[n]), n)):
        ph = seen[name]
        first = min((p for p in ph if p in order), key=order.index, default="?")
        where = "; ".join(f"{p}: {'+'.join(sorted(v))}" for p, v in sorted(ph.items(), key=lambda x: order.index(x[0]) if x[0] in order else 9))
        print(f"{name:40} {first:10} {where}")


if __name__ == "__main__":
    main()
