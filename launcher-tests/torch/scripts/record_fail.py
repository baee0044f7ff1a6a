"""A worker whose main is wrapped in @record: rank 1 raises, so an error.json is written."""
import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise RuntimeError("recorded failure from rank 1: xyzzy-42")
    time.sleep(300)  # stopped by the launcher
    sys.exit(99)


if __name__ == "__main__":
    main()
