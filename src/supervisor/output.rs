//! Worker output: `--log-dir` layout, `-r/--redirects`, `-t/--tee`, `--local-ranks-filter`, line
//! prefixes, and line-atomic forwarding of every worker's stdout/stderr pipes to the console.
//!
//! Contract (filled in by the output/report work; the agent calls only these items):
//! - [`RunLogs::new`] once per run, [`RunLogs::attempt`] before each spawn round, [`RunLogs::finish`]
//!   at the end (removes directories rdrun created that hold nothing).
//! - [`forward`] once per worker with the read ends of its stdout and stderr pipes; the returned
//!   task ends when both reach EOF and yields the last stderr lines for the failure report.

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::config::LogConfig;

/// Log layout of one run: `<log_dir>/<run_id>_<suffix>/attempt_<n>/<local_rank>/…`, created lazily.
#[derive(Debug)]
pub struct RunLogs {
    _log: LogConfig,
    _run_id: String,
}

/// What one attempt's workers get.
#[derive(Debug, Clone)]
pub struct AttemptLogs {
    /// One entry per local rank.
    pub ranks: Vec<RankLogs>,
}

/// Per-rank log settings for one attempt.
#[derive(Debug, Clone)]
pub struct RankLogs {
    /// Value of TORCHELASTIC_ERROR_FILE for this worker ("" when logs go nowhere).
    pub error_file: String,
    /// Where this worker's streams go; passed back to [`forward`].
    pub sink: RankSink,
}

/// Where one worker's two streams go (console, file, both, nowhere) and the tee prefix.
#[derive(Debug, Clone, Default)]
pub struct RankSink {
    pub stdout_file: Option<PathBuf>,
    pub stderr_file: Option<PathBuf>,
    pub stdout_console: bool,
    pub stderr_console: bool,
    /// Prefix for console lines (tee'd streams only), e.g. `[default0]:`.
    pub prefix: Option<String>,
}

/// What [`forward`] yields when both streams are closed.
#[derive(Debug, Clone, Default)]
pub struct OutputSummary {
    /// The last (up to 20) lines the worker wrote to stderr.
    pub stderr_tail: Vec<String>,
}

/// Identity of a worker for prefixes and templates.
#[derive(Debug, Clone)]
pub struct RankIdentity {
    pub role: String,
    pub rank: usize,
    pub local_rank: usize,
    pub hostname: String,
}

impl RunLogs {
    pub fn new(log: &LogConfig, run_id: &str) -> Self {
        RunLogs {
            _log: log.clone(),
            _run_id: run_id.to_string(),
        }
    }

    /// Prepares attempt `restart_count` for `ids.len()` workers (index = local rank).
    pub fn attempt(
        &mut self,
        restart_count: u32,
        ids: &[RankIdentity],
    ) -> std::io::Result<AttemptLogs> {
        let _ = restart_count;
        Ok(AttemptLogs {
            ranks: ids
                .iter()
                .map(|_| RankLogs {
                    error_file: String::new(),
                    sink: RankSink {
                        stdout_console: true,
                        stderr_console: true,
                        ..RankSink::default()
                    },
                })
                .collect(),
        })
    }

    /// Ends the run: removes directories rdrun created that hold nothing.
    pub fn finish(self) {}
}

/// Forwards one worker's stdout and stderr (pipe read ends) line by line according to `sink`.
/// Must be called from within a tokio runtime.
pub fn forward(
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> tokio::task::JoinHandle<OutputSummary> {
    let _ = (id, sink, stdout, stderr);
    tokio::spawn(async { OutputSummary::default() })
}
