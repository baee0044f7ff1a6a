//! rdrun: a Rust drop-in replacement for PyTorch's `torchrun`, plus the worker runtime that Rust
//! trainers link to all-reduce gradients.
//!
//! # Map
//! - [`cli`]: hand-written argparse-compatible parser of every torchrun flag (both spellings, PET_* fallback); parse only.
//! - [`config`]: parsed args -> [`config::LaunchConfig`], resolved once against the machine (contract
//!   types + `resolve`; `host` machine facts; `flags` per-flag parsers; `endpoint` rendezvous and
//!   MASTER_ADDR/PORT; `command` the worker command).
//! - [`workerenv`]: the launcher <-> worker environment contract, and the per-worker rules applied
//!   at spawn time (`${local_rank}`, OMP_NUM_THREADS, virtual devices).
//! - [`cluster`]: scheduler detection (Slurm, Kubernetes, MPI, LSF, hostfiles) -> a topology with per-field sources, called by `config`.
//! - [`exit`]: every exit code rdrun can return.
//! - [`health`]: node health checks before a node joins a round (interpreter, disk, shm,
//!   memory, open files, GPUs, NICs, the site's command, the clock), each a one-line verdict;
//!   the network pre-check's pairs, verdict and probe sockets.
//! - [`store`]: TCPStore-compatible key-value server and client (PyTorch's wire protocol).
//! - [`supervisor`]: spawns, watches, stops and restarts the local worker group; output and report.
//! - [`rendezvous`]: how agents on several nodes agree on ranks (static, c10d-like over the store,
//!   etcd v3 behind the `etcd` feature; the plumbing they share in `rendezvous::plumbing`).
//! - [`runtime`]: the worker side: process group over the store, CPU/NCCL collectives, DDP buckets.
//!
//! # Flow
//! ```text
//! argv -> cli::LaunchArgs -> config::LaunchConfig -> supervisor::run
//!   supervisor (one task owns the group state)
//!     <- signals, worker exit events, store server exit
//!     -> WorkerEnv per local rank -> spawn (own process group, PDEATHSIG) -> stop / restart
//!     -> report (failure summary, JSON) -> exit::code
//! worker process: WorkerEnv::from_env -> runtime::ProcessGroup -> store client -> tcp | shm | nccl
//! ```
//!
//! Dependency direction (enforced by the `import_rules` test): `workerenv`, `store` and
//! `cluster` depend on nothing else in the crate; `cli` only on `exit` (the statuses `--help`
//! lists); `rendezvous` uses `store` and `config`'s spec
//! types; `config` uses `cli`, `cluster`, `exit`, `workerenv`; `health` uses `config`; `supervisor` uses
//! `rendezvous`, `store`, `config`, `cluster`, `exit`, `health`, `workerenv`; `exit` maps `supervisor::RunEnd`;
//! `runtime` uses only `store` and `workerenv`.

pub mod cli;
pub mod cluster;
pub mod config;
pub mod exit;
pub mod health;
pub mod rendezvous;
pub mod runtime;
pub mod store;
pub mod supervisor;
pub mod workerenv;

#[cfg(test)]
mod import_rules;
