//! The runtime's error type: every failure names the rank that saw it and the operation it was in.

use std::time::Duration;

/// Why a runtime call failed. `rank` is always the local rank in the group (RANK), `op` the
/// collective or setup step ("all_reduce", "init", ...).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("rank {rank}: {op}: worker environment: {source}")]
    Env {
        rank: usize,
        op: &'static str,
        #[source]
        source: crate::workerenv::WorkerEnvError,
    },
    #[error("rank {rank}: {op}: store: {msg}")]
    Store {
        rank: usize,
        op: &'static str,
        msg: String,
    },
    #[error("rank {rank}: {op}: peer rank {peer}: {msg}")]
    Peer {
        rank: usize,
        op: &'static str,
        peer: usize,
        msg: String,
    },
    #[error("rank {rank}: {op}: timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        rank: usize,
        op: &'static str,
        after: Duration,
        waiting_for: String,
    },
    #[error("rank {rank}: {op}: invalid argument: {msg}")]
    Invalid {
        rank: usize,
        op: &'static str,
        msg: String,
    },
    #[error("rank {rank}: {op}: shared memory: {msg}")]
    Shm {
        rank: usize,
        op: &'static str,
        msg: String,
    },
    #[error("rank {rank}: {op}: io: {msg}")]
    Io {
        rank: usize,
        op: &'static str,
        msg: String,
    },
    #[error("rank {rank}: {op}: nccl error {code}: {msg}")]
    Nccl {
        rank: usize,
        op: &'static str,
        code: i64,
        msg: String,
    },
    #[error("rank {rank}: {op}: backend {backend} is not available: {why}")]
    Unavailable {
        rank: usize,
        op: &'static str,
        backend: String,
        why: String,
    },
    #[error("rank {rank}: {op}: the group is unusable after an earlier error: {first}")]
    Poisoned {
        rank: usize,
        op: &'static str,
        first: String,
    },
}

impl RuntimeError {
    /// The operation name the error carries.
    pub fn op(&self) -> &'static str {
        match self {
            RuntimeError::Env { op, .. }
            | RuntimeError::Store { op, .. }
            | RuntimeError::Peer { op, .. }
            | RuntimeError::Timeout { op, .. }
            | RuntimeError::Invalid { op, .. }
            | RuntimeError::Shm { op, .. }
            | RuntimeError::Io { op, .. }
            | RuntimeError::Nccl { op, .. }
            | RuntimeError::Unavailable { op, .. }
            | RuntimeError::Poisoned { op, .. } => op,
        }
    }

    /// True for failures that mean a peer is gone or unresponsive (the group must be rebuilt).
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            RuntimeError::Peer { .. }
                | RuntimeError::Timeout { .. }
                | RuntimeError::Poisoned { .. }
        )
    }
}

/// Shorthand used throughout the runtime.
pub type Result<T> = std::result::Result<T, RuntimeError>;
