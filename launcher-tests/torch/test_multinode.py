"""Multi-node DDP under rdrun: 2 rdrun agents (nodes) x 2 workers on loopback, gloo backend.

Each rank trains a small model with DistributedDataParallel on rank-dependent data and saves its
final weights; all four must be identical (gradients were all-reduced across both nodes). The
nodes use the static backend (node 0 hosts the store) and c10d. Skipped when torch is missing.
Run: ~/.cache/rdrun/torch-venv/bin/python -m pytest launcher-tests/torch/test_multinode.py
The rdrun binary: $RDRUN_BIN, else target/release/rdrun, else target/debug/rdrun.
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import WARM_FORKED, WARM_LOG  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# As conftest.py: RDRUN_BIN, else the release build, else the debug build.
RDRUN = os.environ.get("RDRUN_BIN") or next(
    (str(p) for p in (REPO / "target" / "release" / "rdrun", REPO / "target" / "debug" / "rdrun")
     if p.exists()),
    str(REPO / "target" / "debug" / "rdrun"),
)
TIMEOUT = 240  # seconds, hard bound on each agent

TRAIN = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(5):
        x = torch.randn(16, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = sys.argv[1]
    torch.save({k: v.detach().clone() for k, v in model.module.state_dict().items()},
               os.path.join(out, f"w.{rank}.pt"))
    with open(os.path.join(out, f"group.{rank}"), "w") as f:
        f.write(os.environ["GROUP_RANK"] + " " + os.environ["GROUP_WORLD_SIZE"])
    # torch 2.15's teardown abort (README.md): end without interpreter finalisation.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(tmp_path, node_args, prefixes=None, extra_env=None):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    # The script is the program, with the interpreter in PYTHON_EXEC: under rdrun's default the
    # workers are forked warm, and each node must show 2 warm forks. Under RDRUN_COMPAT_COLD=all
    # (conftest.py) the interpreter is named as the program (rdrun runs it directly: cold).
    warm = os.environ.get("RDRUN_COMPAT_COLD") != "all"
    program = [sys.executable] if not warm else []
    env.update(RDRUN_WARM_MEMORY="off")
    if warm:
        env.update(PYTHON_EXEC=sys.executable, RUST_LOG=WARM_LOG)
        env.pop("RDRUN_WARM_START", None)
    prefixes = prefixes or [[] for _ in node_args]
    procs = [
        subprocess.Popen(
            [*prefix, RDRUN, *args, "--nproc-per-node", "2", *program, str(script),
             str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for prefix, args in zip(prefixes, node_args)
    ]
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT)
            outs.append((p.returncode, out.decode(errors="replace")))
    finally:
        for p in procs:  # by pid, our own children
            if p.poll() is None:
                p.kill()
                p.wait()
    for code, out in outs:
        assert code == 0, out
        if warm:
            cold = [
                l for l in out.splitlines()
                if "warm start:" in l and not l.startswith("rdrun warm start:")
                and ("WARN" in l or " cold" in l)
            ]
            assert not cold and out.count(WARM_FORKED) == 2, out
    weights = [torch.load(tmp_path / f"w.{r}.pt") for r in range(4)]
    for w in weights[1:]:
        for k in weights[0]:
            assert torch.equal(weights[0][k], w[k]), k
    groups = sorted((tmp_path / f"group.{r}").read_text() for r in range(4))
    assert groups == ["0 2", "0 2", "1 2", "1 2"]


@pytest.mark.skipif(not Path(RDRUN).exists(), reason="rdrun binary not built")
def test_ddp_two_static_nodes_identical_weights(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    run_nodes(tmp_path, [common + ["--node-rank", "0"], common + ["--node-rank", "1"]])


@pytest.mark.skipif(not Path(RDRUN).exists(), reason="rdrun binary not built")
def test_ddp_two_c10d_nodes_identical_weights(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
              "--rdzv-id", "ddp"]
    run_nodes(tmp_path, [common + ["--local-addr", "127.0.0.1"], common + ["--local-addr", "127.0.0.2"]])


NETNS = REPO / "scripts" / "netns.sh"


@pytest.mark.skipif(not Path(RDRUN).exists(), reason="rdrun binary not built")
def test_ddp_two_namespace_nodes_identical_weights(tmp_path):
    """Two separate network hosts (namespaces on a bridge), 2 workers each, c10d over 10.231.0.1."""
    check = subprocess.run([str(NETNS), "check"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(check.stdout.strip() or check.stderr.strip())
    tag = f"py{os.getpid() % 10**8}"
    up = subprocess.run([str(NETNS), "up", tag, "2"], capture_output=True, text=True,
                        env=dict(os.environ, RDRUN_NETNS_OWNER=str(os.getpid())))
    assert up.returncode == 0, up.stderr
    try:
        common = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  "10.231.0.1:29400", "--rdzv-id", "ddpns"]
        prefixes = [["ip", "netns", "exec", f"rdrun-{tag}-{i}"] for i in range(2)]
        # gloo picks its interface from the hostname by default, which no namespace has.
        run_nodes(tmp_path, [common, common], prefixes, {"GLOO_SOCKET_IFNAME": "eth0"})
    finally:
        subprocess.run([str(NETNS), "down", tag], check=False)
