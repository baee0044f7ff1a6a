"""A gloo job whose chosen rank raises on chosen attempts while the others wait in a collective,
for the multi-node stop-verdict tests (launcher-tests/static_restart.rs; issue 28 item 5).

Usage: ddp_verdict.py OUT_DIR PLAN, PLAN a comma list: entry k is `RANK:KIND` for attempt k
(TORCHELASTIC_RESTART_COUNT), KIND `value` (a ValueError) or `key` (a KeyError), each raised at
its own line; attempts past the list finish. The other ranks wait in a barrier that the failing
rank never joins: they die of gloo's peer errors (the same line every attempt) or are stopped.
Every rank of every attempt writes OUT_DIR/attempt.<k>.<rank>; a rank that finishes writes
OUT_DIR/done<rank>.
"""
import os
import sys

import torch.distributed as dist

out, plan = sys.argv[1], [e.split(":") for e in sys.argv[2].split(",") if e]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(out, f"attempt.{restart}.{rank}"), "w").close()
dist.barrier()


def value_error(step):
    raise ValueError(f"bad batch at step {step}")


def key_error(step):
    raise KeyError(f"step {step}")


if restart < len(plan):
    who, kind = int(plan[restart][0]), plan[restart][1]
    if rank == who:
        {"value": value_error, "key": key_error}[kind](restart * 17)
    dist.barrier()  # never completes: the failing rank never joins
    sys.exit(99)

dist.barrier()
dist.destroy_process_group()
open(os.path.join(out, f"done{rank}"), "w").close()
