//! The one integration-test binary. Each module drives the real `rdrun` binary (or the library's
//! public API over real sockets) with a hard wall-clock bound on every run.
//!
//! - `util`: the `Rdrun` runner builder, temp dirs, hard timeouts, process-leak checks.
//! - `cli`, `env`, `restart`, `signals`, `output`, `report`: the launcher (single node).
//! - `store`: the TCPStore-compatible server and client over 127.0.0.1.
//! - `runtime`, `train`: the worker runtime's collectives and the `train` demo under rdrun.
//! - `rendezvous`: multi-node launches on loopback and in network namespaces.
//! - `multinode`: several real `rdrun` agents forming one job (static, c10d; loopback, netns).
//! - `cluster`: scheduler environments (a Slurm step, a PyTorchJob pod) with no flag: one world,
//!   the topology banner, `--dry-run`, refusals.
//! - `addr`: MASTER_ADDR as given, where stores listen, endpoint ports and names.
//! - `contain`: nothing a worker starts outlives rdrun's death (cgroup, watchdog, segments).
//! - `hang`: hang detection wired into the agent, with small budgets.
//! - `scale`: small-size smokes of the scale benchmarks (store start-up storm), no timings.
//! - `regression`: one test per fixed bug or torchrun misbehaviour, named after it.

mod addr;
mod cli;
mod cluster;
mod contain;
mod env;
mod hang;
mod multinode;
mod output;
mod regression;
mod rendezvous;
mod report;
mod restart;
mod runtime;
mod scale;
mod signals;
mod store;
#[cfg(feature = "train")]
mod train;
mod util;
