//! The watch task: hang detection, the D-state check and torch's FileTimer server run here, as
//! one tokio task of their own beside the agent. The agent tells it what to watch
//! ([`Watch::attempt`], each attempt's ranks and monitors), which ranks exited
//! ([`Watch::exited`]) and when to stop judging ([`Watch::pause`], the group is being stopped);
//! the task samples, judges, captures, and sends each verdict back ([`Watch::next`], an
//! [`super::verdict::WatchVerdict`] that the agent hands to the attempt as an event). It never
//! touches the attempt's state, never signals a worker and never prints: a FileTimer expiry's
//! signal is the attempt's to send, the capture's block is the observer's to print.
//!
//! A capture takes time (py-spy, bounded by `--hang-capture-timeout`); while it runs the agent
//! goes on reaping and stopping, and the verdict carries when its sample was taken so that the
//! attempt can order it against a failure it saw meanwhile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::dstate::DStateWatch;
use super::hang::filetimer::{is_heartbeat_scope, Expired};
use super::hang::filetimer::{scope_list, WARN_INTERVAL};
use super::hang::{HangSettings, OutputCounter, RankProcs, TimerExpiry};
use super::link::HangLink;
use super::timers::{
    capture_timer_expiry, owning_worker, ExpiredTarget, FileTimerServe, TimerWake,
};
use super::verdict::{HangFinding, TimerSignal, WatchVerdict};
use crate::store::server::LogLimiter;
use crate::store::state::Store;

/// A rank's last output lines, oldest first (read at capture time).
pub(crate) type LastOutput = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// One worker of the attempt, as the watch sees it.
pub(crate) struct WatchedRank {
    pub rank: u32,
    pub local_rank: usize,
    pub pid: i32,
    /// Bytes of output so far (the output pump counts them).
    pub output: OutputCounter,
    pub last: LastOutput,
}

/// What one attempt gives the watch.
#[derive(Default)]
pub(crate) struct AttemptWatch {
    pub ranks: Vec<WatchedRank>,
    /// Hang detection (`None` when off).
    pub hang: Option<HangLink>,
    /// `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT` (`None` when unset).
    pub dstate: Option<Duration>,
    /// Where a FileTimer expiry's capture goes and how it is bounded (`None`: no capture).
    pub capture: Option<(HangSettings, PathBuf)>,
    /// The store rdrun hosts for these workers (its pending waits are part of a capture).
    pub store: Option<Arc<Store>>,
}

enum Cmd {
    Attempt(Box<AttemptWatch>),
    Exited { pid: i32, code: i32 },
    StoppedByRdrun { pid: i32 },
    Pause,
}

/// The agent's handle on the watch task.
pub(crate) struct Watch {
    cmds: UnboundedSender<Cmd>,
    verdicts: UnboundedReceiver<WatchVerdict>,
    task: JoinHandle<()>,
    paused: bool,
}

impl Watch {
    /// Starts the task; `timers`: the FileTimer server, kept for the whole run (the FIFO is
    /// removed when the task ends). Must run inside the tokio runtime.
    pub fn start(timers: Option<FileTimerServe>) -> Watch {
        let (cmds, cmd_rx) = unbounded_channel();
        let (out, verdicts) = unbounded_channel();
        let task = tokio::spawn(run(timers, cmd_rx, out));
        Watch {
            cmds,
            verdicts,
            task,
            paused: false,
        }
    }

    /// A new attempt: what was watched before is forgotten (and the previous workers'
    /// FileTimers are void).
    pub fn attempt(&mut self, a: AttemptWatch) {
        self.paused = false;
        // Verdicts of the previous attempt still queued are about workers that are gone.
        while self.verdicts.try_recv().is_ok() {}
        let _ = self.cmds.send(Cmd::Attempt(Box::new(a)));
    }

    /// A worker was reaped with torchrun's code (negative: killed by that signal).
    pub fn exited(&self, pid: i32, code: i32) {
        let _ = self.cmds.send(Cmd::Exited { pid, code });
    }

    /// rdrun stopped the worker `pid` itself (`--chaos hang`): a hang to find, not a
    /// debugger's stop.
    pub fn stopped_by_rdrun(&self, pid: i32) {
        let _ = self.cmds.send(Cmd::StoppedByRdrun { pid });
    }

    /// The group is being stopped (or waits for leftovers): no more hang or D-state verdicts in
    /// this attempt. FileTimers are still served. Idempotent.
    pub fn pause(&mut self) {
        if !self.paused {
            self.paused = true;
            let _ = self.cmds.send(Cmd::Pause);
        }
    }

    /// The next verdict; never resolves once the task is gone.
    pub async fn next(&mut self) -> WatchVerdict {
        match self.verdicts.recv().await {
            Some(v) => v,
            None => std::future::pending().await,
        }
    }

    /// Ends the task (and with it the FileTimer FIFO), waiting until it is dropped.
    pub async fn end(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The watch of the current attempt.
struct Current {
    ranks: Vec<WatchedRank>,
    exited: Vec<i32>,
    hang: Option<HangLink>,
    dstate: Option<DStateWatch>,
    capture: Option<(HangSettings, PathBuf)>,
    store: Option<Arc<Store>>,
    /// Hang and D-state verdicts are judged (not paused, no kill verdict yet).
    judging: bool,
}

impl Current {
    fn new(a: AttemptWatch) -> Current {
        Current {
            ranks: a.ranks,
            exited: Vec::new(),
            hang: a.hang,
            dstate: a.dstate.map(DStateWatch::new),
            capture: a.capture,
            store: a.store,
            judging: true,
        }
    }

    fn live(&self) -> impl Iterator<Item = &WatchedRank> {
        self.ranks.iter().filter(|r| !self.exited.contains(&r.pid))
    }

    fn live_pids(&self) -> Vec<i32> {
        self.live().map(|r| r.pid).collect()
    }
}

async fn run(
    mut timers: Option<FileTimerServe>,
    mut cmds: UnboundedReceiver<Cmd>,
    out: UnboundedSender<WatchVerdict>,
) {
    let mut cur = Current::new(AttemptWatch::default());
    // FileTimer expiries of processes outside the worker trees: one line per interval.
    let mut outside = LogLimiter::new(WARN_INTERVAL, "FileTimer expiries outside the worker trees");
    loop {
        let hang_on = cur.judging && cur.hang.as_ref().is_some_and(HangLink::active);
        let dstate_on = cur.judging && cur.dstate.is_some();
        let Current { hang, dstate, .. } = &mut cur;
        let wake = tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(cmd) => Wake::Cmd(cmd),
                None => break,
            },
            _ = tick_opt(hang.as_mut()), if hang_on => Wake::Hang,
            _ = dstate_tick(dstate.as_mut()), if dstate_on => Wake::DState,
            w = timer_next(timers.as_mut()), if timers.is_some() => Wake::Timer(w),
        };
        match wake {
            Wake::Cmd(Cmd::Attempt(a)) => {
                if let Some(line) = outside.flush_all() {
                    tracing::warn!("FileTimer: {line}");
                }
                if let Some(t) = timers.as_mut() {
                    t.clear();
                }
                cur = Current::new(*a);
            }
            Wake::Cmd(Cmd::Exited { pid, code }) => {
                if let Some(r) = cur.ranks.iter().find(|r| r.pid == pid) {
                    if let Some(h) = cur.hang.as_mut() {
                        h.rank_exited(r.rank, code);
                    }
                    cur.exited.push(pid);
                }
            }
            Wake::Cmd(Cmd::StoppedByRdrun { pid }) => {
                if let (Some(r), Some(h)) =
                    (cur.ranks.iter().find(|r| r.pid == pid), cur.hang.as_mut())
                {
                    h.stopped_by_rdrun(r.rank);
                }
            }
            Wake::Cmd(Cmd::Pause) => cur.judging = false,
            Wake::Hang => {
                if let Some(v) = poll_hang(&mut cur, &out).await {
                    let _ = out.send(v);
                }
            }
            Wake::DState => {
                if let Some(v) = check_dstate(&mut cur) {
                    let _ = out.send(v);
                }
            }
            Wake::Timer(w) => {
                let Some(t) = timers.as_mut() else { continue };
                if let Some(v) = on_timer(&mut cur, t, &mut outside, w).await {
                    let _ = out.send(v);
                }
            }
        }
    }
    if let Some(line) = outside.flush_all() {
        tracing::warn!("FileTimer: {line}");
    }
}

enum Wake {
    Cmd(Cmd),
    Hang,
    DState,
    Timer(TimerWake),
}

/// One hang poll: samples the live ranks, and on a verdict captures them.
async fn poll_hang(cur: &mut Current, out: &UnboundedSender<WatchVerdict>) -> Option<WatchVerdict> {
    let judged_at = Instant::now();
    let live: Vec<RankProcs> = cur
        .live()
        .map(|r| RankProcs {
            rank: r.rank,
            pid: r.pid,
            output: r.output.clone(),
        })
        .collect();
    let ranks = &cur.ranks;
    let last = |rank: u32| {
        ranks
            .iter()
            .find(|r| r.rank == rank)
            .map(|r| (r.last)())
            .unwrap_or_default()
    };
    let mut judged = || {
        let _ = out.send(WatchVerdict::Capturing { judged_at });
    };
    let found = cur
        .hang
        .as_mut()?
        .poll(&live, last, cur.store.as_deref(), &mut judged)
        .await?;
    if found.kill {
        // The attempt stops the group: nothing more to judge in it.
        cur.judging = false;
    }
    Some(WatchVerdict::Hang { found, judged_at })
}

/// The D-state sample: a worker stuck past the timeout is a verdict (once per attempt).
fn check_dstate(cur: &mut Current) -> Option<WatchVerdict> {
    let judged_at = Instant::now();
    let live: Vec<(i32, usize)> = cur.live().map(|r| (r.pid, r.rank as usize)).collect();
    let watch = cur.dstate.as_mut()?;
    let (pid, rank, dwell) = watch.check(&live)?;
    let summary = format!(
        "worker pid={pid} (rank {rank}) stuck in uninterruptible sleep (D state) for {:.1}s (>= TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT={:.1}s); restarts disabled",
        dwell.as_secs_f64(),
        watch.timeout().as_secs_f64()
    );
    cur.judging = false;
    Some(WatchVerdict::DState {
        found: HangFinding {
            kill: true,
            suspect: Some(rank as u32),
            summary,
            block: String::new(),
        },
        judged_at,
    })
}

/// A FileTimer message (a heartbeat for the hang detector, then the table) or a check for
/// expired timers: each expired process in a live worker's tree is captured (its stack, waits
/// and output: the same capture and files as a hang) and handed to the attempt with its
/// timer's signal — never rdrun, never anything outside the worker trees.
async fn on_timer(
    cur: &mut Current,
    timers: &mut FileTimerServe,
    outside: &mut LogLimiter,
    wake: TimerWake,
) -> Option<WatchVerdict> {
    let live = cur.live_pids();
    let rank_of = |pid: i32| {
        owning_worker(pid, &live).and_then(|w| cur.ranks.iter().position(|r| r.pid == w))
    };
    let expired = match wake {
        // Already rate-limited by the FIFO reader (one line per interval).
        TimerWake::Msg(Err(line)) => {
            tracing::warn!("FileTimer: {line}");
            return None;
        }
        TimerWake::Msg(Ok(msg)) => {
            if let Some(i) = rank_of(msg.pid()) {
                let (rank, pid) = (cur.ranks[i].rank, cur.ranks[i].pid);
                if let Some(h) = cur.hang.as_mut() {
                    h.timer_msg(rank, pid, &msg);
                }
            }
            timers.apply(msg);
            return None;
        }
        TimerWake::Check => {
            if let Some(line) = outside.flush(Instant::now()) {
                tracing::warn!("FileTimer: {line}");
            }
            timers.expired()
        }
    };
    let mut targets: Vec<ExpiredTarget> = Vec::new();
    let mut signals: Vec<TimerSignal> = Vec::new();
    for e in expired {
        let rank = |pid: i32| rank_of(pid).map(|i| &cur.ranks[i]);
        if let Some((signal, target)) = expired_target(e, rank, outside) {
            signals.push(signal);
            targets.push(target);
        }
    }
    if targets.is_empty() {
        return None;
    }
    let found = match cur.capture.as_ref() {
        Some((settings, dir)) => {
            Some(capture_timer_expiry(settings, dir, targets, cur.store.as_deref()).await)
        }
        None => None,
    };
    Some(WatchVerdict::TimerExpired { found, signals })
}

/// What to do about one expired process: its signal and its capture, when it is in a live
/// worker's tree (`rank_of`) and its timer names a signal. A heartbeat without a signal is the
/// hang detector's; a process outside every tree is reported (rate-limited), never signalled.
fn expired_target<'a>(
    e: Expired,
    rank_of: impl Fn(i32) -> Option<&'a WatchedRank>,
    outside: &mut LogLimiter,
) -> Option<(TimerSignal, ExpiredTarget)> {
    // A missed heartbeat is the hang detector's to judge (and report), whether its process
    // still lives or was already stopped (a hang verdict stops the group before the
    // heartbeat's own expiry comes due).
    let heartbeat_only = e.timers.iter().all(|t| is_heartbeat_scope(&t.scope_id));
    // Capped: every line and report below names at most a few (issue 25).
    let scopes = scope_list(&e.timers);
    if e.signal.is_none() && heartbeat_only {
        return None;
    }
    let Some(r) = rank_of(e.pid) else {
        let what = format!("pid {} (scopes {scopes:?})", e.pid);
        if let Some(line) = outside.event(Instant::now(), what) {
            tracing::warn!(
                "FileTimer expired for a process outside every worker's tree; not \
                 signalled: {line}"
            );
        }
        return None;
    };
    let Some(sig) = e.signal else {
        tracing::warn!(
            pid = e.pid,
            rank = r.rank,
            ?scopes,
            "FileTimer expired without a signal; not reaped"
        );
        return None;
    };
    tracing::info!(
        pid = e.pid,
        rank = r.rank,
        ?scopes,
        "FileTimer expired: capturing that process before it is signalled"
    );
    let expired_at = e
        .timers
        .iter()
        .map(|t| t.expiration_time)
        .fold(f64::INFINITY, f64::min);
    let signal = TimerSignal {
        pid: e.pid,
        sig,
        rank: r.rank,
        local_rank: r.local_rank,
        scopes: scopes.clone(),
    };
    let target = ExpiredTarget {
        expiry: TimerExpiry {
            rank: r.rank,
            pid: e.pid,
            scopes,
            signal: crate::exit::signal_label(sig).to_string(),
        },
        last_output: (r.last)(),
        expired_at,
    };
    Some((signal, target))
}

/// The next FileTimer wake-up; never without a FIFO.
async fn timer_next(timers: Option<&mut FileTimerServe>) -> TimerWake {
    match timers {
        Some(t) => t.next().await,
        None => std::future::pending().await,
    }
}

/// The next D-state sample; never without TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT.
async fn dstate_tick(watch: Option<&mut DStateWatch>) {
    match watch {
        Some(w) => w.tick().await,
        None => std::future::pending().await,
    }
}

/// The next hang poll tick; never without detection.
async fn tick_opt(hang: Option<&mut HangLink>) {
    match hang {
        Some(h) => h.tick().await,
        None => std::future::pending().await,
    }
}
