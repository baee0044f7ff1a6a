//! rdrun's key-value store, byte-compatible with PyTorch's TCPStore (torch 2.15.0): the opcodes and
//! reply enums of `torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp`, the client encoding of
//! `TCPStore.cpp` and the server behaviour of `TCPStoreLibUvBackend.cpp`.
//!
//! - [`protocol`]: pure codec: query types, validation magic, requests and replies ([`protocol::Reply`]
//!   is encoded by the server and decoded by the client), resumable decoders.
//! - [`state`]: the shared map, queues and per-key waiters.
//! - [`server`]: the tokio server the launcher runs for the life of the job.
//! - [`client`]: the async client (PyTorch's "/" key prefix and PrefixStore nesting).
//! - [`blocking`]: the blocking client for the worker runtime.
//!
//! The store depends on nothing else in the crate.

pub(crate) mod blocking;
pub mod client;
pub mod protocol;
pub mod server;
pub(crate) mod state;
pub mod stats;

pub use protocol::CLOCK_KEY;

pub use blocking::BlockingClient;
pub use client::{Client, StoreError};
pub use protocol::Limits;
pub use server::{ServerConfig, StoreServer};
