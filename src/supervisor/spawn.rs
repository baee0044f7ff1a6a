//! Starting one attempt's workers, behind the [`Spawner`] trait: [`Workers`] builds each local
//! rank's spawn spec (`worker.rs`), starts the process and its output forwarder, and tells the
//! observer; the attempt's table tests use a fake that hands out pids (`attempt_tests.rs`).

use std::path::PathBuf;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::LaunchConfig;
use crate::rendezvous::Assignment;

use super::observe::Observer;
use super::output::{self, AttemptLogs, OutputSummary, RankIdentity};
use super::worker::{self, RunWorkerEnv};

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

/// The real spawner: the run's config and shared worker environment, this attempt's round, log
/// sinks, the observer.
pub(crate) struct Workers<'a> {
    pub config: &'a LaunchConfig,
    pub asg: &'a Assignment,
    pub logs: &'a AttemptLogs,
    pub worker_env: &'a RunWorkerEnv,
    pub obs: &'a Observer,
    /// Tells the output forwarders that every process rdrun can stop is gone: a pipe still open
    /// then is held by a descendant that escaped and outlived the stop (`output::pump`).
    pub stop_output: &'a watch::Sender<bool>,
    /// How many workers were forked warm, and started cold (the restart's cost line).
    pub started: (usize, usize),
}

impl Spawner for Workers<'_> {
    fn spawn(&mut self, lr: usize, id: &RankIdentity) -> Result<Spawned, String> {
        let rank_logs = &self.logs.ranks[lr];
        let mut spec = worker::spawn_spec(
            self.config,
            self.asg,
            lr,
            &rank_logs.error_file,
            self.worker_env,
        )
        .map_err(|err| err.to_string())?;
        // `Group::spawn` starts the local ranks in order, one right after the other.
        spec.more_follow = lr + 1 < self.logs.ranks.len();
        let spawned = worker::spawn(&spec).map_err(|err| err.describe())?;
        tracing::debug!(local_rank = lr, pid = spawned.pid, "worker started");
        match spawned.warm {
            true => self.started.0 += 1,
            false => self.started.1 += 1,
        }
        if let Some(attach) = &spec.debug {
            // `--debug-rank`: one line, where to attach (or how to look inside without debugpy).
            output::own::stderr_line(&super::debugrank::announcement(
                id.rank,
                spawned.pid,
                attach,
            ));
        }
        let activity = output::Activity::default();
        self.obs
            .get()
            .spawned(id.local_rank, id.rank, spawned.pid, &activity.bytes);
        let handle = output::forward_until(
            id.clone(),
            rank_logs.sink.clone(),
            spawned.stdout,
            spawned.stderr,
            self.stop_output.subscribe(),
            activity.clone(),
        );
        Ok(Spawned {
            pid: spawned.pid,
            output: Some(handle),
            activity,
            error_file: Some(rank_logs.error_file.as_str())
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
        })
    }
}
