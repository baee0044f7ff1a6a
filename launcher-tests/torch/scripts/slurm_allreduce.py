"""A gloo all_reduce across every rank, for the real-Slurm tests (launcher-tests/slurm.rs).

Usage: slurm_allreduce.py OUT_DIR. Each rank all-reduces (RANK + 1) and writes
OUT_DIR/rank<R>.json with the torchrun variables it saw, its host name, the address MASTER_ADDR
resolves to here, and the sum, which must be WORLD_SIZE * (WORLD_SIZE + 1) / 2 on every rank.
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
keys = [
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURMD_NODENAME",
    "SLURM_PROCID",
]
info = {k: os.environ.get(k) for k in keys}
info.update(
    hostname=socket.gethostname(),
    master_ip=socket.gethostbyname(os.environ["MASTER_ADDR"]),
    dist_rank=dist.get_rank(),
    dist_world=dist.get_world_size(),
    sum=t.item(),
)
dist.destroy_process_group()
rank = os.environ["RANK"]
tmp = os.path.join(out, f".rank{rank}.tmp")
with open(tmp, "w") as f:
    json.dump(info, f)
os.rename(tmp, os.path.join(out, f"rank{rank}.json"))
