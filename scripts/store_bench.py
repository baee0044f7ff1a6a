"""Helper for scripts/bench-store.sh: PyTorch's side of the TCPStore benchmark.

Modes:
  serve           start PyTorch's own TCPStore server (libuv backend), print "port=N",
                  serve until killed.
  ops PORT SECS   one PyTorch client connection: SET, ADD and GET ops/s (each op timed
                  separately for SECS seconds); prints "op=... ops_per_s=..." lines.
"""
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def serve():
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, use_libuv=True, wait_for_workers=False,
        timeout=timedelta(seconds=600),
    )
    print(f"port={store.port}", flush=True)
    while True:  # until killed
        time.sleep(3600)


def ops(port, secs):
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    value = b"v" * 16
    store.set("bench/get", value)
    for name, fn in (
        ("set", lambda i: store.set("bench/set", value)),
        ("add", lambda i: store.add("bench/add", 1)),
        ("get", lambda i: store.get("bench/get")),
    ):
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + secs
        while True:
            for i in range(100):
                fn(i)
            n += 100
            if time.perf_counter() >= deadline:
                break
        # A SET has no reply: a final round trip makes sure the server processed them all
        # before the clock stops.
        store.add("bench/sync", 0)
        dt = time.perf_counter() - t0
        print(f"op={name} ops={n} secs={dt:.2f} ops_per_s={n / dt:.0f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "ops":
        ops(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit(f"store_bench.py: unknown mode {sys.argv[1]!r}")
