"""Gloo training that runs until stopped. Its SIGTERM handler writes <out>/term_rank<R>.txt and
then dies of the signal. Writes <out>/ready_rank<R>.txt (its pid) once training is under way.
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

out = sys.argv[sys.argv.index("--out") + 1]


def on_term(signum, frame):
    with open(os.path.join(out, f"term_rank{os.environ['RANK']}.txt"), "w") as f:
        f.write(f"{os.getpid()} {signum}\n")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


signal.signal(signal.SIGTERM, on_term)
dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
while True:
    try:
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        step += 1
        if step == 3:
            with open(os.path.join(out, f".ready{rank}"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(out, f".ready{rank}"), os.path.join(out, f"ready_rank{rank}.txt"))
    except Exception:  # noqa: BLE001 - a peer died of the signal first; wait for our own
        time.sleep(60)
    time.sleep(0.05)  # most of the time is spent here, where a signal is handled at once
