//! Containment of the health checks' programs (issue 38.11; the checks are `crate::health`,
//! what they do to the run `nodes/health_gate.rs`): each program — the interpreter check,
//! `nvidia-smi`, the site's `--health-check-cmd` — runs in a cgroup of its own below the run's
//! (`check-<n>`), killed and removed with whatever the program started (`setsid` and double
//! forks included) as soon as the program ends, and with the run's cgroup when rdrun stops or
//! dies (the watchdog kills the run's cgroup, sub-cgroups included). Its process group is
//! registered with the watchdog too. Without a cgroup (see `docs/containment.md`) the process
//! group, the watchdog and the parent-death signal remain. `--dry-run` has no run: [`dry_run`]
//! makes a cgroup for its checks alone.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::LaunchConfig;
use crate::health::{self, HealthReport};

use crate::supervisor::group::contain::{self, Cgroup, SubCgroup};

/// How long the end of a check waits for its cgroup to empty after SIGKILL.
const CELL_WAIT: Duration = Duration::from_secs(5);

/// The checks' containment ([`health::Containment`]) in one run.
#[derive(Debug)]
pub(in crate::supervisor) struct CheckCells {
    /// The run's cgroup directory, below which each program gets its own.
    run: Option<PathBuf>,
    /// The watchdog's registration socket. It outlives every check: the agent ends the `warn`
    /// checks (`nodes::health_gate::Background`) before it drops the watchdog.
    watchdog: Option<RawFd>,
}

impl CheckCells {
    pub(in crate::supervisor) fn of(
        run: Option<PathBuf>,
        watchdog: Option<RawFd>,
    ) -> health::Contain {
        Some(Arc::new(CheckCells { run, watchdog }))
    }
}

/// One program's cgroup.
struct Cell(SubCgroup);

impl health::Cell for Cell {
    fn procs_fd(&self) -> RawFd {
        self.0.procs_fd()
    }

    fn end(self: Box<Self>) {
        let dir = self.0.dir().display().to_string();
        if !self.0.destroy(CELL_WAIT) {
            // Left for the run's end, which kills and removes the run's cgroup, this one too.
            tracing::warn!(
                "a health check's processes outlived SIGKILL for {CELL_WAIT:?} (uninterruptible sleep?); their cgroup {dir} goes with the run's"
            );
        }
    }
}

impl health::Containment for CheckCells {
    fn cell(&self) -> Option<Box<dyn health::Cell>> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let run = self.run.as_ref()?;
        let name = format!("check-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        match SubCgroup::create(run, &name) {
            Ok(cg) => Some(Box::new(Cell(cg))),
            Err(err) => {
                tracing::debug!("a health check runs without a cgroup of its own: {err}");
                None
            }
        }
    }

    fn enter(&self, cell: Option<RawFd>) {
        if let Some(fd) = cell {
            let _ = contain::join(fd);
        }
        if let Some(fd) = self.watchdog {
            // SAFETY: getpid(2) has no arguments.
            crate::supervisor::group::deadman::register(fd, unsafe { libc::getpid() });
        }
    }
}

/// `--dry-run`'s checks (`health::run_blocking`), their programs contained in a cgroup made
/// for them alone (none where rdrun may not make one), removed with everything in it after.
/// Call before any runtime or thread exists (the cgroup is tried with a forked probe).
pub fn dry_run(config: &LaunchConfig) -> Option<HealthReport> {
    if !health::enabled(config.resilience.health) {
        return None;
    }
    let cgroup = match Cgroup::create(&contain::plan(config.run_env.cgroup)) {
        Ok(cg) => Some(cg),
        Err(err) => {
            tracing::debug!("the dry run's checks run without a cgroup: {err}");
            None
        }
    };
    let cells = CheckCells::of(cgroup.as_ref().map(|c| c.dir().to_path_buf()), None);
    let report = health::run_blocking(config, cells);
    if let Some(cg) = cgroup {
        cg.destroy(CELL_WAIT);
    }
    report
}
