"""Warm start parity (issue 37, docs/warm-start.md "Parity"): a worker forked from the template
interpreter is indistinguishable from a cold one in what it draws and sees for itself.

scripts/warm_parity.py runs 2 ranks x 2 attempts (rank 1 fails once, `--max-restarts 1`) under
torchrun, rdrun cold (`--warm-start off`), rdrun's default (`auto`: attempt 0 forked from the bare
template, attempt 1 from the template once it learned torch: rank 1 waits for that, reading the
remembered list), `--warm-start on` (torch imported before the first fork) and `on` with
`--preload torch._dynamo` (the recovery benchmark's list; the script then imports it too).
Rules, with torchrun as the reference that the rule itself holds:
- every per-process random state and secret differs between all four (rank, attempt) records
  of a launch: `random`, numpy's global state, torch's initial seed, torch.rand/randn, a
  dropout mask, a shuffled DataLoader's first batch, a DataLoader worker's seed,
  multiprocessing's authkey (and sympy's generators with torch._dynamo preloaded);
- after torch.manual_seed / random.seed / numpy.random.seed the draws are the same in every
  record of every launch;
- the top-level frame probes (`inspect.stack()`, `f_back`, `traceback.extract_stack()`,
  warnings' reported locations), `__main__` (its names in order, `__annotations__`,
  `__loader__`, `__spec__`, `__file__`, `__cached__`, `__builtins__`, `__mp_main__`) and
  `threading.main_thread()` match the cold worker's exactly;
- a warm worker whose torch came from the template and that sets OMP_NUM_THREADS (read when
  the template imported torch) says so once; one that imported torch itself (auto's attempt 0)
  and cold ones print nothing, and nothing of PATH; under the default, attempt 1 holds torch;
  no `nanobind: leaked` line at exit with torch._dynamo preloaded (the template's gc.freeze()).
Every warm launch must show its 4 workers forked from the template.
"""
import itertools
import json

import pytest

from conftest import SCRIPTS, check_warm, cold_all, get_launcher

OMP_LINE = "OMP_NUM_THREADS was set to '3' after this worker was forked"


def launch(procs, tmp_path, name, extra=(), script_args=(), env=None):
    """One launch of the probe; its records by (rank, attempt) and its result."""
    out = tmp_path / ("-".join([name, *extra]).replace(".", "_").replace("--", ""))
    out.mkdir()
    launcher = get_launcher(name if name in ("torchrun", "rdrun-cold") else "rdrun")
    args = list(extra)
    if name.startswith("rdrun-on"):
        args = ["--warm-start", "on", *args]
    r = procs.run(
        launcher.cmd(
            "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *args,
            SCRIPTS / "warm_parity.py", "--out", out, *script_args,
        ),
        env=env,
        timeout=300,
    )
    assert r.rc == 0, f"{name} {extra}:\n{r.describe()}"
    records = {}
    for rank, attempt in itertools.product(range(2), range(2)):
        p = out / f"r{rank}.a{attempt}.json"
        assert p.exists(), f"{name} {extra}: no record of rank {rank} attempt {attempt}\n{r.describe()}"
        records[(rank, attempt)] = json.loads(p.read_text())
    if launcher.is_warm:
        assert not check_warm(r, forks=4), f"{check_warm(r, forks=4)}\n{r.describe()}"
    return records, r


def same_values(records, key):
    """Problems: keys of `records[...][key]` whose value repeats between two records."""
    problems = []
    names = sorted(next(iter(records.values()))[key])
    for field in names:
        seen = {}
        for where, rec in sorted(records.items()):
            v = json.dumps(rec[key][field])
            if v in seen:
                problems.append(f"{field}: rank/attempt {seen[v]} and {where} drew the same {v[:60]}")
            seen.setdefault(v, where)
    return problems


def test_warm_parity(procs, tmp_path):
    if cold_all():
        pytest.skip("every rdrun launch is cold (RDRUN_COMPAT_COLD=all)")
    runs = {"torchrun": launch(procs, tmp_path, "torchrun")}
    cold = "rdrun-cold"
    runs[cold] = launch(procs, tmp_path, cold)
    memory = tmp_path / "memory"
    runs["rdrun"] = launch(
        procs, tmp_path, "rdrun", script_args=["--learned", memory],
        env=procs.env(RDRUN_WARM_MEMORY=str(memory)),
    )
    runs["rdrun-on"] = launch(procs, tmp_path, "rdrun-on")
    runs["rdrun-on-dynamo"] = launch(
        procs, tmp_path, "rdrun-on", ["--preload", "torch._dynamo"], ["--dynamo"]
    )
    held = {(r, a): rec["held"] for (r, a), rec in runs["rdrun"][0].items()}
    assert held == {(0, 0): False, (1, 0): False, (0, 1): True, (1, 1): True}, (
        f"rdrun's default: which workers were forked holding torch: {held}"
    )

    problems = []
    for name, (records, r) in runs.items():
        problems += [f"{name}: {p}" for p in same_values(records, "drawn")]
        seeded = {json.dumps(rec["seeded"], sort_keys=True) for rec in records.values()}
        ref = json.dumps(runs["torchrun"][0][(0, 0)]["seeded"], sort_keys=True)
        if seeded != {ref}:
            problems.append(f"{name}: manual_seed streams differ from torchrun's: {seeded} vs {ref}")
        for where, rec in sorted(records.items()):
            want = runs[cold][0][where]["frame"]
            if rec["frame"] != want:
                diff = {k: (v, want.get(k)) for k, v in rec["frame"].items() if want.get(k) != v}
                problems.append(f"{name} {where}: frame probes differ from cold ({cold}): {diff}")
        omp = r.err.count(OMP_LINE)
        # One per worker whose torch came from the template.
        want = sum(rec["held"] for rec in records.values()) if name.startswith("rdrun") else 0
        if omp != want:
            problems.append(f"{name}: {omp} OMP_NUM_THREADS warnings, expected {want}")
        if "rdrun warm start: PATH" in r.err:
            problems.append(f"{name}: a change of PATH (not read by torch's import) was reported")
        if "nanobind: leaked" in r.text:
            problems.append(f"{name}: nanobind reports leaks at exit")
    assert "sympy_rng" in runs["rdrun-on-dynamo"][0][(0, 0)]["drawn"]
    # The rules themselves hold for torchrun's cold workers.
    assert not [p for p in problems if p.startswith("torchrun:")], "\n".join(problems)
    assert not problems, "warm start parity:\n  " + "\n  ".join(problems)
