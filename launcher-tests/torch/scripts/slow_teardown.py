"""Rank 0 raises first (its @record error file is written), then is slow to exit (an atexit
sleep, as gloo's destructors can be); rank 1 raises 2.2 s later. rdrun's stop then SIGTERMs
rank 0. Issue 24.5: the run's status must be the failure's (1), not the stop's SIGTERM (143).
"""
import atexit
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if int(os.environ["RANK"]) == 0:
        # Slow shutdown after its error file is written; long enough that rank 1 (whose torch import
        # may finish later) always fails first while rank 0 is still here.
        atexit.register(time.sleep, 60)
        raise RuntimeError("rank 0 failed first")
    time.sleep(2.2)
    raise RuntimeError("rank 1 failed second")


if __name__ == "__main__":
    main()
