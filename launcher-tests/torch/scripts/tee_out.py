"""Prints one stdout and one stderr line per rank, and records the run id."""
import os
import sys

out = sys.argv[sys.argv.index("--out") + 1]
rank = os.environ["LOCAL_RANK"]
with open(os.path.join(out, f"runid_rank{rank}.txt"), "w") as f:
    f.write(os.environ["TORCHELASTIC_RUN_ID"])
print(f"out{rank} hello stdout", flush=True)
print(f"err{rank} hello stderr", file=sys.stderr, flush=True)
