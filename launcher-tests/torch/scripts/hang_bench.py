"""The hung job of scripts/bench-hang.sh (issue 13): on attempt 0 rank 1 writes
`<out>/hung` = wall time and sleeps forever (inside torch's `expires(after=BENCH_TIMER)` when
BENCH_TIMER is set and a FileTimer FIFO is given); the other ranks sleep too (waiting for it,
as in a collective). On later attempts every rank writes `<out>/progress.<rank>` = wall time
and exits 0: the job is restarted and progressing. Attempt 0's workers write `<out>/pid.<rank>`
(the bench ends, by pid, what a launcher orphaned).
"""
import contextlib
import os
import sys
import time

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
if restart > 0:
    with open(os.path.join(out, f"progress.{rank}"), "w") as f:
        f.write(f"{time.time()}\n")
    sys.exit(0)
print(f"rank {rank} started", flush=True)  # progress: the steady budget applies
with open(os.path.join(out, f"pid.{rank}"), "w") as f:
    f.write(f"{os.getpid()}\n")
guard = contextlib.nullcontext()
if os.environ.get("BENCH_TIMER") and os.environ.get("TORCHELASTIC_TIMER_FILE"):
    from torch.distributed.elastic import timer

    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    guard = timer.expires(after=float(os.environ["BENCH_TIMER"]), scope="bench/hang")
with guard:
    if rank == 1:
        with open(os.path.join(out, "hung"), "w") as f:
            f.write(f"{time.time()}\n")
    while True:
        time.sleep(1)
