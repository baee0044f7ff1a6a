//! The report's renderer: the restarts and regroups the run took, as `--report-json`'s
//! `restarts` lists them (`report/end.rs`'s [`Restart`]), rendered from the events — each
//! `restart` with the attempt that ended and its cause, the next attempt's `restart_cost`, and
//! its `restart_back` (`back_in_user_code_s`). The agent reads the list back once the run is
//! over ([`super::Observer::restarts`]), beside the last attempt's ranks from the shared facts.
//! The rest of the report is the run's end itself (`report/end.rs`, `report/schema.rs`).

use super::event::RunEvent;
use super::facts::{Facts, Renderer};
use crate::supervisor::report::end::Restart;

/// The run's restarts so far (see the module docs).
#[derive(Debug, Default)]
pub struct ReportRenderer {
    restarts: Vec<Restart>,
}

impl ReportRenderer {
    /// The restarts and regroups, in order.
    pub fn restarts(&self) -> Vec<Restart> {
        self.restarts.clone()
    }
}

impl Renderer for ReportRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, _facts: &Facts) {
        match ev {
            RunEvent::Restart {
                charged,
                ended,
                cause,
                ..
            } => self.restarts.push(Restart {
                restart_count: *ended,
                charged: *charged,
                cause: cause.to_string(),
                cost: None,
            }),
            // The cost of the restart whose next attempt was just spawned: the last one.
            RunEvent::RestartCost { fields, .. } => {
                if let Some(r) = self.restarts.last_mut() {
                    r.cost = Some((*fields).clone());
                }
            }
            RunEvent::RestartBack { secs, .. } => {
                if let Some(cost) = self
                    .restarts
                    .last_mut()
                    .and_then(|r| r.cost.as_mut())
                    .and_then(|c| c.as_object_mut())
                {
                    cost.insert("back_in_user_code_s".into(), (*secs).into());
                }
            }
            _ => {}
        }
    }
}
