"""Dumps what a worker sees (environment, argv, interpreter, process group) to <out>/rank<R>.json."""
import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
with open("/proc/self/cmdline", "rb") as f:
    cmdline = [a.decode() for a in f.read().split(b"\0")[:-1]]
info = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "cmdline": cmdline,
    "prefix": sys.prefix,
    "cwd": os.getcwd(),
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
    "sid": os.getsid(0),
}
rank = os.environ["RANK"]
tmp = os.path.join(out, f".rank{rank}.tmp")
with open(tmp, "w") as f:
    json.dump(info, f)
os.rename(tmp, os.path.join(out, f"rank{rank}.json"))
