//! The worker runtime: process group over the store, CPU (TCP, shared memory) and NCCL
//! collectives, and a DDP-style gradient reducer.

pub(crate) mod backend;
pub(crate) mod bootstrap;
#[cfg(feature = "train")]
pub mod candle;
pub(crate) mod ddp;
pub(crate) mod elem;
pub(crate) mod error;
pub(crate) mod group;
pub(crate) mod groupstore;
pub(crate) mod hier;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod shm;
pub(crate) mod tcp;
pub mod watchdog;

pub use bootstrap::{BackendChoice, GroupOptions, DEFAULT_TIMEOUT};
pub use elem::{DType, Element, ReduceOp};
pub use error::{Result, RuntimeError};
pub use group::ProcessGroup;
pub use groupstore::{FileStore, GroupStore, MemStore, StoreFailure};
pub use shm::cleanup_run_shm;
pub use watchdog::Watchdog;

pub use ddp::{assign_buckets, Reducer, ReducerEvent, ReducerOptions};

#[cfg(test)]
mod tests;
