"""Fixtures for the PyTorch compatibility suite (issue #4): real PyTorch programs under rdrun.

What this file owns:
- finding the launchers: `torchrun` from the venv this pytest runs in, and the rdrun binary
  (env RDRUN_BIN, else <repo>/target/release/rdrun, else <repo>/target/debug/rdrun);
- the `launcher` fixture, parametrized over the launchers named in env RDRUN_COMPAT_LAUNCHERS
  (default "torchrun,rdrun"): every scenario runs under torchrun too, so the test itself is known
  to be right about PyTorch before it judges rdrun. "rdrun" is rdrun's default (`--warm-start
  auto`, docs/warm-start.md): every launch of a Python script must show that its workers were
  forked from the template (`check_warm`, `is_warm_run`). A test marked `warm` (where warm and
  cold workers could differ) also runs under "rdrun-cold" (`--warm-start off`, as torchrun)
  unless RDRUN_COMPAT_COLD=0; RDRUN_COMPAT_COLD=all instead runs every rdrun launch of the suite
  cold (RDRUN_WARM_START=off). The learned list is not remembered across launches
  (RDRUN_WARM_MEMORY=off): each launch is a first run, as on a fresh machine;
- `procs`: starts launchers in their own session with a per-test tag in the environment, and on
  teardown kills (by PID) anything still carrying the tag — the launcher, its workers, and
  workers the launcher orphaned. Leftovers after a launcher exited on its own fail the test:
  a launcher must not leave processes behind.

Every launch has a hard timeout. Everything is loopback-only (standalone runs bind localhost).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPTS = HERE / "scripts"
# This pytest runs on the venv's interpreter (scripts/torch-compat.sh makes sure of it), so the
# venv's bin holds torchrun and the python the workers should use.
VENV_BIN = Path(sys.executable).parent
VENV = VENV_BIN.parent
TAG_VAR = "RDRUN_COMPAT_TAG"

# Variables that would leak launcher/worker state from an outer environment into ours.
_SCRUB_PREFIXES = ("PET_", "TORCHELASTIC_", "TORCH_ELASTIC_")
_SCRUB = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "PYTHON_EXEC",
    "GLOO_ENABLE_STORE_V2_API", "TORCH_DIST_INIT_BARRIER", "LOGLEVEL", "PYTHONPATH",
    "PYTEST_CURRENT_TEST", "PYTEST_VERSION", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
}


def rdrun_bin() -> Path | None:
    env = os.environ.get("RDRUN_BIN")
    if env:
        return Path(env)
    for profile in ("release", "debug"):
        cand = REPO / "target" / profile / "rdrun"
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def store_bench_bin() -> Path | None:
    """rdrun's standalone store server (`rdrun-store-bench serve`), next to the rdrun under test."""
    env = os.environ.get("RDRUN_STORE_BENCH_BIN")
    if env:
        return Path(env)
    rd = rdrun_bin()
    cands = ([rd.parent / "rdrun-store-bench"] if rd else []) + [
        REPO / "target" / p / "rdrun-store-bench" for p in ("release", "debug")
    ]
    for cand in cands:
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


@dataclass(frozen=True)
class Launcher:
    name: str  # "torchrun", "rdrun" (its default: warm) or "rdrun-cold"
    argv: tuple[str, ...]

    def cmd(self, *args: str) -> list[str]:
        return [*self.argv, *map(str, args)]

    @property
    def is_rdrun(self) -> bool:
        return self.name in ("rdrun", "rdrun-cold")

    @property
    def is_warm(self) -> bool:
        return self.name == "rdrun" and not cold_all()


# rdrun's log filter in this suite: its default (warnings) plus the warm-start module's debug
# lines, one per worker forked from the template (the evidence `check_warm` reads), and its INFO
# lines (a reason to start a worker cold, under the default `auto`).
WARM_LOG = "warn,rdrun::supervisor::group::warm=debug"
WARM_FORKED = "worker forked from the template"


def get_launcher(name: str) -> Launcher:
    if name == "torchrun":
        return Launcher("torchrun", (str(VENV_BIN / "torchrun"),))
    if name == "rdrun":
        path = rdrun_bin()
        if path is None or not path.is_file():
            pytest.fail(
                "rdrun binary not found: set RDRUN_BIN or build it with "
                "`cargo build --release --bin rdrun`"
            )
        return Launcher("rdrun", (str(path),))
    if name == "rdrun-cold":
        rd = get_launcher("rdrun").argv[0]
        return Launcher("rdrun-cold", (rd, "--warm-start", "off"))
    raise ValueError(f"unknown launcher {name!r}")


def selected_launchers() -> list[str]:
    raw = os.environ.get("RDRUN_COMPAT_LAUNCHERS", "torchrun,rdrun")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    for n in names:
        if n not in ("torchrun", "rdrun"):
            raise pytest.UsageError(f"RDRUN_COMPAT_LAUNCHERS: unknown launcher {n!r}")
    return names


_LIVE: list["Procs"] = []


def _cleanup_all() -> None:
    """Last resort (pytest interrupted or stopped): kill whatever any test still has running."""
    for p in list(_LIVE):
        p.cleanup()


def pytest_configure(config):
    # `timeout` (scripts/torch-compat.sh) stops pytest with SIGTERM; turn it into an interrupt so
    # that fixture teardown and the atexit hook still kill the launched process trees.
    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(_cleanup_all)
    config.addinivalue_line(
        "markers", "warm: also run under rdrun --warm-start off (launcher rdrun-cold)"
    )


def cold_enabled() -> bool:
    return os.environ.get("RDRUN_COMPAT_COLD", "1") not in ("0", "all")


def cold_all() -> bool:
    return os.environ.get("RDRUN_COMPAT_COLD") == "all"


def is_warm_run(cmd: list[str], env: dict[str, str] | None) -> bool:
    """Whether this launch must show warm workers: any rdrun launch of a Python script under
    rdrun's default, with this suite's log filter (`--no-python` and `--warm-start off`: cold
    by design; a test that sets its own RUST_LOG judges its own output)."""
    env = env or {}
    if cold_all() or env.get("RUST_LOG") != WARM_LOG or env.get("RDRUN_WARM_START") == "off":
        return False
    if Path(cmd[0]).name != "rdrun" or "--no-python" in cmd or "--warm-start=off" in cmd:
        return False
    return not any(a == "--warm-start" and b == "off" for a, b in zip(cmd, cmd[1:]))


def pytest_generate_tests(metafunc):
    if "launcher" in metafunc.fixturenames:
        names = selected_launchers()
        if metafunc.definition.get_closest_marker("warm") and "rdrun" in names and cold_enabled():
            names = [*names, "rdrun-cold"]
        metafunc.parametrize("launcher", names, indirect=True)


def check_warm(r: "Result", forks: int | None = None) -> list[str]:
    """Problems with a warm run (rdrun's default): every worker must come from the template.
    Each reason to spawn cold is a line starting "warm start:" that says "cold" (INFO under the
    default `auto`, WARN under `on`), a warning of the warm-start module is a problem too, and
    each fork is a debug line; `forks`: how many there must be."""
    problems = []
    # rdrun's log lines ("... INFO warm start: ..."), not the lines starting "rdrun warm
    # start:" (rdrun's ready line, a worker's note about a variable it set).
    cold = [
        l for l in r.err.splitlines()
        if "warm start:" in l and not l.startswith("rdrun warm start:")
        and ("WARN" in l or " cold" in l)
    ]
    if cold:
        problems.append("workers spawned cold: " + " | ".join(cold))
    n = r.err.count(WARM_FORKED)
    if n == 0 or (forks is not None and n != forks):
        want = "at least 1" if forks is None else str(forks)
        problems.append(f"{n} workers forked from the template, expected {want}")
    return problems


@pytest.fixture
def launcher(request) -> Launcher:
    return get_launcher(request.param)


def base_env(tag: str) -> dict[str, str]:
    """The environment a user with the venv activated would launch from."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _SCRUB and not k.startswith(_SCRUB_PREFIXES)
    }
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["VIRTUAL_ENV"] = str(VENV)
    # 2-core CI machines: one thread per worker (torchrun would also set it, but we want the same
    # value whatever the launcher does; the env-parity test removes it to check that part).
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[TAG_VAR] = tag
    env["RDRUN_WARM_MEMORY"] = "off"
    if cold_all():
        env["RDRUN_WARM_START"] = "off"
    else:
        env["RUST_LOG"] = WARM_LOG
    return env


@dataclass
class Result:
    cmd: list[str]
    rc: int | None
    out: str
    err: str
    elapsed: float
    timed_out: bool = False

    @property
    def text(self) -> str:
        return self.out + self.err

    def describe(self, limit: int = 6000) -> str:
        return (
            f"command: {' '.join(self.cmd)}\nexit status: {self.rc}"
            f"{' (TIMED OUT, killed)' if self.timed_out else ''}; {self.elapsed:.1f}s\n"
            f"--- stdout (tail) ---\n{self.out[-limit:]}\n--- stderr (tail) ---\n{self.err[-limit:]}"
        )


def exit_status(returncode: int) -> int:
    """Popen's code as a shell would show it (death by signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Running:
    popen: subprocess.Popen
    cmd: list[str]
    out_path: Path
    err_path: Path
    started: float
    timeout: float
    result: Result | None = None
    # The launch's environment (`is_warm_run` reads rdrun's log filter and warm-start setting).
    env: dict[str, str] | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float | None = None) -> Result:
        """Waits for exit; on timeout kills the launcher's process group and its tagged workers."""
        if self.result is not None:
            return self.result
        timed_out = False
        try:
            self.popen.wait(timeout=self.timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _killpg(self.popen.pid)
            self.popen.wait(timeout=30)
        self.result = Result(
            cmd=self.cmd,
            rc=exit_status(self.popen.returncode),
            out=self.out_path.read_text(errors="replace"),
            err=self.err_path.read_text(errors="replace"),
            elapsed=time.monotonic() - self.started,
            timed_out=timed_out,
        )
        return self.result


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tagged_pids(tag: str) -> list[int]:
    """Live (non-zombie) processes whose initial environment carries `tag`."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            if needle not in env.split(b"\0"):
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
            if state in (b"Z", b"X"):
                continue
            found.append(pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return found


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
    return state not in (b"Z", b"X")


@dataclass
class Procs:
    """Starts launchers for one test and guarantees nothing outlives it."""

    tmp: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex)
    running: list[Running] = field(default_factory=list)
    _n: int = 0

    def env(self, **overrides: str | None) -> dict[str, str]:
        env = base_env(self.tag)
        for k, v in overrides.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def start(
        self,
        cmd: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stdin=subprocess.DEVNULL,
    ) -> Running:
        self._n += 1
        out_path = self.tmp / f"launch{self._n}.stdout"
        err_path = self.tmp / f"launch{self._n}.stderr"
        env = self.env() if env is None else env
        assert env.get(TAG_VAR) == self.tag, "env must come from procs.env()"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            popen = subprocess.Popen(
                cmd,
                stdin=stdin,
                stdout=out,
                stderr=err,
                env=env,
                cwd=str(cwd or self.tmp),
                start_new_session=True,
            )
        r = Running(popen, cmd, out_path, err_path, time.monotonic(), timeout, env=env)
        self.running.append(r)
        return r

    def run(self, cmd: list[str], *, timeout: float, **kw) -> Result:
        return self.start(cmd, timeout=timeout, **kw).wait()

    def leftovers(self, grace: float = 10.0) -> list[int]:
        """Tagged processes still alive after `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            pids = tagged_pids(self.tag)
            if not pids or time.monotonic() > deadline:
                return pids
            time.sleep(0.2)

    def cleanup(self) -> list[str]:
        problems = []
        for r in self.running:
            if r.result is not None and is_warm_run(r.cmd, r.env):
                problems += [f"warm run: {p}" for p in check_warm(r.result)]
        # Once we SIGKILL a launcher, its workers are orphaned by us, not left behind by it.
        killed_by_us = any(r.result is not None and r.result.timed_out for r in self.running)
        for r in self.running:
            if r.popen.poll() is None:
                problems.append(f"launcher still running at teardown: {' '.join(r.cmd)}")
                killed_by_us = True
                _killpg(r.popen.pid)
                try:
                    r.popen.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    problems.append(f"launcher pid {r.popen.pid} did not die on SIGKILL")
        left = self.leftovers(grace=1.0 if killed_by_us else 10.0)
        for pid in left:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmdline = "?"
            if not killed_by_us:
                problems.append(f"process left behind: pid {pid}: {cmdline}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return problems


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp=tmp_path)
    _LIVE.append(p)
    yield p
    problems = p.cleanup()
    _LIVE.remove(p)
    if problems:
        pytest.fail("cleanup: " + "; ".join(problems))


@pytest.fixture(scope="session")
def compat_results():
    """Session-wide notes, e.g. torchrun's final weights, to compare rdrun's against."""
    return {}


# torch 2.15 + gloo now and then aborts a worker at interpreter exit, after the script has written
# everything it reports ("terminate called without an active exception", SIGABRT), under torchrun
# and rdrun alike, more often on a loaded machine. That is the reference library flaking, not the
# launcher: a run that shows exactly this signature *and* whose results are complete is run once
# more, and every such retry is listed at the end of the session. Anything else fails as before.
TORCH_EXIT_ABORT = "terminate called without an active exception"
TORCH_EXIT_RETRIES: list[str] = []


def is_torch_exit_abort(r: Result) -> bool:
    """The exact signature of torch's at-exit abort: the C++ message plus a SIGABRT death."""
    if r.rc == 0 or r.timed_out:
        return False
    sigabrt = "SIGABRT" in r.text or "Signal 6" in r.text or r.rc == 128 + signal.SIGABRT
    return TORCH_EXIT_ABORT in r.text and sigabrt


def run_retrying_torch_exit_abort(procs: "Procs", cmd: list[str], *, timeout: float, complete, reset,
                                  **kw) -> Result:
    """`procs.run`, retried once when torch aborted at exit after `complete()` became true.

    `complete()` says whether the script's results are all written; `reset()` clears them before
    the retry so that the retry's results are the ones judged.
    """
    r = procs.run(cmd, timeout=timeout, **kw)
    if is_torch_exit_abort(r) and complete():
        TORCH_EXIT_RETRIES.append(
            f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}: {' '.join(cmd)}"
        )
        reset()
        r = procs.run(cmd, timeout=timeout, **kw)
    return r


def pytest_terminal_summary(terminalreporter):
    if TORCH_EXIT_RETRIES:
        terminalreporter.section("torch at-exit aborts (retried once)")
        for line in TORCH_EXIT_RETRIES:
            terminalreporter.write_line(line)


def read_json(path: Path):
    return json.loads(path.read_text())


def wait_for_files(paths: list[Path], timeout: float, running: Running | None = None) -> bool:
    """Polls until every path exists; stops early if `running` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths):
            return True
        if running is not None and running.popen.poll() is not None:
            return all(p.exists() for p in paths)
        time.sleep(0.1)
    return False
