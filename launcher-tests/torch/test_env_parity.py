"""Scenario 3 of issue #4: the same script under torchrun and rdrun sees the same environment.

Rule: every variable torchrun sets or changes in a worker's environment (compared with the
environment the launcher was started from) must be present under rdrun with the same value,
except these run-specific ones, which must have the same *form*:

- TORCHELASTIC_RUN_ID: a UUID (standalone), the same for every rank of a run.
- MASTER_PORT: a decimal port 1..65535, the same for every rank of a run.
- MASTER_ADDR: torchrun writes socket.getfqdn(). Same form = a name or address of this host that
  a worker here can connect to: torchrun's value itself, "localhost", a 127.0.0.0/8 or ::1
  literal, socket.gethostname() or socket.getfqdn(). Same for every rank.
- TORCHELASTIC_ERROR_FILE: an absolute path <run dir>/attempt_0/<local_rank>/error.json whose run
  dir's name contains the run id. (torchrun without --log-dir: <mkdtemp torchelastic_*>/
  <run_id>_<suffix>; rdrun: one temp dir rdrun-<run_id>-<suffix>. The exact <run_id>_<suffix>
  layout under an explicit --log-dir is checked by test_entrypoints.py::test_log_dir_tee.)

Documented deviations (docs/compat.md), checked by their own rule instead of equality:

- TORCHELASTIC_SIGNALS_TO_HANDLE: rdrun also handles SIGUSR1,SIGUSR2 by default, so its list must
  contain torchrun's, in torchrun's order, as a prefix.

Nothing from the launcher's own environment may be removed. argv (sys.argv and the process
command line after the interpreter) must be identical; the interpreter must be the same venv
(sys.prefix); cwd the same; each worker is its own session and process-group leader, as under
torchrun. OMP_NUM_THREADS is left unset here, so the launcher's default (1 for nproc > 1) is
compared as well. rdrun runs twice, with its default (`--warm-start auto`: workers forked from
the template interpreter, docs/warm-start.md) and cold (`--warm-start off`), and both must pass
the same rules; the default run must show both workers forked warm. (The worker's /proc/self/cmdline is compared after the interpreter
and with trailing empty words dropped: a warm worker's command-line area may be NUL-padded,
docs/warm-start.md "Known differences".)
"""
import ipaddress
import os
import re
import shutil
import socket
from pathlib import Path

from conftest import SCRIPTS, check_warm, cold_enabled, get_launcher, read_json

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RUN_SPECIFIC = {"TORCHELASTIC_RUN_ID", "MASTER_PORT", "MASTER_ADDR", "TORCHELASTIC_ERROR_FILE"}


def signals_superset(rdrun_value: str, torchrun_value: str) -> bool:
    ours, theirs = rdrun_value.split(","), torchrun_value.split(",")
    return ours[: len(theirs)] == theirs


# name -> (rule, why): deviations the project documents on purpose.
DOCUMENTED_DEVIATIONS = {
    "TORCHELASTIC_SIGNALS_TO_HANDLE": (
        signals_superset,
        "docs/compat.md: rdrun's default list adds SIGUSR1,SIGUSR2",
    ),
}


def is_local_host(value: str, torchrun_value: str) -> bool:
    if value in (torchrun_value, "localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def check_form(name, value, env, local_rank, torchrun_value, problems):
    if name == "TORCHELASTIC_RUN_ID":
        if not UUID_RE.match(value):
            problems.append(f"{name}={value!r} is not a UUID like torchrun's {torchrun_value!r}")
    elif name == "MASTER_PORT":
        if not (value.isdigit() and 1 <= int(value) <= 65535):
            problems.append(f"{name}={value!r} is not a port number")
    elif name == "MASTER_ADDR":
        if not is_local_host(value, torchrun_value):
            problems.append(f"{name}={value!r} does not name this host (torchrun: {torchrun_value!r})")
    elif name == "TORCHELASTIC_ERROR_FILE":
        p = Path(value)
        run_id = env.get("TORCHELASTIC_RUN_ID", "")
        if not (
            p.is_absolute()
            and value.endswith(f"/attempt_0/{local_rank}/error.json")
            and run_id
            and run_id in p.parents[2].name
        ):
            problems.append(
                f"{name}={value!r} is not of the form <run dir named after {run_id}>/attempt_0/"
                f"{local_rank}/error.json (torchrun: {torchrun_value!r})"
            )


def test_env_parity(procs, tmp_path):
    base = procs.env(OMP_NUM_THREADS=None)
    dump = tmp_path / "dump"
    dumps = {}
    rdruns = ["rdrun", "rdrun-cold"] if cold_enabled() else ["rdrun"]
    for name in ("torchrun", *rdruns):
        launcher = get_launcher(name)
        dump.mkdir()
        r = procs.run(
            launcher.cmd(
                "--standalone", "--nproc-per-node", "2",
                "envdump.py", "--out", dump, "--foo", "bar baz", "--nproc-per-node", "5",
            ),
            env=base,
            cwd=SCRIPTS,
            timeout=120,
        )
        assert r.rc == 0, f"{name}:\n{r.describe()}"
        if launcher.is_warm:
            assert not check_warm(r, forks=2), f"{check_warm(r, forks=2)}\n{r.describe()}"
        dumps[name] = {i: read_json(dump / f"rank{i}.json") for i in range(2)}
        shutil.move(dump, tmp_path / name)

    problems, extras = [], set()
    for name in rdruns:
        compare(name, dumps, base, problems, extras)
    if extras:
        print("variables rdrun sets that torchrun does not:", sorted(extras))
    assert not problems, "env parity with torchrun:\n  " + "\n  ".join(problems)


def cmdline_words(words: list[str]) -> list[str]:
    """The command line after the interpreter, trailing empty words (NUL padding) dropped."""
    words = list(words[1:])
    while words and words[-1] == "":
        words.pop()
    return words


def compare(name, dumps, base, found, extras):
    """Appends to `found` where launcher `name`'s workers differ from torchrun's."""
    problems = []
    for rank in range(2):
        t, d = dumps["torchrun"][rank], dumps[name][rank]
        te, de = t["env"], d["env"]
        set_by_torchrun = {k for k, v in te.items() if base.get(k) != v}
        assert "RANK" in set_by_torchrun and "OMP_NUM_THREADS" in set_by_torchrun  # sanity
        for k in sorted(set_by_torchrun):
            if k not in de:
                problems.append(f"rank {rank}: {k} missing (torchrun: {te[k]!r})")
            elif k in RUN_SPECIFIC:
                check_form(k, de[k], de, int(te["LOCAL_RANK"]), te[k], problems)
            elif k in DOCUMENTED_DEVIATIONS:
                rule, why = DOCUMENTED_DEVIATIONS[k]
                if not rule(de[k], te[k]):
                    problems.append(f"rank {rank}: {k}={de[k]!r}, torchrun: {te[k]!r} ({why})")
            elif de[k] != te[k]:
                problems.append(f"rank {rank}: {k}={de[k]!r}, torchrun: {te[k]!r}")
        for k in base:
            if k not in de:
                problems.append(f"rank {rank}: inherited variable {k} was removed")
        extras |= {k for k, v in de.items() if base.get(k) != v and k not in te}

        if d["argv"] != t["argv"]:
            problems.append(f"rank {rank}: sys.argv {d['argv']} != torchrun {t['argv']}")
        warm = get_launcher(name).is_warm
        ours = cmdline_words(d["cmdline"]) if warm else d["cmdline"][1:]
        if ours != t["cmdline"][1:]:
            problems.append(
                f"rank {rank}: command line {d['cmdline']} != torchrun {t['cmdline']} "
                "(after the interpreter)"
            )
        if d["prefix"] != t["prefix"]:
            problems.append(f"rank {rank}: interpreter prefix {d['prefix']} != {t['prefix']}")
        if d["cwd"] != t["cwd"]:
            problems.append(f"rank {rank}: cwd {d['cwd']} != {t['cwd']}")
        assert t["pid"] == t["pgid"] == t["sid"]  # torchrun: setsid per worker
        if not d["pid"] == d["pgid"] == d["sid"]:
            problems.append(f"rank {rank}: worker is not its own session/group leader: {d}")

    # consistency within the run
    for k in ("TORCHELASTIC_RUN_ID", "MASTER_PORT", "MASTER_ADDR"):
        vals = {dumps[name][i]["env"].get(k) for i in range(2)}
        if len(vals) != 1:
            problems.append(f"{k} differs between the ranks: {vals}")
    found += [f"{name}: {p}" for p in problems]
