//! Rendezvous: how the agents of a multi-node job agree on ranks, round after round.
//!
//! - `handle`: [`Rendezvous::start`], the supervisor's entry point (any backend, one API).
//! - `static_`: `--rdzv-backend=static` (fixed `--node-rank`, node 0 hosts the store).
//! - `c10d` + `state` + `join_machine`: rdrun's dynamic rendezvous (MIN:MAX nodes) over the
//!   store: the driver's I/O, the pure decisions on the state, the pure decisions of its join loop.
//! - `keys`: every store key, spelled once per namespace (c10d, static, etcd, a round's own).
//! - `plumbing`: what the backends share: round events and the keeper task, store retry with
//!   backoff, heartbeats and the liveness rules (own store loss, peers' heartbeats), close
//!   acknowledgements, the `--nnodes` agreement check.
//! - `etcd`: the same rounds over an etcd v3 cluster (`--rdzv-backend etcd-v3`, feature `etcd`).
//! - `barrier`: the exit barrier. `addr`: which address to advertise, is_host inference.
//! - `exchange`: the key-value exchange the agents share beside their rounds (the run's TCPStore,
//!   or etcd), for the network pre-check and the failure counts (issue 28).
//! - `store`: the store operations used ([`RdzvStore`]) and an in-memory store for tests.
//! - `tcp`: the store over TCP: the one store binder, hosting (is_host), connecting, a
//!   reconnecting client. `addr` also says where a store listens (`listen_plan`).
//! - `error`: [`RendezvousError`]. The `--rdzv-conf` settings each backend takes are resolved
//!   flags, owned by the config (`config/rdzv_conf.rs`).

pub mod addr;
pub(crate) mod barrier;
pub(crate) mod c10d;
pub(crate) mod error;
pub mod etcd;
pub(crate) mod exchange;
pub(crate) mod handle;
pub(crate) mod join_machine;
pub(crate) mod keys;
pub(crate) mod plumbing;
pub mod progress;
pub(crate) mod state;
pub(crate) mod static_;
pub(crate) mod store;
pub mod tcp;

pub use crate::config::rdzv_conf::C10dSettings;
pub use c10d::{C10dRendezvous, RoundRequest};
pub use error::RendezvousError;
pub use exchange::Exchange;
pub use handle::{NodeSpec, Rendezvous};
pub use plumbing::RdzvEvent;
pub use state::{Assignment, RoundReason};
pub use store::{RdzvStore, StoreOpError};
pub use tcp::TcpRdzvStore;
