//! An unhealthy elastic node does not outlive the job it stayed out of (issue 38.5), with real
//! agents: under `--health-check on` a node whose check fails does not join an elastic job and
//! checks again after a back-off; once the job ends without it, it ends too, as a bad node
//! (exit 75, remembered in `--bad-nodes-file`), instead of checking on until the join timeout
//! (600 s here, as by default) while it holds its allocation. On c10d (loopback, distinct
//! `--local-addr`) the store goes with the agent that hosted it; on etcd (`etcd`'s testbed) the
//! rendezvous is closed and etcd stays.
//!
//! The order is made, not timed: the healthy node's worker waits (bounded) until the bad node's
//! check has run once, so the bad node is outside, waiting, when the job ends. Every agent runs
//! under a hard bound far below the join timeout.

use std::path::Path;
use std::time::Duration;

use crate::util::{free_port, Output, Rdrun, TempDir};

/// Hard bound on one agent: before the fix the bad node ran into it (join timeout 600 s).
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// The healthy node's worker: waits (at most 120 s) until the bad node's check ran, then
/// records the world it ran in (`ran.<GROUP_WORLD_SIZE>`).
const WORKER: &str = r#"i=0
while [ ! -e "$1/checked" ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.1; done
echo > "$1/ran.$GROUP_WORLD_SIZE""#;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// What the bad node gets beyond the rendezvous flags: the check that marks it ran and fails,
/// the failure memory, and the (never started) program.
fn bad_node_args(r: Rdrun, dir: &Path) -> Rdrun {
    r.args(["--health-check", "on", "--health-check-cmd"])
        .arg(format!("touch '{}/checked'; exit 1", dir.display()))
        .arg("--bad-nodes-file")
        .arg(dir.join("bad-nodes"))
}

fn with_program(r: Rdrun, dir: &Path) -> Rdrun {
    r.args(["--no-python", "sh", "-c", WORKER, "sh"]).arg(dir)
}

/// The healthy node ran the job alone; the bad node ended as a bad node because the job was
/// over, remembered in the file, without waiting for its join timeout.
fn assert_outlived_nothing(dir: &Path, good: &Output, bad: &Output) {
    good.assert_code(0);
    assert!(dir.join("ran.1").exists(), "{good:?}");
    bad.assert_code(75);
    assert!(
        bad.stderr
            .contains("the run this node waited to join is over ("),
        "{bad:?}"
    );
    assert!(
        bad.stderr
            .contains(&format!("{} failed the health check: command", hostname())),
        "{bad:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("bad-nodes")).unwrap(),
        format!("{}\n", hostname()),
        "{bad:?}"
    );
}

/// c10d, `--nnodes 1:2`: the store's host is healthy and runs the job; the other node fails its
/// check. When the host's job ends its store goes with it, and the bad node ends at once.
#[test]
fn an_unhealthy_c10d_node_ends_when_the_job_does() {
    let dir = TempDir::new("health_outside_c10d");
    let port = free_port();
    let agent = |h: usize| {
        Rdrun::new().timeout(AGENT_TIMEOUT).args([
            "--nnodes",
            "1:2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &format!("127.0.0.1:{port}"),
            "--rdzv-id",
            "outside",
            "--rdzv-conf",
            &format!("last_call_timeout=1,join_timeout=600,is_host={}", h == 1),
            "--local-addr",
            &format!("127.0.0.{h}"),
            "--nproc-per-node",
            "1",
        ])
    };
    let good = with_program(agent(1), dir.path()).spawn();
    let bad = with_program(bad_node_args(agent(2), dir.path()), dir.path()).spawn();
    let (good, bad) = (good.wait(), bad.wait());
    assert_outlived_nothing(dir.path(), &good, &bad);
}

/// etcd, `--nnodes 1:2`: the healthy node runs the job and closes the rendezvous; the bad
/// node reads the close and ends at once (etcd itself stays up).
#[cfg(feature = "etcd")]
#[test]
fn an_unhealthy_etcd_node_ends_when_the_job_does() {
    crate::netns::bounded(Duration::from_secs(300), || {
        let Some(tb) = crate::etcd::Testbed::new(2, 1) else {
            return;
        };
        let dir = TempDir::new("health_outside_etcd");
        let agent = |i: usize| {
            let r = Rdrun::new().timeout(AGENT_TIMEOUT).args([
                "--nnodes",
                "1:2",
                "--rdzv-backend",
                "etcd-v3",
                "--rdzv-endpoint",
                &tb.endpoints(),
                "--rdzv-id",
                "outside",
                "--rdzv-conf",
                "last_call_timeout=1,join_timeout=600",
                "--nproc-per-node",
                "1",
            ]);
            match &tb.net {
                Some(net) => r.netns(&net.name(i)),
                None => r.args(["--local-addr".to_string(), tb.addr(i)]),
            }
        };
        let good = with_program(agent(0), dir.path()).spawn();
        let bad = with_program(bad_node_args(agent(1), dir.path()), dir.path()).spawn();
        let (good, bad) = (good.wait(), bad.wait());
        assert_outlived_nothing(dir.path(), &good, &bad);
        assert!(
            bad.stderr
                .contains("the run this node waited to join is over (the rendezvous was closed)"),
            "{bad:?}"
        );
    });
}
