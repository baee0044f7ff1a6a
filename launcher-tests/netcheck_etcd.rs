//! The network pre-check on the etcd backend (issue 28 item 3): the probe addresses and the
//! results go through etcd keys under the run's prefix instead of a TCPStore, so the check names
//! the slow node, and a slow node with a spare leaves, exactly as on c10d (`netcheck`). Against
//! the real etcd of `etcd.rs`'s [`Testbed`] (skipped with a message where etcd is missing); the
//! slow node is a namespace host rate-limited with `tc tbf` (skipped without namespaces).
//!
//! Every agent runs under the runner's hard bound; the members and namespaces go on drop.

use std::time::Duration;

use crate::etcd::Testbed;
use crate::netcheck::{
    assert_slow_host1_left_out, failing_host2_leaves, named, started, SLOW_RATE, WORKER,
};
use crate::netns::bounded;
use crate::util::{Output, Rdrun, TempDir};

const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// One etcd agent of an elastic `nnodes` job on host `i` (named `host<i>` in namespaces), with
/// the network check on; its worker records `ran.<GROUP_WORLD_SIZE>.<restart>.<RANK>` in `dir`,
/// then runs `script`.
fn agent_running(
    tb: &Testbed,
    i: usize,
    dir: &TempDir,
    run: &str,
    nnodes: &str,
    extra: &[&str],
    script: &str,
) -> Rdrun {
    // Info level: a failure shows where each agent was (the rendezvous, the check).
    let r = Rdrun::new()
        .timeout(AGENT_TIMEOUT)
        .env("RUST_LOG", "info")
        .args([
            "--nnodes",
            nnodes,
            "--rdzv-backend",
            "etcd-v3",
            "--rdzv-endpoint",
            &tb.endpoints(),
            "--rdzv-id",
            run,
            "--rdzv-conf",
            "last_call_timeout=20",
            "--network-check",
            "on",
        ]);
    let r = match &tb.net {
        Some(net) => r.netns(&net.name(i)).hostname(&format!("host{i}")),
        None => r.args(["--local-addr".to_string(), tb.addr(i)]),
    };
    r.arg("--bad-nodes-file")
        .arg(dir.join("bad-nodes"))
        .args(extra)
        .args(["--no-python", "sh", "-c", WORKER, "sh"])
        .arg(dir.path())
        .arg(script)
}

/// [`agent_running`] a worker that succeeds.
fn agent(tb: &Testbed, i: usize, dir: &TempDir, run: &str, nnodes: &str, extra: &[&str]) -> Rdrun {
    agent_running(tb, i, dir, run, nnodes, extra, "exit 0")
}

fn no_skip(outs: &[Output]) {
    for o in outs {
        assert!(!o.stderr.contains("network check skipped"), "{o:?}");
    }
}

/// `--nnodes 2:3` on three hosts, host 1 rate-limited: every node names host 1; it leaves before
/// any worker starts (exit 75, remembered in --bad-nodes-file) and the other two run the job in
/// the next round at restart count 0, as on c10d.
#[test]
fn etcd_with_a_spare_the_slow_node_is_named_and_left_out() {
    bounded(Duration::from_secs(420), || {
        let Some(tb) = Testbed::new(3, 1) else { return };
        let Some(net) = &tb.net else {
            eprintln!("SKIPPED: no network namespaces here for a rate-limited link");
            return;
        };
        let dir = TempDir::new("netcheck_etcd_spare");
        net.slow(1, SLOW_RATE);
        let runs: Vec<_> = (0..3)
            .map(|i| agent(&tb, i, &dir, "netetcd1", "2:3", &[]).spawn())
            .collect();
        let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
        no_skip(&outs);
        assert_slow_host1_left_out(&outs, &net.addr(1), dir.path());
    });
}

/// An even network: the check runs on etcd (its event has every node's score) and names
/// nobody, 3 runs; the job runs on all three.
#[test]
fn etcd_on_an_even_network_nobody_is_named() {
    bounded(Duration::from_secs(300), || {
        let Some(tb) = Testbed::new(3, 1) else { return };
        for run in 0..3 {
            let dir = TempDir::new("netcheck_etcd_even");
            let events = dir.join("events.jsonl");
            let id = format!("netetcdeven{run}");
            let runs: Vec<_> = (0..3)
                .map(|i| {
                    let ev = ["--events", events.to_str().unwrap()];
                    let extra: &[&str] = if i == 0 { &ev } else { &[] };
                    agent(&tb, i, &dir, &id, "3", extra).spawn()
                })
                .collect();
            let outs: Vec<Output> = runs.into_iter().map(|r| r.wait()).collect();
            no_skip(&outs);
            for o in &outs {
                o.assert_code(0);
                assert!(named(o).is_empty(), "run {run}: {o:?}");
            }
            assert_eq!(
                started(dir.path()),
                ["ran.3.0.0", "ran.3.0.1", "ran.3.0.2"],
                "{outs:?}"
            );
            let text = std::fs::read_to_string(&events).unwrap();
            let ev: serde_json::Value = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["event"] == "network_check")
                .unwrap_or_else(|| panic!("no network_check event in {text}"));
            assert_eq!(ev["nodes"].as_array().unwrap().len(), 3, "{ev}");
            // The pre-check's time on node 0 (docs/benchmarks.md quotes it).
            eprintln!("etcd network check, 3 hosts, run {run}: {} ms", ev["ms"]);
            assert_eq!(ev["slow"].as_array().unwrap().len(), 0, "{ev}");
            assert!(
                ev["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|n| n["bytes_per_second"].as_f64().unwrap_or(0.0) > 0.0),
                "{ev}"
            );
        }
    });
}

/// `--max-node-failures 2` on etcd: the host whose workers fail in every attempt leaves the
/// elastic job after its second failure (exit 75, remembered in --bad-nodes-file) while
/// restarts were left, as on c10d; its report has its counts and the run's, read back from
/// etcd; the other two finish in the next round.
#[test]
fn etcd_a_node_that_failed_twice_leaves() {
    bounded(Duration::from_secs(300), || {
        let Some(tb) = Testbed::new(3, 1) else { return };
        if tb.net.is_none() {
            eprintln!("SKIPPED: no network namespaces here for hosts of their own names");
            return;
        }
        let dir = TempDir::new("netcheck_etcd_failures");
        let report = dir.join("report.json");
        failing_host2_leaves(&dir, &report, |i, extra, script| {
            agent_running(&tb, i, &dir, "etcdfail", "2:3", extra, script)
        });
    });
}
