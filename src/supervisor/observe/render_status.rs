//! The status line's renderer: what rdrun waits for, from the events that begin and end a wait
//! (connecting to the rendezvous store, a round, the stop's grace, the exit barrier). The line
//! itself — its text, its printer task, the terminal's live line — is `status.rs`'s.

use super::event::RunEvent;
use super::facts::{Facts, Renderer};
use super::status::{Status, Waiting};
use crate::rendezvous::progress::Board;
use crate::supervisor::group::stop::Phase;

/// Sets the wait of the status line (see the module docs).
pub struct StatusRenderer {
    status: Status,
}

impl StatusRenderer {
    pub fn new(status: Status) -> StatusRenderer {
        StatusRenderer { status }
    }

    /// The board a rendezvous round publishes its looks to (the same for the whole run).
    pub fn board(&self) -> Board {
        self.status.board()
    }
}

impl Renderer for StatusRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, _: &Facts) {
        match ev {
            RunEvent::Connecting { endpoint } => {
                self.status.set(Some(Waiting::connect(endpoint.clone())));
            }
            RunEvent::RendezvousBegins(_) => self.status.set(Some(Waiting::rendezvous())),
            RunEvent::StopProgress { stop, live } => match stop.phase() {
                Phase::Running => {}
                Phase::Grace(deadline) if *live > 0 => {
                    self.status.set(Some(Waiting::grace(deadline, *live)));
                }
                Phase::Grace(_) | Phase::Killed(_) => self.status.set(None),
            },
            RunEvent::BarrierBegins { timeout } => self
                .status
                .set(Some(Waiting::barrier(std::time::Instant::now() + *timeout))),
            RunEvent::Connected
            | RunEvent::RendezvousEnded(_)
            | RunEvent::AttemptOver
            | RunEvent::BarrierEnded => self.status.set(None),
            // Nothing is waited for any more: the printer ends (a status line on a terminal is
            // cleared first).
            RunEvent::RunEnd(_) => self.status.stop(),
            _ => {}
        }
    }
}
