//! What the agent reacts to, in the order it sees them: every wake-up of an attempt is one
//! [`Event`], handed to the attempt's group ([`crate::supervisor::group::attempt::Group::handle`]).
//!
//! The agent is the only owner of the worker-group state; everything that happens outside it
//! (a child exited, a signal arrived, a deadline passed, the rendezvous changed, the watch task
//! judged) reaches it as one of these values.

use crate::exit::WorkerStatus;
use crate::rendezvous::RdzvEvent;

use crate::supervisor::watch::verdict::WatchVerdict;

/// Something the agent must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A child of rdrun was reaped (a worker, an orphaned grandchild, or the watchdog).
    Reaped { pid: i32, status: WorkerStatus },
    /// A handled signal reached rdrun.
    Signal(i32),
    /// The current stop phase ran out of time (grace, then the bounded SIGKILL wait).
    Deadline,
    /// The worker store stopped serving (why): the run cannot go on.
    StoreStopped(String),
    /// The rendezvous reported a change (multi-node): membership, closed, or store lost.
    Rendezvous(RdzvEvent),
    /// `--leftovers=wait`: time to look again whether what the workers left is gone (a
    /// grandchild's exit sends rdrun no SIGCHLD).
    LeftoverPoll,
    /// The watch task's verdict: a hang, a worker stuck in D state, expired FileTimers.
    Watch(WatchVerdict),
}
