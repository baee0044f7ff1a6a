//! `--rdzv-backend=etcd-v3` (alias `etcd`): the dynamic rendezvous over an etcd v3 cluster, so
//! that no rdrun node is a single point of failure (issue 14; spec cluster.md §5).
//!
//! - this file: the errors a build without the `etcd` cargo feature gives (the settings,
//!   [`EtcdSettings`], are typed by the config: `config/etcd_conf.rs`);
//! - `client` (feature `etcd`): the etcd-client wrapper — connect with a bound, one-line errors
//!   naming the endpoints, leases, compare-and-set on revisions, watches;
//! - `driver` (feature `etcd`): [`driver::EtcdRendezvous`], the round protocol. The round rules
//!   are `state.rs`'s (the same join timeout, last call, scale up and down as c10d); only the
//!   store and the liveness mechanism differ: one leased key per agent kept alive by the client,
//!   peers' deaths seen as DELETE events of a watch (no heartbeat polling), rounds written with
//!   transactions that compare the state key's `mod_revision`.
//!
//! The workers' TCPStore stays on an rdrun agent (group rank 0 of each round, published in the
//! round's state as MASTER_ADDR/MASTER_PORT): when that node dies its lease expires, the
//! survivors start a new round without it, and the next group rank 0 serves the store.

/// The etcd backend's settings are resolved flags, owned by the config.
pub use crate::config::etcd_conf::{EtcdSettings, DEFAULT_PREFIX, DEFAULT_TTL};

#[cfg(feature = "etcd")]
pub(crate) mod client;
#[cfg(feature = "etcd")]
pub(crate) mod driver;

/// The `--rdzv-conf` key under which the config layer passes every `--rdzv-endpoint` member (the
/// config's `Endpoint` holds only the first one).
pub use crate::config::ETCD_ENDPOINTS_KEY as ENDPOINTS_KEY;

/// `--rdzv-conf` keys only the etcd backend reads (listed with the others in `settings`).
pub use crate::config::rdzv_conf::ETCD_KEYS as KNOWN_KEYS;

/// The error of `--rdzv-backend etcd-v3` in a build without the `etcd` feature.
pub fn missing_feature() -> String {
    "this rdrun was built without the `etcd` cargo feature, so --rdzv-backend etcd-v3 is not \
     available: rebuild with `cargo install --path . --features etcd` (needs protoc and the \
     protobuf headers), or use --rdzv-backend c10d"
        .to_string()
}

/// The error of `--rdzv-backend etcd-v2`.
pub fn v2_is_gone() -> String {
    "--rdzv-backend etcd-v2: the etcd v2 API is gone (off by default since etcd 3.4, removed in \
     3.6), so torchrun's etcd backends cannot work; use --rdzv-backend etcd-v3 (alias etcd), \
     which speaks the v3 API"
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_way_out() {
        assert!(missing_feature().contains("--features etcd"));
        assert!(v2_is_gone().contains("etcd-v3"));
        assert!(!missing_feature().contains('\n') && !v2_is_gone().contains('\n'));
    }
}
