"""Scenario 8 of issue #4: SIGTERM to the launcher during gloo training.

The workers' SIGTERM handler must run (it writes a marker), nothing may be left running, and rdrun
exits 143 (128 + SIGTERM). torchrun exits 1 here (spec torchrun-compat §3.6), which is tested as
the reference.
"""
import os
import signal
import time

import pytest

from conftest import SCRIPTS, pid_alive, wait_for_files


@pytest.mark.warm
def test_sigterm_reaches_workers(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = procs.start(
        launcher.cmd("--standalone", "--nproc-per-node", "2", SCRIPTS / "sigterm_train.py", "--out", out),
        timeout=300,
    )
    ready = [out / f"ready_rank{r}.txt" for r in range(2)]
    if not wait_for_files(ready, 180, job):
        job.popen.kill()
        raise AssertionError("training did not get under way:\n" + job.wait(60).describe())
    pids = [int(p.read_text()) for p in ready]
    os.kill(job.pid, signal.SIGTERM)
    res = job.wait(120)
    assert not res.timed_out, res.describe()
    assert res.rc == (143 if launcher.is_rdrun else 1), res.describe()
    for rank, pid in enumerate(pids):
        marker = out / f"term_rank{rank}.txt"
        assert marker.is_file(), f"rank {rank}'s SIGTERM handler did not run:\n{res.describe()}"
        assert marker.read_text().split() == [str(pid), str(int(signal.SIGTERM))]
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids), f"workers still running: {pids}"
    assert procs.leftovers(grace=5) == [], "processes left running"
