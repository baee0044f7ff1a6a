"""The README's first demo job: every rank says who it is and where the job's store listens.

Standard library only, so it runs right after `pip install .` with no PyTorch installed:
`rdrun --nproc_per_node=4 examples/hello.py`. A PyTorch job is started the same way.
"""

import os
import socket

print(
    "rank {RANK}/{WORLD_SIZE} (local rank {LOCAL_RANK}) on {host}: store at "
    "{MASTER_ADDR}:{MASTER_PORT}, restart {TORCHELASTIC_RESTART_COUNT}".format(
        host=socket.gethostname(), **os.environ
    ),
    flush=True,
)
