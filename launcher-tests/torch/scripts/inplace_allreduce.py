"""In-place launch worker (launcher-tests/mpi.rs): one gloo all_reduce over env://, then
OUT/r<RANK>.json with the launcher's variables, torch's view of the world and the sum.

Usage: inplace_allreduce.py OUT
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
keys = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID",
]
rec = {k: os.environ.get(k) for k in keys}
rec.update(dist_rank=rank, dist_world=world, sum=t.item(), host=socket.gethostname())
tmp = os.path.join(out, f"r{rank}.json.tmp")
with open(tmp, "w") as f:
    json.dump(rec, f)
os.rename(tmp, os.path.join(out, f"r{rank}.json"))
dist.destroy_process_group()
