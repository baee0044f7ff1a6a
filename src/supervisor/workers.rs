//! The real [`Spawner`] of an attempt (the trait: `group/spawn.rs`): builds each local rank's
//! spawn spec (`group/worker.rs`), starts the process (cold, or forked warm), its output
//! forwarder, and tells the observer. It sits beside the agent, not in the worker group's wing:
//! it wires the group to the output and the observer, which the group itself never calls.

use std::path::PathBuf;

use tokio::sync::watch;

use crate::rendezvous::Assignment;

use crate::supervisor::group::spawn::{Spawned, Spawner};
use crate::supervisor::group::worker::{self, WorkerSettings};
use crate::supervisor::observe::{Observer, RunEvent};
use crate::supervisor::output::{self, AttemptLogs, RankIdentity};

/// The real spawner: what a spawn spec reads of the launch (with the run's shared worker
/// environment), this attempt's round, log sinks, the observer.
pub(crate) struct Workers<'a> {
    pub settings: WorkerSettings<'a>,
    pub asg: &'a Assignment,
    pub logs: &'a AttemptLogs,
    /// The run's warm-start template manager, which forks the workers it can (`--warm-start`).
    pub warm: Option<&'a crate::supervisor::group::warm::WarmStart>,
    pub obs: &'a Observer,
    /// The terminal's console, where the workers' output goes.
    pub console: &'a output::Console,
    /// Tells the output forwarders that every process rdrun can stop is gone: a pipe still open
    /// then is held by a descendant that escaped and outlived the stop (`output::pump`).
    pub stop_output: &'a watch::Sender<bool>,
    /// How many workers were forked warm, and started cold (the restart's cost line).
    pub started: (usize, usize),
}

impl Spawner for Workers<'_> {
    fn spawn(&mut self, lr: usize, id: &RankIdentity) -> Result<Spawned, String> {
        let rank_logs = &self.logs.ranks[lr];
        let mut spec = worker::spawn_spec(&self.settings, self.asg, lr, &rank_logs.error_file)
            .map_err(|err| err.to_string())?;
        // `Group::spawn` starts the local ranks in order, one right after the other.
        spec.more_follow = lr + 1 < self.logs.ranks.len();
        let spawned = worker::spawn(&spec, self.warm).map_err(|err| err.describe())?;
        tracing::debug!(local_rank = lr, pid = spawned.pid, "worker started");
        match spawned.warm {
            true => self.started.0 += 1,
            false => self.started.1 += 1,
        }
        if let Some(attach) = &spec.debug {
            // `--debug-rank`: one line, where to attach (or how to look inside without debugpy).
            output::own::stderr_line(&crate::supervisor::group::debugrank::announcement(
                id.rank,
                spawned.pid,
                attach,
            ));
        }
        let activity = output::Activity::default();
        self.obs.emit(RunEvent::Spawned {
            local_rank: id.local_rank,
            rank: id.rank,
            pid: spawned.pid,
            output: &activity.bytes,
        });
        let handle = output::forward_until(
            self.console.clone(),
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
