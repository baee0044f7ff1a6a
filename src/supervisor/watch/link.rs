//! Hang detection for one attempt: [`HangLink`] holds the [`HangMonitor`] and its poll timer,
//! is fed worker exits and FileTimer activity by the watch task, and on a verdict captures every
//! live rank and writes `rank<R>.txt` files; the block to print travels in the
//! [`HangFinding`] (the observer prints it). What follows the verdict (stop the group, restart)
//! is the attempt's: [`HangFinding::kill`] says whether to.
//!
//! Multi-node ([`ClusterArgs`], from the rendezvous and the round's assignment): the local
//! quiet rule gives way to `hang::cluster` — each poll publishes this node's quiet state and
//! reads the others'; a verdict comes only when every node is quiet, once per round, and every
//! agent captures its own ranks, prints its block naming the other nodes' suspects too, and
//! stops its workers. A heartbeat past its budget still acts on its node alone (an explicit
//! contract of one rank); without the store, the local rule at twice the budget.
//!
//! Where the files go: `<log-dir>/attempt_<n>/hang/` when `--log-dir` names a directory (it
//! outlives the run); otherwise a private directory `rdrun-hang-<run id>-<pid>/attempt_<n>/`
//! under the temporary directory, named in the block, which rdrun never removes (the temporary
//! log directory is cleaned at the end of the run, and the stacks must survive it).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::{Interval, MissedTickBehavior};

use super::hang::capture::{store_waits_of, tcp_sockets_of};
use super::hang::cluster::{job_suspect, Cluster, ClusterQuiet, NodeFindings, Step};
use super::hang::filetimer::{epoch_now, is_heartbeat_scope};
use super::hang::{
    capture, CaptureOptions, CaptureTarget, HangMode, HangMonitor, HangReason, HangSettings,
    RankProcs, TimerMsg, Verdict,
};
use super::verdict::HangFinding;
use crate::rendezvous::{Assignment, Rendezvous, TcpRdzvStore};
use crate::store::state::Store;

/// What a multi-node attempt gives hang detection: the rendezvous store (None: a backend
/// without one, etcd) and this node's place in the round.
pub(crate) struct ClusterArgs {
    store: Option<Arc<TcpRdzvStore>>,
    prefix: String,
    node: u32,
    nodes: u32,
}

impl ClusterArgs {
    /// None for a single-node round (the local rule alone is right there).
    pub fn of(rdzv: Option<&Rendezvous>, asg: &Assignment) -> Option<ClusterArgs> {
        let r = rdzv?;
        (asg.group_world_size > 1).then(|| ClusterArgs {
            store: r.store.clone(),
            prefix: asg.store_prefix.clone(),
            node: u32::try_from(asg.group_rank).unwrap_or(u32::MAX),
            nodes: u32::try_from(asg.group_world_size).unwrap_or(u32::MAX),
        })
    }
}

/// Hang detection for one attempt; `None` from [`HangLink::new`] when it is off.
pub(crate) struct HangLink {
    monitor: HangMonitor,
    interval: Interval,
    settings: HangSettings,
    dir: PathBuf,
    /// A kill verdict was acted on: no more sampling in this attempt.
    done: bool,
    /// Multi-node: the cluster rule replaces the local quiet rule.
    cluster: Option<Cluster<Arc<TcpRdzvStore>>>,
}

impl HangLink {
    /// Starts detection for ranks spawned now; files of a verdict go to `dir`. `cluster`:
    /// this node's place in a multi-node round (module doc).
    pub fn new(
        settings: &HangSettings,
        dir: PathBuf,
        cluster: Option<ClusterArgs>,
    ) -> Option<HangLink> {
        let tty = std::io::stdin().is_terminal();
        let monitor = HangMonitor::new(settings, tty, Instant::now());
        if !monitor.enabled() {
            return None;
        }
        if tty && settings.mode == HangMode::Kill {
            tracing::info!("stdin is a terminal: hang detection observes only (never kills)");
        }
        // The first sample one interval after the spawn, not at once: nothing can be judged
        // before, and the workers' start is left undisturbed by a /proc scan.
        let poll = monitor.poll_interval();
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(HangLink {
            monitor,
            interval,
            settings: settings.clone(),
            dir,
            done: false,
            cluster: cluster.map(|c| Cluster::new(c.store, &c.prefix, c.node, c.nodes, poll)),
        })
    }

    /// Whether the poll arm should run.
    pub fn active(&self) -> bool {
        !self.done
    }

    /// Resolves at the next poll tick.
    pub async fn tick(&mut self) {
        self.interval.tick().await;
    }

    /// rdrun stopped `rank` itself (`--chaos hang`): not exempt from the quiet rule.
    pub fn stopped_by_rdrun(&mut self, rank: u32) {
        self.monitor
            .detector()
            .stopped_by_rdrun(rank, Instant::now());
    }

    /// A worker exited with torchrun's code (negative: killed by that signal).
    pub fn rank_exited(&mut self, rank: u32, code: i32) {
        self.monitor
            .detector()
            .rank_exited(rank, code, Instant::now());
    }

    /// A FileTimer message from `rank`'s tree: activity and progress. An acquire with an
    /// `rdrun/` scope and signal 0 is a heartbeat (spec §5.8): its expiration is the budget
    /// until the next beat; its release ends that contract.
    pub fn timer_msg(&mut self, rank: u32, pid: i32, msg: &TimerMsg) {
        let now = Instant::now();
        let d = self.monitor.detector();
        match msg {
            TimerMsg::Acquire {
                scope_id,
                expiration_time,
                signal: 0,
                ..
            } if is_heartbeat_scope(scope_id) => {
                let left = expiration_time - epoch_now();
                let budget = std::time::Duration::from_secs_f64(left.clamp(0.0, 1e9));
                d.heartbeat(rank, pid, now, Some(budget));
            }
            TimerMsg::Release { scope_id, .. } if is_heartbeat_scope(scope_id) => {
                d.heartbeat(rank, pid, now, None);
                d.end_heartbeat(rank);
            }
            _ => d.heartbeat(rank, pid, now, None),
        }
    }

    /// Samples the live ranks; on a verdict captures them, writes the files, prints the block
    /// and says what to do.
    /// `last_output(rank)`: that rank's last output lines, oldest first. `store`: the store
    /// rdrun hosts for these workers, if any (its pending waits are mapped to ranks).
    pub async fn poll(
        &mut self,
        live: &[RankProcs],
        last_output: impl Fn(u32) -> Vec<String>,
        store: Option<&Store>,
        judged: &mut (dyn FnMut() + Send),
    ) -> Option<HangFinding> {
        let now = Instant::now();
        let local = self.monitor.sample(now, live);
        let Some(cluster) = self.cluster.as_mut() else {
            return Some(
                self.act(local?, live, last_output, store, None, judged)
                    .await,
            );
        };
        // A heartbeat past its budget is one rank's own contract: acted on here alone (the
        // node's failure then takes the multi-node failure path). The local quiet rules give
        // way to the cluster's.
        if let Some(v) = local.filter(|v| matches!(v.reason, HangReason::Heartbeat { .. })) {
            return Some(self.act(v, live, last_output, store, None, judged).await);
        }
        let state = self.monitor.detector().node_state(now);
        let (node, nodes) = (cluster.node(), cluster.nodes());
        let (verdict, note) = match cluster.step(&state, now).await {
            Step::Nothing => return None,
            Step::Fallback(ClusterQuiet { quiet_for, budget }) => (
                self.monitor
                    .detector()
                    .declare(HangReason::Quiescence, quiet_for, budget, now),
                Some(format!(
                    "[rdrun]   the other nodes' state is unknown (the rendezvous store is unreachable, or the backend has none): local rule at {}x the budget\n",
                    super::hang::cluster::FALLBACK_FACTOR
                )),
            ),
            Step::Verdict(v) => {
                tracing::info!(by = v.by, node, nodes, "every node is quiet: the job hangs");
                (
                    self.monitor.detector().declare(
                        HangReason::Cluster {
                            nodes: v.nodes,
                            by: v.by,
                        },
                        Duration::from_millis(v.quiet_ms),
                        Duration::from_millis(v.budget_ms),
                        now,
                    ),
                    None,
                )
            }
        };
        let found = self
            .act(
                verdict,
                live,
                last_output,
                store,
                Some(note.unwrap_or_default()),
                judged,
            )
            .await;
        if found.kill {
            self.done = true;
        }
        Some(found)
    }

    /// Captures, writes the files, renders the block. `cluster_note`: Some for a multi-node
    /// verdict or fallback (lines to add to the block; a cluster verdict adds the other
    /// nodes' findings).
    async fn act(
        &mut self,
        verdict: Verdict,
        live: &[RankProcs],
        last_output: impl Fn(u32) -> Vec<String>,
        store: Option<&Store>,
        cluster_note: Option<String>,
        judged: &mut (dyn FnMut() + Send),
    ) -> HangFinding {
        // A kill verdict: the attempt learns of it before the capture, which takes time (the
        // other nodes' findings are waited for), so that nothing stops the workers under it.
        if verdict.action == HangMode::Kill {
            judged();
        }
        let mut store_waits = rank_store_waits(store, live.iter().map(|r| (r.rank, r.pid)));
        let targets: Vec<CaptureTarget> = live
            .iter()
            .filter(|r| verdict.ranks.iter().any(|v| v.rank == r.rank && v.alive))
            .map(|r| CaptureTarget {
                rank: r.rank,
                pid: r.pid,
                last_output: last_output(r.rank),
                store_waits: store_waits.remove(&r.rank).unwrap_or_default(),
            })
            .collect();
        let mut report = capture(
            &verdict,
            &targets,
            &CaptureOptions::from_settings(&self.settings),
        )
        .await;
        let files = match report.write_files(&self.dir) {
            Ok(_) => Some(self.dir.clone()),
            Err(err) => {
                tracing::warn!(dir = %self.dir.display(), "cannot write the hang capture: {err}");
                None
            }
        };
        let mut block = report.render();
        let mut suspect = report.suspects.first().copied();
        let mut suspect_reason = report.suspect_reason.clone();
        if let Some(note) = cluster_note {
            let mut extra = note;
            if matches!(verdict.reason, HangReason::Cluster { .. }) {
                let (lines, best) = self.cluster_findings(&report, files.as_deref()).await;
                extra.push_str(&lines);
                if let Some((rank, reason)) = best {
                    suspect = Some(rank);
                    suspect_reason = reason;
                }
            }
            // Before the last line (the action), so the block still ends with what rdrun does.
            let cut = block
                .trim_end_matches('\n')
                .rfind('\n')
                .map_or(0, |i| i + 1);
            block.insert_str(cut, &extra);
        }
        let kill = verdict.action == HangMode::Kill;
        if kill {
            self.done = true;
        }
        let what = block
            .lines()
            .next()
            .and_then(|l| l.split_once("): "))
            .map(|(_, w)| w.split("; captured").next().unwrap_or(w).to_string())
            .unwrap_or_else(|| "the job stopped making progress".to_string());
        let mut summary = what;
        if let Some(s) = suspect {
            summary.push_str(&format!(", suspect rank {s} ({suspect_reason})"));
        }
        if let Some(d) = files {
            summary.push_str(&format!("; stacks in {}", d.display()));
        }
        HangFinding {
            kill,
            suspect,
            summary,
            block,
        }
    }

    /// After a cluster verdict: publishes this node's findings, waits (bounded) for the other
    /// nodes', and returns the block's lines for them plus the job's suspect (global rank and
    /// why) when the strongest finding is another node's.
    async fn cluster_findings(
        &self,
        report: &super::hang::HangReport,
        files: Option<&Path>,
    ) -> (String, Option<(u32, String)>) {
        let Some(cluster) = self.cluster.as_ref() else {
            return (String::new(), None);
        };
        let mine = NodeFindings {
            node: cluster.node(),
            ranks: report.ranks.iter().map(|r| r.rank).collect(),
            suspects: report.suspects.clone(),
            reason: report.suspect_reason.clone(),
            files: files.map(|d| d.display().to_string()),
        };
        // The others capture after their next poll: allow one capture and a few polls.
        let bound = self.settings.capture_timeout.min(Duration::from_secs(10))
            + self.monitor.poll_interval() * 3
            + Duration::from_secs(1);
        let others = cluster.share_findings(&mine, bound).await;
        let mut lines = String::new();
        for (n, f) in &others {
            match f {
                None => lines.push_str(&format!(
                    "[rdrun]   node {n}: no findings within {}s\n",
                    bound.as_secs()
                )),
                Some(f) => {
                    let what = match f.suspects.as_slice() {
                        [] => "no suspect".to_string(),
                        s => format!(
                            "suspect rank {} ({})",
                            s.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
                            f.reason
                        ),
                    };
                    let at = f
                        .files
                        .as_deref()
                        .map(|d| format!("; stacks on that node in {d}"))
                        .unwrap_or_default();
                    lines.push_str(&format!(
                        "[rdrun]   node {n} ranks {:?}: {what}{at}\n",
                        f.ranks
                    ));
                }
            }
        }
        let all: Vec<&NodeFindings> = std::iter::once(&mine)
            .chain(others.values().flatten())
            .collect();
        let best = job_suspect(&all);
        if let Some((rank, f)) = best {
            lines.push_str(&format!(
                "[rdrun]   job suspect: rank {rank} on node {} ({})\n",
                f.node, f.reason
            ));
        }
        (lines, best.map(|(r, f)| (r, f.reason.clone())))
    }
}

/// The hosted store's pending waits of each `(rank, pid)`, mapped through the processes'
/// sockets (nothing to read when nobody waits).
pub(super) fn rank_store_waits(
    store: Option<&Store>,
    ranks: impl Iterator<Item = (u32, i32)>,
) -> std::collections::BTreeMap<u32, Vec<super::hang::capture::StoreWait>> {
    let waits = store.map(Store::pending_waits_by_peer).unwrap_or_default();
    if waits.is_empty() {
        return Default::default();
    }
    let sockets: Vec<_> = ranks
        .map(|(rank, pid)| (rank, tcp_sockets_of(Path::new("/proc"), pid)))
        .collect();
    store_waits_of(&waits, &sockets, Instant::now())
}
