"""A long-running worker that publishes its environment, so a test can reach the launcher's store.

Writes <out>/env.json (atomically) and sleeps until the launcher stops it.
"""
import json
import os
import sys
import time

out = sys.argv[1]
tmp = os.path.join(out, ".env.tmp")
with open(tmp, "w") as f:
    json.dump(dict(os.environ), f)
os.rename(tmp, os.path.join(out, "env.json"))
time.sleep(600)
