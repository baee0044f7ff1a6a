"""A store wait nobody answers (issue 13): rank 0 blocks in torch's TCPStore `get("ready/1")`,
which rank 1 should set but, on attempt 0, never does (it prints and sleeps). On later attempts
rank 1 sets the key and both exit 0, writing `<out>/done_rank<R>.txt` = "<attempt>".
"""
import datetime
import os
import sys
import time

from torch.distributed import TCPStore

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                 timeout=datetime.timedelta(seconds=300))
print(f"rank {rank} attempt {restart} connected", flush=True)
if rank == 0:
    store.get("ready/1")
elif restart == 0:
    while True:
        time.sleep(1)
else:
    store.set("ready/1", "1")
with open(os.path.join(out, f"done_rank{rank}.txt"), "w") as f:
    f.write(f"{restart}\n")
