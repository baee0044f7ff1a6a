//! `--rdzv-conf` keys turned into typed rendezvous settings (pure; spec torchrun-compat §4.1-4.3).
//! The config checks them when it resolves a run that will hold a rendezvous
//! ([`super::LaunchConfig::uses_rendezvous`]), so a bad value is a one-line error naming its key
//! before anything starts; the rendezvous backends (`rendezvous::c10d`, `static_`, `etcd`)
//! build theirs from the same functions.
//!
//! Values are torchrun's: seconds as integers (rdrun also accepts fractions), booleans as
//! 1/0/true/false/t/f/yes/no/y/n in any case. Unknown keys are ignored as torchrun does (they are
//! returned so the caller can log them). Heartbeat defaults differ on purpose: torchrun drops a
//! node after `keep_alive_interval` 5 s × `keep_alive_max_attempt` 3 = 15 s and does not restart
//! the survivors; rdrun heartbeats every second and drops a node after 5 missed beats, then
//! restarts the survivors at once.

use std::collections::BTreeMap;
use std::time::Duration;

use super::spec::NodeRange;

/// A bad `--rdzv-conf` value.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConfError {
    #[error("rdzv-conf {key}={value:?}: expected a number of seconds")]
    Seconds { key: String, value: String },
    #[error("rdzv-conf {key}={value:?}: expected a positive integer")]
    Count { key: String, value: String },
    #[error("rdzv-conf {key}={value:?}: expected a boolean (true/false, 1/0, yes/no)")]
    Bool { key: String, value: String },
    #[error("rdzv-conf store_type={0:?} is not supported (only tcp)")]
    StoreType(String),
    #[error("invalid node range {min}:{max}: need 1 <= min <= max")]
    NodeRange { min: usize, max: usize },
    /// A key whose value breaks its own rule (etcd's keys).
    #[error("rdzv-conf {key}={value:?}: {why}")]
    Bad {
        key: &'static str,
        value: String,
        why: &'static str,
    },
}

/// Parses torchrun's boolean spellings.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Some(true),
        "0" | "false" | "f" | "no" | "n" => Some(false),
        _ => None,
    }
}

fn secs(conf: &BTreeMap<String, String>, key: &str, default: f64) -> Result<Duration, ConfError> {
    match conf.get(key) {
        None => Ok(Duration::from_secs_f64(default)),
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e9)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| ConfError::Seconds {
                key: key.into(),
                value: v.clone(),
            }),
    }
}

fn count(conf: &BTreeMap<String, String>, key: &str, default: u32) -> Result<u32, ConfError> {
    match conf.get(key) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| ConfError::Count {
                key: key.into(),
                value: v.clone(),
            }),
    }
}

fn boolean(conf: &BTreeMap<String, String>, key: &str) -> Result<Option<bool>, ConfError> {
    conf.get(key)
        .map(|v| {
            parse_bool(v).ok_or_else(|| ConfError::Bool {
                key: key.into(),
                value: v.clone(),
            })
        })
        .transpose()
}

/// Keys rdrun understands; the rest are returned by [`unknown_keys`].
const KNOWN: &[&str] = &[
    "timeout",
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "read_timeout",
    "is_host",
    "store_type",
    "cas_backoff_max_seconds",
    "rank",
    "poll_interval",
];

/// `--rdzv-conf` keys only the etcd backend reads.
pub const ETCD_KEYS: &[&str] = &[
    super::spec::ETCD_ENDPOINTS_KEY,
    "ttl",
    "lease_ttl",
    "key_prefix",
    "prefix",
    "protocol",
    "cacert",
    "cert",
    "key",
    "username",
    "user",
    "password",
];

/// Conf keys rdrun ignores (for a warning).
pub fn unknown_keys(conf: &BTreeMap<String, String>) -> Vec<String> {
    conf.keys()
        .filter(|k| !KNOWN.contains(&k.as_str()) && !ETCD_KEYS.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// Default `keep_alive_interval` and `poll_interval` of a c10d job, in seconds (issue 16): 1 s
/// up to 2,000 nodes (`--nnodes` MAX), then MAX / 2,000 s up to 3 s from 6,000 nodes on, so
/// that the rendezvous store's steady load stays well under a fifth of a core at 10,000 nodes
/// while a lost node is still dropped within 5 × 3 = 15 s at any size (torchrun's default
/// budget, 5 s × 3). Explicit `--rdzv-conf` values always win.
pub fn beat_default(nodes: NodeRange) -> f64 {
    (nodes.max as f64 / 2000.0).clamp(1.0, 3.0)
}

/// Settings of the c10d-like backend.
#[derive(Debug, Clone, PartialEq)]
pub struct C10dSettings {
    pub min_nodes: usize,
    pub max_nodes: usize,
    /// How long one `next_round` may wait to be admitted (torchrun 600 s).
    pub join_timeout: Duration,
    /// Wait after `min` nodes joined for more (torchrun 30 s).
    pub last_call_timeout: Duration,
    /// Time allowed to mark the rendezvous closed (torchrun 30 s).
    pub close_timeout: Duration,
    /// Time allowed for one heartbeat write (torchrun 5 s).
    pub heartbeat_timeout: Duration,
    /// Heartbeat period (torchrun 5 s; rdrun 1 s).
    pub keep_alive_interval: Duration,
    /// Missed beats before a node is dropped (torchrun 3; rdrun 5).
    pub keep_alive_max_attempt: u32,
    /// Store connect/read timeout (torchrun 60 s).
    pub read_timeout: Duration,
    /// `is_host` as given; `None` = infer from the endpoint.
    pub is_host: Option<bool>,
    /// Longest pause between two reads of the state while waiting (rdrun; default 1 s).
    pub poll_interval: Duration,
}

impl C10dSettings {
    /// Settings from `--nnodes` and `--rdzv-conf`.
    pub fn from_conf(nodes: NodeRange, conf: &BTreeMap<String, String>) -> Result<Self, ConfError> {
        if nodes.min == 0 || nodes.min > nodes.max {
            return Err(ConfError::NodeRange {
                min: nodes.min,
                max: nodes.max,
            });
        }
        if let Some(t) = conf.get("store_type") {
            if !t.trim().eq_ignore_ascii_case("tcp") {
                return Err(ConfError::StoreType(t.clone()));
            }
        }
        Ok(Self {
            min_nodes: nodes.min,
            max_nodes: nodes.max,
            join_timeout: secs(conf, "join_timeout", 600.0)?,
            last_call_timeout: secs(conf, "last_call_timeout", 30.0)?,
            close_timeout: secs(conf, "close_timeout", 30.0)?,
            heartbeat_timeout: secs(conf, "heartbeat_timeout", 5.0)?,
            keep_alive_interval: secs(conf, "keep_alive_interval", beat_default(nodes))?
                .max(Duration::from_millis(10)),
            keep_alive_max_attempt: count(conf, "keep_alive_max_attempt", 5)?,
            read_timeout: secs(conf, "read_timeout", 60.0)?,
            is_host: boolean(conf, "is_host")?,
            poll_interval: secs(conf, "poll_interval", beat_default(nodes))?
                .max(Duration::from_millis(10)),
        })
    }

    /// A node whose heartbeat did not change for this long is dropped.
    pub fn dead_after(&self) -> Duration {
        self.keep_alive_interval * self.keep_alive_max_attempt
    }
}

/// Settings of the static backend.
#[derive(Debug, Clone, PartialEq)]
pub struct StaticSettings {
    /// Rendezvous timeout (`timeout`, torchrun 900 s): connecting and waiting for every node.
    pub timeout: Duration,
    /// Timeout of one store operation (`read_timeout`, 60 s).
    pub read_timeout: Duration,
    /// Time allowed for one heartbeat write (`heartbeat_timeout`, 5 s).
    pub heartbeat_timeout: Duration,
    pub keep_alive_interval: Duration,
    pub keep_alive_max_attempt: u32,
    pub poll_interval: Duration,
}

impl StaticSettings {
    pub fn from_conf(conf: &BTreeMap<String, String>) -> Result<Self, ConfError> {
        Ok(Self {
            timeout: secs(conf, "timeout", 900.0)?,
            read_timeout: secs(conf, "read_timeout", 60.0)?,
            heartbeat_timeout: secs(conf, "heartbeat_timeout", 5.0)?,
            keep_alive_interval: secs(conf, "keep_alive_interval", 1.0)?
                .max(Duration::from_millis(10)),
            keep_alive_max_attempt: count(conf, "keep_alive_max_attempt", 5)?,
            poll_interval: secs(conf, "poll_interval", 1.0)?.max(Duration::from_millis(10)),
        })
    }

    pub fn dead_after(&self) -> Duration {
        self.keep_alive_interval * self.keep_alive_max_attempt
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::conf;
    use super::*;

    /// Issue 16: the heartbeat defaults grow with `--nnodes` MAX (bounded), explicit values win.
    #[test]
    fn heartbeat_defaults_scale_with_the_job_and_explicit_values_win() {
        let at = |max: usize, c: &[(&str, &str)]| {
            C10dSettings::from_conf(NodeRange { min: 1, max }, &conf(c)).unwrap()
        };
        assert_eq!(at(2000, &[]).keep_alive_interval, Duration::from_secs(1));
        assert_eq!(at(4000, &[]).keep_alive_interval, Duration::from_secs(2));
        assert_eq!(at(4000, &[]).poll_interval, Duration::from_secs(2));
        assert_eq!(at(100_000, &[]).dead_after(), Duration::from_secs(15));
        let set = at(
            10_000,
            &[("keep_alive_interval", "1"), ("poll_interval", "0.5")],
        );
        assert_eq!(set.keep_alive_interval, Duration::from_secs(1));
        assert_eq!(set.poll_interval, Duration::from_millis(500));
    }

    #[test]
    fn bool_spellings() {
        for (s, want) in [
            ("1", Some(true)),
            ("TRUE", Some(true)),
            ("t", Some(true)),
            ("Yes", Some(true)),
            ("y", Some(true)),
            ("0", Some(false)),
            ("False", Some(false)),
            ("f", Some(false)),
            ("no", Some(false)),
            ("N", Some(false)),
            ("maybe", None),
            ("", None),
        ] {
            assert_eq!(parse_bool(s), want, "{s:?}");
        }
    }

    #[test]
    fn c10d_defaults_and_overrides() {
        let nodes = NodeRange { min: 1, max: 4 };
        let d = C10dSettings::from_conf(nodes, &conf(&[])).unwrap();
        assert_eq!(d.join_timeout, Duration::from_secs(600));
        assert_eq!(d.last_call_timeout, Duration::from_secs(30));
        assert_eq!(d.read_timeout, Duration::from_secs(60));
        assert_eq!(d.dead_after(), Duration::from_secs(5));
        assert_eq!(d.is_host, None);
        let s = C10dSettings::from_conf(
            nodes,
            &conf(&[
                ("join_timeout", "5"),
                ("last_call_timeout", "0.5"),
                ("keep_alive_interval", "2"),
                ("keep_alive_max_attempt", "3"),
                ("is_host", "no"),
                ("store_type", "TCP"),
            ]),
        )
        .unwrap();
        assert_eq!(s.join_timeout, Duration::from_secs(5));
        assert_eq!(s.last_call_timeout, Duration::from_millis(500));
        assert_eq!(s.dead_after(), Duration::from_secs(6));
        assert_eq!(s.is_host, Some(false));
    }

    #[test]
    fn c10d_errors() {
        let nodes = NodeRange { min: 1, max: 2 };
        let cases = [
            (
                ("join_timeout", "soon"),
                "rdzv-conf join_timeout=\"soon\": expected a number of seconds",
            ),
            (
                ("join_timeout", "-1"),
                "rdzv-conf join_timeout=\"-1\": expected a number of seconds",
            ),
            (
                ("keep_alive_max_attempt", "0"),
                "rdzv-conf keep_alive_max_attempt=\"0\": expected a positive integer",
            ),
            (
                ("is_host", "maybe"),
                "rdzv-conf is_host=\"maybe\": expected a boolean (true/false, 1/0, yes/no)",
            ),
            (
                ("store_type", "file"),
                "rdzv-conf store_type=\"file\" is not supported (only tcp)",
            ),
        ];
        for ((k, v), want) in cases {
            let err = C10dSettings::from_conf(nodes, &conf(&[(k, v)])).unwrap_err();
            assert_eq!(err.to_string(), want);
        }
        assert_eq!(
            C10dSettings::from_conf(NodeRange { min: 3, max: 2 }, &conf(&[]))
                .unwrap_err()
                .to_string(),
            "invalid node range 3:2: need 1 <= min <= max"
        );
    }

    #[test]
    fn static_timeout_and_unknown_keys() {
        assert_eq!(
            StaticSettings::from_conf(&conf(&[])).unwrap().timeout,
            Duration::from_secs(900)
        );
        assert_eq!(
            StaticSettings::from_conf(&conf(&[("timeout", "12")]))
                .unwrap()
                .timeout,
            Duration::from_secs(12)
        );
        assert_eq!(
            unknown_keys(&conf(&[("timeout", "1"), ("colour", "red")])),
            ["colour"]
        );
    }

    /// A run that holds a rendezvous types its `--rdzv-conf` at resolution: a bad value is one
    /// line naming the key, exit 1 as when the rendezvous found it; a run without one (a single
    /// node, standalone) does not look at it, as before.
    #[test]
    fn resolution_types_the_conf_of_a_run_with_a_rendezvous() {
        use crate::config::testkit::{fail, ok};
        let multi = [
            "--nnodes=2",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=h:29400",
            "--rdzv-conf=join_timeout=x",
            "--no-python",
            "true",
        ];
        let e = fail(&multi);
        assert_eq!(
            e.to_string(),
            "invalid rendezvous configuration: rdzv-conf join_timeout=\"x\": expected a number of seconds"
        );
        assert_eq!(e.exit_code(), crate::exit::LAUNCHER_FAILURE);
        let stat = [
            "--nnodes=2",
            "--rdzv-backend=static",
            "--master-addr=h",
            "--rdzv-conf=keep_alive_max_attempt=0",
            "--no-python",
            "true",
        ];
        assert!(fail(&stat).to_string().contains("keep_alive_max_attempt"));
        ok(&[
            "--standalone",
            "--rdzv-conf=join_timeout=x",
            "--no-python",
            "true",
        ]);
    }
}
