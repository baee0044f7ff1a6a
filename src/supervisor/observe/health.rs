//! The health state of the local worker group, as the health endpoint answers it: 200 while the
//! group runs healthily, 503 otherwise (starting, in rendezvous, stopping, restarting, failed,
//! finished). torchrun's `TORCHELASTIC_HEALTH_CHECK_PORT` is a no-op stub in open-source builds;
//! here it is this state over HTTP, on every path, and also `/healthz` on the metrics server.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use super::http::{text, Response};

/// Where the group stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Starting = 0,
    Rendezvous = 1,
    /// Workers are being started.
    Spawning = 2,
    /// Every worker is up and none failed: the only healthy state.
    Running = 3,
    /// A stop is under way (a failure, a signal, a membership change).
    Stopping = 4,
    /// The group stopped and a new attempt follows.
    Restarting = 5,
    /// The run is over and failed (or was interrupted).
    Failed = 6,
    /// The run is over and succeeded (the exit barrier may still run).
    Succeeded = 7,
}

impl State {
    const ALL: [State; 8] = [
        State::Starting,
        State::Rendezvous,
        State::Spawning,
        State::Running,
        State::Stopping,
        State::Restarting,
        State::Failed,
        State::Succeeded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Rendezvous => "rendezvous",
            State::Spawning => "spawning",
            State::Running => "running",
            State::Stopping => "stopping",
            State::Restarting => "restarting",
            State::Failed => "failed",
            State::Succeeded => "succeeded",
        }
    }
}

/// The shared state: its renderer (`render_health.rs`) sets it, the HTTP handlers and
/// `rdrun_healthy` read it.
#[derive(Debug, Clone)]
pub struct Health(Arc<AtomicU8>);

impl Default for Health {
    fn default() -> Self {
        Health(Arc::new(AtomicU8::new(State::Starting as u8)))
    }
}

impl Health {
    pub fn set(&self, s: State) {
        self.0.store(s as u8, Ordering::Relaxed);
    }

    pub fn get(&self) -> State {
        let v = self.0.load(Ordering::Relaxed);
        State::ALL
            .into_iter()
            .find(|s| *s as u8 == v)
            .unwrap_or(State::Starting)
    }

    /// The HTTP answer: 200 `running`, else 503 with the state's name.
    pub fn response(&self) -> Response {
        let s = self.get();
        let code = if s == State::Running { 200 } else { 503 };
        text(code, format!("{}\n", s.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_running_is_healthy() {
        let h = Health::default();
        for s in State::ALL {
            h.set(s);
            assert_eq!(h.get(), s);
            let r = h.response();
            assert_eq!(r.status == 200, s == State::Running, "{s:?}");
            assert_eq!(r.body.trim(), s.name());
        }
    }
}
