"""Seed-style DDP training on CPU (gloo, env://), as users launch with torchrun.

Pattern from the seeds: DistributedSampler + set_epoch, DDP, SGD, all_reduce of a metric,
barrier, destroy_process_group. With --checkpoint: after the first epoch rank 0 saves the DDP
state_dict, barrier, every rank loads it with map_location, training continues.
Writes <out>/rank<R>.json with what the test checks.
"""
import argparse
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N_SAMPLES = 64


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def digest(t):
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()

    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    assert world == int(os.environ["WORLD_SIZE"])

    g = torch.Generator().manual_seed(0)
    x = torch.randn(N_SAMPLES, 10, generator=g)
    y = torch.randint(0, 2, (N_SAMPLES,), generator=g)
    ds = TensorDataset(x, y)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)

    # Different init per rank on purpose: DDP must broadcast rank 0's parameters.
    torch.manual_seed(100 + rank)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    initial = flat(model).clone()

    epochs, seen, loaded_ok = [], [], None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen.append(list(iter(sampler)))
        loss_sum, count = 0.0, 0
        ddp.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(xb)
            count += len(xb)
        local = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
        reduced = local.clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
        epochs.append({"local": local.tolist(), "reduced": reduced.tolist()})

        if args.checkpoint and epoch == 0:
            if rank == 0:
                torch.save(ddp.state_dict(), args.checkpoint)
            dist.barrier()
            state = torch.load(args.checkpoint, map_location=torch.device("cpu"))
            ddp.load_state_dict(state)
            mine = flat(model)
            ref = mine.clone()
            dist.broadcast(ref, src=0)
            loaded_ok = {
                "keys": sorted(state.keys()),
                "equal_to_rank0": torch.equal(mine, ref),
            }

    dist.barrier()
    final = flat(model)
    ref = final.clone()
    dist.broadcast(ref, src=0)
    ranks = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(ranks)

    result = {
        "rank": rank,
        "world": world,
        "equal_after_broadcast": torch.equal(final, ref),
        "digest": digest(final),
        "changed": not torch.equal(initial, final),
        "rank_sum": int(ranks.item()),
        "epochs": epochs,
        "seen": seen,
        "checkpoint": loaded_ok,
    }
    tmp = os.path.join(args.out, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, os.path.join(args.out, f"rank{rank}.json"))
    # torch 2.15's teardown abort (launcher-tests/torch/README.md): the gloo thread that finishes the
    # last collective must take the GIL to drop it; if this thread reaches interpreter finalisation
    # first, CPython ends that thread mid-destructor and C++ calls std::terminate (SIGABRT), under
    # torchrun as under rdrun. Nothing is left to do, so the script ends without finalisation.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
