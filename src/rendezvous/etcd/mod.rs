//! `--rdzv-backend=etcd-v3` (alias `etcd`): the dynamic rendezvous over an etcd v3 cluster, so
//! that no rdrun node is a single point of failure (issue 14; spec cluster.md §5).
//!
//! - this file: the settings ([`EtcdSettings`], pure: `--rdzv-conf` keys, the endpoint list) and
//!   the errors a build without the `etcd` cargo feature gives;
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

use std::collections::BTreeMap;
use std::time::Duration;

use super::settings::{C10dSettings, ConfError};
use crate::config::{Endpoint, NodeRange};

#[cfg(feature = "etcd")]
pub(crate) mod client;
#[cfg(feature = "etcd")]
pub(crate) mod driver;

/// The `--rdzv-conf` key under which the config layer passes every `--rdzv-endpoint` member (the
/// config's `Endpoint` holds only the first one).
pub use crate::config::ETCD_ENDPOINTS_KEY as ENDPOINTS_KEY;

/// `--rdzv-conf` keys only the etcd backend reads (listed with the others in `settings`).
pub use super::settings::ETCD_KEYS as KNOWN_KEYS;

/// Default lease TTL: a dead agent is noticed within this (rdrun's c10d drops a node after 5 s
/// too; torchrun's 3 × 5 s would miss the < 10 s failover goal of issue 14). etcd grants at
/// least 2 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);

/// Default key prefix: keys are `<prefix>/<run_id>/…`.
pub const DEFAULT_PREFIX: &str = "/rdrun";

/// Settings of the etcd backend.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdSettings {
    /// The round rules' timeouts and node range (the c10d keys mean the same here).
    pub rounds: C10dSettings,
    /// Every etcd member, `host:port` (the client fails over between them).
    pub endpoints: Vec<String>,
    /// Lease TTL of each agent's alive key (`ttl`/`lease_ttl`, whole seconds, at least 2).
    pub ttl: Duration,
    /// Key prefix (`key_prefix`/`prefix`), without a trailing `/`.
    pub prefix: String,
    /// TLS: `protocol=https` or any of the files given.
    pub tls: bool,
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    /// `username`/`user` and `password` (etcd's auth).
    pub user: Option<(String, String)>,
}

/// A bad etcd setting (one line, names the key).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EtcdConfError {
    #[error(transparent)]
    Conf(#[from] ConfError),
    #[error("rdzv-conf {key}={value:?}: {why}")]
    Bad {
        key: &'static str,
        value: String,
        why: &'static str,
    },
}

fn bad(key: &'static str, value: &str, why: &'static str) -> EtcdConfError {
    EtcdConfError::Bad {
        key,
        value: value.to_string(),
        why,
    }
}

fn first<'a>(
    conf: &'a BTreeMap<String, String>,
    keys: &[&'static str],
) -> Option<(&'static str, &'a str)> {
    keys.iter()
        .find_map(|k| conf.get(*k).map(|v| (*k, v.trim())))
}

impl EtcdSettings {
    /// Settings from `--nnodes`, the first endpoint and `--rdzv-conf`.
    pub fn from_conf(
        nodes: NodeRange,
        endpoint: &Endpoint,
        conf: &BTreeMap<String, String>,
    ) -> Result<Self, EtcdConfError> {
        let rounds = C10dSettings::from_conf(nodes, conf)?;
        let endpoints = match conf.get(ENDPOINTS_KEY) {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => vec![super::addr::host_port(&endpoint.host, endpoint.port)],
        };
        let ttl = match first(conf, &["ttl", "lease_ttl"]) {
            None => DEFAULT_TTL,
            Some((k, v)) => match v.parse::<u64>() {
                Ok(s) if (2..=86_400).contains(&s) => Duration::from_secs(s),
                _ => {
                    return Err(bad(
                        k,
                        v,
                        "expected whole seconds between 2 and 86400 (etcd grants at least 2)",
                    ))
                }
            },
        };
        let prefix = match first(conf, &["key_prefix", "prefix"]) {
            None => DEFAULT_PREFIX.to_string(),
            Some((k, v)) => {
                let p = v.trim_end_matches('/');
                if !v.starts_with('/')
                    || p.is_empty()
                    || v.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(bad(
                        k,
                        v,
                        "expected a key prefix such as /rdrun (starts with /, no spaces)",
                    ));
                }
                p.to_string()
            }
        };
        let tls = match first(conf, &["protocol"]) {
            None => false,
            Some((_, v)) if v.eq_ignore_ascii_case("http") => false,
            Some((_, v)) if v.eq_ignore_ascii_case("https") => true,
            Some((k, v)) => return Err(bad(k, v, "expected http or https")),
        };
        let file = |k: &'static str| conf.get(k).map(|v| v.trim().to_string());
        let (cacert, cert, key) = (file("cacert"), file("cert"), file("key"));
        if cert.is_some() != key.is_some() {
            let (k, v) = if cert.is_some() {
                ("cert", cert.clone())
            } else {
                ("key", key.clone())
            };
            return Err(bad(
                k,
                &v.unwrap_or_default(),
                "a client certificate needs both cert and key",
            ));
        }
        let tls = tls || cacert.is_some() || cert.is_some();
        let user = match (first(conf, &["username", "user"]), conf.get("password")) {
            (None, None) => None,
            (Some((_, u)), Some(p)) if !u.is_empty() => Some((u.to_string(), p.clone())),
            (Some((k, u)), None) => {
                return Err(bad(
                    k,
                    u,
                    "a user needs a password (rdzv-conf password=...)",
                ))
            }
            (Some((k, u)), Some(_)) => return Err(bad(k, u, "expected a user name")),
            (None, Some(_)) => {
                return Err(bad(
                    "password",
                    "***",
                    "a password needs a user (rdzv-conf username=...)",
                ))
            }
        };
        Ok(Self {
            rounds,
            endpoints,
            ttl,
            prefix,
            tls,
            cacert,
            cert,
            key,
            user,
        })
    }

    /// `h1:2379, h2:2379` for messages.
    pub fn describe_endpoints(&self) -> String {
        self.endpoints.join(", ")
    }
}

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

    fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ep() -> Endpoint {
        Endpoint {
            host: "h1".into(),
            port: 2379,
        }
    }

    const NODES: NodeRange = NodeRange { min: 2, max: 4 };

    #[test]
    fn defaults() {
        let s = EtcdSettings::from_conf(NODES, &ep(), &conf(&[])).unwrap();
        assert_eq!(s.endpoints, ["h1:2379"]);
        assert_eq!(s.ttl, DEFAULT_TTL);
        assert_eq!(s.prefix, "/rdrun");
        assert!(!s.tls && s.user.is_none());
        assert_eq!(s.rounds.min_nodes, 2);
        assert_eq!(s.rounds.last_call_timeout, Duration::from_secs(30));
    }

    #[test]
    fn keys_and_aliases() {
        let s = EtcdSettings::from_conf(
            NODES,
            &ep(),
            &conf(&[
                (ENDPOINTS_KEY, "h1:2379,h2:2380"),
                ("ttl", "9"),
                ("key_prefix", "/jobs/a/"),
                ("cacert", "ca.pem"),
                ("username", "u"),
                ("password", "p"),
                ("join_timeout", "7"),
            ]),
        )
        .unwrap();
        assert_eq!(s.endpoints, ["h1:2379", "h2:2380"]);
        assert_eq!(s.ttl, Duration::from_secs(9));
        assert_eq!(s.prefix, "/jobs/a");
        assert!(s.tls);
        assert_eq!(s.user, Some(("u".into(), "p".into())));
        assert_eq!(s.rounds.join_timeout, Duration::from_secs(7));
        let s =
            EtcdSettings::from_conf(NODES, &ep(), &conf(&[("lease_ttl", "3"), ("prefix", "/x")]))
                .unwrap();
        assert_eq!((s.ttl, s.prefix.as_str()), (Duration::from_secs(3), "/x"));
    }

    #[test]
    fn bad_values_are_one_line_errors_naming_the_key() {
        for (pairs, want) in [
            (vec![("ttl", "1")], "rdzv-conf ttl=\"1\": expected whole seconds between 2 and 86400 (etcd grants at least 2)"),
            (vec![("key_prefix", "rdrun")], "rdzv-conf key_prefix=\"rdrun\": expected a key prefix such as /rdrun (starts with /, no spaces)"),
            (vec![("prefix", "/")], "rdzv-conf prefix=\"/\": expected a key prefix such as /rdrun (starts with /, no spaces)"),
            (vec![("protocol", "ftp")], "rdzv-conf protocol=\"ftp\": expected http or https"),
            (vec![("cert", "c.pem")], "rdzv-conf cert=\"c.pem\": a client certificate needs both cert and key"),
            (vec![("username", "u")], "rdzv-conf username=\"u\": a user needs a password (rdzv-conf password=...)"),
            (vec![("password", "p")], "rdzv-conf password=\"***\": a password needs a user (rdzv-conf username=...)"),
            (vec![("join_timeout", "x")], "rdzv-conf join_timeout=\"x\": expected a number of seconds"),
        ] {
            let err = EtcdSettings::from_conf(NODES, &ep(), &conf(&pairs)).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn messages_name_the_way_out() {
        assert!(missing_feature().contains("--features etcd"));
        assert!(v2_is_gone().contains("etcd-v3"));
        assert!(!missing_feature().contains('\n') && !v2_is_gone().contains('\n'));
    }
}
