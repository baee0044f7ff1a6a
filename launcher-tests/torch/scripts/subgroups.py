"""Process groups beyond the default (gloo): new_group subgroups, including one created with
use_local_synchronization, plus whatever GLOO_ENABLE_STORE_V2_API / TORCH_DIST_INIT_BARRIER the
launcher environment sets. Expects 4 ranks. Writes <out>/rank<R>.json.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

out = sys.argv[sys.argv.index("--out") + 1]
dist.init_process_group(backend="gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4, world

# Every rank calls new_group for every group (the classic rule).
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
evens = dist.new_group([0, 2])
mine = pairs[rank // 2]

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, group=mine)
pair_sum = t.item()

even_sum = None
if rank % 2 == 0:
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=evens)
    even_sum = t.item()

# Only the members create this one (hashed group name, store keys under it).
lo = rank // 2 * 2
local = dist.new_group([lo, lo + 1], use_local_synchronization=True)
b = torch.tensor([float(rank * 10)])
dist.broadcast(b, src=lo + 1, group=local)
local_bcast = b.item()

gathered = [torch.zeros(1) for _ in range(world)]
dist.all_gather(gathered, torch.tensor([float(rank)]))
dist.barrier()

result = {
    "rank": rank,
    "pair_sum": pair_sum,
    "even_sum": even_sum,
    "local_bcast": local_bcast,
    "gathered": [g.item() for g in gathered],
    "env": {k: os.environ.get(k) for k in ("GLOO_ENABLE_STORE_V2_API", "TORCH_DIST_INIT_BARRIER")},
}
with open(os.path.join(out, f".rank{rank}.tmp"), "w") as f:
    json.dump(result, f)
os.rename(os.path.join(out, f".rank{rank}.tmp"), os.path.join(out, f"rank{rank}.json"))
dist.destroy_process_group()
