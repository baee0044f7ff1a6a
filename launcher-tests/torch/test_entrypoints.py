"""Scenario 7 of issue #4: -m package.module, --no-python with a shebang script, --run-path, and
--log-dir with --tee 3 (log tree and [default<N>]: prefixes)."""
import os

import pytest

from conftest import SCRIPTS, VENV, read_json


def log_tree(root):
    """Every file under the log dir with its contents, for failure messages."""
    if not root.exists():
        return f"\n--- {root} was not created ---"
    parts = [f"\n--- files under {root} ---"]
    for p in sorted(root.rglob("*")):
        if p.is_file():
            parts.append(f"{p.relative_to(root)}:\n{p.read_text(errors='replace')[-2000:]}")
    return "\n".join(parts)


@pytest.mark.warm
def test_module(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = procs.run(
        launcher.cmd("--standalone", "--nproc-per-node", "2", "-m", "pkg.mod", "--out", out, "x", "-y"),
        env=procs.env(PYTHONPATH=str(SCRIPTS)),
        timeout=120,
    )
    assert r.rc == 0, r.describe()
    for rank in range(2):
        res = read_json(out / f"mod_rank{rank}.json")
        assert res["name"] == "__main__" and res["spec"] == "pkg.mod", res
        assert res["argv"][0] == str(SCRIPTS / "pkg" / "mod.py"), res
        assert res["argv"][1:] == ["--out", str(out), "x", "-y"], res
        assert res["prefix"] == str(VENV), res


def test_no_python_shebang(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = SCRIPTS / "shebang.py"
    assert os.access(script, os.X_OK), f"{script} lost its executable bit"
    r = procs.run(
        launcher.cmd("--standalone", "--nproc-per-node", "2", "--no-python", script, "--out", out, "a b"),
        timeout=120,
    )
    assert r.rc == 0, r.describe()
    for rank in range(2):
        res = read_json(out / f"shebang_rank{rank}.json")
        assert res["argv"] == [str(script), "--out", str(out), "a b"], res
        # `#!/usr/bin/env python3` found the venv's python first on PATH, and no -u was added
        assert res["prefix"] == str(VENV), res
        assert res["cmdline"][1:] == [str(script), "--out", str(out), "a b"], res


@pytest.mark.warm
def test_run_path(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = SCRIPTS / "runpath.py"
    r = procs.run(
        launcher.cmd("--standalone", "--nproc-per-node", "2", "--run-path", script, "--out", out, "z"),
        timeout=120,
    )
    assert r.rc == 0, r.describe()
    for rank in range(2):
        res = read_json(out / f"runpath_rank{rank}.json")
        assert res["name"] == "__main__", res
        assert res["argv"] == [str(script), "--out", str(out), "z"], res
        assert res["prefix"] == str(VENV), res


@pytest.mark.warm
def test_log_dir_tee(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    r = procs.run(
        launcher.cmd(
            "--standalone", "--nproc-per-node", "2", "--log-dir", logs, "--tee", "3",
            SCRIPTS / "tee_out.py", "--out", out,
        ),
        timeout=120,
    )
    assert r.rc == 0, r.describe() + log_tree(logs)
    out_lines, err_lines = r.out.splitlines(), r.err.splitlines()
    run_id = (out / "runid_rank0.txt").read_text()
    assert (out / "runid_rank1.txt").read_text() == run_id
    run_dirs = sorted(logs.glob(f"{run_id}_*"))
    assert len(run_dirs) == 1, f"expected one {run_id}_* run dir in {logs}: {sorted(logs.iterdir())}"
    for rank in range(2):
        assert f"[default{rank}]:out{rank} hello stdout" in out_lines, r.describe()
        assert f"[default{rank}]:err{rank} hello stderr" in err_lines, r.describe()
        d = run_dirs[0] / "attempt_0" / str(rank)
        assert (d / "stdout.log").read_text().splitlines() == [f"out{rank} hello stdout"]
        assert f"err{rank} hello stderr" in (d / "stderr.log").read_text().splitlines()
