"""A 2-rank gloo DDP job whose rank 1 waits forever on a threading.Event inside its step on
attempt 0 (issue 24): rank 0 then waits in DDP's backward (the reducer's all_reduce inside
autograd's engine), the healthy waiter; rank 1, waiting in its own code, is the one to blame.
Every rank prints after each step, so the detector is in its steady phase. Later attempts train
to the end and write `<out>/done_rank<R>.txt` = "<attempt>".
"""
import os
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
never = threading.Event()


def wait_for_the_signal():
    # Nobody ever sets it: the rank's own code blocks, not a collective.
    never.wait()


def step(i):
    if restart == 0 and rank == 1 and i == 2:
        wait_for_the_signal()
    opt.zero_grad()
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()


for i in range(5):
    step(i)
    print(f"rank {rank} attempt {restart} step {i}", flush=True)

with open(os.path.join(out, f"done_rank{rank}.txt"), "w") as f:
    f.write(f"{restart}\n")
# torch 2.15's teardown abort (launcher-tests/torch/README.md): the gloo thread that finishes the
# last collective must take the GIL to drop it; if this thread reaches interpreter finalisation
# first, CPython ends that thread mid-destructor and C++ calls std::terminate (SIGABRT), under
# torchrun as under rdrun. Nothing is left to do, so the script ends without finalisation.
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
