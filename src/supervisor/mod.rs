//! Supervision of the local worker group: spawn, watch, stop, restart, forward output, report.

pub mod output;
pub mod report;

use crate::config::LaunchConfig;

/// Runs one launch to the end and returns the process exit code (see [`crate::exit`]).
///
/// Contract stub: replaced by the agent (supervisor issue).
pub fn run(config: LaunchConfig) -> i32 {
    let _ = config;
    eprintln!("rdrun: error: the supervisor is not built yet");
    crate::exit::LAUNCHER_FAILURE
}
