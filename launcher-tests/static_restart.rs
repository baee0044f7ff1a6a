//! Restarts of a static multi-node job with real PyTorch DDP (issue 24.1): two rdrun agents on
//! loopback, 2 gloo workers each, sharing node 0's store as torchrun's workers do
//! (TORCHELASTIC_USE_AGENT_STORE). A rank fails on one attempt, on either node; every later
//! attempt must form its process group from a clean store namespace (before the fix, attempt 1
//! read attempt 0's gloo addresses and died in connectFullMesh), and finish with the same
//! weights on every rank. The Slurm versions are in `slurm.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::util::{free_port, torch_python, torch_script, Output, Rdrun, TempDir};

/// Hard bound on one agent: four attempts of a torch job on a loaded 2-core machine.
const AGENT_TIMEOUT: Duration = Duration::from_secs(400);

/// Runs the two-node job with `--max-restarts max` where entry k of `fail` is the rank that
/// exits 7 on attempt k; returns both agents' outputs.
fn two_nodes(dir: &TempDir, py: &Path, max: u32, fail: &str) -> [Output; 2] {
    let port = free_port();
    let agent = |rank: usize| {
        Rdrun::new()
            .timeout(AGENT_TIMEOUT)
            .env("PYTHON_EXEC", py)
            .args([
                "--nnodes",
                "2",
                "--node-rank",
                &rank.to_string(),
                "--nproc-per-node",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port.to_string(),
                "--max-restarts",
                &max.to_string(),
                // Every failing rank exits 7 with no traceback: by issue 28.5's rule that is
                // "the same failure" in a row, and a node whose own workers fail the same way
                // twice would stop. These tests are about restarts (issue 24.1), so the stop
                // verdict is off, as in `restart.rs`. (Without it, the three-restart case
                // failed once in CI: node 1 closed the job after attempt 2. Its log was not
                // kept; the likely cause is that its attempt 1 root cause came out as its
                // other rank's gloo RuntimeError, the same as attempt 2's, when both exits
                // were reaped together.)
                "--max-same-failures=0",
            ])
            .arg(torch_script("ddp_restart.py"))
            .arg(dir.path())
            .arg(fail)
            .spawn()
    };
    let (a, b) = (agent(0), agent(1));
    [a.wait(), b.wait()]
}

/// Checks that every rank reached attempt `last` and finished there with one digest.
pub(crate) fn assert_finished(dir: &Path, world: usize, last: u32, outs: &[Output]) {
    let mut digests = BTreeMap::new();
    for rank in 0..world {
        let done = std::fs::read_to_string(dir.join(format!("done{rank}.json")))
            .unwrap_or_else(|e| panic!("rank {rank} did not finish ({e}): {outs:?}"));
        let v: serde_json::Value = serde_json::from_str(&done).expect("done json");
        assert_eq!(v["restart"], last, "rank {rank}: {v} {outs:?}");
        assert_eq!(v["world"], world, "rank {rank}: {v}");
        digests.insert(rank, v["digest"].as_str().unwrap_or("").to_string());
        // One line per attempt that got its process group: 0..=last, none repeated.
        let lines = std::fs::read_to_string(dir.join(format!("rank{rank}.jsonl"))).unwrap();
        let seen: Vec<u64> = lines
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["restart"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            seen,
            (0..=u64::from(last)).collect::<Vec<_>>(),
            "rank {rank}: {lines}"
        );
    }
    let first = digests[&0].clone();
    assert!(
        digests.values().all(|d| *d == first),
        "final weights differ: {digests:?}"
    );
}

#[test]
fn static_two_nodes_ddp_restart_once_after_a_failure_on_node_1() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("static_ddp_r1");
    let outs = two_nodes(&dir, &py, 1, "3");
    for o in &outs {
        o.assert_code(0);
    }
    assert_finished(dir.path(), 4, 1, &outs);
}

/// Three restarts, the failing rank alternating between the nodes (node 0 hosts the store).
#[test]
fn static_two_nodes_ddp_restart_three_times_failing_on_either_node() {
    let Some(py) = torch_python() else { return };
    let dir = TempDir::new("static_ddp_r3");
    let outs = two_nodes(&dir, &py, 3, "0,3,1");
    for o in &outs {
        o.assert_code(0);
    }
    assert_finished(dir.path(), 4, 3, &outs);
}
