"""Drives a running TCPStore server with PyTorch's own TCPStore client, through every operation.

Usage: python store_ops.py HOST PORT
Prints "ok <step>" after each step, so that a hang (a server that never answers) shows which
operation it was stuck in; exits non-zero with a traceback on the first wrong answer.
The caller bounds the run with a timeout.
"""
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch.distributed as dist

HOST, PORT = sys.argv[1], int(sys.argv[2])
P = f"compat-{uuid.uuid4().hex[:8]}/"  # our keys, apart from the launcher's own
TIMEOUT = timedelta(seconds=60)


def client():
    return dist.TCPStore(HOST, PORT, is_master=False, timeout=TIMEOUT, wait_for_workers=False)


def step(name):
    print(f"ok {name}", flush=True)


def in_thread(fn):
    """Runs fn in a daemon thread; returns (thread, box) where box gets 'value' or 'error'."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, box


def expect_raises(fn, what):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    raise AssertionError(f"{what}: expected an exception, got none")


s = client()
step("connect")

# set / get, including binary and empty values
s.set(P + "k1", "v1")
assert s.get(P + "k1") == b"v1"
s.set(P + "bin", b"\x00\xff\x00zz")
assert s.get(P + "bin") == b"\x00\xff\x00zz"
s.set(P + "empty", b"")
assert s.get(P + "empty") == b""
s.set(P + "k1", "v1b")  # overwrite
assert s.get(P + "k1") == b"v1b"
big = bytes(range(256)) * 4096  # 1 MiB
s.set(P + "big", big)
assert s.get(P + "big") == big
step("set/get")

# add: counters are decimal text; missing key counts as 0; add(k, 0) is an atomic read
assert s.add(P + "ctr", 5) == 5
assert s.add(P + "ctr", -2) == 3
assert s.add(P + "ctr", 0) == 3
assert s.get(P + "ctr") == b"3"
step("add")

# compare_set
assert s.compare_set(P + "cas", "", "a") == b"a"  # missing + empty expected -> created
assert s.compare_set(P + "cas", "a", "b") == b"b"  # match -> swapped
assert s.compare_set(P + "cas", "zzz", "c") == b"b"  # mismatch -> current value
assert s.get(P + "cas") == b"b"
assert s.compare_set(P + "cas-missing", "x", "y") == b"x"  # missing + non-empty expected
assert not s.check([P + "cas-missing"])
step("compare_set")

# check
assert s.check([P + "k1"])
assert s.check([P + "k1", P + "ctr"])
assert not s.check([P + "k1", P + "nope"])
step("check")

# wait without timeout: present keys return at once; a missing one is released by a set
s.wait([P + "k1", P + "ctr"])
other = client()
t, box = in_thread(lambda: s.wait([P + "later"]))
time.sleep(0.5)
assert t.is_alive(), f"wait returned before the key existed: {box}"
other.set(P + "later", "x")
t.join(30)
assert not t.is_alive(), "wait not released by another client's set"
assert "error" not in box, box
step("wait (released by another client)")

# wait with timeout: raises after about the timeout; the connection stays usable afterwards
t0 = time.monotonic()
e = expect_raises(lambda: s.wait([P + "never"], timedelta(seconds=1)), "wait with timeout")
dt = time.monotonic() - t0
assert 0.8 <= dt < 20, f"wait timeout took {dt:.2f}s"
assert "timeout" in str(e).lower(), f"unexpected error text: {e}"
assert s.get(P + "k1") == b"v1b"
s.set(P + "after-timeout", "1")
assert other.get(P + "after-timeout") == b"1"
step("wait with timeout")

# blocking get released by another client
t, box = in_thread(lambda: s.get(P + "late"))
time.sleep(0.5)
assert t.is_alive(), f"get returned before the key existed: {box}"
other.set(P + "late", "released")
t.join(30)
assert not t.is_alive(), "blocking get not released by another client's set"
assert box.get("value") == b"released", box
step("blocking get released by another client")

# num_keys / delete_key (relative: the launcher's store may hold keys of its own)
n0 = s.num_keys()
s.set(P + "tmp", "1")
assert s.num_keys() == n0 + 1, (n0, s.num_keys())
assert s.delete_key(P + "tmp") is True
assert s.delete_key(P + "tmp") is False
assert s.num_keys() == n0
assert not s.check([P + "tmp"])
step("num_keys/delete_key")

# append
s.append(P + "ap", "ab")
s.append(P + "ap", b"\x00cd")
assert s.get(P + "ap") == b"ab\x00cd"
step("append")

# multi_set / multi_get
s.multi_set([P + "m1", P + "m2", P + "m3"], ["x", "yy", ""])
assert s.multi_get([P + "m1", P + "m2", P + "m3"]) == [b"x", b"yy", b""]
assert s.multi_get([P + "k1", P + "m2"]) == [b"v1b", b"yy"]
step("multi_set/multi_get")

# queues
s.queue_push(P + "q", "a")
s.queue_push(P + "q", b"b\x00")
assert s.queue_len(P + "q") == 2
assert s.queue_len(P + "q-unknown") == 0
assert s.queue_pop(P + "q") == b"a"
assert s.queue_pop(P + "q", block=False) == b"b\x00"
assert s.queue_len(P + "q") == 0
e = expect_raises(lambda: s.queue_pop(P + "q", block=False), "pop of an empty queue")
assert isinstance(e, dist.QueueEmptyError), repr(e)
t, box = in_thread(lambda: s.queue_pop(P + "q2"))
time.sleep(0.5)
assert t.is_alive(), f"blocking queue_pop returned on an empty queue: {box}"
other.queue_push(P + "q2", "pushed")
t.join(30)
assert not t.is_alive(), "blocking queue_pop not released by another client's push"
assert box.get("value") == b"pushed", box
step("queue_push/queue_pop/queue_len")

# list_keys: our KV keys are there (without the client's '/' prefix); queues are not keys
keys = set(s.list_keys())
for k in ("k1", "ctr", "cas", "ap", "m1", "m2", "later"):
    assert P + k in keys, (k, sorted(x for x in keys if x.startswith(P)))
assert P + "tmp" not in keys
assert P + "q" not in keys
step("list_keys")

# barrier: three clients pass together; a short one times out
clients = [client() for _ in range(2)]
threads = [in_thread(lambda c=c: c.barrier(P + "bar", 3)) for c in clients]
time.sleep(0.3)
assert all(t.is_alive() for t, _ in threads), "barrier released before everyone arrived"
s.barrier(P + "bar", 3, timedelta(seconds=30))
for t, box in threads:
    t.join(30)
    assert not t.is_alive(), "barrier not released for a waiting client"
    assert "error" not in box, box
t0 = time.monotonic()
expect_raises(lambda: s.barrier(P + "bar-short", 2, timedelta(seconds=1)), "barrier timeout")
assert time.monotonic() - t0 < 20
assert s.get(P + "k1") == b"v1b"  # still usable
step("barrier")

# 32 clients at once
N = 32


def worker(i):
    c = client()
    c.add(P + "c32/count", 1)
    c.set(P + f"c32/{i}", str(i))
    c.wait([P + f"c32/{j}" for j in range(N)])
    vals = c.multi_get([P + f"c32/{j}" for j in range(N)])
    assert vals == [str(j).encode() for j in range(N)], vals
    assert c.get(P + f"c32/{(i + 1) % N}") == str((i + 1) % N).encode()
    c.barrier(P + "c32/bar", N, timedelta(seconds=60))
    return c.add(P + "c32/count", 0)


with ThreadPoolExecutor(max_workers=N) as pool:
    counts = list(pool.map(worker, range(N)))
assert counts == [N] * N, counts
assert s.add(P + "c32/count", 0) == N
step("32 clients at once")

print("ALL STORE OPERATIONS OK", flush=True)
