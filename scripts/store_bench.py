"""Helper for scripts/bench-store.sh: PyTorch's side of the TCPStore benchmark.

Modes:
  serve           start PyTorch's own TCPStore server (libuv backend), print "port=N",
                  serve until killed.
  ops PORT SECS   one PyTorch client connection: SET, ADD and GET ops/s (each op timed
                  separately for SECS seconds); prints "op=... ops_per_s=..." lines.
  compat PORT     sanity check before measuring: PyTorch's client drives every store
                  operation against the server on PORT (which must be fresh) and asserts
                  PyTorch's documented results; prints "compat=ok" or fails.
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


def compat(port):
    import threading

    t = timedelta(seconds=10)
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
    s.set("k1", "v1")
    assert s.get("k1") == b"v1"
    assert s.add("cnt", 5) == 5 and s.add("cnt", -2) == 3 and s.get("cnt") == b"3"
    assert s.compare_set("cs", "x", "d") == b"x"  # missing key, non-empty expected
    assert s.compare_set("cs", "", "d") == b"d"
    assert s.compare_set("cs", "d", "e") == b"e"
    assert s.compare_set("cs", "zz", "f") == b"e"
    assert s.check(["k1", "cnt"]) and not s.check(["k1", "nope"])
    s.wait(["k1"], timedelta(seconds=1))
    try:
        s.wait(["nope"], timedelta(milliseconds=200))
        raise AssertionError("wait did not time out")
    except RuntimeError as e:  # DistStoreError
        assert "timeout" in str(e).lower(), e
    s.set("after", "ok")  # the connection survives CANCEL_WAIT
    assert s.get("after") == b"ok"
    s.append("ap", "ab")
    s.append("ap", "cd")
    assert s.get("ap") == b"abcd"
    assert s.delete_key("ap") and not s.delete_key("ap")
    s.multi_set(["m1", "m2"], ["x", "yy"])
    assert s.multi_get(["m1", "m2"]) == [b"x", b"yy"]
    s.queue_push("q", "i1")
    s.queue_push("q", b"i2")
    assert s.queue_len("q") == 2
    assert s.queue_pop("q") == b"i1" and s.queue_pop("q", block=False) == b"i2"
    try:
        s.queue_pop("q", block=False)
        raise AssertionError("expected QueueEmptyError")
    except dist.QueueEmptyError:
        pass
    assert sorted(s.list_keys()) == ["after", "cnt", "cs", "k1", "m1", "m2"], s.list_keys()
    assert s.num_keys() == 6
    s.barrier("bar", 1)
    try:
        s.barrier("bar2", 2, timedelta(milliseconds=200))
        raise AssertionError("barrier did not time out")
    except RuntimeError as e:
        assert "timeout" in str(e).lower(), e
    c2 = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t)
    threading.Timer(0.2, lambda: c2.set("late", "1")).start()
    assert s.get("late") == b"1"  # get blocks until another client sets the key
    dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=t)  # ADD "init/" 1
    assert s.num_keys() == 10  # + bar, bar2, late, init/
    dist.PrefixStore("default_pg", s).set("x", "1")
    assert s.get("default_pg/x") == b"1"
    print("compat=ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "compat":
        compat(int(sys.argv[2]))
    elif sys.argv[1] == "ops":
        ops(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit(f"store_bench.py: unknown mode {sys.argv[1]!r}")
