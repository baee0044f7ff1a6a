//! The agent's side of hang detection (issue 13): one [`HangLink`] per attempt holds the
//! [`HangMonitor`] and its poll timer, feeds it worker exits, and on a verdict captures every
//! live rank, writes `rank<R>.txt` files and prints the one block on stderr. What follows the
//! verdict (stop the group, restart) is the agent's: [`HangFinding::kill`] says whether to.
//! [`FileTimerServe`] serves torch's FileTimer FIFO for the whole run; on an expiry the attempt
//! captures the expired processes first ([`capture_timer_expiry`], the same capture and files
//! as a hang) and then sends each its timer's signal.
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
use super::hang::{
    capture, CaptureOptions, CaptureTarget, HangMode, HangMonitor, HangReason, HangSettings,
    RankProcs, TimerExpiry, TimerFifo, TimerMsg, TimerTable, Verdict,
};
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

/// What the agent does with a verdict.
#[derive(Debug, Clone)]
pub(crate) struct HangFinding {
    /// Stop the group and take the failure path (kill mode); else only report (observe).
    pub kill: bool,
    /// The suspect the capture named first (global rank), if any.
    pub suspect: Option<u32>,
    /// One line for the failure report's root cause, e.g. `no activity on any of 2 ranks for
    /// 3s (budget 3s), suspect rank 1; stacks in DIR`.
    pub summary: String,
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
    ) -> Option<HangFinding> {
        let now = Instant::now();
        let local = self.monitor.sample(now, live);
        let Some(cluster) = self.cluster.as_mut() else {
            return Some(self.act(local?, live, last_output, store, None).await);
        };
        // A heartbeat past its budget is one rank's own contract: acted on here alone (the
        // node's failure then takes the multi-node failure path). The local quiet rules give
        // way to the cluster's.
        if let Some(v) = local.filter(|v| matches!(v.reason, HangReason::Heartbeat { .. })) {
            return Some(self.act(v, live, last_output, store, None).await);
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
            )
            .await;
        if found.kill {
            self.done = true;
        }
        Some(found)
    }

    /// Captures, writes the files, prints the block. `cluster_note`: Some for a multi-node
    /// verdict or fallback (lines to add to the block; a cluster verdict adds the other
    /// nodes' findings).
    async fn act(
        &mut self,
        verdict: Verdict,
        live: &[RankProcs],
        last_output: impl Fn(u32) -> Vec<String>,
        store: Option<&Store>,
        cluster_note: Option<String>,
    ) -> HangFinding {
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
        super::output::own::stderr(&block);
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
fn rank_store_waits(
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

/// A FileTimer expiry of a live worker's tree, as the agent found it: captured before the
/// signal goes out (issue 13: "capture that rank, then signal that worker only").
pub(crate) struct ExpiredTarget {
    pub expiry: TimerExpiry,
    /// The worker (the tree's root) the expired process belongs to: its output tail.
    pub last_output: Vec<String>,
    /// The earliest expired timer's expiration (seconds since the epoch, torch's clock).
    pub expired_at: f64,
}

/// Captures the processes whose FileTimers expired — Python stack, kernel waits, last output,
/// store waits — in parallel and bounded like a hang capture, writes `rank<R>.txt` into `dir`,
/// prints the one block and returns the finding for the failure report (`kill`: the signal is
/// the timer's to send; the caller sends it after this returns). Capture works whether hang
/// detection is on or off: the script opted into the watchdog, and its stack is the point.
pub(crate) async fn capture_timer_expiry(
    settings: &HangSettings,
    dir: &Path,
    expired: Vec<ExpiredTarget>,
    store: Option<&Store>,
) -> HangFinding {
    let now = epoch_now();
    let overdue = expired
        .iter()
        .map(|t| now - t.expired_at)
        .fold(0.0_f64, f64::max);
    let mut store_waits =
        rank_store_waits(store, expired.iter().map(|t| (t.expiry.rank, t.expiry.pid)));
    let targets: Vec<CaptureTarget> = expired
        .iter()
        .map(|t| CaptureTarget {
            rank: t.expiry.rank,
            pid: t.expiry.pid,
            last_output: t.last_output.clone(),
            store_waits: store_waits.remove(&t.expiry.rank).unwrap_or_default(),
        })
        .collect();
    let each: Vec<String> = expired
        .iter()
        .map(|t| {
            let e = &t.expiry;
            format!(
                "rank {} scope {:?} ({})",
                e.rank,
                e.scopes.join(","),
                e.signal
            )
        })
        .collect();
    let verdict = Verdict {
        reason: HangReason::FileTimer {
            expired: expired.into_iter().map(|t| t.expiry).collect(),
        },
        phase: super::hang::Phase::Steady,
        quiet_for: Duration::from_secs_f64(overdue.clamp(0.0, 1e9)),
        budget: Duration::ZERO,
        action: HangMode::Kill,
        ranks: Vec::new(),
    };
    let mut report = capture(&verdict, &targets, &CaptureOptions::from_settings(settings)).await;
    let files = match report.write_files(dir) {
        Ok(_) => Some(dir.to_path_buf()),
        Err(err) => {
            tracing::warn!(dir = %dir.display(), "cannot write the FileTimer capture: {err}");
            None
        }
    };
    super::output::own::stderr(&report.render());
    let mut summary = format!("torch FileTimer expired: {}", each.join("; "));
    if let Some(d) = files {
        summary.push_str(&format!("; stacks in {}", d.display()));
    }
    HangFinding {
        kill: true,
        suspect: report.suspects.first().copied(),
        summary,
    }
}

/// torch's FileTimer watchdog served the right way (issue 13): with
/// `TORCHELASTIC_ENABLE_FILE_TIMER=1` in rdrun's environment, as torchrun, the FIFO is created
/// before any worker starts (at `TORCHELASTIC_TIMER_FILE` if set, else in a private 0700
/// directory whose FIFO path every worker gets), kept across restarts and removed at the end.
/// An expired timer's signal goes to that process only, and only if it belongs to a worker's
/// process tree — never to rdrun (torchrun SIGKILLs itself) — and the worker's death takes the
/// normal failure path.
pub(crate) struct FileTimerServe {
    fifo: TimerFifo,
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<TimerMsg, String>>,
    table: TimerTable,
    /// The private directory rdrun made for the FIFO (removed at the end).
    private_dir: Option<PathBuf>,
    interval: Interval,
}

/// What woke the FileTimer arm.
pub(crate) enum TimerWake {
    Msg(Result<TimerMsg, String>),
    /// Time to look for expired timers.
    Check,
}

/// How often armed timers are checked (torch's server: `max_interval` 0.1 s).
const TIMER_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl FileTimerServe {
    /// `None` unless `TORCHELASTIC_ENABLE_FILE_TIMER` is `"1"`; else the server and, when rdrun
    /// chose the path, the `TORCHELASTIC_TIMER_FILE` value every worker must get. Must run
    /// inside the tokio runtime.
    pub fn start(
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<(FileTimerServe, Option<String>)>, String> {
        if env("TORCHELASTIC_ENABLE_FILE_TIMER").as_deref() != Some("1") {
            return Ok(None);
        }
        let (path, private_dir) = match env("TORCHELASTIC_TIMER_FILE").filter(|p| !p.is_empty()) {
            Some(p) => (PathBuf::from(p), None),
            None => {
                let dir = private_dir().map_err(|e| {
                    format!("cannot create a private directory for the FileTimer FIFO: {e}")
                })?;
                (dir.join("watchdog_timer"), Some(dir))
            }
        };
        let cleanup = |d: &Option<PathBuf>| {
            if let Some(d) = d {
                let _ = std::fs::remove_dir(d);
            }
        };
        let fifo = TimerFifo::create(&path).map_err(|e| {
            cleanup(&private_dir);
            format!(
                "cannot create the FileTimer FIFO {} (TORCHELASTIC_ENABLE_FILE_TIMER=1): {e}",
                path.display()
            )
        })?;
        let rx = fifo.serve().map_err(|e| {
            format!(
                "cannot open the FileTimer FIFO {}: {e}",
                fifo.path().display()
            )
        })?;
        let mut interval = tokio::time::interval(TIMER_CHECK);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let worker_path = private_dir
            .is_some()
            .then(|| fifo.path().to_string_lossy().into_owned());
        tracing::info!(path = %fifo.path().display(), "serving torch's FileTimer watchdog");
        Ok(Some((
            FileTimerServe {
                fifo,
                rx,
                table: TimerTable::default(),
                private_dir,
                interval,
            },
            worker_path,
        )))
    }

    /// The next message, or the next check while some timer is armed.
    pub async fn next(&mut self) -> TimerWake {
        let armed = !self.table.is_empty();
        tokio::select! {
            m = self.rx.recv() => match m {
                Some(m) => TimerWake::Msg(m),
                // The reader task ended (the FIFO failed): nothing more will come.
                None => std::future::pending().await,
            },
            _ = self.interval.tick(), if armed => TimerWake::Check,
        }
    }

    pub fn apply(&mut self, msg: TimerMsg) {
        self.table.apply(msg);
    }

    /// Takes the timers expired by now (wall clock, as torch's client sets them).
    pub fn expired(&mut self) -> Vec<super::hang::filetimer::Expired> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.table.take_expired(now)
    }

    /// A new attempt: the previous workers' timers are void.
    pub fn clear(&mut self) {
        self.table.clear();
    }
}

impl Drop for FileTimerServe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.fifo.path());
        if let Some(d) = &self.private_dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A fresh 0700 directory `rdrun-timer-<pid>-<n>` under the temporary directory.
fn private_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = None;
    for i in 0..16u32 {
        let d = base.join(format!(
            "rdrun-timer-{}-{:08x}",
            std::process::id(),
            seed.wrapping_add(i.wrapping_mul(0x9e37_79b9))
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

/// The worker (of `workers`, live main pids) whose process tree holds `pid`: `pid` itself or
/// an ancestor, found by walking `/proc/<pid>/stat` parents.
pub(crate) fn owning_worker(pid: i32, workers: &[i32]) -> Option<i32> {
    let mut p = pid;
    for _ in 0..64 {
        if p <= 1 {
            return None;
        }
        if workers.contains(&p) {
            return Some(p);
        }
        let text = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        p = super::hang::sample::parse_stat(&text)?.ppid;
    }
    None
}

/// The store keys torch's ProcessGroupNCCL uses to broadcast a fatal dump to every rank
/// (`kStoreDumpKey`, `kStoreErrorSignalKey`; spec hang-detection §2). They sit at the store root,
/// outside every attempt prefix (torch strips all prefixes first), so a store that outlives an
/// attempt would hand a stale one to the next attempt's ranks: a dump and an abort ~8 minutes
/// into a healthy job. On the wire torch's TCPStore client puts `/` before every key, so the
/// server holds `/exception_dump`; the bare form is what another client may write.
pub(crate) const TORCH_DUMP_KEYS: [&str; 4] = [
    "/exception_dump",
    "/remote_error",
    "exception_dump",
    "remote_error",
];

/// Deletes [`TORCH_DUMP_KEYS`] from a store rdrun hosts; returns those that were there.
pub(crate) fn clear_torch_dump_keys(store: &crate::store::state::Store) -> Vec<&'static str> {
    TORCH_DUMP_KEYS
        .into_iter()
        .filter(|k| store.delete(k.as_bytes()))
        .collect()
}

/// Whether a FileTimer scope is rdrun's (heartbeat policy, never a kill when its signal is 0).
pub(crate) fn is_heartbeat_scope(scope: &str) -> bool {
    scope.starts_with("rdrun/")
}

fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Where an attempt's hang files go (module doc).
pub(crate) fn hang_dir(
    log_dir: Option<&Path>,
    attempt_dir: Option<&Path>,
    run_id: &str,
    attempt: u32,
) -> PathBuf {
    match (log_dir, attempt_dir) {
        (Some(d), Some(a)) if d != Path::new("/dev/null") => a.join("hang"),
        _ => {
            let safe: String = run_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            std::env::temp_dir()
                .join(format!("rdrun-hang-{safe}-{}", std::process::id()))
                .join(format!("attempt_{attempt}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_dump_keys_are_deleted_and_nothing_else() {
        let store = crate::store::state::Store::new();
        // As torch's TCPStore client writes them (a `/` before the key), and bare.
        store.set(b"/exception_dump".to_vec(), 1i32.to_le_bytes().to_vec());
        store.set(b"/remote_error".to_vec(), b"rank 1".to_vec());
        store.set(b"exception_dump".to_vec(), b"x".to_vec());
        store.set(b"/worker/attempt_0/exception_dump".to_vec(), b"x".to_vec());
        assert_eq!(
            clear_torch_dump_keys(&store),
            ["/exception_dump", "/remote_error", "exception_dump"]
        );
        assert!(store.get(b"/exception_dump").is_none() && store.get(b"/remote_error").is_none());
        assert!(store.get(b"/worker/attempt_0/exception_dump").is_some());
        assert!(
            clear_torch_dump_keys(&store).is_empty(),
            "second time: nothing left"
        );
    }

    #[test]
    fn files_go_under_the_log_dir_else_a_named_temp_dir() {
        let a = Path::new("/logs/run/attempt_1");
        assert_eq!(
            hang_dir(Some(Path::new("/logs")), Some(a), "x", 1),
            a.join("hang")
        );
        let t = hang_dir(None, Some(a), "a/b", 2);
        assert!(t.starts_with(std::env::temp_dir()), "{t:?}");
        assert!(t.ends_with("attempt_2"), "{t:?}");
        let name = t.parent().unwrap().file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("rdrun-hang-a_b-"), "{name}");
        let n = hang_dir(Some(Path::new("/dev/null")), None, "x", 0);
        assert!(n.starts_with(std::env::temp_dir()), "{n:?}");
    }
}
