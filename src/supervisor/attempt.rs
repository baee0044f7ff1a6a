//! One attempt's worker group, as state and one method per event: the workers' slots, the stop
//! under way, the failures seen, a shutdown signal, how the rendezvous ended the attempt, and
//! the hang / D-state / FileTimer verdicts. [`Group::spawn`] starts every local rank;
//! the agent's select loop (`agent.rs`) waits and hands each event to the method for it;
//! [`Group::finish`] collects the output and says how the attempt ended as an [`Outcome`].
//!
//! The group never waits on its own and never decides what follows the attempt (that is
//! `restart::decide`'s); *how* it stops is [`GroupStop`]'s.
//!
//! How an attempt ended, [`Outcome`], lives in `outcome.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{LaunchConfig, LeftoverPolicy};
use crate::exit::WorkerStatus;
use crate::rendezvous::{Assignment, RdzvEvent, RoundReason};
use crate::store::server::LogLimiter;
use crate::store::state::Store;

use super::dstate::DStateWatch;
use super::hang::filetimer::scope_list;
use super::hang::RankProcs;
use super::hang::{HangSettings, TimerExpiry};
use super::hanglink::{
    capture_timer_expiry, owning_worker, ExpiredTarget, FileTimerServe, HangFinding, HangLink,
    TimerWake,
};
use super::observe::Observer;
use super::output::{self, AttemptLogs, OutputSummary, RankIdentity};
use super::report::Failure;
use super::restart;
use super::signals::{self, SignalReaction};
use super::stop::{self, GroupGuard, GroupStop, Phase, StopReason, KILL_WAIT};
use super::worker::{self, RunWorkerEnv};

pub(super) use super::outcome::{rendezvous_end, Outcome};

/// One worker of the current attempt.
#[derive(Debug)]
pub(super) struct Slot {
    local_rank: usize,
    rank: usize,
    /// Process id = process group id = session id.
    pid: i32,
    status: Option<WorkerStatus>,
    /// When rdrun had begun stopping the group at the moment it reaped this worker.
    stop_sent_at: Option<SystemTime>,
    output: Option<JoinHandle<OutputSummary>>,
    error_file: Option<PathBuf>,
    /// Output bytes so far and the last lines (the hang detector's output signal and capture).
    activity: output::Activity,
}

impl Slot {
    /// This worker's entry for the failure report (stderr tail and traceback come later, from
    /// its output task).
    fn failure(&self, status: WorkerStatus, observed_at: SystemTime, abandoned: bool) -> Failure {
        Failure {
            local_rank: self.local_rank,
            rank: self.rank,
            pid: self.pid as u32,
            status,
            observed_at,
            error_file: self.error_file.clone(),
            stderr_tail: Vec::new(),
            traceback: None,
            abandoned,
            stop_sent_at: self.stop_sent_at,
        }
    }
}

/// What spawning needs from the agent: the run's config and shared worker environment, the
/// identities and log sinks of this attempt's ranks, the observer.
pub(super) struct SpawnArgs<'a> {
    pub config: &'a LaunchConfig,
    pub asg: &'a Assignment,
    pub ids: &'a [RankIdentity],
    pub logs: &'a AttemptLogs,
    pub worker_env: &'a RunWorkerEnv,
    pub obs: &'a Observer,
    /// Tells the output forwarders that every process rdrun can stop is gone: a pipe still open
    /// then is held by a descendant that escaped and outlived the stop (`output::pump`).
    pub stop_output: &'a watch::Sender<bool>,
}

/// The worker group of one attempt and everything that has happened to it.
pub(super) struct Group {
    slots: Vec<Slot>,
    by_pid: HashMap<i32, usize>,
    /// SIGKILLs every worker's process group if the agent panics before the group is over.
    guard: GroupGuard,
    stop: GroupStop,
    failures: Vec<Failure>,
    /// Slots reaped with a failure, not yet recorded in `failures`.
    failed_slots: Vec<usize>,
    /// A shutdown signal stopped the group.
    interrupted: Option<i32>,
    /// When the first failure was seen, and a peer loss reported close to it.
    first_failure: Option<Instant>,
    peer_loss: Option<(RoundReason, Vec<String>)>,
    /// `--leftovers=wait`: every worker exited 0, rdrun waits for what they left behind.
    waiting_for_leftovers: bool,
    launch_error: Option<String>,
    /// How the rendezvous ended the attempt (`Regroup` or `RendezvousLost`), if it did.
    rdzv_end: Option<Outcome>,
    /// A kill-mode hang (or D-state) verdict of this attempt.
    hang_found: Option<HangFinding>,
    /// Hang detection (`None` when off or when a worker could not be started).
    pub(super) hang: Option<HangLink>,
    /// Where a FileTimer expiry's capture goes and how it is bounded (`None` without a
    /// FileTimer server: nothing can expire).
    pub(super) timer_capture: Option<(HangSettings, PathBuf)>,
    /// The capture of this attempt's last FileTimer expiry: the root cause when the expired
    /// rank then fails (it may survive a catchable signal; then it is no failure at all).
    timer_found: Option<HangFinding>,
    /// FileTimer expiries of processes outside the worker trees: one line per interval.
    outside_warns: LogLimiter,
    /// TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT's watch (`None` when unset).
    pub(super) dstate: Option<DStateWatch>,
}

impl Group {
    /// Starts every local rank in order; the first that cannot be started ends the spawning
    /// (the group is then stopped as a launch error).
    pub(super) fn spawn(args: SpawnArgs<'_>, watchdog: (Option<i32>, Option<PathBuf>)) -> Group {
        let SpawnArgs {
            config,
            asg,
            ids,
            logs,
            worker_env,
            obs,
            stop_output,
        } = args;
        let mut guard = GroupGuard::default();
        let mut slots: Vec<Slot> = Vec::with_capacity(ids.len());
        let mut launch_error = None;
        for (lr, id) in ids.iter().enumerate() {
            let rank_logs = &logs.ranks[lr];
            let spawned = worker::spawn_spec(config, asg, lr, &rank_logs.error_file, worker_env)
                .map_err(|err| err.to_string())
                .and_then(|spec| worker::spawn(&spec).map_err(|err| err.describe()));
            let spawned = match spawned {
                Ok(spawned) => spawned,
                Err(err) => {
                    launch_error = Some(err);
                    break;
                }
            };
            tracing::debug!(local_rank = lr, pid = spawned.pid, "worker started");
            guard.pgids.push(spawned.pid);
            let activity = output::Activity::default();
            obs.get()
                .spawned(id.local_rank, id.rank, spawned.pid, &activity.bytes);
            let handle = output::forward_until(
                id.clone(),
                rank_logs.sink.clone(),
                spawned.stdout,
                spawned.stderr,
                stop_output.subscribe(),
                activity.clone(),
            );
            // In place the one slot's LOCAL_RANK is the scheduler's (`RankIdentity`), and so is
            // what every log line, prefix and report names.
            slots.push(Slot {
                local_rank: id.local_rank,
                rank: id.rank,
                pid: spawned.pid,
                status: None,
                stop_sent_at: None,
                output: Some(handle),
                error_file: Some(rank_logs.error_file.as_str())
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from),
                activity,
            });
        }
        let by_pid = slots.iter().enumerate().map(|(i, s)| (s.pid, i)).collect();
        let mut stop = GroupStop::new(
            slots.iter().map(|s| s.pid).collect(),
            watchdog.0,
            watchdog.1,
            config.shutdown_timeout,
        );
        if launch_error.is_some() {
            stop.begin(StopReason::LaunchError);
        }
        Group {
            slots,
            by_pid,
            guard,
            stop,
            failures: Vec::new(),
            failed_slots: Vec::new(),
            interrupted: None,
            first_failure: None,
            peer_loss: None,
            waiting_for_leftovers: false,
            launch_error,
            rdzv_end: None,
            hang_found: None,
            hang: None,
            timer_capture: None,
            timer_found: None,
            outside_warns: LogLimiter::new(
                super::hang::filetimer::WARN_INTERVAL,
                "FileTimer expiries outside the worker trees",
            ),
            dstate: config
                .torch_env
                .uninterruptible_timeout
                .map(DStateWatch::new),
        }
    }

    pub(super) fn launch_failed(&self) -> bool {
        self.launch_error.is_some()
    }

    pub(super) fn stop(&self) -> &GroupStop {
        &self.stop
    }

    /// Workers not reaped yet.
    pub(super) fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.status.is_none()).count()
    }

    /// Whether the rendezvous still needs watching (a lost one has nothing more to say).
    pub(super) fn watch_rdzv(&self) -> bool {
        !matches!(self.rdzv_end, Some(Outcome::RendezvousLost(_)))
    }

    /// A child was reaped: a worker's exit is recorded (a failure is recorded with the batch).
    pub(super) fn on_reaped(&mut self, pid: i32, status: WorkerStatus) {
        let Some(&i) = self.by_pid.get(&pid) else {
            tracing::debug!(pid, ?status, "reaped a descendant");
            return;
        };
        let slot = &mut self.slots[i];
        slot.status = Some(status);
        slot.stop_sent_at = self.stop.sent_at();
        if let Some(h) = self.hang.as_mut() {
            h.rank_exited(slot.rank as u32, status.torchrun_code());
        }
        if !status.success() {
            self.failed_slots.push(i);
        }
    }

    /// A handled signal: forwarded, a shutdown, or (again, in the grace) kill now.
    pub(super) fn on_signal(&mut self, sig: i32) {
        let in_grace = matches!(self.stop.phase(), Phase::Grace(_));
        match signals::react(sig, self.interrupted.is_some(), in_grace) {
            SignalReaction::Forward => {
                tracing::info!("forwarding {} to the workers", signals::name(sig));
                self.stop.forward(sig);
            }
            SignalReaction::Shutdown => {
                tracing::warn!("received {}, shutting down the workers", signals::name(sig));
                self.interrupted = Some(sig);
                self.stop.shutdown(sig);
            }
            SignalReaction::KillNow => {
                tracing::warn!(
                    "received {} again, killing the workers now",
                    signals::name(sig)
                );
                self.stop.kill_all();
            }
        }
    }

    /// A rendezvous event. Only a lost store outranks this node's own failure (a close by
    /// another node does not: the own failure is reported, issue 11.3). After this node's own
    /// failure the failure decides: its restart joins whatever round the others started; a peer
    /// lost close to it is remembered (`restart::PEER_LOSS_WINDOW`).
    pub(super) fn on_rendezvous(&mut self, ev: RdzvEvent, static_job: bool) {
        let store_lost = matches!(ev, RdzvEvent::StoreUnreachable(_));
        let end = rendezvous_end(ev, static_job);
        let own_failure = !self.failures.is_empty() || !self.failed_slots.is_empty();
        if let (Outcome::Regroup { reason, lost }, Some(at)) = (&end, self.first_failure) {
            if !lost.is_empty()
                && self.peer_loss.is_none()
                && restart::attributed_to_peer_loss(at.elapsed())
            {
                self.peer_loss = Some((*reason, lost.clone()));
            }
        }
        if store_lost || (!own_failure && self.interrupted.is_none() && self.rdzv_end.is_none()) {
            tracing::info!(?end, "rendezvous event; stopping the workers");
            self.rdzv_end = Some(end);
            self.stop.begin(StopReason::Rendezvous);
        }
    }

    /// The worker store stopped serving: the attempt cannot go on.
    pub(super) fn on_store_stopped(&mut self, why: String) {
        tracing::error!("the worker store stopped ({why}); stopping the workers");
        if self.launch_error.is_none() {
            self.launch_error = Some(format!("the worker store stopped: {why}"));
        }
        self.stop.begin(StopReason::StoreStopped);
    }

    /// The stop phase ran out of time: SIGKILL after the grace; after the SIGKILL wait, `true`:
    /// what is left is abandoned and the attempt is over.
    pub(super) fn on_deadline(&mut self) -> bool {
        match self.stop.phase() {
            Phase::Running => false,
            Phase::Grace(_) => {
                for s in self.slots.iter().filter(|s| s.status.is_none()) {
                    tracing::warn!(
                        pid = s.pid,
                        local_rank = s.local_rank,
                        "worker did not stop within {:?}, sending SIGKILL",
                        self.stop.grace()
                    );
                }
                self.stop.kill_all();
                false
            }
            Phase::Killed(_) => {
                let left = stop::describe_leftovers(&self.stop.leftovers(), |pid| {
                    self.slots
                        .iter()
                        .find(|s| s.pid == pid)
                        .map(|s| (s.local_rank, s.rank))
                });
                tracing::error!(
                    "processes still alive after SIGKILL and {:?} (uninterruptible sleep?), abandoning them: {left}",
                    KILL_WAIT
                );
                true
            }
        }
    }

    /// Records the failures of the last batch of events, in local-rank order with one
    /// timestamp, and stops the group. The first is logged as torchrun does.
    pub(super) fn record_failures(&mut self, program: &Path) {
        if self.failed_slots.is_empty() {
            return;
        }
        let slots = &self.slots;
        self.failed_slots.sort_by_key(|&i| slots[i].local_rank);
        let now = SystemTime::now();
        for &i in &self.failed_slots {
            let s = &slots[i];
            let status = s.status.expect("failed slot has a status");
            if self.failures.is_empty() && self.rdzv_end.is_none() && self.hang_found.is_none() {
                tracing::error!(
                    "failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}",
                    status.torchrun_code(),
                    s.local_rank,
                    s.pid,
                    program.display()
                );
            }
            self.failures.push(s.failure(status, now, false));
        }
        self.failed_slots.clear();
        self.first_failure.get_or_insert_with(Instant::now);
        self.stop.begin(StopReason::WorkerFailed);
    }

    /// Every worker exited: `true` when the attempt is over, i.e. nothing was left behind, or
    /// `--leftovers` says not to wait for it (then the stop of the leftovers begins).
    pub(super) fn all_done(&mut self, policy: LeftoverPolicy) -> bool {
        if self.slots.iter().any(|s| s.status.is_none()) {
            return false;
        }
        let left = self.stop.leftovers();
        let done = left.is_empty()
            || (self.stop.phase() == Phase::Running
                && !self.waiting_for_leftovers
                && !self.stop.handle_leftovers(policy, &left));
        if !done && policy == LeftoverPolicy::Wait && self.stop.phase() == Phase::Running {
            self.waiting_for_leftovers = true;
        }
        done
    }

    /// `--leftovers=wait` is waiting (it polls: a grandchild's exit sends rdrun no SIGCHLD).
    pub(super) fn polls_leftovers(&self) -> bool {
        self.waiting_for_leftovers && self.stop.phase() == Phase::Running
    }

    /// The group runs untouched: no failure, signal, rendezvous end or stop under way.
    fn untouched(&self) -> bool {
        self.stop.phase() == Phase::Running
            && self.failures.is_empty()
            && self.interrupted.is_none()
            && self.rdzv_end.is_none()
    }

    /// Whether the hang poll runs (only while the group runs untouched: after a failure, a
    /// signal or a kill verdict the stop path is already under way).
    pub(super) fn watch_hang(&self) -> bool {
        self.untouched()
            && !self.waiting_for_leftovers
            && self.hang.as_ref().is_some_and(HangLink::active)
    }

    pub(super) fn watch_dstate(&self) -> bool {
        self.dstate.is_some() && self.untouched() && self.hang_found.is_none()
    }

    /// The D-state sample: a worker stuck past the timeout stops the group as a failure and
    /// `true` says that restarts are disabled from now on (as torch).
    pub(super) fn check_dstate(&mut self) -> bool {
        let live: Vec<(i32, usize)> = self
            .slots
            .iter()
            .filter(|s| s.status.is_none())
            .map(|s| (s.pid, s.rank))
            .collect();
        let Some(watch) = self.dstate.as_mut() else {
            return false;
        };
        let Some((pid, rank, dwell)) = watch.check(&live) else {
            return false;
        };
        let summary = format!(
            "worker pid={pid} (rank {rank}) stuck in uninterruptible sleep (D state) for {:.1}s (>= TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT={:.1}s); restarts disabled",
            dwell.as_secs_f64(),
            watch.timeout().as_secs_f64()
        );
        tracing::error!("{summary}; stopping the worker group");
        self.hang_found = Some(HangFinding {
            kill: true,
            suspect: Some(rank as u32),
            summary,
        });
        self.first_failure.get_or_insert_with(Instant::now);
        self.stop.begin(StopReason::WorkerFailed);
        true
    }

    /// One hang poll (samples, and on a verdict the capture); a kill verdict stops the group
    /// as a failure with the hang as its root cause. `store`: the store the workers use, for
    /// the keys they wait on.
    pub(super) async fn poll_hang(&mut self, store: Option<&Store>, obs: &Observer) {
        let live: Vec<RankProcs> = self
            .slots
            .iter()
            .filter(|s| s.status.is_none())
            .map(|s| RankProcs {
                rank: s.rank as u32,
                pid: s.pid,
                output: s.activity.bytes.clone(),
            })
            .collect();
        let slots = &self.slots;
        let last = |rank: u32| {
            slots
                .iter()
                .find(|s| s.rank as u32 == rank)
                .map(|s| s.activity.last.snapshot())
                .unwrap_or_default()
        };
        let Some(link) = self.hang.as_mut() else {
            return;
        };
        let Some(found) = link.poll(&live, last, store).await else {
            return;
        };
        obs.get().hang(&found);
        if found.kill {
            tracing::error!("the worker group hangs ({}); stopping it", found.summary);
            self.hang_found = Some(found);
            self.first_failure.get_or_insert_with(Instant::now);
            self.stop.begin(StopReason::WorkerFailed);
        }
    }

    /// A FileTimer message (a heartbeat for the hang detector, then the table) or a check for
    /// expired timers: each expired process in a live worker's tree is captured first (its
    /// stack, waits and output: the same capture and files as a hang), then sent its timer's
    /// signal — never rdrun, never anything outside the worker trees; its exit then takes the
    /// normal failure path, with the capture as the root cause. `store`: the store rdrun hosts
    /// for the workers, if any (its pending waits are part of the capture).
    pub(super) async fn on_timer(
        &mut self,
        wake: TimerWake,
        timers: &mut FileTimerServe,
        store: Option<&Store>,
        obs: &Observer,
    ) {
        let slots = &self.slots;
        let live: Vec<i32> = slots
            .iter()
            .filter(|s| s.status.is_none())
            .map(|s| s.pid)
            .collect();
        let slot_of =
            |pid: i32| owning_worker(pid, &live).and_then(|w| slots.iter().find(|s| s.pid == w));
        let expired = match wake {
            // Already rate-limited by the FIFO reader (one line per interval).
            TimerWake::Msg(Err(line)) => {
                tracing::warn!("FileTimer: {line}");
                return;
            }
            TimerWake::Msg(Ok(msg)) => {
                if let (Some(h), Some(s)) = (self.hang.as_mut(), slot_of(msg.pid())) {
                    h.timer_msg(s.rank as u32, s.pid, &msg);
                }
                timers.apply(msg);
                return;
            }
            TimerWake::Check => {
                if let Some(line) = self.outside_warns.flush(Instant::now()) {
                    tracing::warn!("FileTimer: {line}");
                }
                timers.expired()
            }
        };
        // What to capture, and what to signal after it (signal number, local rank).
        let mut targets: Vec<ExpiredTarget> = Vec::new();
        let mut sigs: Vec<(TimerExpiry, i32, usize)> = Vec::new();
        for e in expired {
            // A missed heartbeat is the hang detector's to judge (and report), whether its
            // process still lives or was already stopped (a hang verdict stops the group
            // before the heartbeat's own expiry comes due).
            let heartbeat_only = e
                .timers
                .iter()
                .all(|t| super::hanglink::is_heartbeat_scope(&t.scope_id));
            // Capped: every line and report below names at most a few (issue 25).
            let scopes = scope_list(&e.timers);
            if e.signal.is_none() && heartbeat_only {
                continue;
            }
            let Some(s) = slot_of(e.pid) else {
                let what = format!("pid {} (scopes {scopes:?})", e.pid);
                if let Some(line) = self.outside_warns.event(Instant::now(), what) {
                    tracing::warn!(
                        "FileTimer expired for a process outside every worker's tree; not \
                         signalled: {line}"
                    );
                }
                continue;
            };
            let Some(sig) = e.signal else {
                tracing::warn!(
                    pid = e.pid,
                    rank = s.rank,
                    ?scopes,
                    "FileTimer expired without a signal; not reaped"
                );
                continue;
            };
            tracing::info!(
                pid = e.pid,
                rank = s.rank,
                ?scopes,
                "FileTimer expired: capturing that process before it is signalled"
            );
            let expired_at = e
                .timers
                .iter()
                .map(|t| t.expiration_time)
                .fold(f64::INFINITY, f64::min);
            let expiry = TimerExpiry {
                rank: s.rank as u32,
                pid: e.pid,
                scopes,
                signal: signals::name(sig).to_string(),
            };
            sigs.push((expiry.clone(), sig, s.local_rank));
            targets.push(ExpiredTarget {
                expiry,
                last_output: s.activity.last.snapshot(),
                expired_at,
            });
        }
        if targets.is_empty() {
            return;
        }
        if let Some((settings, dir)) = self.timer_capture.as_ref() {
            let found = capture_timer_expiry(settings, dir, targets, store).await;
            obs.get().hang(&found);
            self.timer_found = Some(found);
        }
        for (e, sig, local_rank) in sigs {
            let pid = e.pid;
            // The capture took time: the process may have exited (its pid even reused); signal
            // it only if it is still in a live worker's tree (read afresh from /proc).
            if owning_worker(pid, &live).is_none() {
                tracing::warn!(
                    pid,
                    "the expired FileTimer's process is gone; not signalled"
                );
                continue;
            }
            tracing::error!(
                pid,
                rank = e.rank,
                local_rank,
                scopes = ?e.scopes,
                "FileTimer expired: sending {} to that worker process only",
                e.signal
            );
            // SAFETY: plain kill(2); the pid was just seen in a live worker's tree.
            if unsafe { libc::kill(pid, sig) } == -1 {
                tracing::warn!(
                    pid,
                    "cannot signal the expired FileTimer's process: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }

    /// The attempt is over (every worker reaped, or what is left abandoned): collects output
    /// summaries and says how it ended.
    pub(super) async fn finish(
        mut self,
        stop_output: &watch::Sender<bool>,
        obs: &Observer,
    ) -> Outcome {
        if let Some(line) = self.outside_warns.flush_all() {
            tracing::warn!("FileTimer: {line}");
        }
        obs.get().attempt_over();
        // Workers whose exit came in the very last batch (after a deadline) are failures too.
        let now = SystemTime::now();
        for i in std::mem::take(&mut self.failed_slots) {
            let s = &self.slots[i];
            if let Some(status) = s.status.filter(|st| !st.success()) {
                self.failures.push(s.failure(status, now, false));
            }
        }
        let failures = &mut self.failures;
        // A worker never reaped after SIGKILL is reported as killed.
        for s in self.slots.iter_mut().filter(|s| s.status.is_none()) {
            tracing::error!(
                pid = s.pid,
                local_rank = s.local_rank,
                "worker could not be reaped"
            );
            if !failures.iter().any(|f| f.local_rank == s.local_rank) {
                // rdrun's SIGKILL went out before: never a cause on its own.
                s.stop_sent_at = s.stop_sent_at.or(Some(now));
                failures.push(s.failure(WorkerStatus::Signaled(libc::SIGKILL), now, true));
            }
        }
        // Output: every byte in the pipes is forwarded, however far behind the console is. The
        // forwarders learn that the workers' processes are gone: a pipe they then find drained
        // and still held open (a process rdrun could not stop) is closed after a short linger
        // (`output::pump` decides that from the pipe, never from a clock while data flows).
        let _ = stop_output.send(true);
        for s in self.slots.iter_mut() {
            let Some(handle) = s.output.take() else {
                continue;
            };
            let summary = handle.await.ok();
            if let Some(summary) = summary {
                for f in failures.iter_mut().filter(|f| f.local_rank == s.local_rank) {
                    f.set_output(&summary);
                }
            }
        }
        if self.hang_found.is_some() {
            // Stopped for a hang: every worker is part of the failure, even one that exited 0
            // on rdrun's stop signal (the attempt failed; it must not count as a success).
            for s in self.slots.iter() {
                if let Some(status) = s.status {
                    if !failures.iter().any(|f| f.local_rank == s.local_rank) {
                        failures.push(s.failure(status, now, false));
                    }
                }
            }
        }
        // Everything is stopped (or abandoned after SIGKILL): the drop guard has nothing to do.
        self.guard.pgids.clear();
        let failures = std::mem::take(&mut self.failures);
        if let Some(msg) = self.launch_error.take() {
            return Outcome::LauncherError(msg);
        }
        match self.rdzv_end.take() {
            Some(end @ Outcome::RendezvousLost(_)) => return end,
            Some(end) if self.interrupted.is_none() => return end,
            _ => {}
        }
        if let Some(signal) = self.interrupted {
            return Outcome::Interrupted { signal, failures };
        }
        if failures.is_empty() {
            Outcome::Succeeded
        } else {
            // A FileTimer capture is the root cause only if its rank is among the failures.
            let timer = self.timer_found.take().filter(|t| {
                t.suspect
                    .is_some_and(|r| failures.iter().any(|f| f.rank as u32 == r))
            });
            Outcome::Failed {
                peer_loss: self.peer_loss.take(),
                hang: self.hang_found.take().or(timer),
                failures,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_events_to_outcomes() {
        let regroup = |o: Outcome| match o {
            Outcome::Regroup { reason, lost } => Some((reason, lost)),
            _ => None,
        };
        let lost = vec!["n2".to_string()];
        // A static job cannot shrink: a lost peer is charged; c10d regroups for free.
        assert_eq!(
            regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), true)),
            Some((RoundReason::PeerLost, lost.clone()))
        );
        assert_eq!(
            regroup(rendezvous_end(RdzvEvent::PeersLost(lost.clone()), false)),
            Some((RoundReason::Membership, lost))
        );
        for ev in [
            RdzvEvent::NodesWaiting(1),
            RdzvEvent::RoundChanged {
                round: 3,
                reason: RoundReason::WorkerFailure,
            },
        ] {
            assert_eq!(
                regroup(rendezvous_end(ev, false)),
                Some((RoundReason::Membership, Vec::new()))
            );
        }
        for (ev, want) in [
            (
                RdzvEvent::Closed,
                "the rendezvous was closed: its store says so",
            ),
            (
                RdzvEvent::StoreUnreachable("x:1 refused".into()),
                "lost the rendezvous store: x:1 refused",
            ),
        ] {
            match rendezvous_end(ev, true) {
                Outcome::RendezvousLost(msg) => assert!(msg.starts_with(want), "{msg}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
