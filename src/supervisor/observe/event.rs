//! What the agent tells the observer: one [`RunEvent`] per thing that happened, handed to
//! the observer's `emit`, which passes it to each of its renderers in turn (`render_*.rs`) —
//! the status line, the health state, the Prometheus metrics, the capture blocks and the
//! lifecycle event log (`events.jsonl`, `--events`, the console's event lines) — so the agent
//! never formats JSON, touches a registry or writes the terminal, and no module below the agent
//! names the observer at all (`import_rules.rs` enforces it): the node gates
//! (`nodes/health_gate.rs`, `nodes/network_check.rs`) hand what they found back to the agent,
//! which emits it.
//!
//! The events borrow what they describe: the observer renders each at once, under its lock,
//! and keeps nothing of it (the facts it keeps are `facts.rs`'s).

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::config::RdzvConfig;
use crate::exit::WorkerStatus;
use crate::health::network::{NetVerdict, Peer};
use crate::health::HealthReport;
use crate::rendezvous::{Assignment, RoundReason};

use crate::supervisor::group::stop::GroupStop;
use crate::supervisor::report::end::RunEnd;
use crate::supervisor::watch::hang::OutputCounter;
use crate::supervisor::watch::verdict::HangFinding;

/// One thing that happened in the run, as the agent saw it.
pub enum RunEvent<'a> {
    /// Connecting to (or hosting) the rendezvous store at `endpoint`, before the first round.
    Connecting { endpoint: String },
    /// The rendezvous store is reachable (or the attempt to reach it ended).
    Connected,
    /// A rendezvous round begins (why).
    RendezvousBegins(RoundReason),
    /// The round ended: its assignment, or how the run ends.
    RendezvousEnded(Result<&'a Assignment, &'a RunEnd>),
    /// An attempt begins: its number, the run directory (for `events.jsonl`).
    AttemptBegins {
        attempt: u32,
        run_dir: Option<&'a Path>,
    },
    /// A worker was started (`output`: its byte counter, sampled for the metrics).
    Spawned {
        local_rank: usize,
        rank: usize,
        pid: i32,
        output: &'a OutputCounter,
    },
    /// A child was reaped (only workers of this attempt make an event).
    Reaped { pid: i32, status: WorkerStatus },
    /// A handled signal reached rdrun.
    Signal(i32),
    /// A turn of the attempt's loop: where the group's stop is (a stop beginning, its
    /// escalation to SIGKILL, the grace left on the status line) and how many workers live.
    StopProgress { stop: &'a GroupStop, live: usize },
    /// The attempt's processes are gone: a stop under way is finished.
    AttemptOver,
    /// A new attempt follows: its number, whether it used a restart, `restart` or `regroup`;
    /// the attempt that ended (its TORCHELASTIC_RESTART_COUNT) and what ended it, for the
    /// report's `restarts`.
    Restart {
        next: u32,
        charged: bool,
        kind: &'a str,
        ended: u32,
        cause: &'a str,
    },
    /// The next attempt's workers were spawned after a restart: its phases
    /// (`report/restart_cost.rs`'s JSON) and the total.
    RestartCost { fields: &'a Value, total: Duration },
    /// A restarted attempt's ranks are all back in user code (their first output).
    RestartBack { restart: u32, secs: f64 },
    /// One run of the node's health checks (issue 28).
    HealthChecks(&'a HealthReport),
    /// One network pre-check after a round (issue 28 item 3): its verdict, the peers, the
    /// nodes left out, how long it took.
    NetworkCheck {
        verdict: &'a NetVerdict,
        peers: &'a [Peer],
        leaving: &'a [usize],
        took: Duration,
    },
    /// This node's worker failures in the run so far (issue 28 item 4).
    NodeFailures(u32),
    /// Every node's failure counts in the run as last read (node name, count).
    RunNodeFailures(&'a [(&'a str, u32)]),
    /// The hang detector's verdict (its capture block is printed).
    Hang(&'a HangFinding),
    /// The exit barrier begins (multi-node, after local success), bounded by `timeout`.
    BarrierBegins { timeout: Duration },
    /// The exit barrier ended.
    BarrierEnded,
    /// `--chaos` injected a fault (issue 41): the fault's record (`supervisor/chaos`).
    ChaosInject { fields: &'a Value },
    /// An injected fault's recovery was measured: its record, and its kind and seconds for
    /// the histograms.
    ChaosRecovered {
        kind: &'a str,
        detect: Option<f64>,
        recover: Option<f64>,
        fields: &'a Value,
    },
    /// The run is over.
    RunEnd(&'a RunEnd),
}

impl RunEvent<'_> {
    /// [`RunEvent::Connecting`] to the configured rendezvous endpoint.
    pub fn connecting(rdzv: &RdzvConfig) -> RunEvent<'static> {
        let endpoint = rdzv
            .endpoint
            .as_ref()
            .map_or_else(String::new, |e| format!("{}:{}", e.host, e.port));
        RunEvent::Connecting { endpoint }
    }
}
