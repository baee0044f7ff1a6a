//! The rendezvous spec's basic values (node range, backend, endpoint) and their defaults: the
//! leaf every resolver and every typed `--rdzv-conf` reader shares, so none of them needs the
//! whole configuration's types (`types.rs`) to name one.

/// `--nnodes`: `N` (min = max = N) or `MIN:MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRange {
    pub min: usize,
    pub max: usize,
}

/// `--rdzv-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdzvBackend {
    Static,
    C10d,
    Etcd,
    EtcdV2,
}

/// A `host:port` endpoint; `host` is kept without IPv6 brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

/// torchrun's `master_port` default for the static backend.
pub const DEFAULT_STATIC_MASTER_PORT: u16 = 29500;
/// Default rendezvous ports when an endpoint has none (c10d; etcd and etcd-v2).
pub const DEFAULT_C10D_PORT: u16 = 29400;

/// The `--rdzv-conf` key under which an etcd endpoint list (`h1:2379,h2:2379`, every member)
/// reaches the etcd backend; the config's endpoint is the first member.
pub const ETCD_ENDPOINTS_KEY: &str = "etcd_endpoints";
pub const DEFAULT_ETCD_PORT: u16 = 2379;
