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

/// A key no value is stored under: GET or COMPARE_SET of it answers the server's wall-clock time
/// (nanoseconds since the Unix epoch, decimal), so that an agent can measure its clock offset to
/// the store host from one round trip (issue 28's `clock` health check). A PyTorch store answers
/// it as any missing key.
pub const CLOCK_KEY: &str = "rdrun.clock";

/// Whether a key on the wire is [`CLOCK_KEY`] (raw, or with the TCPStore client's "/" prefix).
pub(crate) fn is_clock_key(key: &[u8]) -> bool {
    key.strip_prefix(b"/").unwrap_or(key) == CLOCK_KEY.as_bytes()
}

/// [`CLOCK_KEY`]'s answer: now, in nanoseconds since the Unix epoch.
pub(crate) fn clock_now() -> Vec<u8> {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    ns.to_string().into_bytes()
}

pub use blocking::BlockingClient;
pub use client::{Client, StoreError};
pub use protocol::Limits;
pub use server::{ServerConfig, StoreServer};
