"""torch's fatal-dump store keys across a restart (issue 13, spec hang-detection §2).

Each worker connects torch's TCPStore client to MASTER_ADDR:MASTER_PORT (the store its process
group would use; the keys below sit at its root, outside any prefix, as ProcessGroupNCCL writes
them) and writes which of `exception_dump` / `remote_error` it finds to
`<out>/seen_rank<R>_attempt<A>.txt` ("-" for none). On attempt 0 the last rank then sets both,
as a rank that hit a collective timeout would (a raw 4-byte int, an error string), and exits 1;
the others wait to be stopped. Later attempts exit 0.
"""
import datetime
import os
import struct
import sys
import time

from torch.distributed import TCPStore

out = sys.argv[sys.argv.index("--out") + 1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                 timeout=datetime.timedelta(seconds=60))
seen = [k for k in ("exception_dump", "remote_error") if store.check([k])]
tmp = os.path.join(out, f"seen_rank{rank}_attempt{restart}.tmp")
with open(tmp, "w") as f:
    f.write((" ".join(seen) or "-") + "\n")
os.rename(tmp, tmp[:-4] + ".txt")
if restart == 0:
    if rank == world - 1:
        store.set("exception_dump", struct.pack("i", rank))
        store.set("remote_error", f"rank {rank} hit a collective timeout")
        sys.exit(1)
    time.sleep(120)  # stopped by the launcher
