//! Rendezvous: how the agents of a multi-node job agree on ranks, round after round.
//!
//! - `static_`: `--rdzv-backend=static` (fixed `--node-rank`, node 0 hosts the store).
//! - `c10d` + `state`: rdrun's dynamic rendezvous (MIN:MAX nodes) over the store.
//! - `barrier`: the exit barrier. `addr`: which address to advertise, is_host inference.
//! - `store`: the store operations used ([`RdzvStore`]) and an in-memory store for tests.
//! - `settings`: `--rdzv-conf` parsing. `error`: [`RendezvousError`].

pub mod addr;
pub mod barrier;
pub mod c10d;
pub mod error;
pub mod settings;
pub mod state;
pub mod static_;
pub mod store;

pub use barrier::exit_barrier;
pub use c10d::{C10dRendezvous, RdzvEvent, RoundRequest};
pub use error::RendezvousError;
pub use settings::{C10dSettings, StaticSettings};
pub use state::{Assignment, RoundReason};
pub use static_::StaticRendezvous;
pub use store::{MemStore, RdzvStore, StoreOpError};
