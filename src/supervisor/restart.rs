//! The restart decision: pure and synchronous, table-tested.
//!
//! The agent reports how an attempt ended and how many restarts it has used; this file says what
//! happens next. It never touches processes (spec torchrun-compat §3.2 step 4: a failed group is
//! restarted while restarts remain, each restart consuming one).

/// How one attempt of the worker group ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Every worker exited 0.
    Succeeded,
    /// At least one worker exited non-zero or died by a signal.
    Failed,
    /// rdrun received a shutdown signal (TERM, INT, HUP, QUIT) and stopped the group.
    Interrupted,
    /// rdrun itself could not run the attempt (a worker could not be started, bad environment).
    LauncherError,
}

/// What the agent does after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The run is over and succeeded.
    Finish,
    /// Start attempt `restart_count` (the value of TORCHELASTIC_RESTART_COUNT for the new attempt).
    Restart { restart_count: u32 },
    /// The run is over and failed (or was interrupted); no restart.
    GiveUp,
}

/// Decides what follows an attempt that ran with TORCHELASTIC_RESTART_COUNT = `restart_count`.
///
/// Only worker failures are retried, as torchrun: a signal to the launcher or a launcher error
/// ends the run at once.
pub fn decide(end: AttemptEnd, restart_count: u32, max_restarts: u32) -> Decision {
    match end {
        AttemptEnd::Succeeded => Decision::Finish,
        AttemptEnd::Failed if restart_count < max_restarts => Decision::Restart {
            restart_count: restart_count + 1,
        },
        AttemptEnd::Failed | AttemptEnd::Interrupted | AttemptEnd::LauncherError => {
            Decision::GiveUp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AttemptEnd::*;

    #[test]
    fn decision_table() {
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
        ];
        for (end, count, max, want) in table {
            assert_eq!(decide(end, count, max), want, "{end:?} {count}/{max}");
        }
    }
}
