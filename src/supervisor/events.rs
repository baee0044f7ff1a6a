//! Internal events the agent reacts to, in the order it sees them.
//!
//! The agent is the only owner of the worker-group state; everything that happens outside it
//! (a child exited, a signal arrived, a deadline passed) reaches it as one of these values.

use crate::exit::WorkerStatus;
use crate::rendezvous::RdzvEvent;

/// Something the agent must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
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
}
