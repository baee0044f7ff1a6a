"""Started with --run-path: runs as __main__ inside the launcher's bootstrap."""
import json
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
rank = os.environ["RANK"]
with open(os.path.join(out, f"runpath_rank{rank}.json"), "w") as f:
    json.dump({"name": __name__, "argv": sys.argv, "prefix": sys.prefix}, f)
