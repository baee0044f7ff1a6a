//! The etcd backend's `--rdzv-conf` keys turned into typed settings (pure): the round rules
//! (the c10d keys mean the same here), every etcd member, the lease TTL, the key prefix, TLS
//! files and the user. Typed when the run is resolved, so a bad value is a one-line error naming
//! its key before anything starts; the etcd backend (`rendezvous/etcd/`) only reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use super::rdzv_conf::{C10dSettings, ConfError};
use super::spec::{Endpoint, NodeRange, ETCD_ENDPOINTS_KEY as ENDPOINTS_KEY};

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

fn bad(key: &'static str, value: &str, why: &'static str) -> ConfError {
    ConfError::Bad {
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
    ) -> Result<Self, ConfError> {
        let rounds = C10dSettings::from_conf(nodes, conf)?;
        let endpoints = match conf.get(ENDPOINTS_KEY) {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => vec![match endpoint.host.contains(':') {
                true => format!("[{}]:{}", endpoint.host, endpoint.port),
                false => format!("{}:{}", endpoint.host, endpoint.port),
            }],
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

#[cfg(test)]
mod tests {
    use super::super::testkit::conf;
    use super::*;

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
}
