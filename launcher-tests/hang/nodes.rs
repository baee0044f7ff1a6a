//! Multi-node hang detection (issue 13), two agents in network namespaces (skipped where not
//! root), small budgets: every node quiet gives one verdict for the job that every agent
//! captures and acts on, naming the other node's suspect (static and c10d backends); a busy
//! rank on one node keeps the quiet node from a verdict; a node whose cable is pulled judges
//! alone at twice the budget while the store's host declares the job hung.

use std::time::Duration;

use crate::util::{Rdrun, TempDir};

use super::find_dir;

/// One static agent of a 2-node job in network namespace `node` of `net`, with the small
/// budgets of [`launch_budget`] (2 s), its own log directory, `--max-restarts`, and
/// `sh -c script`.
fn netns_agent(
    net: &crate::netns::Netns,
    node: usize,
    nproc: usize,
    dir: &TempDir,
    max_restarts: u32,
    script: &str,
) -> Rdrun {
    netns_agent_on(net, node, nproc, dir, max_restarts, script, false)
}

/// As [`netns_agent`]; `c10d`: the c10d backend (endpoint on node 0, no `--node-rank`: the
/// group ranks are the rendezvous' choice) instead of static.
fn netns_agent_on(
    net: &crate::netns::Netns,
    node: usize,
    nproc: usize,
    dir: &TempDir,
    max_restarts: u32,
    script: &str,
    c10d: bool,
) -> Rdrun {
    let rdzv: Vec<String> = if c10d {
        [
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            &format!("{}:29400", net.addr(0)),
            "--rdzv-id",
            "hangjob",
        ]
        .map(String::from)
        .to_vec()
    } else {
        [
            "--nnodes",
            "2",
            "--node-rank",
            &node.to_string(),
            "--master-addr",
            &net.addr(0),
            "--master-port",
            "29500",
        ]
        .map(String::from)
        .to_vec()
    };
    Rdrun::new()
        .args(rdzv)
        .arg(format!("--max-restarts={max_restarts}"))
        .arg(format!("--nproc-per-node={nproc}"))
        .args(["--hang-timeout", "2", "--hang-startup-timeout", "2"])
        .args(["--hang-poll-interval", "0.25"])
        .env_remove("RDRUN_HANG_DETECT")
        .env_remove("RDRUN_HANG_TIMEOUT")
        .env_remove("RDRUN_HANG_STARTUP_TIMEOUT")
        .env_remove("RDRUN_HANG_POLL_INTERVAL")
        .env_remove("RDRUN_PY_SPY")
        .arg(format!(
            "--log-dir={}",
            dir.join(format!("logs{node}")).display()
        ))
        .args(["--tee", "3"])
        .env("D", dir.path())
        .timeout(Duration::from_secs(150))
        .netns(&net.name(node))
        .args(["--no-python", "sh", "-c", script])
}

/// The pids the workers of [`netns_agent`] scripts recorded (`pid.<rank>.<attempt>`).
fn recorded_worker_pids(dir: &std::path::Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("pid.").then_some(())?;
            std::fs::read_to_string(e.path()).ok()?.trim().parse().ok()
        })
        .collect()
}

/// Attempt 0: every rank of both nodes goes silent after one line; rank 4 (node 1) blocks
/// opening a FIFO nobody writes — on its node the odd kernel wait among 3 ranks, hence the
/// suspect — while the others sleep (on node 0 there is no odd one out). Attempt 1: every rank
/// prints and exits 0.
const TWO_NODE_HANG: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  echo "before the hang $RANK"
  if [ "$RANK" = 4 ]; then exec cat "$D/never"; fi
  exec sleep 300
fi
echo "ok rank $RANK attempt $TORCHELASTIC_RESTART_COUNT"
"#;

/// Multi-node (issue 13): every node quiet → one verdict for the job, taken by every agent:
/// each captures its own ranks and prints one block naming the same declaring node, node 0's
/// block names the suspect on node 1, both stop their workers and the job restarts once.
#[test]
fn netns_two_nodes_one_hung_rank_every_agent_captures_and_restarts() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns");
        let fifo = dir.join("never");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: plain mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 3, &dir, 1, TWO_NODE_HANG).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        for o in &outs {
            o.assert_code(0);
            assert_eq!(o.stderr.matches("[rdrun] HANG (").count(), 1, "{o:?}");
            assert!(o.stderr.contains("no activity on any of 2 nodes"), "{o:?}");
            assert!(o.stderr.contains("stopping the worker group"), "{o:?}");
            // The job's suspect, in every node's block (node 1 found it, node 0 read it).
            assert!(o.stderr.contains("job suspect: rank 4 on node 1"), "{o:?}");
        }
        // One verdict: both blocks name the same declaring node.
        let by = |o: &crate::util::Output| {
            let i = o.stderr.find("declared by node ").expect("declared by") + 17;
            o.stderr[i..i + 1].to_string()
        };
        assert_eq!(by(&outs[0]), by(&outs[1]));
        // Node 0's block lists node 1's findings; node 1 marks rank 4 itself.
        assert!(
            outs[0]
                .stderr
                .contains("node 1 ranks [3, 4, 5]: suspect rank 4"),
            "{:?}",
            outs[0]
        );
        let line = outs[1]
            .stderr
            .lines()
            .find(|l| l.contains("<- suspect"))
            .unwrap_or_else(|| panic!("node 1 names no suspect: {:?}", outs[1]));
        assert!(line.contains("rank 4 pid"), "{line}");
        // Every node captured its own ranks, then restarted with one count.
        for (n, ranks) in [(0usize, 0..3u32), (1, 3..6)] {
            let hang = find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                .expect("attempt_0")
                .join("hang");
            for r in ranks.clone() {
                assert!(
                    hang.join(format!("rank{r}.txt")).is_file(),
                    "node {n} rank {r} not captured in {hang:?}"
                );
                assert!(
                    outs[n].stdout.contains(&format!("ok rank {r} attempt 1")),
                    "{:?}",
                    outs[n]
                );
            }
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// The same over the c10d backend (its store on node 0's agent): one verdict, every agent
/// captures and restarts, the suspect named in both blocks. Which agent gets group rank 1 is
/// the rendezvous' choice, so the checks do not depend on the agent's index.
#[test]
fn netns_c10d_two_nodes_one_hung_rank_one_verdict() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_c10d");
        let fifo = dir.join("never");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: plain mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent_on(&net, n, 3, &dir, 1, TWO_NODE_HANG, true).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        let mut declared = Vec::new();
        for o in &outs {
            o.assert_code(0);
            assert_eq!(o.stderr.matches("[rdrun] HANG (").count(), 1, "{o:?}");
            assert!(o.stderr.contains("no activity on any of 2 nodes"), "{o:?}");
            assert!(o.stderr.contains("job suspect: rank 4 on node 1"), "{o:?}");
            let i = o.stderr.find("declared by node ").expect("declared by") + 17;
            declared.push(o.stderr[i..i + 1].to_string());
        }
        assert_eq!(declared[0], declared[1], "one verdict for the job");
        let stdout: String = outs.iter().map(|o| o.stdout.as_str()).collect();
        for r in 0..6 {
            assert!(
                stdout.contains(&format!("ok rank {r} attempt 1")),
                "rank {r} did not restart: {outs:?}"
            );
            let captured = (0..2).any(|n| {
                find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                    .is_some_and(|d| d.join("hang").join(format!("rank{r}.txt")).is_file())
            });
            assert!(captured, "rank {r} not captured");
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Attempt-less: ranks 0, 1 (node 0) and 2 (node 1) block silently on their own FIFO; rank 3
/// (node 1) burns CPU for 12 s (6x the budget, 3x the fallback budget), then opens each FIFO
/// and exits; every rank exits 0.
const ONE_BUSY_NODE: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
if [ "$RANK" = 3 ]; then
  end=$(( $(date +%s) + 12 ))
  while [ "$(date +%s)" -lt "$end" ]; do :; done
  touch "$D/busy_done"
  for r in 0 1 2; do echo go > "$D/f$r"; done
  exit 0
fi
exec cat "$D/f$RANK"
"#;

/// Multi-node: a node with an active rank keeps the quiet node from a verdict. Node 0's ranks
/// are silent far past the 2 s budget (the local rule alone fires there), but node 1's rank 3
/// burns CPU the whole time; the run then ends normally with no hang reported anywhere.
#[test]
fn netns_active_rank_on_one_node_prevents_the_verdict_on_the_other() {
    crate::netns::bounded(Duration::from_secs(240), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_busy");
        for r in 0..3 {
            let c = std::ffi::CString::new(dir.join(format!("f{r}")).to_str().unwrap()).unwrap();
            // SAFETY: plain mkfifo(3) on a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        }
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 2, &dir, 0, ONE_BUSY_NODE).spawn())
            .collect();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        for o in &outs {
            assert!(!o.stderr.contains("HANG"), "{o:?}");
            o.assert_code(0);
        }
        assert!(dir.join("busy_done").exists(), "rank 3 did not finish");
        for r in 0..3 {
            let n = usize::from(r >= 2);
            assert!(
                outs[n].stdout.contains("go"),
                "rank {r} never got its go: {:?}",
                outs[n]
            );
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}

/// Every rank prints a line every 0.2 s (activity: no verdict is possible) until `$D/quiet`
/// exists, then goes silent.
const TICK_THEN_QUIET: &str = r#"
echo $$ > "$D/pid.$RANK.$TORCHELASTIC_RESTART_COUNT"
while [ ! -e "$D/quiet" ]; do echo "tick $RANK"; sleep 0.2; done
exec sleep 300
"#;

/// Multi-node with the store lost (issue 13): node 1's cable is pulled while every rank is
/// still active, then every rank goes quiet. Node 1 cannot read the other nodes' state, so it
/// judges alone at twice the budget and says so in its block; node 0 (the store's host) sees
/// node 1's report stop changing, counts it quiet since last seen, and declares the job hung.
/// Both capture their own ranks and stop their workers (no restarts left). The order is made
/// by the files, not by timing: nothing can be judged before `$D/quiet` exists.
#[test]
fn netns_store_lost_node_falls_back_to_the_local_rule() {
    crate::netns::bounded(Duration::from_secs(300), || {
        let Some(net) = crate::netns::Netns::create(2) else {
            return;
        };
        let dir = TempDir::new("hang_netns_lost");
        let runs: Vec<_> = (0..2)
            .map(|n| netns_agent(&net, n, 2, &dir, 0, TICK_THEN_QUIET).spawn())
            .collect();
        // Every rank of both nodes is running (and ticking) before the cut.
        let started = std::time::Instant::now();
        while (0..4).any(|r| !dir.join(format!("pid.{r}.0")).exists()) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "workers did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let node 1 publish a few reports first (it is then a node node 0 has seen).
        std::thread::sleep(Duration::from_secs(1));
        net.cut(1);
        std::fs::write(dir.join("quiet"), "").unwrap();
        let outs: Vec<_> = runs.into_iter().map(|r| r.wait()).collect();
        // Node 1: the local rule at 2x the budget, named in its one block.
        let o1 = &outs[1];
        assert_eq!(o1.stderr.matches("[rdrun] HANG (").count(), 1, "{o1:?}");
        assert!(
            o1.stderr
                .contains("the other nodes' state is unknown (the rendezvous store is unreachable"),
            "{o1:?}"
        );
        assert!(
            o1.stderr.contains("(budget 4s)"),
            "twice the 2 s budget: {o1:?}"
        );
        assert!(o1.stderr.contains("stopping the worker group"), "{o1:?}");
        assert_ne!(o1.code, Some(0), "{o1:?}");
        // Node 0: every node quiet (node 1's report stale), the job's verdict.
        let o0 = &outs[0];
        assert_eq!(o0.stderr.matches("[rdrun] HANG (").count(), 1, "{o0:?}");
        assert!(
            o0.stderr.contains("no activity on any of 2 nodes"),
            "{o0:?}"
        );
        assert_ne!(o0.code, Some(0), "{o0:?}");
        for (n, ranks) in [(0usize, 0..2u32), (1, 2..4)] {
            let hang = find_dir(&dir.join(format!("logs{n}")), "attempt_0")
                .expect("attempt_0")
                .join("hang");
            for r in ranks {
                assert!(
                    hang.join(format!("rank{r}.txt")).is_file(),
                    "node {n} rank {r} not captured in {hang:?}"
                );
            }
        }
        crate::util::assert_no_leak(&recorded_worker_pids(dir.path()), Duration::from_secs(10));
    });
}
