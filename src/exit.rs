//! Exit codes of the `rdrun` binary: the only place where these numbers live.
//!
//! torchrun collapses every failure to 1; rdrun keeps 0 / 1 / 2 with torchrun's meaning and, for a
//! worker failure, exits with the root-cause worker's own status (its code, or 128+N for death by
//! signal N, as `srun` does). See docs/compat.md for the table against torchrun.

use crate::supervisor::RunEnd;

/// All workers exited 0.
pub const SUCCESS: i32 = 0;
/// A launcher-level failure: rendezvous timeout, a config error found after parsing, a worker that
/// could not be started, an internal error.
pub const LAUNCHER_FAILURE: i32 = 1;
/// A command-line usage error (as argparse/torchrun).
pub const USAGE: i32 = 2;

/// Shell convention for "terminated by signal N".
pub const fn for_signal(signal: i32) -> i32 {
    128 + signal
}

/// The status of a run that ended as `end`: 0 on success, the root cause's own status for a
/// worker failure, 128+N after signal N, 1 for a launcher error or a lost rendezvous.
pub fn for_run_end(end: &RunEnd) -> i32 {
    match end {
        RunEnd::Succeeded => SUCCESS,
        RunEnd::WorkersFailed(report) => report.exit_code(),
        RunEnd::Interrupted { signal, .. } => for_signal(*signal),
        RunEnd::LauncherError(_) | RunEnd::RendezvousLost(_) => LAUNCHER_FAILURE,
    }
}

/// How a worker process ended, as seen by `waitpid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerStatus {
    /// Normal exit with this code.
    Exited(i32),
    /// Killed by this signal number.
    Signaled(i32),
}

impl WorkerStatus {
    /// True when the worker succeeded.
    pub fn success(self) -> bool {
        self == WorkerStatus::Exited(0)
    }

    /// The status rdrun exits with when this worker is the root cause of a failure.
    ///
    /// An exit code of 0 cannot be a root cause; a code above 255 cannot occur on Linux, but is
    /// clamped so that a failure never turns into a success.
    pub fn launcher_exit_code(self) -> i32 {
        match self {
            WorkerStatus::Exited(code) if code & 0xff == 0 => LAUNCHER_FAILURE,
            WorkerStatus::Exited(code) => code & 0xff,
            WorkerStatus::Signaled(sig) => for_signal(sig),
        }
    }

    /// Popen-style code as torchrun prints it: negative for signals.
    pub fn torchrun_code(self) -> i32 {
        match self {
            WorkerStatus::Exited(code) => code,
            WorkerStatus::Signaled(sig) => -sig,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(WorkerStatus::Exited(3).launcher_exit_code(), 3);
        assert_eq!(WorkerStatus::Signaled(9).launcher_exit_code(), 137);
        assert_eq!(WorkerStatus::Signaled(15).torchrun_code(), -15);
        assert_eq!(
            WorkerStatus::Exited(0).launcher_exit_code(),
            LAUNCHER_FAILURE
        );
        assert_eq!(
            WorkerStatus::Exited(256).launcher_exit_code(),
            LAUNCHER_FAILURE
        );
        assert!(WorkerStatus::Exited(0).success());
        assert!(!WorkerStatus::Signaled(0).success());
    }

    #[test]
    fn run_ends() {
        use crate::supervisor::report::{Failure, FailureReport};
        let failed = |status| {
            RunEnd::WorkersFailed(
                FailureReport {
                    name: "x".into(),
                    host: "h".into(),
                    failures: vec![Failure {
                        local_rank: 0,
                        rank: 0,
                        pid: 1,
                        status,
                        observed_at: std::time::SystemTime::now(),
                        error_file: None,
                        stderr_tail: Vec::new(),
                        traceback: None,
                        abandoned: false,
                        stop_sent_at: None,
                    }],
                }
                .resolve(),
            )
        };
        let table = [
            (RunEnd::Succeeded, SUCCESS),
            (failed(WorkerStatus::Exited(3)), 3),
            (failed(WorkerStatus::Signaled(9)), 137),
            (
                RunEnd::Interrupted {
                    signal: 2,
                    report: None,
                },
                130,
            ),
            (RunEnd::error("x"), LAUNCHER_FAILURE),
            (RunEnd::RendezvousLost("gone".into()), LAUNCHER_FAILURE),
        ];
        for (end, want) in table {
            assert_eq!(for_run_end(&end), want, "{end:?}");
        }
    }
}
