//! The health state's renderer: where the local worker group stands (`health.rs`'s [`State`],
//! which the health endpoint and `/healthz` answer and `rdrun_healthy` reads), moved along by the
//! events. Only a group whose every worker was spawned, none failed and no stop is under way is
//! `running`, the one healthy state.

use super::event::RunEvent;
use super::facts::{Facts, Renderer};
use super::health::{Health, State};
use crate::supervisor::report::end::RunEnd;

/// Sets the shared health state (see the module docs).
pub struct HealthRenderer {
    health: Health,
}

impl HealthRenderer {
    /// `health`: the state the HTTP handlers read.
    pub fn new(health: Health) -> HealthRenderer {
        HealthRenderer { health }
    }
}

impl Renderer for HealthRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, facts: &Facts) {
        let h = &self.health;
        match ev {
            RunEvent::Connecting { .. } | RunEvent::RendezvousBegins(_) => h.set(State::Rendezvous),
            RunEvent::AttemptBegins { .. } => h.set(State::Spawning),
            // The group is complete and no stop began while it was spawned.
            RunEvent::Spawned { .. } if facts.now.spawn_done.is_some() && !facts.stopping() => {
                h.set(State::Running);
            }
            RunEvent::Reaped { status, .. } if facts.now.exited.is_some() => {
                if !status.success() && h.get() == State::Running {
                    h.set(State::Stopping);
                }
                // Every worker exited 0: the group no longer runs (what follows is the run's
                // end).
                if facts.group_exited() && h.get() == State::Running {
                    h.set(State::Succeeded);
                }
            }
            RunEvent::StopProgress { .. } if facts.now.stop_began.is_some() => {
                h.set(State::Stopping);
            }
            RunEvent::Restart { .. } => h.set(State::Restarting),
            RunEvent::BarrierBegins { .. } => h.set(State::Succeeded),
            RunEvent::RunEnd(end) => h.set(match end {
                RunEnd::Succeeded => State::Succeeded,
                _ => State::Failed,
            }),
            _ => {}
        }
    }
}
