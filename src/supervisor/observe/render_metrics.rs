//! The Prometheus metrics' renderer: the values of `metrics.rs`'s registry, set as the events
//! arrive (workers up, attempts, restarts and what they cost, rounds, spawns and stops timed,
//! health and network checks, failure counts, chaos histograms). `/metrics` is served from the
//! same registry (`serve.rs`); what is sampled at a scrape instead is `metrics.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::event::RunEvent;
use super::facts::{Facts, Renderer};
use super::metrics::Metrics;

/// Sets the metric values (see the module docs); present only with `--metrics-addr`.
pub struct MetricsRenderer {
    metrics: Arc<Metrics>,
}

impl MetricsRenderer {
    pub fn new(metrics: Arc<Metrics>) -> MetricsRenderer {
        MetricsRenderer { metrics }
    }
}

impl Renderer for MetricsRenderer {
    fn on(&mut self, ev: &RunEvent<'_>, facts: &Facts) {
        let m = &self.metrics;
        match ev {
            RunEvent::RendezvousEnded(_) => {
                m.rendezvous_took(Duration::from_secs_f64(facts.now.round_s));
            }
            RunEvent::AttemptBegins { attempt, .. } => m.attempt_begins(*attempt),
            RunEvent::Spawned {
                local_rank, output, ..
            } => {
                m.spawned(*local_rank, (*output).clone());
                if let Some(took) = facts.now.spawn_done {
                    m.spawn_took(took);
                }
            }
            RunEvent::Reaped { .. } => {
                if let Some(w) = facts.now.exited {
                    m.exited(w.local_rank);
                }
            }
            RunEvent::AttemptOver => {
                if let Some(s) = facts.now.stop_ended {
                    m.stop_took(s.took);
                }
            }
            RunEvent::Restart { charged, .. } => m.restarted(*charged),
            RunEvent::RestartCost { total, .. } => m.restart_took(*total),
            RunEvent::HealthChecks(report) => {
                for v in &report.verdicts {
                    m.node_check(v.check, v.status == crate::health::Status::Failed);
                }
            }
            RunEvent::NetworkCheck { verdict, took, .. } => m.network_check(verdict, *took),
            RunEvent::NodeFailures(count) => m.node_failures(*count),
            RunEvent::RunNodeFailures(nodes) => m.run_node_failures(nodes.iter().copied()),
            RunEvent::ChaosRecovered {
                kind,
                detect,
                recover,
                ..
            } => m.chaos_recovered(kind, *detect, *recover),
            _ => {}
        }
    }
}
