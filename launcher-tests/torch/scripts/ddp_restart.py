"""A gloo DDP job that fails on chosen ranks of chosen attempts, for the restart tests of the
static backend (launcher-tests/static_restart.rs, launcher-tests/slurm.rs; issue 24.1).

Usage: ddp_restart.py OUT_DIR FAIL_RANKS, FAIL_RANKS a comma list: entry k is the rank that
exits 7 on attempt k (TORCHELASTIC_RESTART_COUNT), after the process group is up and one DDP
step ran (so attempt k's gloo addresses are in the store when it fails); attempts past the list
train to the end. Every rank of every attempt that got its process group appends a JSON line to
OUT_DIR/rank<R>.jsonl; a rank that finishes writes OUT_DIR/done<R>.json with the final weights'
digest, which must be the same on every rank.
"""
import hashlib
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

out, fail_ranks = sys.argv[1], [int(r) for r in sys.argv[2].split(",") if r]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
with open(os.path.join(out, f"rank{rank}.jsonl"), "a") as f:
    f.write(json.dumps({"restart": restart, "world": world, "host": socket.gethostname(),
                        "group_rank": os.environ.get("GROUP_RANK")}) + "\n")

torch.manual_seed(0)
model = DDP(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def step(i):
    g = torch.Generator().manual_seed(1000 * rank + i)
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


step(0)
if restart < len(fail_ranks):
    if rank == fail_ranks[restart]:
        sys.stdout.flush()
        os._exit(7)
    # The others wait in a collective until the launcher stops them.
    dist.barrier()
    sys.exit(99)  # never reached under a working launcher: the failing rank never joins

for i in range(1, 4):
    step(i)
w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
digest = hashlib.sha256(w.numpy().tobytes()).hexdigest()
tmp = os.path.join(out, f".done{rank}.tmp")
with open(tmp, "w") as f:
    json.dump({"restart": restart, "world": world, "digest": digest}, f)
os.rename(tmp, os.path.join(out, f"done{rank}.json"))
# torch 2.15's teardown abort (launcher-tests/torch/README.md): the gloo thread that finishes the
# last collective must take the GIL to drop it; if this thread reaches interpreter finalisation
# first, CPython ends that thread mid-destructor and C++ calls std::terminate (SIGABRT), under
# torchrun as under rdrun. Nothing is left to do, so the script ends without finalisation.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
