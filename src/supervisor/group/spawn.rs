//! Starting one attempt's workers, behind the [`Spawner`] trait the attempt calls: the real one
//! (`supervisor/workers.rs`, beside the agent: it builds each local rank's spawn spec, starts
//! the process and its output forwarder, and tells the observer), and in the attempt's table
//! tests a fake that hands out pids (`attempt_tests.rs`).

use std::path::PathBuf;

use tokio::task::JoinHandle;

use crate::supervisor::output::{self, OutputSummary, RankIdentity};

/// One started worker, as the attempt keeps it.
pub(crate) struct Spawned {
    /// Process id = process group id = session id.
    pub pid: i32,
    /// The output forwarder (`None` when nothing forwards: a fake).
    pub output: Option<JoinHandle<OutputSummary>>,
    /// Output bytes so far and the last lines (the hang detector's signal and capture).
    pub activity: output::Activity,
    /// torch's error file for this rank (`None` when not set).
    pub error_file: Option<PathBuf>,
}

/// Starts the worker of one local rank; the error is one line for the report.
pub(crate) trait Spawner {
    fn spawn(&mut self, local_rank: usize, id: &RankIdentity) -> Result<Spawned, String>;
}
