//! What an attempt does to the world and reads from it, behind one trait: the clocks, signals
//! to worker process groups and to single processes, the kill of the run's cgroup, the table of
//! rdrun's own descendants. [`Os`] does it for real; the attempt's table tests use a fake that
//! records every effect and moves its clock by hand (`attempt_tests.rs`). Spawning is the other
//! effect, behind [`crate::supervisor::group::spawn::Spawner`].

use std::path::Path;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::supervisor::group::proctree::ProcEntry;
use crate::supervisor::group::worker;

/// The attempt's effects and probes.
pub(crate) trait Effects {
    /// The monotonic clock (deadlines, the peer-loss window).
    fn now(&self) -> Instant;
    /// The wall clock (when a failure was seen, when the stop signal went out).
    fn wall(&self) -> SystemTime;
    /// `kill(-pgid, sig)`: a worker's whole process group.
    fn signal_group(&mut self, pgid: i32, sig: i32);
    /// `kill(pid, sig)`: one process.
    fn signal_pid(&mut self, pid: i32, sig: i32);
    /// SIGKILL of everything in the run's cgroup (containment), bounded by `wait`.
    fn kill_cgroup(&mut self, dir: &Path, wait: Duration);
    /// The live descendants of rdrun that it started (never what it inherited).
    fn own_tree(&self) -> Vec<ProcEntry>;
    /// The worker (of `workers`, live main pids) whose process tree holds `pid`, if any.
    fn owning_worker(&self, pid: i32, workers: &[i32]) -> Option<i32>;
    /// A process's command line, for the leftovers' warning.
    fn command_line(&self, pid: i32) -> String;
}

/// The real thing: system calls and `/proc`.
pub(crate) struct Os;

impl Effects for Os {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn signal_group(&mut self, pgid: i32, sig: i32) {
        worker::signal_group(pgid, sig);
    }

    fn signal_pid(&mut self, pid: i32, sig: i32) {
        worker::signal_pid(pid, sig);
    }

    fn kill_cgroup(&mut self, dir: &Path, wait: Duration) {
        crate::supervisor::group::contain::kill(dir, wait);
    }

    fn own_tree(&self) -> Vec<ProcEntry> {
        let me = std::process::id() as i32;
        crate::supervisor::group::proctree::own_tree(
            me,
            crate::supervisor::group::proctree::note_inherited(),
        )
    }

    fn owning_worker(&self, pid: i32, workers: &[i32]) -> Option<i32> {
        crate::supervisor::watch::timers::owning_worker(pid, workers)
    }

    fn command_line(&self, pid: i32) -> String {
        crate::supervisor::group::proctree::command_line(pid)
    }
}
