"""Scenario 4 of issue #4: PyTorch's TCPStore client against the launcher's own store.

The launcher runs one long-lived worker (store_env.py) that publishes its environment; the
store the launcher serves to workers is at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE
=True means the launcher, not a worker, hosts it). store_ops.py then drives it with torch's client
through every operation, a blocking get released by another client, and 32 clients at once.
"""
import os
import signal
import sys
import time

import pytest
from conftest import SCRIPTS, read_json, store_bench_bin, wait_for_files


def test_tcpstore_client(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = procs.start(
        launcher.cmd("--standalone", "--nproc-per-node", "1", SCRIPTS / "store_env.py", out),
        timeout=400,
    )
    try:
        if not wait_for_files([out / "env.json"], 120, job):
            job.popen.kill()
            raise AssertionError("worker did not start:\n" + job.wait(30).describe())
        env = read_json(out / "env.json")
        assert env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", (
            "the launcher does not host the worker store "
            f"(TORCHELASTIC_USE_AGENT_STORE={env.get('TORCHELASTIC_USE_AGENT_STORE')!r})"
        )
        host, port = env["MASTER_ADDR"], env["MASTER_PORT"]
        ops = procs.run(
            [sys.executable, str(SCRIPTS / "store_ops.py"), host, port], timeout=240
        )
        assert ops.rc == 0 and "ALL STORE OPERATIONS OK" in ops.out, (
            f"store at {host}:{port}:\n{ops.describe()}"
        )
    finally:
        if job.popen.poll() is None:
            os.kill(job.pid, signal.SIGTERM)
        job.wait(90)


def test_tcpstore_client_standalone_server(procs, tmp_path):
    """The same client run against rdrun's store server on its own (`rdrun-store-bench serve`),
    so a store regression is told apart from a launcher one."""
    exe = store_bench_bin()
    if exe is None:
        pytest.skip("rdrun-store-bench not built (cargo build --release --bins)")
    server = procs.start([str(exe), "serve", "--host", "127.0.0.1", "--port", "0"], timeout=400)
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline and server.popen.poll() is None:
            for line in server.out_path.read_text().splitlines():
                if line.startswith("port="):
                    port = line.split("=", 1)[1]
            time.sleep(0.05)
        assert port, "server did not print port=N:\n" + server.wait(10).describe()
        ops = procs.run(
            [sys.executable, str(SCRIPTS / "store_ops.py"), "127.0.0.1", port], timeout=240
        )
        assert ops.rc == 0 and "ALL STORE OPERATIONS OK" in ops.out, ops.describe()
    finally:
        if server.popen.poll() is None:
            os.kill(server.pid, signal.SIGINT)  # serve stops on Ctrl-C
        res = server.wait(60)
    assert not res.timed_out and res.rc == 0, res.describe()
