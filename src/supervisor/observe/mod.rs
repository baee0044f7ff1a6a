//! Watching a run from outside (issue 15): the agent owns one [`Observer`] and emits a
//! [`RunEvent`] ([`event`]) where things happen (one line each); the observer hands each event
//! to its renderers, separate objects that each consume the events they care about
//! ([`facts::Renderer`]), so the agent's select loop never formats JSON, touches a registry or
//! draws a line. Only the agent emits (`import_rules.rs`).
//!
//! The renderers, in the order each event reaches them: the status line ([`render_status`];
//! the line itself is [`status`]'s), the health state ([`render_health`]; the state and its
//! HTTP answer are [`health`]'s), the Prometheus metrics ([`render_metrics`]; the registry is
//! [`metrics`]', its text forms [`exposition`]'s), the capture blocks ([`render_capture`]), the
//! lifecycle events ([`render_events`]: `events.jsonl`, `--events` and their console lines,
//! through [`lifecycle`]'s sinks) and the report's restarts ([`render_report`], read back at the
//! run's end for `--report-json`). The order keeps rdrun's stderr as it was: a wait's status
//! line is ended before the event lines that follow it, and a hang's capture block comes
//! before its `hang` line. What several renderers read — the attempt, the workers, the
//! durations an event measures — is one [`facts::Facts`], updated before the renderers and lent
//! to them (its module doc says why one struct and not a copy in each).
//!
//! This file holds the handle, the dispatch and the lifecycle: [`Observer::start`] takes the
//! small [`settings::Settings`] the agent builds from the config, opens the sinks, binds the
//! servers ([`serve`], over the minimal HTTP responder [`http`]) and writes `run_start`; the
//! servers stop when the last handle is dropped. Nothing here can fail the run once it started:
//! a sink that breaks is dropped with one warning. Only binding the ports and opening
//! `--events` fail the launch, before anything starts.

pub mod event;
pub mod exposition;
pub mod facts;
pub mod health;
pub mod http;
pub mod lifecycle;
pub mod metrics;
pub mod render_capture;
pub mod render_events;
pub mod render_health;
pub mod render_metrics;
pub mod render_report;
pub mod render_status;
pub mod serve;
pub mod settings;
pub mod status;

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::rendezvous::progress::Board;
use crate::supervisor::output::Console;
pub use event::RunEvent;
use facts::{Facts, Renderer};
use health::Health;
use lifecycle::Common;
use render_events::EventsRenderer;
use render_status::StatusRenderer;
pub use settings::{ConfigShown, Settings};
use status::Status;

/// The agent's observer (see the module docs): a shared handle, so that the run's end is
/// recorded whichever way the agent returns.
#[derive(Clone)]
pub struct Observer(Arc<std::sync::Mutex<Inner>>);

impl Observer {
    /// Opens the sinks, binds the servers and emits `run_start` (see [`Inner::start`]);
    /// `console`: the terminal's, which draws the status line on a terminal.
    pub async fn start(settings: Settings, console: Console) -> Result<Observer, String> {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_string());
        let inner = Inner::start(&settings, &host, Some(console)).await?;
        Ok(Observer(Arc::new(std::sync::Mutex::new(inner))))
    }

    /// Hands `ev` to the renderers (the lock is never held across an await).
    pub fn emit(&self, ev: RunEvent<'_>) {
        self.lock().on(ev);
    }

    /// Where the round about to be joined publishes what it waits for (the status line's);
    /// join it in [`crate::rendezvous::progress::Board::scope`].
    pub fn join_progress(&self) -> Board {
        self.lock().board.clone()
    }

    /// The workers of the last attempt as (local rank, global rank), by rank.
    pub fn last_ranks(&self) -> Vec<(usize, usize)> {
        self.lock().facts.last_ranks()
    }

    /// The restarts and regroups the run took, with their causes and costs
    /// ([`render_report`]), for `--report-json`.
    pub fn restarts(&self) -> Vec<crate::supervisor::report::end::Restart> {
        self.lock().report.restarts()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The observer's state: the shared facts, the renderers in their order, the servers.
struct Inner {
    facts: Facts,
    /// Every event reaches each, in this order (the module docs say why).
    renderers: Vec<Box<dyn Renderer>>,
    /// The report's renderer, last (it prints nothing); held apart so that the run's end can
    /// read its restarts back.
    report: render_report::ReportRenderer,
    /// The status line's board, the same for the whole run.
    board: Board,
    servers: Vec<JoinHandle<()>>,
}

impl Inner {
    /// Opens the sinks and binds the servers (errors: one line, the launch fails), then emits
    /// `run_start`.
    async fn start(
        settings: &Settings,
        host: &str,
        console: Option<Console>,
    ) -> Result<Inner, String> {
        let mut events = EventsRenderer::open(settings)?;
        let health = Health::default();
        let served = serve::start(&settings.sinks, &health).await?;
        let facts = Facts::new(
            Common {
                run_id: settings.run_id.clone(),
                attempt: 0,
                node_rank: settings.known_node_rank,
                host: host.to_string(),
            },
            settings.nproc,
            settings.grace,
        );
        events.run_start(&facts.common, settings);
        let status = StatusRenderer::new(Status::new(settings.status_interval, console));
        let board = status.board();
        let mut renderers: Vec<Box<dyn Renderer>> = vec![
            Box::new(status),
            Box::new(render_health::HealthRenderer::new(health)),
        ];
        if let Some(m) = served.metrics {
            renderers.push(Box::new(render_metrics::MetricsRenderer::new(m)));
        }
        renderers.push(Box::new(render_capture::CaptureRenderer));
        renderers.push(Box::new(events));
        Ok(Inner {
            facts,
            renderers,
            report: render_report::ReportRenderer::default(),
            board,
            servers: served.tasks,
        })
    }

    /// Hands one event to the renderers (`event.rs`'s module doc): the facts first, then each
    /// renderer in turn; what a renderer does not render it ignores.
    fn on(&mut self, ev: RunEvent<'_>) {
        self.facts.before(&ev);
        for r in &mut self.renderers {
            r.on(&ev, &self.facts);
        }
        self.report.on(&ev, &self.facts);
        self.facts.after(&ev);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The servers' last answer was the final state; they end with the observer.
        for t in &self.servers {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests;
