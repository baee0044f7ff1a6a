//! One attempt's worker group, as state that handles events: the workers' slots, the stop
//! under way, the failures seen, a shutdown signal, how the rendezvous ended the attempt, and
//! the watch task's verdicts. [`Group::spawn`] starts every local rank through a
//! [`Spawner`]; the agent's select loop turns every wake-up into an [`Event`] and hands each
//! batch to [`Group::handle`], which records it, begins the stop when it must and says whether
//! the attempt is over; [`Group::finish`] collects the output and says how the attempt ended as
//! an [`Outcome`] (`outcome.rs`).
//!
//! Every effect (signals, the cgroup kill, reading the process table, the clocks) goes through
//! the group's [`Effects`]: the real one in production, a recording fake with a hand-moved
//! clock in the table tests (`attempt_tests.rs`). The group never waits on its own and never
//! decides what follows the attempt (that is `restart::decide`'s); *how* it stops is
//! [`GroupStop`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::LeftoverPolicy;
use crate::exit::WorkerStatus;
use crate::rendezvous::{RdzvEvent, RoundReason};

use crate::supervisor::group::effects::Effects;
use crate::supervisor::group::events::Event;
use crate::supervisor::group::restart;
use crate::supervisor::group::signals::{self, SignalReaction};
use crate::supervisor::group::spawn::Spawner;
use crate::supervisor::group::stop::{
    self, known_helper, GroupGuard, GroupStop, Phase, StopReason, KILL_WAIT, KNOWN_HELPER_GRACE,
    LEFTOVER_GRACE, LEFTOVER_GRACE_POLL, LEFTOVER_POLL,
};
use crate::supervisor::output::{self, OutputSummary, RankIdentity};
use crate::supervisor::report::failure::Failure;
use crate::supervisor::watch::task::WatchedRank;
use crate::supervisor::watch::verdict::{HangFinding, WatchVerdict};

pub(in crate::supervisor) use crate::supervisor::group::outcome::{rendezvous_end, Outcome};

/// One worker of the current attempt.
#[derive(Debug)]
pub(in crate::supervisor) struct Slot {
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

/// What the group needs to know of the run (from the config and the rendezvous).
#[derive(Debug, Clone)]
pub(in crate::supervisor) struct GroupSettings {
    /// `--shutdown-timeout`: the grace between the stop signal and SIGKILL.
    pub grace: Duration,
    /// The watchdog's pid (never signalled) and the run's cgroup (killed whole on a hard stop).
    pub watchdog_pid: Option<i32>,
    pub cgroup: Option<PathBuf>,
    /// The worker program, for the first failure's log line (as torchrun).
    pub program: PathBuf,
    pub leftovers: LeftoverPolicy,
    /// A static multi-node job (a lost peer is charged; c10d regroups for free).
    pub static_job: bool,
}

/// Whether the attempt goes on after a batch of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::supervisor) enum Flow {
    Continue,
    /// Every worker is reaped (and nothing is left to wait for), or what is left was abandoned
    /// after SIGKILL: [`Group::finish`] next.
    Over,
}

/// The worker group of one attempt and everything that has happened to it.
pub(in crate::supervisor) struct Group {
    slots: Vec<Slot>,
    by_pid: HashMap<i32, usize>,
    /// SIGKILLs every worker's process group if the agent panics before the group is over.
    guard: GroupGuard,
    stop: GroupStop,
    settings: GroupSettings,
    fx: Box<dyn Effects>,
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
    /// Every worker exited 0 and processes of theirs were still alive: until this instant they
    /// may still exit on their own (a helper exits when its parent does) before they are
    /// called left behind ([`LEFTOVER_GRACE`], [`KNOWN_HELPER_GRACE`]).
    leftover_grace: Option<Instant>,
    launch_error: Option<String>,
    /// How the rendezvous ended the attempt (`Regroup` or `RendezvousLost`), if it did.
    rdzv_end: Option<Outcome>,
    /// A kill-mode hang (or D-state) verdict of this attempt.
    hang_found: Option<HangFinding>,
    /// The capture of this attempt's last FileTimer expiry: the root cause when the expired
    /// rank then fails (it may survive a catchable signal; then it is no failure at all).
    timer_found: Option<HangFinding>,
    /// The FileTimer expiries' signals this attempt sent: (rank, pid signalled, signal).
    timer_sent: Vec<(u32, i32, i32)>,
    /// A worker stayed in D state past the timeout: no more restarts (as torch).
    restarts_disabled: bool,
    /// A kill verdict's capture is under way (`WatchVerdict::Capturing`): what would stop the
    /// workers under the capture waits until its verdict — rendezvous events (in `deferred`)
    /// and a failure's stop. A shutdown signal does not wait: the user's word comes first.
    capturing: bool,
    deferred: Vec<RdzvEvent>,
}

impl Group {
    /// Starts every local rank in order; the first that cannot be started ends the spawning
    /// (the group is then stopped as a launch error).
    pub(in crate::supervisor) fn spawn(
        ids: &[RankIdentity],
        spawner: &mut dyn Spawner,
        settings: GroupSettings,
        mut fx: Box<dyn Effects>,
    ) -> Group {
        let mut guard = GroupGuard::default();
        let mut slots: Vec<Slot> = Vec::with_capacity(ids.len());
        let mut launch_error = None;
        for (lr, id) in ids.iter().enumerate() {
            let spawned = match spawner.spawn(lr, id) {
                Ok(spawned) => spawned,
                Err(err) => {
                    launch_error = Some(err);
                    break;
                }
            };
            guard.pgids.push(spawned.pid);
            // In place the one slot's LOCAL_RANK is the scheduler's (`RankIdentity`), and so is
            // what every log line, prefix and report names.
            slots.push(Slot {
                local_rank: id.local_rank,
                rank: id.rank,
                pid: spawned.pid,
                status: None,
                stop_sent_at: None,
                output: spawned.output,
                error_file: spawned.error_file,
                activity: spawned.activity,
            });
        }
        let by_pid = slots.iter().enumerate().map(|(i, s)| (s.pid, i)).collect();
        let mut stop = GroupStop::new(
            slots.iter().map(|s| s.pid).collect(),
            settings.watchdog_pid,
            settings.cgroup.clone(),
            settings.grace,
        );
        if launch_error.is_some() {
            stop.begin(StopReason::LaunchError, &mut *fx);
        }
        Group {
            slots,
            by_pid,
            guard,
            stop,
            settings,
            fx,
            failures: Vec::new(),
            failed_slots: Vec::new(),
            interrupted: None,
            first_failure: None,
            peer_loss: None,
            waiting_for_leftovers: false,
            leftover_grace: None,
            launch_error,
            rdzv_end: None,
            hang_found: None,
            timer_found: None,
            timer_sent: Vec::new(),
            restarts_disabled: false,
            capturing: false,
            deferred: Vec::new(),
        }
    }

    pub(in crate::supervisor) fn launch_failed(&self) -> bool {
        self.launch_error.is_some()
    }

    pub(in crate::supervisor) fn stop(&self) -> &GroupStop {
        &self.stop
    }

    /// Workers not reaped yet.
    pub(in crate::supervisor) fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.status.is_none()).count()
    }

    /// Whether the rendezvous still needs watching (a lost one has nothing more to say).
    pub(in crate::supervisor) fn watch_rdzv(&self) -> bool {
        !matches!(self.rdzv_end, Some(Outcome::RendezvousLost(_)))
    }

    /// What the watch task watches: every started worker.
    pub(in crate::supervisor) fn watched_ranks(&self) -> Vec<WatchedRank> {
        self.slots
            .iter()
            .map(|s| {
                let last = s.activity.last.clone();
                WatchedRank {
                    rank: s.rank as u32,
                    local_rank: s.local_rank,
                    pid: s.pid,
                    output: s.activity.bytes.clone(),
                    last: Box::new(move || last.snapshot()),
                }
            })
            .collect()
    }

    /// Whether hang and D-state verdicts are still wanted: only while the group runs untouched
    /// (after a failure, a signal or a verdict the stop path is already under way) and not
    /// while it waits for leftovers.
    pub(in crate::supervisor) fn judging(&self) -> bool {
        self.untouched()
            && !self.waiting_for_leftovers
            && self.leftover_grace.is_none()
            && self.hang_found.is_none()
    }

    /// A kill verdict's capture is under way: its verdict is still to come.
    pub(in crate::supervisor) fn capturing(&self) -> bool {
        self.capturing
    }

    /// A worker stayed in D state past the timeout: restarts are disabled from now on.
    pub(in crate::supervisor) fn disables_restarts(&self) -> bool {
        self.restarts_disabled
    }

    /// `--leftovers=wait` is waiting (it polls: a grandchild's exit sends rdrun no SIGCHLD).
    pub(in crate::supervisor) fn polls_leftovers(&self) -> bool {
        (self.waiting_for_leftovers || self.leftover_grace.is_some())
            && self.stop.phase() == Phase::Running
    }

    /// How often to poll while [`Self::polls_leftovers`]: often during the grace (a helper's
    /// exit ends a successful run, which should not wait a second longer for it), once a second
    /// while `--leftovers=wait` waits.
    pub(in crate::supervisor) fn leftover_poll(&self) -> Duration {
        match self.waiting_for_leftovers {
            true => LEFTOVER_POLL,
            false => LEFTOVER_GRACE_POLL,
        }
    }

    /// One batch of events (what one wake-up of the agent brought), in order; then the
    /// failures of the batch are recorded (one timestamp, local-rank order) and the group says
    /// whether the attempt is over.
    pub(in crate::supervisor) fn handle(
        &mut self,
        events: impl IntoIterator<Item = Event>,
    ) -> Flow {
        for event in events {
            match event {
                Event::Reaped { pid, status } => self.on_reaped(pid, status),
                Event::Signal(sig) => self.on_signal(sig),
                Event::Rendezvous(ev) => self.on_rendezvous(ev),
                Event::StoreStopped(why) => self.on_store_stopped(why),
                Event::Deadline => {
                    if self.on_deadline() {
                        return Flow::Over;
                    }
                }
                Event::LeftoverPoll => {}
                Event::Watch(v) => self.on_verdict(v),
            }
        }
        self.record_failures();
        if self.all_done() {
            Flow::Over
        } else {
            Flow::Continue
        }
    }

    /// A child was reaped: a worker's exit is recorded (a failure is recorded with the batch).
    fn on_reaped(&mut self, pid: i32, status: WorkerStatus) {
        let Some(&i) = self.by_pid.get(&pid) else {
            tracing::debug!(pid, ?status, "reaped a descendant");
            return;
        };
        let slot = &mut self.slots[i];
        slot.status = Some(status);
        slot.stop_sent_at = self.stop.sent_at();
        if !status.success() {
            self.failed_slots.push(i);
        }
    }

    /// A handled signal: forwarded, a shutdown, or (again, in the grace) kill now.
    fn on_signal(&mut self, sig: i32) {
        let in_grace = matches!(self.stop.phase(), Phase::Grace(_));
        let fx = &mut *self.fx;
        match signals::react(sig, self.interrupted.is_some(), in_grace) {
            SignalReaction::Forward => {
                tracing::info!(
                    "forwarding {} to the workers",
                    crate::exit::signal_label(sig)
                );
                self.stop.forward(sig, fx);
            }
            SignalReaction::Shutdown => {
                tracing::warn!(
                    "received {}, shutting down the workers",
                    crate::exit::signal_label(sig)
                );
                self.interrupted = Some(sig);
                self.stop.shutdown(sig, fx);
            }
            SignalReaction::KillNow => {
                tracing::warn!(
                    "received {} again, killing the workers now",
                    crate::exit::signal_label(sig)
                );
                self.stop.kill_all(fx);
            }
        }
    }

    /// A rendezvous event. Only a lost store outranks this node's own failure (a close by
    /// another node does not: the own failure is reported, issue 11.3). After this node's own
    /// failure the failure decides: its restart joins whatever round the others started; a peer
    /// lost close to it is remembered (`restart::PEER_LOSS_WINDOW`).
    fn on_rendezvous(&mut self, ev: RdzvEvent) {
        if self.capturing {
            self.deferred.push(ev);
            return;
        }
        let store_lost = matches!(ev, RdzvEvent::StoreUnreachable(_));
        let end = rendezvous_end(ev, self.settings.static_job);
        let own_failure = !self.failures.is_empty() || !self.failed_slots.is_empty();
        if let (Outcome::Regroup { reason, lost }, Some(at)) = (&end, self.first_failure) {
            if !lost.is_empty()
                && self.peer_loss.is_none()
                && restart::attributed_to_peer_loss(self.fx.now().saturating_duration_since(at))
            {
                self.peer_loss = Some((*reason, lost.clone()));
            }
        }
        if store_lost || (!own_failure && self.interrupted.is_none() && self.rdzv_end.is_none()) {
            tracing::info!(?end, "rendezvous event; stopping the workers");
            self.rdzv_end = Some(end);
            self.stop.begin(StopReason::Rendezvous, &mut *self.fx);
        }
    }

    /// The worker store stopped serving: the attempt cannot go on.
    fn on_store_stopped(&mut self, why: String) {
        tracing::error!("the worker store stopped ({why}); stopping the workers");
        if self.launch_error.is_none() {
            self.launch_error = Some(format!("the worker store stopped: {why}"));
        }
        self.stop.begin(StopReason::StoreStopped, &mut *self.fx);
    }

    /// The stop phase ran out of time: SIGKILL after the grace; after the SIGKILL wait, `true`:
    /// what is left is abandoned and the attempt is over.
    fn on_deadline(&mut self) -> bool {
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
                self.stop.kill_all(&mut *self.fx);
                false
            }
            Phase::Killed(_) => {
                let left = stop::describe_leftovers(&self.stop.leftovers(&*self.fx), |pid| {
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

    /// A verdict of the watch task. A kill verdict (hang or D state) stops the group as a
    /// failure with the verdict as its root cause. One that arrives after the stop began counts
    /// as the root cause only if its sample was taken before this node's first failure was seen
    /// (the capture ran while the failure came in: the failure is the hang's consequence); a
    /// later one changes nothing. An observe verdict is only shown (the observer's). A FileTimer
    /// expiry is captured already: its processes are signalled if still in a live worker's tree.
    fn on_verdict(&mut self, v: WatchVerdict) {
        let (found, judged_at, dstate) = match v {
            WatchVerdict::Capturing { .. } => {
                self.capturing = self.untouched();
                return;
            }
            WatchVerdict::Hang { found, judged_at } => {
                self.capturing = false;
                self.verdict(found, judged_at, false);
                // A failure seen during the capture: its stop waited for the capture too.
                if !self.failures.is_empty() {
                    self.stop.begin(StopReason::WorkerFailed, &mut *self.fx);
                }
                // What the rendezvous said during the capture, in order, now that the verdict
                // is recorded (the old attempt's loop saw it after the capture too).
                for ev in std::mem::take(&mut self.deferred) {
                    self.on_rendezvous(ev);
                }
                return;
            }
            WatchVerdict::DState { found, judged_at } => (found, judged_at, true),
            WatchVerdict::TimerExpired { found, signals } => {
                if found.is_some() {
                    self.timer_found = found;
                }
                self.signal_expired(signals);
                return;
            }
        };
        self.verdict(found, judged_at, dstate);
    }

    /// A hang or D-state verdict (see [`Group::on_verdict`]).
    fn verdict(&mut self, found: HangFinding, judged_at: Instant, dstate: bool) {
        if !found.kill || self.hang_found.is_some() {
            return;
        }
        if self.untouched() {
            if dstate {
                tracing::error!("{}; stopping the worker group", found.summary);
            } else {
                tracing::error!("the worker group hangs ({}); stopping it", found.summary);
            }
            self.first_failure.get_or_insert(self.fx.now());
            self.stop.begin(StopReason::WorkerFailed, &mut *self.fx);
        } else if self.interrupted.is_none()
            && self.rdzv_end.is_none()
            && self.first_failure.is_some_and(|f| judged_at <= f)
        {
            tracing::info!(
                "the hang verdict was judged before the first failure: it is the root cause"
            );
        } else {
            tracing::info!("a hang verdict after the group began stopping; not the cause");
            return;
        }
        self.hang_found = Some(found);
        self.restarts_disabled |= dstate;
    }

    /// Sends each expired FileTimer's signal to its process, if that process is still in a live
    /// worker's tree (the capture took time: it may have exited, its pid even been reused).
    fn signal_expired(&mut self, signals: Vec<crate::supervisor::watch::verdict::TimerSignal>) {
        let live: Vec<i32> = self
            .slots
            .iter()
            .filter(|s| s.status.is_none())
            .map(|s| s.pid)
            .collect();
        for t in signals {
            if self.fx.owning_worker(t.pid, &live).is_none() {
                tracing::warn!(
                    pid = t.pid,
                    "the expired FileTimer's process is gone; not signalled"
                );
                continue;
            }
            tracing::error!(
                pid = t.pid,
                rank = t.rank,
                local_rank = t.local_rank,
                scopes = ?t.scopes,
                "FileTimer expired: sending {} to that worker process only",
                crate::exit::signal_label(t.sig)
            );
            self.fx.signal_pid(t.pid, t.sig);
            self.timer_sent.push((t.rank, t.pid, t.sig));
        }
    }

    /// Records the failures of the last batch of events, in local-rank order with one
    /// timestamp, and stops the group. The first is logged as torchrun does.
    fn record_failures(&mut self) {
        if self.failed_slots.is_empty() {
            return;
        }
        let slots = &self.slots;
        self.failed_slots.sort_by_key(|&i| slots[i].local_rank);
        let now = self.fx.wall();
        for &i in &self.failed_slots {
            let s = &slots[i];
            let status = s.status.expect("failed slot has a status");
            if self.failures.is_empty() && self.rdzv_end.is_none() && self.hang_found.is_none() {
                tracing::error!(
                    "failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}",
                    status.torchrun_code(),
                    s.local_rank,
                    s.pid,
                    self.settings.program.display()
                );
            }
            self.failures.push(s.failure(status, now, false));
        }
        self.failed_slots.clear();
        self.first_failure.get_or_insert(self.fx.now());
        // Under a kill verdict's capture the peers are being captured: they are stopped once
        // its verdict is in (`on_verdict`).
        if !self.capturing {
            self.stop.begin(StopReason::WorkerFailed, &mut *self.fx);
        }
    }

    /// Every worker exited: `true` when the attempt is over, i.e. nothing was left behind, or
    /// `--leftovers` says not to wait for it (then the stop of the leftovers begins).
    fn all_done(&mut self) -> bool {
        if self.slots.iter().any(|s| s.status.is_none()) {
            return false;
        }
        let policy = self.settings.leftovers;
        let left = self.stop.leftovers(&*self.fx);
        if !left.is_empty() && self.in_leftover_grace(&left) {
            return false;
        }
        let done = left.is_empty()
            || (self.stop.phase() == Phase::Running
                && !self.waiting_for_leftovers
                && !self.stop.handle_leftovers(policy, &left, &mut *self.fx));
        if !done && policy == LeftoverPolicy::Wait && self.stop.phase() == Phase::Running {
            self.waiting_for_leftovers = true;
        }
        done
    }

    /// Every worker exited and `left` are still alive: whether they still have time to exit on
    /// their own (issue 38 item 8). multiprocessing's resource_tracker and forkserver, and
    /// debugpy's adapter, exit when the processes they serve do, a moment after the workers;
    /// calling them left behind at once gave them a WARN and a SIGTERM for nothing. Every
    /// process gets [`LEFTOVER_GRACE`]; while only such known helpers remain, up to
    /// [`KNOWN_HELPER_GRACE`]. Only a group that runs untouched waits (a stop is under way
    /// otherwise, and it ends them anyway).
    fn in_leftover_grace(&mut self, left: &[i32]) -> bool {
        if self.stop.phase() != Phase::Running || self.waiting_for_leftovers {
            return false;
        }
        let now = self.fx.now();
        let since = *self.leftover_grace.get_or_insert(now);
        let waited = now.saturating_duration_since(since);
        if waited < LEFTOVER_GRACE {
            return true;
        }
        waited < KNOWN_HELPER_GRACE
            && left
                .iter()
                .all(|&pid| known_helper(&self.fx.command_line(pid)).is_some())
    }

    /// The group runs untouched: no failure, signal, rendezvous end or stop under way.
    fn untouched(&self) -> bool {
        self.stop.phase() == Phase::Running
            && self.failures.is_empty()
            && self.interrupted.is_none()
            && self.rdzv_end.is_none()
    }

    /// The attempt is over (every worker reaped, or what is left abandoned): collects output
    /// summaries and says how it ended.
    pub(in crate::supervisor) async fn finish(
        mut self,
        stop_output: &watch::Sender<bool>,
    ) -> Outcome {
        // Workers whose exit came in the very last batch (after a deadline) are failures too.
        let now = self.fx.wall();
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
            // A FileTimer capture is the root cause only if the expiry's signal ended its rank
            // (issue 38 item 13): the rank failed before rdrun's own stop, and where the signal
            // went to the worker process itself, that signal is what it died of. A rank that
            // handled the signal and was later stopped by rdrun is a bystander, not a hang.
            let sent = &self.timer_sent;
            let timer = self.timer_found.take().filter(|t| {
                t.suspect.is_some_and(|r| {
                    failures.iter().any(|f| {
                        f.rank as u32 == r
                            && f.stop_sent_at.is_none()
                            && sent.iter().filter(|s| s.0 == r).all(|&(_, pid, sig)| {
                                pid != f.pid as i32 || f.status == WorkerStatus::Signaled(sig)
                            })
                    })
                })
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
#[path = "attempt_tests.rs"]
mod tests;
