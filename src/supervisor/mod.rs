//! Supervision of the local worker group: spawn, watch, stop, restart, forward output, report.
//!
//! [`run`] is the entry point the binary calls; `agent` owns the group state and drives the rest.

mod agent;
pub mod contain;
pub mod events;
pub mod ncclpath;
pub mod output;
pub mod report;
pub mod restart;
pub mod signals;
mod watchdog;
pub mod worker;

pub use agent::run;
