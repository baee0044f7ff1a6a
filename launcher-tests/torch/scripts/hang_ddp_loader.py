"""A 2-rank gloo DDP job whose rank 1 has a DataLoader worker (`num_workers=2`) stuck forever
in the dataset on attempt 0 (issue 24): rank 1's main process waits on its DataLoader, rank 0
waits in DDP's backward. The stuck worker process writes `<out>/stuck_pid.txt` = its pid (the
test looks for its stack in rank 1's capture). Every rank prints after each step, so the
detector is in its steady phase. Later attempts train to the end and write
`<out>/done_rank<R>.txt` = "<attempt>".
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(backend="gloo", init_method="env://")
rank = dist.get_rank()


def stuck_forever():
    with open(os.path.join(out, "stuck_pid.tmp"), "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(os.path.join(out, "stuck_pid.tmp"), os.path.join(out, "stuck_pid.txt"))
    while True:
        time.sleep(1)


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if restart == 0 and rank == 1 and i == 24:
            stuck_forever()
        return torch.full((8,), float(i))


torch.manual_seed(0)
model = DDP(nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Samples(), batch_size=4, num_workers=2)
for i, x in enumerate(loader):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
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
