//! The restart decision: pure and synchronous, table-tested.
//!
//! The agent reports how an attempt ended and how many restarts the job has used; this file says
//! what happens next. It never touches processes (spec torchrun-compat §3.2 step 4: a failed group
//! is restarted while restarts remain, each restart consuming one). The rules, in one place:
//!
//! - success finishes the run; a shutdown signal, a launcher error or a lost rendezvous ends it
//!   at once (as torchrun, only failures are retried);
//! - a worker failure restarts the group while restarts remain (charged), else the run fails;
//! - a membership change (late joiner, another node's new round, a c10d peer lost) regroups
//!   without charging a restart; a static job's lost peer is charged (a static job cannot
//!   shrink: it regroups only while restarts remain);
//! - a worker failure with a peer node lost within [`PEER_LOSS_WINDOW`] of it is attributed to
//!   the membership change (issue 17: a SIGKILLed node makes its peers' collectives fail before
//!   the heartbeats tell that it is gone), so it is charged exactly as that loss would be;
//! - once restarts are disabled (a worker stuck in D state past
//!   TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT, as torch), nothing charged follows: the run
//!   gives up; a free membership change still regroups;
//! - a worker failure that is the same as the ones before it (`verdict.rs`: same exception type
//!   and innermost frame, or same status) `max_same_failures` attempts in a row stops the run,
//!   restarts left or not (issue 28.5: a deterministic bug would burn every restart); 0 = never.

use std::time::Duration;

/// How close a lost peer must be to a worker failure for the failure to count as the loss's.
/// A little more than the rendezvous's default detection time (5 heartbeats of 1 s).
pub const PEER_LOSS_WINDOW: Duration = Duration::from_secs(10);

/// How one attempt of the worker group ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Every worker exited 0.
    Succeeded,
    /// At least one worker exited non-zero or died by a signal.
    Failed,
    /// Workers failed and a peer node was reported lost within [`PEER_LOSS_WINDOW`] of the first
    /// failure; `charged` as for [`AttemptEnd::Regroup`].
    FailedWithPeerLoss { charged: bool },
    /// The rendezvous membership changed; `charged` when it counts as a failure of the job (a
    /// static job's lost peer).
    Regroup { charged: bool },
    /// rdrun received a shutdown signal (TERM, INT, HUP, QUIT) and stopped the group.
    Interrupted,
    /// rdrun itself could not run the attempt (a worker could not be started, bad environment).
    LauncherError,
    /// The rendezvous was closed by another node or its store became unreachable.
    RendezvousLost,
}

/// What the agent does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The run is over and succeeded.
    Finish,
    /// A charged restart after a worker failure: start attempt `restart_count` (the value of
    /// TORCHELASTIC_RESTART_COUNT for the new attempt).
    Restart { restart_count: u32 },
    /// Join the next rendezvous round; `charged`: the round counts as a restart of the job.
    Regroup { charged: bool },
    /// The run is over and failed (or was interrupted); no restart.
    GiveUp,
    /// The run is over: the same failure ended `max_same_failures` attempts in a row; do not
    /// requeue.
    SameFailure,
}

/// The stop verdict's inputs: how many attempts in a row ended with this attempt's failure
/// (`verdict::SameFailure`), and `--max-same-failures` (0: no verdict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Repeats {
    pub in_a_row: u32,
    pub max_same_failures: u32,
}

impl Repeats {
    fn reached(self) -> bool {
        self.max_same_failures > 0 && self.in_a_row >= self.max_same_failures
    }
}

/// Decides what follows an attempt that ran with TORCHELASTIC_RESTART_COUNT = `restart_count`;
/// `restarts_disabled`: no charged restart may follow, whatever the budget; `repeats`: the same
/// failure in a row so far.
pub fn decide(
    end: AttemptEnd,
    restart_count: u32,
    max_restarts: u32,
    restarts_disabled: bool,
    repeats: Repeats,
) -> Decision {
    let restarts_left = restart_count < max_restarts && !restarts_disabled;
    match end {
        AttemptEnd::Succeeded => Decision::Finish,
        AttemptEnd::Failed if repeats.reached() => Decision::SameFailure,
        AttemptEnd::Failed if restarts_left => Decision::Restart {
            restart_count: restart_count + 1,
        },
        AttemptEnd::Regroup { charged: false }
        | AttemptEnd::FailedWithPeerLoss { charged: false } => Decision::Regroup { charged: false },
        AttemptEnd::Regroup { charged: true }
        | AttemptEnd::FailedWithPeerLoss { charged: true }
            if restarts_left =>
        {
            Decision::Regroup { charged: true }
        }
        AttemptEnd::Failed
        | AttemptEnd::Regroup { .. }
        | AttemptEnd::FailedWithPeerLoss { .. }
        | AttemptEnd::Interrupted
        | AttemptEnd::LauncherError
        | AttemptEnd::RendezvousLost => Decision::GiveUp,
    }
}

/// Whether a peer loss noticed `gap` away from the first worker failure (either side) is close
/// enough to be the failure's cause.
pub fn attributed_to_peer_loss(gap: Duration) -> bool {
    gap <= PEER_LOSS_WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptEnd::*;

    #[test]
    fn decision_table() {
        let regroup = |charged| Decision::Regroup { charged };
        let table = [
            // (end, restart_count, max_restarts, expected)
            (Succeeded, 0, 0, Decision::Finish),
            (Succeeded, 2, 3, Decision::Finish),
            (Failed, 0, 0, Decision::GiveUp),
            (Failed, 0, 1, Decision::Restart { restart_count: 1 }),
            (Failed, 1, 3, Decision::Restart { restart_count: 2 }),
            (Failed, 3, 3, Decision::GiveUp),
            (Failed, 4, 3, Decision::GiveUp),
            (
                Failed,
                u32::MAX - 1,
                u32::MAX,
                Decision::Restart {
                    restart_count: u32::MAX,
                },
            ),
            (Failed, u32::MAX, u32::MAX, Decision::GiveUp),
            (Interrupted, 0, 5, Decision::GiveUp),
            (LauncherError, 0, 5, Decision::GiveUp),
            (RendezvousLost, 0, 5, Decision::GiveUp),
            // Membership changes are free, whatever the budget.
            (Regroup { charged: false }, 0, 0, regroup(false)),
            (Regroup { charged: false }, 7, 3, regroup(false)),
            // A static job's lost peer: charged, only while restarts remain.
            (Regroup { charged: true }, 0, 1, regroup(true)),
            (Regroup { charged: true }, 1, 1, Decision::GiveUp),
            // A failure next to a lost peer is the loss's (issue 17: max-restarts 0 survives a
            // SIGKILLed c10d node).
            (FailedWithPeerLoss { charged: false }, 0, 0, regroup(false)),
            (FailedWithPeerLoss { charged: false }, 3, 3, regroup(false)),
            (FailedWithPeerLoss { charged: true }, 0, 2, regroup(true)),
            (FailedWithPeerLoss { charged: true }, 2, 2, Decision::GiveUp),
        ];
        for (end, count, max, want) in table {
            assert_eq!(
                decide(end, count, max, false, Repeats::default()),
                want,
                "{end:?} {count}/{max}"
            );
        }
    }

    #[test]
    fn disabled_restarts_allow_nothing_charged() {
        let table = [
            (Succeeded, Decision::Finish),
            (Failed, Decision::GiveUp),
            (Regroup { charged: true }, Decision::GiveUp),
            (FailedWithPeerLoss { charged: true }, Decision::GiveUp),
            // A membership change costs nothing, so it still regroups.
            (
                Regroup { charged: false },
                Decision::Regroup { charged: false },
            ),
            (
                FailedWithPeerLoss { charged: false },
                Decision::Regroup { charged: false },
            ),
            (Interrupted, Decision::GiveUp),
        ];
        for (end, want) in table {
            assert_eq!(decide(end, 0, 5, true, Repeats::default()), want, "{end:?}");
        }
    }

    #[test]
    fn the_same_failure_in_a_row_stops_restarts_left_or_not() {
        let r = |in_a_row, max_same_failures| Repeats {
            in_a_row,
            max_same_failures,
        };
        let table = [
            // (end, restart_count, max_restarts, repeats, expected)
            (
                Failed,
                0,
                5,
                r(1, 2),
                Decision::Restart { restart_count: 1 },
            ),
            (Failed, 1, 5, r(2, 2), Decision::SameFailure),
            (Failed, 1, 5, r(3, 2), Decision::SameFailure),
            // No restart left: still the verdict (do not requeue), not a plain give-up.
            (Failed, 1, 1, r(2, 2), Decision::SameFailure),
            // A different failure reset the count: restarts go on.
            (
                Failed,
                2,
                5,
                r(1, 2),
                Decision::Restart { restart_count: 3 },
            ),
            // Off.
            (
                Failed,
                3,
                5,
                r(4, 0),
                Decision::Restart { restart_count: 4 },
            ),
            (Failed, 0, 5, r(1, 1), Decision::SameFailure),
            (
                Failed,
                0,
                5,
                r(2, 3),
                Decision::Restart { restart_count: 1 },
            ),
            // Only a plain worker failure has a verdict.
            (Succeeded, 1, 5, r(2, 2), Decision::Finish),
            (
                FailedWithPeerLoss { charged: false },
                1,
                5,
                r(2, 2),
                Decision::Regroup { charged: false },
            ),
            (Interrupted, 1, 5, r(2, 2), Decision::GiveUp),
        ];
        for (end, count, max, repeats, want) in table {
            assert_eq!(
                decide(end, count, max, false, repeats),
                want,
                "{end:?} {count}/{max} {repeats:?}"
            );
        }
        // Restarts disabled (D state): the verdict still names the repeat.
        assert_eq!(decide(Failed, 1, 5, true, r(2, 2)), Decision::SameFailure);
    }

    #[test]
    fn peer_loss_window() {
        assert!(attributed_to_peer_loss(Duration::ZERO));
        assert!(attributed_to_peer_loss(PEER_LOSS_WINDOW));
        assert!(!attributed_to_peer_loss(
            PEER_LOSS_WINDOW + Duration::from_millis(1)
        ));
    }
}
