//! What the agent does between two attempts, apart from the rendezvous (`agent_rounds.rs`):
//! the store hygiene before the next attempt's workers (none of the old attempt's keys, torch's
//! fatal-dump keys out), a shutdown that came between attempts, and the restart's cost once the
//! new workers are spawned (`report/restart_cost.rs`).

use super::Agent;
use crate::supervisor::group::signals::{self, SignalAction};
use crate::supervisor::observe::RunEvent;
use crate::supervisor::report::restart_cost::{BackWatch, RestartCost};
use crate::supervisor::watch::files::clear_torch_dump_keys;

impl Agent {
    /// The next attempt's workers were spawned (`started`: how many forked warm, how many
    /// cold): after a restart, its cost in one line at the default level (WARN, as torchrun's
    /// LOGLEVEL default and the "restarting" line before it), the event and histogram, and
    /// `--report-json`'s `seconds` of that restart (the observer's report renderer keeps it).
    /// Returns the cost, for the attempt's [`BackWatch`] (`None`: no restart came before it).
    pub(super) fn restart_cost(&mut self, started: (usize, usize)) -> Option<RestartCost> {
        let taken = self.restarts_taken;
        let cost = self.restart_clock.spawned(taken, started.0, started.1)?;
        self.chaos_restarted(cost.failed_at);
        tracing::warn!("{}", cost.line());
        self.obs.emit(RunEvent::RestartCost {
            fields: &cost.to_json(),
            total: cost.total(),
        });
        Some(cost)
    }

    /// Once every rank of a restarted attempt printed: the failure → back in user code, one
    /// line at the default level, the `restart_back` event and `--report-json`'s
    /// `back_in_user_code_s` of that restart (kept by the report renderer); the watch is then
    /// done.
    pub(super) fn check_back(&mut self) {
        let Some(back) = self.back_watch.as_ref().and_then(BackWatch::back) else {
            return;
        };
        let watch = self.back_watch.take().expect("checked");
        tracing::warn!("{}", watch.line(back));
        let secs = back.as_secs_f64();
        self.chaos_back(back);
        self.obs.emit(RunEvent::RestartBack {
            restart: watch.restart,
            secs,
        });
    }

    /// A shutdown signal already queued (other handled signals have no worker to go to).
    pub(super) fn queued_shutdown(&mut self) -> Option<i32> {
        while let Some(sig) = self.signals.try_recv() {
            if signals::action(sig) == SignalAction::Shutdown {
                return Some(sig);
            }
        }
        None
    }

    /// Between two attempts: the new one must see none of the previous attempt's keys (torchrun
    /// bug pytorch/pytorch#135712: a stale NCCL unique id reused after a restart).
    pub(super) fn between_attempts(&self) {
        if let Some(store) = &self.store {
            store.clear();
        }
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
    }

    /// Once the round is joined (every agent has stopped its old workers), before spawning:
    /// torch's fatal-dump keys out of every store rdrun hosts for workers, so a stale one from
    /// a previous attempt cannot poison this one (the static backend's rendezvous store keeps
    /// its keys across attempts; see `watch::files::TORCH_DUMP_KEYS`).
    pub(super) fn clear_torch_dump_keys(&self) {
        let hosted = self.rdzv.as_ref().and_then(|r| r.server.as_ref());
        for server in self.store.iter().chain(hosted) {
            let gone = clear_torch_dump_keys(server.store());
            if !gone.is_empty() {
                tracing::info!(
                    ?gone,
                    "deleted torch's fatal-dump store keys of the previous attempt"
                );
            }
        }
    }
}
