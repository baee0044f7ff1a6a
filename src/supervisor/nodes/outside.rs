//! An unhealthy elastic node waiting outside the run (issue 38.5). Under `--health-check on`
//! such a node does not join; it checks again after a back-off (`nodes::health_gate`). While it waits
//! it looks at the rendezvous every [`LOOK_EVERY`], and once the run it wanted to join is over
//! (the rendezvous closed: the job finished, or a node gave up; on c10d also the store gone
//! with the agent that hosted it) it stops waiting, so that it ends at once as a bad node
//! instead of checking on until the join timeout while it holds its allocation (a Slurm step
//! and its nodes: ten minutes).
//!
//! A c10d store that stops answering counts as gone by the rule the joined agents apply to
//! their own store (`StoreLoss`: `keep_alive_max_attempt` failed looks in a row, or none
//! answered for `keep_alive_interval × keep_alive_max_attempt`), so one lost answer does not
//! end it. etcd outlives every run: a look that fails there is only tried again.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::RdzvSettings;
use crate::rendezvous::plumbing::StoreLoss;
use crate::rendezvous::{RdzvStore, Rendezvous};

/// How often a node outside looks at the rendezvous: one small read, at the poll period's
/// default (only unhealthy nodes do it).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The bound of one look: a small read answers in milliseconds, and a store that has gone
/// is otherwise reconnected to for seconds per look. A late answer is one failed look of the
/// several that make the store gone.
const LOOK_BOUND: Duration = LOOK_EVERY;

/// What a node outside has seen of the store (see the module doc).
pub(in crate::supervisor) struct Outside {
    loss: StoreLoss,
    interval: Duration,
    max_attempt: u32,
    /// The first error of the looks failing now (the later ones are mostly "no answer").
    first_error: Option<String>,
}

impl Outside {
    /// A node that starts waiting outside the run now; `settings`: the run's typed rendezvous
    /// settings (c10d's keep-alive paces the looks).
    pub(in crate::supervisor) fn new(settings: Option<&RdzvSettings>) -> Outside {
        let (interval, max_attempt) = match settings {
            Some(RdzvSettings::C10d(s)) => (s.keep_alive_interval, s.keep_alive_max_attempt),
            _ => (LOOK_EVERY, 5),
        };
        Outside {
            loss: StoreLoss::new(Instant::now()),
            interval,
            max_attempt,
            first_error: None,
        }
    }

    /// Waits `how_long`, looking at the rendezvous now and every [`LOOK_EVERY`]: `Some(why)`
    /// (the run is over, in words) as soon as a look says so, without waiting out the rest.
    pub(in crate::supervisor) async fn wait(
        &mut self,
        rdzv: &Rendezvous,
        how_long: Duration,
    ) -> Option<String> {
        let until = Instant::now() + how_long;
        loop {
            if let Some(why) = self.look(rdzv).await {
                return Some(format!("the run this node waited to join is over ({why})"));
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            tokio::time::sleep((until - now).min(LOOK_EVERY)).await;
        }
    }

    /// One look: why the run is over, if it is.
    async fn look(&mut self, rdzv: &Rendezvous) -> Option<String> {
        let seen = match tokio::time::timeout(LOOK_BOUND, rdzv.closed_from_outside()).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {LOOK_BOUND:?}")),
        };
        match seen {
            Ok(Some(None)) => Some("the rendezvous was closed".into()),
            Ok(Some(Some(reason))) => Some(format!("the job {reason}")),
            Ok(None) => {
                self.loss.ok(Instant::now());
                self.first_error = None;
                None
            }
            Err(e) if rdzv.store_ends_with_the_run() => {
                tracing::debug!(error = %e, "looking at the rendezvous from outside failed");
                let first = self.first_error.get_or_insert(e).clone();
                let store = rdzv
                    .store
                    .as_ref()
                    .map(|s| s.describe())
                    .unwrap_or_default();
                self.loss
                    .failed(Instant::now(), self.interval, self.max_attempt)
                    .then(|| format!("its rendezvous store {store} stopped answering: {first}"))
            }
            Err(e) => {
                tracing::debug!(error = %e, "looking at the rendezvous from outside failed");
                None
            }
        }
    }
}
