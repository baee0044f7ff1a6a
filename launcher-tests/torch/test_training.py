"""Scenarios 1 and 2 of issue #4: seed-style DDP training (gloo, env://) and the checkpoint pattern."""
import math

import pytest
import shutil

from conftest import SCRIPTS, read_json, run_retrying_torch_exit_abort

N_SAMPLES = 64  # ddp_train.py


def check_training(results, world, epochs):
    ranks = sorted(r["rank"] for r in results)
    assert ranks == list(range(world))
    for r in results:
        assert r["world"] == world
        # all ranks bit-identical: torch.equal against rank 0's broadcast, and the same digest
        assert r["equal_after_broadcast"] is True, f"rank {r['rank']} differs from rank 0"
        assert r["changed"] is True, "training did not change the weights"
        assert r["rank_sum"] == world * (world + 1) // 2
        assert len(r["epochs"]) == epochs
    assert len({r["digest"] for r in results}) == 1, "final weights differ between ranks"

    for e in range(epochs):
        reduced = [r["epochs"][e]["reduced"] for r in results]
        assert all(x == reduced[0] for x in reduced), f"epoch {e}: ranks disagree on all_reduce"
        loss_sum = sum(r["epochs"][e]["local"][0] for r in results)
        count = sum(r["epochs"][e]["local"][1] for r in results)
        assert reduced[0][1] == count == N_SAMPLES
        assert math.isclose(reduced[0][0], loss_sum, rel_tol=1e-12), (reduced[0][0], loss_sum)
        # DistributedSampler: the ranks' shards partition the data set
        seen = [i for r in results for i in r["seen"][e]]
        assert sorted(seen) == list(range(N_SAMPLES)), f"epoch {e}: shards do not partition"
    if epochs > 1:
        # set_epoch reshuffles
        assert results[0]["seen"][0] != results[0]["seen"][1], "set_epoch had no effect"


@pytest.mark.warm
@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_training(launcher, procs, tmp_path, nproc, compat_results):
    out = tmp_path / "out"
    out.mkdir()
    if nproc == 2:
        opts = ["--standalone", "--nproc-per-node", "2"]
    else:
        opts = ["--nproc_per_node=4"]  # the seeds' spelling, no --standalone
    r = run_retrying_torch_exit_abort(
        procs,
        launcher.cmd(*opts, SCRIPTS / "ddp_train.py", "--out", out, "--epochs", "2"),
        timeout=300 if nproc == 4 else 180,
        complete=lambda: all((out / f"rank{i}.json").is_file() for i in range(nproc)),
        reset=lambda: (shutil.rmtree(out), out.mkdir()),
    )
    assert r.rc == 0, r.describe()
    results = [read_json(out / f"rank{i}.json") for i in range(nproc)]
    check_training(results, nproc, epochs=2)

    # Same program, same seeds, one thread per worker: the launcher must not change the result.
    key = ("ddp", nproc)
    digest = results[0]["digest"]
    if launcher.name == "torchrun":
        compat_results[key] = digest
    elif key in compat_results:
        assert digest == compat_results[key], "final weights differ from the torchrun run"


@pytest.mark.warm
def test_checkpoint_pattern(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ckpt = tmp_path / "ckpt.pt"
    r = run_retrying_torch_exit_abort(
        procs,
        launcher.cmd(
            "--standalone", "--nproc-per-node", "2",
            SCRIPTS / "ddp_train.py", "--out", out, "--epochs", "2", "--checkpoint", ckpt,
        ),
        timeout=180,
        complete=lambda: all((out / f"rank{i}.json").is_file() for i in range(2)),
        reset=lambda: (shutil.rmtree(out), out.mkdir(), ckpt.unlink(missing_ok=True)),
    )
    assert r.rc == 0, r.describe()
    assert ckpt.is_file()
    results = [read_json(out / f"rank{i}.json") for i in range(2)]
    check_training(results, 2, epochs=2)
    for res in results:
        cp = res["checkpoint"]
        assert cp is not None, "checkpoint branch did not run"
        assert cp["equal_to_rank0"] is True
        assert cp["keys"] and all(k.startswith("module.") for k in cp["keys"]), cp["keys"]


def test_torch_exit_abort_signature_is_exact():
    """The retry above fires only on torch's at-exit abort, never on another failure."""
    from conftest import Result, is_torch_exit_abort

    def res(rc, err, timed_out=False):
        return Result(cmd=["x"], rc=rc, out="", err=err, elapsed=1.0, timed_out=timed_out)

    abort = "terminate called without an active exception\n"
    assert is_torch_exit_abort(res(134, abort))
    assert is_torch_exit_abort(res(1, abort + "exitcode  : -6 (pid: 7)\nSignal 6 (SIGABRT) received"))
    assert not is_torch_exit_abort(res(0, abort))  # success is never retried
    assert not is_torch_exit_abort(res(1, abort))  # no SIGABRT death: another failure
    assert not is_torch_exit_abort(res(134, "Fatal Python error: Aborted\n"))  # another abort
    assert not is_torch_exit_abort(res(134, abort, timed_out=True))  # a hang is a hang
