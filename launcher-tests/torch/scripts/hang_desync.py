"""A 2-rank gloo job whose rank 1 deserts a collective on attempt 0 (issue 13).

Both ranks meet in one all_reduce and print (so every rank has shown progress: the detector's
steady phase). On attempt 0 each rank then writes `<out>/hang_rank<R>.txt` = "<pid> <wall time>"
and hangs: rank 0 in the next all_reduce, rank 1 skips it and sleeps in `desert()`, forever,
until the launcher stops them. On later attempts both ranks all_reduce, check the sum and write
`<out>/done_rank<R>.txt` = "<attempt>".
"""
import os
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} attempt {restart} step 0 ok", flush=True)


def desert():
    # The deserter: never joins the all_reduce its peer waits in.
    while True:
        time.sleep(1)


if restart == 0:
    with open(os.path.join(out, f"hang_rank{rank}.tmp"), "w") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    os.rename(os.path.join(out, f"hang_rank{rank}.tmp"), os.path.join(out, f"hang_rank{rank}.txt"))
    if rank == 1:
        desert()
    dist.all_reduce(t)  # never completes: rank 1 is not coming
    sys.exit(99)  # never reached

t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size(), t
with open(os.path.join(out, f"done_rank{rank}.txt"), "w") as f:
    f.write(f"{restart}\n")
dist.destroy_process_group()
