#!/usr/bin/env python3
"""Started with --no-python: the kernel runs it through its shebang."""
import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
rank = os.environ["RANK"]
with open("/proc/self/cmdline", "rb") as f:
    cmdline = [a.decode() for a in f.read().split(b"\0")[:-1]]
with open(os.path.join(out, f"shebang_rank{rank}.json"), "w") as f:
    json.dump({"argv": sys.argv, "cmdline": cmdline, "prefix": sys.prefix}, f)
