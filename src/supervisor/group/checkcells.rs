//! Containment of the health checks' programs (issue 38.11; the checks are `crate::health`,
//! what they do to the run `nodes/health_gate.rs`): each program — the interpreter check,
//! `nvidia-smi`, the site's `--health-check-cmd` — runs in a cgroup of its own below the run's
//! (`check-<n>`), killed and removed with whatever the program started (`setsid` and double
//! forks included) as soon as the program ends, and with the run's cgroup when rdrun stops or
//! dies (the watchdog kills the run's cgroup, sub-cgroups included). Its process group is
//! registered with the watchdog too. Without a cgroup (see `docs/containment.md`) the process
//! group, the watchdog and the parent-death signal remain. `--dry-run` has no run:
//! [`DryRunCells`] makes a cgroup for its checks alone.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::health;

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

/// `--dry-run`'s containment of its checks (`health::run_blocking`): a cgroup made for them
/// alone (none where rdrun may not make one, `mode` being `RDRUN_CGROUP`), removed with
/// everything in it when this is dropped. Make it before any runtime or thread exists (the
/// cgroup is tried with a forked probe).
pub struct DryRunCells {
    cgroup: Option<Cgroup>,
}

impl DryRunCells {
    pub fn create(mode: contain::Mode) -> DryRunCells {
        let cgroup = match Cgroup::create(&contain::plan(mode)) {
            Ok(cg) => Some(cg),
            Err(err) => {
                tracing::debug!("the dry run's checks run without a cgroup: {err}");
                None
            }
        };
        DryRunCells { cgroup }
    }

    /// The containment the dry run's checks are built with (`health::Inputs::contain`).
    pub fn contain(&self) -> health::Contain {
        CheckCells::of(self.cgroup.as_ref().map(|c| c.dir().to_path_buf()), None)
    }
}

impl Drop for DryRunCells {
    fn drop(&mut self) {
        if let Some(cg) = self.cgroup.take() {
            cg.destroy(CELL_WAIT);
        }
    }
}
