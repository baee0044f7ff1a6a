//! Supervision of one node's share of a run: spawn, watch, stop, restart, forward output, report.
//!
//! [`run`] is the entry point the binary calls and returns an [`Ended`] (a [`RunEnd`] and the
//! restarts it took). The agent (`agent.rs`, with `agent_between.rs` and `agent_rounds.rs`)
//! owns the run's state, the restart loop and the select loop; `setup.rs` what a run sets up
//! once and the narrow settings built from the config (what the health checks read of the
//! launch; [`dry_run_health`] for `--dry-run`); `workers.rs` the real spawner of an attempt's
//! workers. Around it, one wing per job:
//!
//! - [`group`]: the local worker group: one attempt's state and events, the effects it asks
//!   for, spawning (cold or forked warm), the stop sequence, signals, the process tree, the
//!   run's cgroup and the watchdog process that outlives rdrun, the restart decision.
//! - [`nodes`]: the coordination between nodes: joining rounds, the network and health gates,
//!   the failure counts and root cause every node shares, the stop verdict.
//! - [`watch`]: hangs, heartbeats, FileTimer, stacks.
//! - [`output`]: the workers' output, prefixed, collapsed, tailed, to the console and log files.
//! - `observe`: the observer and its renderers (events, metrics, health endpoint, the status
//!   line, capture blocks), each consuming the agent's `RunEvent`s.
//! - [`report`]: how the run ended: the failure report, its JSON, restart costs, CI outputs.

mod agent;
pub mod chaos;
pub mod group;
pub mod nodes;
mod observe;
pub mod output;
pub mod report;
mod setup;
pub mod watch;
mod workers;

pub use agent::run;
pub use report::end::{
    end_json, error_chain, write_end_json, write_parent_error_file, BadNode, Ended, LaunchError,
    Restart, RunEnd,
};
pub use setup::dry_run_health;
