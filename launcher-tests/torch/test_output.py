"""Output integrity with real PyTorch workers: bursts of short, pipe-sized and longer-than-a-pipe
lines from every rank on stdout and stderr reach the console whole, once, in each rank's order,
prefixed (`--tee 3`), and the per-rank log files hold exactly the rank's own lines. Runs cold
and warm (rdrun `--warm-start on`: the workers' pipes are passed to the forked worker).
"""
import re

import pytest

from conftest import SCRIPTS

LINES = 120
LENGTHS = (10, 200, 5000, 70000, 1, 4095, 4097)  # burst_out.py


def expected(kind: str, rank: int, i: int) -> str:
    head = f"{kind}{rank}-{i}-"
    return head + "x" * max(0, LENGTHS[i % len(LENGTHS)] - len(head))


def check_stream(text: str, kind: str, nproc: int) -> list[str]:
    """Problems with one console stream: each `[defaultR]:` line must be rank R's next line."""
    problems = []
    want = {r: [i for i in range(LINES) if kind == "o" or i % 3 == 0] for r in range(nproc)}
    got = {r: [] for r in range(nproc)}
    for line in text.splitlines():
        m = re.match(r"\[default(\d+)\]:(.*)", line)
        if not m or not m.group(2).startswith(kind):
            continue  # rdrun's or torchrun's own log lines
        rank, body = int(m.group(1)), m.group(2)
        n = len(got[rank])
        if n >= len(want[rank]):
            problems.append(f"rank {rank}: extra {kind} line {body[:40]!r}")
            continue
        if body != expected(kind, rank, want[rank][n]):
            problems.append(
                f"rank {rank}: {kind} line {n} is {body[:40]!r}... ({len(body)} chars), expected "
                f"{expected(kind, rank, want[rank][n])[:20]!r}... "
                f"({len(expected(kind, rank, want[rank][n]))} chars)"
            )
            break
        got[rank].append(body)
    for r in range(nproc):
        if len(got[r]) != len(want[r]):
            problems.append(f"rank {r}: {len(got[r])} of {len(want[r])} {kind} lines")
    return problems


@pytest.mark.warm
def test_line_integrity_under_bursts(launcher, procs, tmp_path):
    nproc = 2
    logs = tmp_path / "logs"
    r = procs.run(
        launcher.cmd(
            "--standalone", "--nproc-per-node", nproc, "--tee", "3", "--log-dir", logs,
            SCRIPTS / "burst_out.py", "--lines", LINES,
        ),
        timeout=240,
    )
    assert r.rc == 0, r.describe(limit=3000)
    problems = check_stream(r.out, "o", nproc) + check_stream(r.err, "e", nproc)
    for rank in range(nproc):
        files = list(logs.glob(f"*/attempt_0/{rank}/stdout.log"))
        assert len(files) == 1, f"rank {rank}: stdout.log files: {files}"
        lines = files[0].read_text().splitlines()
        if lines != [expected("o", rank, i) for i in range(LINES)]:
            problems.append(f"rank {rank}: stdout.log does not hold exactly its {LINES} lines")
    if not launcher.is_rdrun and problems and not any("stdout.log" in p for p in problems):
        # torchrun's --tee prints through a thread that tails the log files with readline(): a
        # line it meets half-written (a 70000-byte line, on a loaded machine) is printed in two
        # pieces, each with a prefix ("[default0]:o0-109-[default0]:xxx"). Seen in one of this
        # session's suite runs beside a CI build on 2 CPUs. A defect of the reference, recorded as
        # such (its log files are still judged exactly); rdrun's legs are judged in full.
        pytest.xfail("torchrun split a line it read mid-write: " + problems[0])
    assert not problems, "\n".join(problems[:20])
