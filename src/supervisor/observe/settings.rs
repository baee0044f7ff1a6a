//! What the observer reads of the run's configuration: a small [`Settings`] that the agent
//! builds from the resolved config (`supervisor/setup.rs` `observer_settings`), so that
//! observation sees only what it renders — its sinks and ports, the values every event carries
//! or measures against, and what `run_start`'s `config` field shows ([`ConfigShown`], rendered
//! here by [`Settings::config_json`]) — and a new config field cannot reach an event unseen.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::config::hang::HangMode;
use crate::config::observe::ObserveSettings;
use crate::config::{Endpoint, LeftoverPolicy, NodeRange, RdzvBackend};

/// The observer's settings (see the module docs).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where events go and which ports are served (`--events`, `--event-log-handler`,
    /// `--metrics-addr`, `TORCHELASTIC_HEALTH_CHECK_PORT`).
    pub sinks: ObserveSettings,
    /// The run id every event carries.
    pub run_id: String,
    /// The node rank every event carries from the start: known up front on a single node and
    /// on the static backend; `None`: a rendezvous round assigns it.
    pub known_node_rank: Option<usize>,
    /// Workers per node (`--nproc-per-node`): the group is complete when this many spawned.
    pub nproc: usize,
    /// The stop's grace (`--shutdown-timeout`): `stop_begin`'s `grace_s`, `stop_end`'s
    /// `grace_used_s`.
    pub grace: Duration,
    /// `--log-dir`: where the run directory, and so `events.jsonl`, will be.
    pub log_dir: Option<PathBuf>,
    /// The plain status line's interval (`RDRUN_STATUS_INTERVAL`).
    pub status_interval: Duration,
    /// The rest of what `run_start` shows.
    pub shown: ConfigShown,
}

/// The configuration values `run_start`'s `config` field shows besides those [`Settings`]
/// holds for its own use.
#[derive(Debug, Clone)]
pub struct ConfigShown {
    pub nnodes: NodeRange,
    /// `--node-rank` as given.
    pub node_rank: usize,
    pub rdzv_backend: RdzvBackend,
    pub rdzv_endpoint: Option<Endpoint>,
    pub standalone: bool,
    pub master_addr: String,
    pub master_port: Option<u16>,
    pub max_restarts: u32,
    pub role: String,
    /// The worker command: the program exec'd and its arguments.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub exit_barrier_timeout: Duration,
    pub leftovers: LeftoverPolicy,
    pub hang_detect: HangMode,
}

impl Settings {
    /// Whether a run directory will hold `events.jsonl` (a log directory other than
    /// `/dev/null`): the event log buffers until it exists.
    pub fn events_in_log_dir(&self) -> bool {
        self.log_dir
            .as_deref()
            .is_some_and(|d| d != Path::new("/dev/null"))
    }

    /// The resolved configuration, as `run_start` shows it.
    pub fn config_json(&self) -> Value {
        let c = &self.shown;
        json!({
            "nproc_per_node": self.nproc,
            "nnodes": format!("{}:{}", c.nnodes.min, c.nnodes.max),
            "node_rank": c.node_rank,
            "rdzv_backend": format!("{:?}", c.rdzv_backend).to_lowercase(),
            "rdzv_endpoint": c.rdzv_endpoint.as_ref().map(|e| format!("{}:{}", e.host, e.port)),
            "run_id": self.run_id,
            "standalone": c.standalone,
            "master_addr": c.master_addr,
            "master_port": c.master_port,
            "max_restarts": c.max_restarts,
            "role": c.role,
            "program": c.program.display().to_string(),
            "args": c.args.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
            "log_dir": self.log_dir.as_ref().map(|d| d.display().to_string()),
            "shutdown_timeout_s": self.grace.as_secs_f64(),
            "exit_barrier_timeout_s": c.exit_barrier_timeout.as_secs_f64(),
            "leftovers": format!("{:?}", c.leftovers).to_lowercase(),
            "hang_detect": format!("{:?}", c.hang_detect).to_lowercase(),
        })
    }
}
