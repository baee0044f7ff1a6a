"""Restart + resume from a checkpoint: gloo DDP for 4 epochs, rank 0 saves model, optimizer and
epoch after every epoch (atomically); with `crash`, rank 1 exits 7 on attempt 0 right after
epoch 1's checkpoint, and the restarted attempt resumes from it. Every rank writes
<out>/result<R>.json: the attempt it finished in, the epoch it started from and its final
weights' digest, which must equal an uninterrupted run's.

Usage: resume_train.py OUT_DIR crash|straight
"""
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

EPOCHS = 4
out, mode = sys.argv[1], sys.argv[2]
ckpt = os.path.join(out, "ckpt.pt")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()

torch.manual_seed(0)
model = DDP(nn.Linear(8, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, map_location="cpu")
    model.module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["epoch"] + 1

for epoch in range(start, EPOCHS):
    g = torch.Generator().manual_seed(1000 * epoch + rank)
    opt.zero_grad()
    model(torch.randn(16, 8, generator=g)).pow(2).mean().backward()
    opt.step()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                   ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    dist.barrier()  # the checkpoint of this epoch is on disk for every rank
    if mode == "crash" and attempt == 0 and epoch == 1 and rank == 1:
        os._exit(7)

digest = hashlib.sha256(
    b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())
).hexdigest()
with open(os.path.join(out, f"result{rank}.json"), "w") as f:
    json.dump({"attempt": attempt, "start": start, "digest": digest}, f)
# torch 2.15's teardown abort (launcher-tests/torch/README.md): the gloo thread that finishes the
# last collective must take the GIL to drop it; if this thread reaches interpreter finalisation
# first, CPython ends that thread mid-destructor and C++ calls std::terminate (SIGABRT), under
# torchrun as under rdrun. Nothing is left to do, so the script ends without finalisation.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
