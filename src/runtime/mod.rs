//! The worker runtime: process group over the store, CPU (TCP, shared memory) and NCCL
//! collectives, and a DDP-style gradient reducer.

pub mod backend;
#[cfg(feature = "train")]
pub mod candle;
pub mod ddp;
pub mod elem;
pub mod error;
pub mod group;
pub mod hier;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod ncclpath;
pub mod rendezvous;
pub mod shm;
pub mod tcp;

pub use elem::{DType, Element, ReduceOp};
pub use error::{Result, RuntimeError};
pub use group::{BackendChoice, GroupOptions, ProcessGroup, DEFAULT_TIMEOUT};
pub use rendezvous::{FileStore, MemStore, Rendezvous, StoreFailure};
pub use shm::cleanup_run_shm;

pub use ddp::{assign_buckets, Reducer, ReducerEvent, ReducerOptions};

#[cfg(test)]
mod tests;
