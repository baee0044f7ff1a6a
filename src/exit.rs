//! Exit codes of the `rdrun` binary: the only place where these numbers live.
//!
//! torchrun collapses every failure to 1; rdrun keeps 0 / 1 / 2 with torchrun's meaning and, for a
//! worker failure, exits with the root-cause worker's own status (its code, or 128+N for death by
//! signal N, as `srun` does). See docs/compat.md for the table against torchrun.

/// Every way rdrun's process can end, and (in [`Exit::code`]) its status: the only mapping from
/// an outcome to a number. The supervisor maps its run's end here (`RunEnd::exit`), the config
/// its errors (`ConfigError::exit`), the binary its usage errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// All workers exited 0 (also `--help`, `--dry-run`).
    Success,
    /// A launcher-level failure: rendezvous timeout, a config error found after parsing, a
    /// worker that could not be started, a lost rendezvous, an internal error.
    LauncherFailure,
    /// A command-line usage error (as argparse/torchrun).
    Usage,
    /// A worker failure: the root-cause worker's own status.
    Worker(WorkerStatus),
    /// A shutdown signal reached rdrun.
    Signal(i32),
    /// Do not requeue (issue 28.5): the same failure ended `--max-same-failures` attempts in a
    /// row, so rdrun stopped restarting (restarts left or not); running the job again would
    /// fail the same way. 93, the code NVIDIA's ft_launcher uses for its no-progress verdict.
    DoNotRequeue,
    /// Bad node, requeue elsewhere (issue 28.2): this node failed a health check before any
    /// worker started (`--health-check on`); the job itself may be fine. 75 is sysexits'
    /// `EX_TEMPFAIL` ("try again later"): a requeue that excludes the named node.
    BadNode,
}

impl Exit {
    /// The process status: 0, 1, 2; the root cause's code, or 128+N for a worker killed by
    /// signal N (as `srun`); 128+N after signal N reached rdrun.
    pub const fn code(self) -> i32 {
        match self {
            Exit::Success => 0,
            Exit::LauncherFailure => 1,
            Exit::Usage => 2,
            Exit::Worker(status) => status.launcher_exit_code(),
            Exit::Signal(signal) => 128 + signal,
            Exit::DoNotRequeue => DO_NOT_REQUEUE,
            Exit::BadNode => BAD_NODE,
        }
    }
}

/// All workers exited 0.
pub const SUCCESS: i32 = Exit::Success.code();
/// See [`Exit::LauncherFailure`].
pub const LAUNCHER_FAILURE: i32 = Exit::LauncherFailure.code();
/// A command-line usage error (as argparse/torchrun).
pub const USAGE: i32 = Exit::Usage.code();
/// See [`Exit::DoNotRequeue`].
pub const DO_NOT_REQUEUE: i32 = 93;
/// See [`Exit::BadNode`].
pub const BAD_NODE: i32 = 75;

/// Every status rdrun exits with and what it means, in the words `--help` and the man page
/// list (`cli/help.rs`): a code added above must be added here (the test below checks the
/// named codes; `launcher-tests/helpscreen.rs` checks `--help` lists each).
pub const STATUSES: &[(&str, &str)] = &[
    (
        "0",
        "success: every worker exited 0 (also --help, --version, --dry-run)",
    ),
    (
        "1",
        "rdrun itself failed (a rendezvous timeout, a configuration error found after parsing, a \
         worker that could not start, a lost rendezvous)",
    ),
    ("2", "usage error (as torchrun's argparse)"),
    (
        "75",
        "bad node, requeue elsewhere: this node failed a health check under --health-check on, \
         is listed by --exclude-nodes-from, or left an elastic job (--max-node-failures)",
    ),
    (
        "93",
        "do not requeue: the same failure ended --max-same-failures attempts in a row",
    ),
    (
        "N",
        "a worker failed: the root-cause worker's own exit code (a code that is 0 modulo 256 \
         becomes 1)",
    ),
    (
        "128+N",
        "the root-cause worker died of signal N, or shutdown signal N reached rdrun (forwarded \
         to the workers, then rdrun stopped)",
    ),
];

/// Shell convention for "terminated by signal N".
pub const fn for_signal(signal: i32) -> i32 {
    Exit::Signal(signal).code()
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
    pub const fn launcher_exit_code(self) -> i32 {
        match self {
            WorkerStatus::Exited(code) if code & 0xff == 0 => Exit::LauncherFailure.code(),
            WorkerStatus::Exited(code) => code & 0xff,
            WorkerStatus::Signaled(sig) => Exit::Signal(sig).code(),
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

/// `SIGTERM` etc. as Python's `signal.Signals(n).name`; `None` where Python has no name.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    match signal {
        34 => Some("SIGRTMIN"),
        64 => Some("SIGRTMAX"),
        n => nix::sys::signal::Signal::try_from(n)
            .ok()
            .map(|s| s.as_str()),
    }
}

/// `SIGTERM`-style name of a signal number for rdrun's own lines: [`signal_name`], else
/// `SIG<n>`.
pub fn signal_label(sig: i32) -> String {
    signal_name(sig).map_or_else(|| format!("SIG{sig}"), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_labels() {
        assert_eq!(signal_label(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_label(1000), "SIG1000");
        assert_eq!(signal_label(34), "SIGRTMIN");
    }

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
        assert_eq!(Exit::DoNotRequeue.code(), 93);
        assert_eq!(Exit::BadNode.code(), 75);
        // Distinct from rdrun's own codes (a worker may exit with any code: documented).
        for own in [SUCCESS, LAUNCHER_FAILURE, USAGE] {
            assert_ne!(own, DO_NOT_REQUEUE);
            assert_ne!(own, BAD_NODE);
        }
        assert!(!WorkerStatus::Signaled(0).success());
    }

    /// Every code rdrun names is in the table `--help` lists.
    #[test]
    fn every_code_is_described() {
        for code in [SUCCESS, LAUNCHER_FAILURE, USAGE, BAD_NODE, DO_NOT_REQUEUE] {
            let text = code.to_string();
            assert!(STATUSES.iter().any(|(c, _)| *c == text), "{code}");
        }
        assert!(STATUSES.iter().any(|(c, _)| *c == "128+N"));
    }
}
