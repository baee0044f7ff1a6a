"""Run as `-m pkg.mod --out DIR ARGS...`: records how it was started."""
import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
rank = os.environ["RANK"]
with open(os.path.join(out, f"mod_rank{rank}.json"), "w") as f:
    json.dump({"name": __name__, "spec": __spec__.name, "argv": sys.argv, "prefix": sys.prefix}, f)
