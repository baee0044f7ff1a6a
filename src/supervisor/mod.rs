//! Supervision of the local worker group: spawn, watch, stop, restart, forward output, report.
//!
//! [`run`] is the entry point the binary calls and returns an [`Ended`] (a [`RunEnd`] and the
//! restarts it took); `agent` owns the run's state, the restart loop and the select loop,
//! `attempt` one attempt's group state and its per-event methods, `stop` the stop sequence,
//! `restart` the restart decision, `report` the failure report, `worker` each worker's spawn
//! spec and process.

mod agent;
mod attempt;
pub mod checkcells;
pub mod ci;
pub mod contain;
pub mod debugrank;
mod effects;
mod end;
pub(crate) mod events;
mod failshare;
mod healthlink;
pub mod ncclpath;
mod netlink;
mod observe;
mod outcome;
pub mod output;
mod outside;
pub mod proctree;
mod rdzvlink;
mod redact;
pub mod report;
pub mod restart;
mod restartcost;
mod rootshare;
mod setup;
pub mod signals;
mod spawn;
mod stop;
pub mod verdict;
mod warm;
pub mod watch;
mod watchdog;
pub mod worker;

pub use agent::run;
pub use end::{
    end_json, error_chain, write_end_json, write_parent_error_file, BadNode, Ended, LaunchError,
    Restart, RunEnd,
};
