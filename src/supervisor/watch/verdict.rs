//! What the watch task tells the agent: a verdict, as the payload of
//! `group::events::Event::Watch`. The watch judges and captures; what follows a
//! verdict (stop the group, restart, disable restarts) is the attempt's, and what is printed is
//! the observer's ([`HangFinding::block`]).

use tokio::time::Instant;

/// A verdict's finding: what the attempt records as the failure's root cause, and the block the
/// observer prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HangFinding {
    /// Stop the group and take the failure path (kill mode); else only report (observe).
    pub kill: bool,
    /// The suspect the capture named first (global rank), if any.
    pub suspect: Option<u32>,
    /// One line for the failure report's root cause, e.g. `no activity on any of 2 ranks for
    /// 3s (budget 3s), suspect rank 1; stacks in DIR`.
    pub summary: String,
    /// The block for stderr (the capture rendered; empty when there is nothing to print).
    pub block: String,
}

/// A FileTimer expiry's process, captured, to be signalled by the attempt if it is still in a
/// live worker's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimerSignal {
    pub pid: i32,
    /// The timer's signal.
    pub sig: i32,
    /// The worker it belongs to (global and local rank).
    pub rank: u32,
    pub local_rank: usize,
    /// The expired scopes (capped list).
    pub scopes: Vec<String>,
}

/// One verdict of the watch task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchVerdict {
    /// A kill verdict was judged and its capture begins (it ends with [`WatchVerdict::Hang`]):
    /// the attempt holds back what would stop the workers under the capture.
    Capturing { judged_at: Instant },
    /// The hang detector's verdict (kill or observe). `judged_at`: when the sample behind it was
    /// taken, so that the attempt can tell a verdict that raced a worker's failure (judged
    /// before the failure was seen: the hang is the root cause) from a late one.
    Hang {
        found: HangFinding,
        judged_at: Instant,
    },
    /// A worker stayed in uninterruptible sleep past `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`:
    /// the group fails and restarts are disabled (as torch).
    DState {
        found: HangFinding,
        judged_at: Instant,
    },
    /// torch FileTimers expired: the capture (if one was taken), then the signals to send.
    TimerExpired {
        found: Option<HangFinding>,
        signals: Vec<TimerSignal>,
    },
}
