"""Rank 1 raises ValueError (no @record) on attempt 0 (or on every attempt with --always-fail).

Each worker appends "<TORCHELASTIC_RESTART_COUNT> <TORCHELASTIC_MAX_RESTARTS>" to
<out>/attempts_rank<R>.txt. On a failing attempt rank 0 just waits to be stopped by the launcher
(it is never in a collective, so rank 1 is unambiguously the first failure).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[sys.argv.index("--out") + 1]
always = "--always-fail" in sys.argv
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()
with open(os.path.join(out, f"attempts_rank{rank}.txt"), "a") as f:
    f.write(f"{restart} {os.environ['TORCHELASTIC_MAX_RESTARTS']}\n")
dist.barrier()

failing = always or restart == 0
if failing:
    if rank == 1:
        raise ValueError(f"boom from rank 1 on attempt {restart}")
    time.sleep(300)  # stopped by the launcher
    sys.exit(99)  # never reached under a working launcher

t = torch.tensor([1.0])
dist.all_reduce(t)
assert t.item() == dist.get_world_size(), t
dist.barrier()
with open(os.path.join(out, f"done_rank{rank}.txt"), "w") as f:
    f.write(f"{restart}\n")
dist.destroy_process_group()
