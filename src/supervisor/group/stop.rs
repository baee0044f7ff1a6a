//! The stop sequence of one attempt's worker group: why it stops, the stop signal to every worker
//! group and to every descendant that left them, the grace, SIGKILL of everything, the bounded
//! wait for what cannot die, the processes workers leave behind, and the drop guard that
//! SIGKILLs every group if the agent panics.
//!
//! The agent decides *when* to stop; this file owns *how*, and remembers when the stop began, so
//! that the report can tell a worker that failed on its own from one rdrun stopped
//! ([`crate::supervisor::report::failure::Failure::stop_sent_at`]). It never waits itself: the agent's select loop
//! sleeps until [`GroupStop::deadline`].

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::config::LeftoverPolicy;

use crate::supervisor::group::effects::Effects;
use crate::supervisor::group::proctree::ProcEntry;

use crate::supervisor::group::worker;

/// How long rdrun waits for processes to disappear after SIGKILL before it gives up on them
/// (a process in uninterruptible sleep cannot die until its I/O ends).
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// How long processes the workers started may take to exit on their own, once every worker
/// exited 0, before they are called left behind (issue 38 item 8: helpers exit when their
/// parent does, a moment later).
pub(crate) const LEFTOVER_GRACE: Duration = Duration::from_secs(2);

/// The longer bound while only [`known_helper`]s remain (debugpy's adapter waits for its
/// client to let go).
pub(crate) const KNOWN_HELPER_GRACE: Duration = Duration::from_secs(10);

/// How often the grace looks whether the processes are gone (no SIGCHLD tells rdrun: they are
/// grandchildren).
pub(crate) const LEFTOVER_GRACE_POLL: Duration = Duration::from_millis(50);

/// How often `--leftovers=wait` looks whether the processes left behind are gone (a grandchild
/// of a leftover exits without a SIGCHLD to rdrun).
pub(crate) const LEFTOVER_POLL: Duration = Duration::from_secs(1);

/// Python's helper processes that exit by themselves when the processes they serve exit, by a
/// fragment of their command line: what they are, for the WARN line when one outlives even
/// [`KNOWN_HELPER_GRACE`].
const KNOWN_HELPERS: &[(&str, &str)] = &[
    (
        "multiprocessing.resource_tracker",
        "Python multiprocessing's resource tracker",
    ),
    (
        "multiprocessing.forkserver",
        "Python multiprocessing's fork server",
    ),
    ("debugpy/adapter", "debugpy's adapter"),
    ("debugpy.adapter", "debugpy's adapter"),
];

/// What a known helper is ([`KNOWN_HELPERS`]), from its command line.
pub(crate) fn known_helper(command_line: &str) -> Option<&'static str> {
    KNOWN_HELPERS
        .iter()
        .find(|(fragment, _)| command_line.contains(fragment))
        .map(|(_, what)| *what)
}

/// Why rdrun stops the worker group (for the log; the sequence is the same for every reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// A worker failed: its peers are stopped.
    WorkerFailed,
    /// A shutdown signal reached rdrun (it is forwarded as is).
    Signal(i32),
    /// The rendezvous asked for a new round, or was lost.
    Rendezvous,
    /// The worker store stopped serving.
    StoreStopped,
    /// A worker could not be started: the ones already started are stopped.
    LaunchError,
    /// Every worker exited 0 but processes they started are still alive.
    Leftovers,
}

/// Where the stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Workers run; nothing asked them to stop.
    Running,
    /// The stop signal went out; SIGKILL at the deadline.
    Grace(Instant),
    /// SIGKILL went out; give up on what is left at the deadline.
    Killed(Instant),
}

/// The stop of one attempt's group: every worker's process group (pgid = the worker's pid).
#[derive(Debug)]
pub(crate) struct GroupStop {
    pgids: Vec<i32>,
    /// Never signalled, never counted as left behind.
    watchdog_pid: Option<i32>,
    /// The run's cgroup (containment): a hard stop kills everything in it, whatever session or
    /// process group a descendant made for itself.
    cgroup: Option<std::path::PathBuf>,
    grace: Duration,
    phase: Phase,
    /// When the first stop signal went out.
    sent_at: Option<SystemTime>,
    /// Why the stop began (for the lifecycle events).
    reason: Option<StopReason>,
}

impl GroupStop {
    pub(crate) fn new(
        pgids: Vec<i32>,
        watchdog_pid: Option<i32>,
        cgroup: Option<std::path::PathBuf>,
        grace: Duration,
    ) -> GroupStop {
        GroupStop {
            cgroup,
            pgids,
            watchdog_pid,
            grace,
            phase: Phase::Running,
            sent_at: None,
            reason: None,
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        self.phase
    }

    /// When the current phase runs out (`None` while the group runs).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Running => None,
            Phase::Grace(d) | Phase::Killed(d) => Some(d),
        }
    }

    /// When rdrun sent its first stop signal to the group, if it did.
    pub(crate) fn sent_at(&self) -> Option<SystemTime> {
        self.sent_at
    }

    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// Why the stop began, once it did.
    pub(crate) fn reason(&self) -> Option<StopReason> {
        self.reason
    }

    /// Starts the stop (SIGTERM, or the shutdown signal itself) unless one is under way.
    pub(crate) fn begin(&mut self, reason: StopReason, fx: &mut dyn Effects) {
        if self.phase != Phase::Running {
            return;
        }
        let sig = match reason {
            StopReason::Signal(sig) => sig,
            _ => libc::SIGTERM,
        };
        tracing::debug!(?reason, "stopping the worker group");
        self.reason = Some(reason);
        self.signal_everything(sig, fx);
        self.phase = Phase::Grace(fx.now() + self.grace);
    }

    /// A shutdown signal: always passed on (also during a stop already under way), and starts
    /// the grace if nothing did yet.
    pub(crate) fn shutdown(&mut self, sig: i32, fx: &mut dyn Effects) {
        if self.phase == Phase::Running {
            self.begin(StopReason::Signal(sig), fx);
        } else {
            self.signal_everything(sig, fx);
        }
    }

    /// Sends `sig` to every worker group and to every descendant that left them (setsid),
    /// without changing the phase (SIGUSR1 and the like).
    pub(crate) fn forward(&mut self, sig: i32, fx: &mut dyn Effects) {
        self.signal_everything(sig, fx);
    }

    fn signal_everything(&mut self, sig: i32, fx: &mut dyn Effects) {
        if self.sent_at.is_none() && sig != libc::SIGUSR1 && sig != libc::SIGUSR2 {
            self.sent_at = Some(fx.wall());
        }
        for &pgid in &self.pgids {
            tracing::info!(
                pgid,
                "sending {} to process group",
                crate::exit::signal_label(sig)
            );
            fx.signal_group(pgid, sig);
        }
        for p in self.stray_descendants(fx) {
            tracing::info!(
                pid = p.pid,
                "sending {} to stray descendant",
                crate::exit::signal_label(sig)
            );
            fx.signal_pid(p.pid, sig);
        }
    }

    /// SIGKILLs every group and every descendant of rdrun (except the watchdog); the bounded
    /// wait for them to disappear starts.
    pub(crate) fn kill_all(&mut self, fx: &mut dyn Effects) {
        if self.sent_at.is_none() {
            self.sent_at = Some(fx.wall());
        }
        for &pgid in &self.pgids {
            fx.signal_group(pgid, libc::SIGKILL);
        }
        // Containment: everything in the run's cgroup, whatever session it made.
        if let Some(dir) = &self.cgroup {
            fx.kill_cgroup(dir, Duration::from_millis(500));
        }
        for p in self.tree(fx) {
            fx.signal_pid(p.pid, libc::SIGKILL);
        }
        self.phase = Phase::Killed(fx.now() + KILL_WAIT);
    }

    /// Live descendants of rdrun that it started (never what it inherited from the shell that
    /// exec'd it, issue 24.3), the watchdog excluded. Every member of a worker group is one
    /// (a group only gains members by fork or by setpgid within its session), so this is also
    /// everything left of the attempt.
    pub(crate) fn tree(&self, fx: &dyn Effects) -> Vec<ProcEntry> {
        fx.own_tree()
            .into_iter()
            .filter(|p| !p.zombie && Some(p.pid) != self.watchdog_pid)
            .collect()
    }

    /// Descendants outside every worker group (they called setsid themselves).
    fn stray_descendants(&self, fx: &dyn Effects) -> Vec<ProcEntry> {
        self.tree(fx)
            .into_iter()
            .filter(|p| !self.pgids.contains(&p.pgid))
            .collect()
    }

    /// Pids of the live processes that still belong to the attempt.
    pub(crate) fn leftovers(&self, fx: &dyn Effects) -> Vec<i32> {
        self.tree(fx).into_iter().map(|p| p.pid).collect()
    }

    /// Every worker exited 0 and `left` are still alive: one WARN line per process (pid and
    /// command), then the policy's action. Returns false when rdrun should not wait for them.
    pub(crate) fn handle_leftovers(
        &mut self,
        policy: LeftoverPolicy,
        left: &[i32],
        fx: &mut dyn Effects,
    ) -> bool {
        let what = match policy {
            LeftoverPolicy::Kill => "stopping",
            LeftoverPolicy::Wait => "waiting for",
            LeftoverPolicy::Leave => "leaving",
        };
        for &pid in left {
            let line = fx.command_line(pid);
            let helper = known_helper(&line)
                .map(|h| {
                    format!(
                        " ({h}, still alive {}s after the workers)",
                        KNOWN_HELPER_GRACE.as_secs()
                    )
                })
                .unwrap_or_default();
            tracing::warn!(
                "workers exited 0; {what} a process they left behind: pid {pid}: {line}{helper} (see --leftovers=kill|wait|leave)"
            );
        }
        match policy {
            LeftoverPolicy::Kill => {
                self.begin(StopReason::Leftovers, fx);
                true
            }
            LeftoverPolicy::Wait => true,
            LeftoverPolicy::Leave => false,
        }
    }
}

/// `pid 12 (local rank 0, rank 4), pid 13` for the error line about processes that outlived
/// SIGKILL: worker pids get their ranks (from `ranks`: pid -> (local rank, rank)) so that the user
/// knows which worker to look at.
pub(crate) fn describe_leftovers(
    pids: &[i32],
    ranks: impl Fn(i32) -> Option<(usize, usize)>,
) -> String {
    if pids.is_empty() {
        return "none left by the time of this check".to_string();
    }
    pids.iter()
        .map(|&pid| match ranks(pid) {
            Some((lr, rank)) => format!("pid {pid} (local rank {lr}, rank {rank})"),
            None => format!("pid {pid}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kills every process group it holds when dropped while armed (a panic in the agent).
#[derive(Debug, Default)]
pub(crate) struct GroupGuard {
    pub(crate) pgids: Vec<i32>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        for &pgid in &self.pgids {
            worker::signal_group(pgid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_descriptions() {
        let ranks = |pid| (pid == 12).then_some((0, 4));
        assert_eq!(
            describe_leftovers(&[12, 13], ranks),
            "pid 12 (local rank 0, rank 4), pid 13"
        );
        assert_eq!(
            describe_leftovers(&[], ranks),
            "none left by the time of this check"
        );
    }
}
