//! [`ConfigError`]: why a parsed command line cannot be turned into a launch, with the exit
//! code each kind maps to and the `PET_*` attribution of a value that came from the environment.

use std::collections::BTreeMap;

use super::rdzv_conf;

/// Why a parsed command line cannot be turned into a launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A flag value that is wrong whatever the machine: a usage error (exit 2). Named by the
    /// `PET_*` variable (`PET_NPROC_PER_NODE='abc': …`) when the value came from one.
    #[error("{}'{value}': {reason}", source_name(flag, var))]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
        /// The `PET_*` variable the value came from (set by [`resolve_with`]).
        var: Option<String>,
    },
    /// torchrun's own message for this combination.
    #[error("don't use both the '--no-python' flag and the '--module' flag at the same time")]
    ModuleWithNoPython,
    #[error("{} {value}: {reason}", var.as_deref().map_or("--nproc-per-node", |v| v))]
    NoDevices {
        value: String,
        reason: String,
        /// `PET_NPROC_PER_NODE` when the value came from it.
        var: Option<String>,
    },
    /// More workers than this user may have processes (RLIMIT_NPROC): a machine limit (exit 1).
    #[error("--nproc-per-node {workers}: more workers than this user's process limit allows (ulimit -u: {limit})")]
    ProcessLimit { workers: usize, limit: u64 },
    #[error("training script not found: {0}")]
    ScriptNotFound(String),
    #[error("program not found: {0} (no such file, and not an executable on PATH)")]
    ProgramNotFound(String),
    #[error("program is not executable: {0}")]
    NotExecutable(String),
    #[error("python interpreter not found: {0}")]
    PythonNotFound(String),
    #[error("--log-dir '{0}' exists and is not a directory")]
    LogDirNotDirectory(String),
    /// A `--chaos` spec (or `--chaos-progress`) that cannot be run: the parser's one line, which
    /// names the fault and the key (issue 41).
    #[error("{0}")]
    Chaos(String),
    /// A scheduler environment that cannot be launched from (a contradiction, a batch script
    /// spanning several nodes, a nested launch): one line naming the variables.
    #[error("{0}")]
    Cluster(String),
    /// A `--hang-*` flag or `RDRUN_HANG_*` variable with a bad value (the message names it).
    #[error("{0}")]
    Hang(String),
    /// `--numa-binding` / `--cpu-binding` cannot be applied on this machine (exit 1).
    #[error("{flag}: {reason}")]
    Binding { flag: String, reason: String },
    #[error(transparent)]
    VirtualDevices(#[from] crate::workerenv::VirtualDevicesError),
    /// A variable of rdrun's environment with a bad value (`RDRUN_CGROUP=yes`; the message
    /// names it): a usage error.
    #[error("{0}")]
    Env(String),
    /// A `--rdzv-conf` value of the wrong type (the message names the key). A launcher failure
    /// (exit 1), as when the rendezvous found it at its start.
    #[error("invalid rendezvous configuration: {0}")]
    RdzvConf(#[from] rdzv_conf::ConfError),
}

impl ConfigError {
    /// How rdrun exits on this error (see docs/compat.md, "exit paths").
    ///
    /// A value that is wrong on any machine is a usage error (2), like argparse's type errors;
    /// what this machine lacks (GPUs, the script, an interpreter) or does not support yet is a
    /// launcher failure (1). torchrun exits 1 for all of these, with a Python traceback.
    pub fn exit(&self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            ConfigError::Invalid { .. }
            | ConfigError::ModuleWithNoPython
            | ConfigError::Hang(_)
            | ConfigError::Chaos(_)
            | ConfigError::Env(_) => Exit::Usage,
            _ => Exit::LauncherFailure,
        }
    }

    /// [`ConfigError::exit`]'s number.
    pub fn exit_code(&self) -> i32 {
        self.exit().code()
    }
}

impl ConfigError {
    /// Names the `PET_*` variable in an error about a flag whose value came from one
    /// (`from_env`: [`LaunchArgs::from_env`]).
    pub(super) fn attributed(self, from_env: &BTreeMap<String, String>) -> ConfigError {
        self.naming(|flag| {
            let dest = flag.trim_start_matches('-').replace('-', "_");
            from_env.get(&dest).cloned()
        })
    }

    /// An error about a flag's value that names no variable yet, naming `var_of(flag)`.
    pub(crate) fn naming(self, var_of: impl Fn(&str) -> Option<String>) -> ConfigError {
        match self {
            ConfigError::Invalid {
                flag,
                value,
                reason,
                var: None,
            } => ConfigError::Invalid {
                var: var_of(flag),
                flag,
                value,
                reason,
            },
            ConfigError::NoDevices {
                value,
                reason,
                var: None,
            } => ConfigError::NoDevices {
                var: var_of("--nproc-per-node"),
                value,
                reason,
            },
            other => other,
        }
    }
}

/// `--flag ` or `PET_FLAG=`: what an [`ConfigError::Invalid`] message starts with.
fn source_name(flag: &str, var: &Option<String>) -> String {
    match var {
        Some(v) => format!("{v}="),
        None => format!("{flag} "),
    }
}

pub(crate) fn invalid(
    flag: &'static str,
    value: impl Into<String>,
    reason: impl Into<String>,
) -> ConfigError {
    ConfigError::Invalid {
        flag,
        value: value.into(),
        reason: reason.into(),
        var: None,
    }
}
