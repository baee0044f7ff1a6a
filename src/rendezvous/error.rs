//! Why a rendezvous operation failed (one enum for the whole module, as `RendezvousError`).

use std::time::Duration;

use super::state::StateError;
use super::store::StoreOpError;
use crate::config::rdzv_conf::ConfError;

/// A failed rendezvous operation.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("rendezvous timed out after {:.0}s: {joined} node(s) joined, at least {min} needed", waited.as_secs_f64())]
    Timeout {
        waited: Duration,
        joined: usize,
        min: usize,
    },
    #[error("rendezvous is closed (marked so in its store: normally the job finished or gave up on another node)")]
    Closed {
        /// This agent was only on the redundancy list (nothing was lost by closing).
        redundant: bool,
    },
    /// The store stopped answering (its host is gone): fatal at once, on every path.
    #[error("lost the rendezvous store: {0}")]
    StoreLost(String),
    /// Another node's workers failed and its agent closed the rendezvous (`failed on node N`).
    #[error("the job {0}; its agent closed the rendezvous")]
    JobFailed(String),
    #[error("invalid rendezvous state")]
    State(#[from] StateError),
    #[error("invalid rendezvous configuration")]
    Conf(#[from] ConfError),
    #[error("rendezvous store {endpoint} unreachable after {:.0}s", waited.as_secs_f64())]
    Unreachable {
        endpoint: String,
        waited: Duration,
        #[source]
        source: StoreOpError,
    },
    #[error("rendezvous store operation failed")]
    Store(#[from] StoreOpError),
    #[error("the nodes disagree on --nnodes: this node says {mine}, {other_node} says {other}")]
    NnodesDisagree {
        mine: String,
        other_node: String,
        other: String,
    },
    #[error("node rank {node_rank} is already taken by the agent on {other}; give every node its own --node-rank")]
    RankTaken { node_rank: usize, other: String },
    /// A duplicate node rank whose job is over (closed, or its store gone): said at once.
    #[error("node rank {node_rank} is already taken by the agent on {other}, and {why}; give every node its own --node-rank")]
    RankTakenJobOver {
        node_rank: usize,
        other: String,
        why: String,
    },
    #[error("node rank {node_rank} is outside 0..{nnodes}")]
    NodeRank { node_rank: usize, nnodes: usize },
    #[error("exit barrier timed out after {:.0}s: {arrived} of {expected} node(s) arrived", waited.as_secs_f64())]
    BarrierTimeout {
        waited: Duration,
        arrived: i64,
        expected: usize,
    },
    /// The exit barrier ended before every node arrived because the job ended elsewhere.
    #[error("exit barrier ended early: {0}")]
    BarrierEnded(String),
    #[error("{0}")]
    Addr(#[from] super::addr::AddrError),
    #[error("cannot serve the rendezvous store at {endpoint}")]
    Host {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("a PyTorch torchrun agent uses this rendezvous ({key} exists): rdrun and torchrun agents cannot share a c10d rendezvous; start every node with rdrun")]
    TorchrunPeer { key: String },
}
