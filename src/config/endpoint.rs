//! Where the job meets: explicit and automatic standalone, the rendezvous backend, endpoint,
//! conf and run id, and the MASTER_ADDR/MASTER_PORT workers get (torchrun-compat §1.3 step 2).
//!
//! Everything that turns `--standalone`, `--rdzv-*`, `--master-addr`, `--master-port` and
//! `--local-addr` into addresses is in this file, so that address rules have one home.

use std::collections::BTreeMap;

use super::error::{invalid, ConfigError};
use super::host::Host;
use super::layout::{EndpointSpec, Layout};
use super::spec::{
    Endpoint, NodeRange, RdzvBackend, DEFAULT_C10D_PORT, DEFAULT_ETCD_PORT,
    DEFAULT_STATIC_MASTER_PORT, ETCD_ENDPOINTS_KEY,
};
use super::types::{RdzvConfig, RdzvSettings};

/// The rendezvous part of [`super::resolve`]: `(standalone, rendezvous, MASTER_ADDR,
/// MASTER_PORT)` from the typed layout.
pub(super) fn resolve_rendezvous(
    p: &Layout,
    local_addr: Option<&str>,
    conf: BTreeMap<String, String>,
    host: &dyn Host,
) -> Result<(bool, RdzvConfig, String, Option<u16>), ConfigError> {
    let backend = p.backend.value;
    let nnodes = p.nnodes.value;
    let master_port = p.master_port.as_ref().map(|g| g.value);
    // Spec §1.3 step 2: explicit and automatic standalone.
    let standalone = p.standalone.value
        || (backend == RdzvBackend::Static
            && p.endpoint.is_none()
            && master_port.is_none()
            && nnodes.max == 1);

    let (rdzv, master_addr, master_port) = if standalone {
        let rdzv = RdzvConfig {
            backend: RdzvBackend::C10d,
            endpoint: None,
            run_id: uuid4(host.random_bytes()),
            conf,
            settings: None,
        };
        (rdzv, "127.0.0.1".to_string(), master_port)
    } else {
        multi_node(p, local_addr, conf, host)?
    };
    Ok((standalone, rdzv, master_addr, master_port))
}

/// A run whose nodes meet at an endpoint: the rendezvous (backend, endpoint, run id, conf) and
/// the MASTER_ADDR/MASTER_PORT its workers get.
fn multi_node(
    p: &Layout,
    local_addr: Option<&str>,
    mut conf: BTreeMap<String, String>,
    host: &dyn Host,
) -> Result<(RdzvConfig, String, Option<u16>), ConfigError> {
    let backend = p.backend.value;
    let nnodes = p.nnodes.value;
    let node_rank = p.node_rank.value;
    let master_port = p.master_port.as_ref().map(|g| g.value);
    if backend != RdzvBackend::Static && node_rank != 0 {
        tracing::warn!(
            "node_rank is only used for static rdzv_backend. It will be ignored for rdzv_backend={}.",
            p.backend_name
        );
    }
    if backend != RdzvBackend::Static && p.endpoint.is_none() {
        tracing::warn!(
            "master_addr is only used for static rdzv_backend and when rdzv_endpoint is not specified."
        );
    }
    if backend == RdzvBackend::Static && node_rank >= nnodes.max {
        return Err(p.node_rank.invalid(
            "--node-rank",
            node_rank.to_string(),
            format!("must be less than the number of nodes ({})", nnodes.max),
        ));
    }
    let run_id = if p.run_id.value.is_empty() {
        // torchrun: `str(uuid.uuid4().int)` with a warning.
        let id = u128::from_be_bytes(uuid4_bytes(host.random_bytes())).to_string();
        tracing::warn!("config has no run_id, generated a random run_id: {id}");
        id
    } else {
        p.run_id.value.clone()
    };
    let (endpoint, port_zero) = meeting_endpoint(p, &mut conf)?;
    // Issue 17.5: port 0 means "pick a free port"; only one node can know which it got.
    if endpoint.port == 0 && nnodes.max > 1 {
        if let Some(e) = port_zero {
            return Err(e);
        }
    }
    let (addr, port) = if backend == RdzvBackend::Static {
        (endpoint.host.clone(), Some(endpoint.port))
    } else {
        (
            local_addr
                .map(str::to_string)
                .unwrap_or_else(|| p.master_addr.value.clone()),
            master_port,
        )
    };
    let rdzv = RdzvConfig {
        backend,
        endpoint: Some(endpoint),
        run_id,
        conf,
        settings: None,
    };
    Ok((rdzv, addr, port))
}

/// The endpoint the nodes meet at (`--rdzv-endpoint`; for static without one, node 0's store
/// at the master address), and the error port 0 is for it on several nodes.
fn meeting_endpoint(
    p: &Layout,
    conf: &mut BTreeMap<String, String>,
) -> Result<(Endpoint, Option<ConfigError>), ConfigError> {
    let backend = p.backend.value;
    Ok(match &p.endpoint {
        // Static without an endpoint: node 0's store at the master address.
        None if backend == RdzvBackend::Static => {
            let port = p
                .master_port
                .as_ref()
                .map(|g| g.value)
                .unwrap_or(DEFAULT_STATIC_MASTER_PORT);
            let ep = endpoint_of(&p.master_addr.value, Some(port), backend).map_err(|reason| {
                p.master_addr
                    .invalid("--master-addr", &p.master_addr.value, reason)
            })?;
            let zero = p
                .master_port
                .as_ref()
                .map(|g| g.invalid("--master-port", "0", PORT_ZERO_MULTI_NODE));
            (ep, zero)
        }
        None => (parse_endpoint("", backend)?, None),
        Some(g) => {
            let ep = match &g.value {
                EndpointSpec::Text(text) => {
                    endpoint_members(text, backend, conf).map_err(|e| g.attribute(e))?
                }
                EndpointSpec::HostPort { host, port } => endpoint_of(host, *port, backend)
                    .map_err(|reason| g.invalid("--master-addr", host, reason))?,
            };
            let zero = Some(g.invalid(
                "--rdzv-endpoint",
                match &g.value {
                    EndpointSpec::Text(text) => text.clone(),
                    EndpointSpec::HostPort { host, .. } => format!("{host}:0"),
                },
                PORT_ZERO_MULTI_NODE,
            ));
            (ep, zero)
        }
    })
}

const PORT_ZERO_MULTI_NODE: &str = "port 0 (pick a free port) works only for one node: the other \
     nodes cannot learn which port was picked; give a fixed port";

/// `--rdzv-endpoint`'s text: one endpoint, or for etcd every member, comma-separated; the first
/// is the config's endpoint and the list travels to the backend in its conf (under
/// [`ETCD_ENDPOINTS_KEY`], which the etcd backend reads).
fn endpoint_members(
    text: &str,
    backend: RdzvBackend,
    conf: &mut BTreeMap<String, String>,
) -> Result<Endpoint, ConfigError> {
    if !(backend == RdzvBackend::Etcd && text.contains(',')) {
        return parse_endpoint(text, backend);
    }
    let members = text
        .split(',')
        .map(|m| parse_endpoint(m, backend))
        .collect::<Result<Vec<_>, _>>()?;
    let list: Vec<String> = members
        .iter()
        .map(|e| match e.host.contains(':') {
            true => format!("[{}]:{}", e.host, e.port),
            false => format!("{}:{}", e.host, e.port),
        })
        .collect();
    conf.insert(ETCD_ENDPOINTS_KEY.to_string(), list.join(","));
    Ok(members
        .into_iter()
        .next()
        .expect("split yields one item at least"))
}

/// A host (an IPv6 address with or without brackets) and port as an [`Endpoint`]: the
/// backend's default port when none is given; the reason when the host is not one.
fn endpoint_of(host: &str, port: Option<u16>, backend: RdzvBackend) -> Result<Endpoint, String> {
    let host = host.trim();
    let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) if !inner.is_empty() => inner,
        _ => host,
    };
    let port = match (port, default_port(backend)) {
        (Some(p), _) | (None, Some(p)) => p,
        (None, None) => return Err("a port is required (try --master-port)".into()),
    };
    if !host_ok(host) {
        return Err(
            "the host must be a hostname, an IPv4 address, or an IPv6 address in brackets".into(),
        );
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
    })
}

fn default_port(backend: RdzvBackend) -> Option<u16> {
    match backend {
        RdzvBackend::Static => None,
        RdzvBackend::C10d => Some(DEFAULT_C10D_PORT),
        RdzvBackend::Etcd | RdzvBackend::EtcdV2 => Some(DEFAULT_ETCD_PORT),
    }
}

fn host_ok(host: &str) -> bool {
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

/// `--rdzv-conf`: `k1=v1,k2=v2`, stripped, split on the first `=`; empty keys or values are errors.
pub fn parse_rdzv_conf(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut conf = BTreeMap::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(conf);
    }
    for kv in text.split(',') {
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (kv.trim(), ""),
        };
        if key.is_empty() {
            return Err(invalid(
                "--rdzv-conf",
                text,
                "expected <key1>=<value1>,...,<keyN>=<valueN>",
            ));
        }
        if value.is_empty() {
            return Err(invalid(
                "--rdzv-conf",
                text,
                format!("option '{key}' must have a value"),
            ));
        }
        conf.insert(key.to_string(), value.to_string());
    }
    Ok(conf)
}

/// A rendezvous endpoint (torchrun `parse_rendezvous_endpoint`): `host[:port]`, `[v6]` or
/// `[v6]:port`, split on the last `:`; the backend's default port when none is given (the static
/// backend needs one).
pub fn parse_endpoint(text: &str, backend: RdzvBackend) -> Result<Endpoint, ConfigError> {
    let default_port = default_port(backend);
    let t = text.trim();
    if t.is_empty() {
        return match default_port {
            Some(port) => Ok(Endpoint {
                host: "localhost".into(),
                port,
            }),
            None => Err(invalid("--rdzv-endpoint", text, "a port is required")),
        };
    }
    let (mut host, port_text) = if t.starts_with('[') && t.ends_with(']') {
        (t, None)
    } else if !t.starts_with('[') && t.matches(':').count() >= 2 {
        // An unbracketed IPv6 literal (issue 10): `::1` is that address, not host ":" port 1.
        // `ADDR:PORT` is accepted as torchrun reads it when ADDR alone is an IPv6 address and
        // the whole is not; when both readings are addresses, brackets must say which.
        let whole = t.parse::<std::net::Ipv6Addr>().is_ok();
        let split = t.rsplit_once(':').filter(|(h, p)| {
            h.parse::<std::net::Ipv6Addr>().is_ok()
                && !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
        });
        match (whole, split) {
            (true, None) => (t, None),
            (false, Some((h, p))) => (h, Some(p)),
            _ => {
                return Err(invalid(
                    "--rdzv-endpoint",
                    text,
                    "write an IPv6 address in brackets: [ADDR] or [ADDR]:PORT",
                ))
            }
        }
    } else {
        match t.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (t, None),
        }
    };
    if host.len() > 1 && host.starts_with('[') && host.ends_with(']') {
        host = &host[1..host.len() - 1];
    }
    let port = match port_text {
        Some(p) => {
            let ok = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
            match p
                .parse::<u32>()
                .ok()
                .filter(|_| ok)
                .and_then(|v| u16::try_from(v).ok())
            {
                Some(v) => v,
                None => {
                    return Err(invalid(
                        "--rdzv-endpoint",
                        text,
                        "the port must be an integer between 0 and 65535",
                    ))
                }
            }
        }
        None => match default_port {
            Some(p) => p,
            None => {
                return Err(invalid(
                    "--rdzv-endpoint",
                    text,
                    "a port is required (try --master-port)",
                ))
            }
        },
    };
    if !host_ok(host) {
        return Err(invalid(
            "--rdzv-endpoint",
            text,
            "the host must be a hostname, an IPv4 address, or an IPv6 address in brackets",
        ));
    }
    Ok(Endpoint {
        host: host.to_string(),
        port,
    })
}

/// A random (version 4) UUID's 16 bytes (the `uuid` crate sets the version and variant bits).
fn uuid4_bytes(b: [u8; 16]) -> [u8; 16] {
    uuid::Builder::from_random_bytes(b).into_uuid().into_bytes()
}

/// `str(uuid.uuid4())`: lowercase 8-4-4-4-12 hex, from random bytes the [`Host`] supplies (so
/// tests pin them).
pub fn uuid4(random: [u8; 16]) -> String {
    uuid::Builder::from_random_bytes(random)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// Typing `--rdzv-conf` for the backend belongs to resolving the rendezvous: here, beside
/// [`parse_rdzv_conf`], not in the types file, which decides nothing.
impl RdzvConfig {
    /// A rendezvous config with its settings typed from `conf` (for a run that holds one).
    pub fn typed(
        backend: RdzvBackend,
        endpoint: Endpoint,
        run_id: impl Into<String>,
        conf: BTreeMap<String, String>,
        nnodes: NodeRange,
    ) -> Result<RdzvConfig, ConfigError> {
        let mut r = RdzvConfig {
            backend,
            endpoint: Some(endpoint),
            run_id: run_id.into(),
            conf,
            settings: None,
        };
        r.settings = Some(r.type_settings(nnodes)?);
        Ok(r)
    }

    /// `conf` typed for `backend`: a bad value is a one-line error naming its key.
    pub(super) fn type_settings(&self, nnodes: NodeRange) -> Result<RdzvSettings, ConfigError> {
        Ok(match self.backend {
            RdzvBackend::Static => {
                RdzvSettings::Static(super::rdzv_conf::StaticSettings::from_conf(&self.conf)?)
            }
            RdzvBackend::C10d => RdzvSettings::C10d(super::rdzv_conf::C10dSettings::from_conf(
                nnodes, &self.conf,
            )?),
            RdzvBackend::Etcd | RdzvBackend::EtcdV2 => {
                let endpoint = self.endpoint.clone().unwrap_or(Endpoint {
                    host: "localhost".into(),
                    port: DEFAULT_ETCD_PORT,
                });
                RdzvSettings::Etcd(super::etcd_conf::EtcdSettings::from_conf(
                    nnodes, &endpoint, &self.conf,
                )?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::super::*;
    use super::*;

    #[test]
    fn multi_node_resolves_to_a_rendezvous() {
        // Static: node 0 hosts the store at --master-addr:--master-port (torchrun's default).
        let c = ok(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "1234",
            "t.py",
        ]);
        assert_eq!(
            (c.nnodes, c.node_rank, c.standalone),
            (NodeRange { min: 2, max: 2 }, 1, false)
        );
        assert_eq!(c.rdzv.backend, RdzvBackend::Static);
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "10.0.0.1".into(),
                port: 1234
            })
        );
        // c10d MIN:MAX with an endpoint.
        let c = ok(&[
            "--nnodes",
            "1:4",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "h:5",
            "--rdzv-id",
            "j",
            "t.py",
        ]);
        assert_eq!(c.nnodes, NodeRange { min: 1, max: 4 });
        assert_eq!(
            (c.rdzv.backend, c.rdzv.run_id.as_str()),
            (RdzvBackend::C10d, "j")
        );
        // A node rank outside the static job is still refused.
        let e = fail(&[
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--master-port",
            "1",
            "t.py",
        ]);
        assert!(e.to_string().starts_with("--node-rank '2'"), "{e}");
    }

    #[test]
    fn etcd_v3_takes_every_member_and_v2_is_a_usage_error() {
        for name in ["etcd-v3", "etcd"] {
            let c = ok(&[
                "--nnodes",
                "2:4",
                "--rdzv-backend",
                name,
                "--rdzv-endpoint",
                "h1,h2:2380,[::1]",
                "--rdzv-id",
                "j",
                "t.py",
            ]);
            assert_eq!(c.rdzv.backend, RdzvBackend::Etcd);
            assert_eq!(
                c.rdzv.endpoint,
                Some(Endpoint {
                    host: "h1".into(),
                    port: 2379
                })
            );
            assert_eq!(
                c.rdzv.conf[ETCD_ENDPOINTS_KEY],
                "h1:2379,h2:2380,[::1]:2379"
            );
        }
        let e = fail(&[
            "--nnodes",
            "2",
            "--rdzv-backend",
            "etcd-v3",
            "--rdzv-endpoint",
            "h1,h2:x",
            "t.py",
        ]);
        assert!(e.to_string().starts_with("--rdzv-endpoint 'h2:x'"), "{e}");
        let e = fail(&["--nnodes", "2", "--rdzv-backend", "etcd-v2", "t.py"]);
        assert!(
            e.to_string()
                .starts_with("--rdzv-backend 'etcd-v2': the etcd v2 API is gone")
                && e.to_string().contains("etcd-v3"),
            "{e}"
        );
    }

    #[test]
    fn standalone_and_auto_standalone() {
        let uuid = "abababab-abab-4bab-abab-abababababab";
        // Plain run: auto-standalone (static default, no endpoint, no master port, one node).
        let c = ok(&["t.py"]);
        assert!(c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
        assert_eq!(c.rdzv.endpoint, None);
        assert_eq!(c.rdzv.run_id, uuid);
        assert_eq!((c.master_addr.as_str(), c.master_port), ("127.0.0.1", None));
        // --standalone ignores the user's backend, endpoint and id.
        let c = ok(&[
            "--standalone",
            "--rdzv-backend",
            "etcd",
            "--rdzv-id",
            "job",
            "--rdzv-endpoint",
            "h:1",
            "t.py",
        ]);
        assert!(c.standalone);
        assert_eq!(c.rdzv.run_id, uuid);
        assert_eq!(c.rdzv.endpoint, None);
        // --standalone with --master-port: that port, loopback.
        let c = ok(&["--standalone", "--master-port", "29511", "t.py"]);
        assert!(c.standalone);
        assert_eq!(c.master_port, Some(29511));
        // --master-port disables auto-standalone: static at master_addr:master_port.
        let c = ok(&["--master-port", "29555", "t.py"]);
        assert!(!c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::Static);
        assert_eq!(c.rdzv.run_id, "none");
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "127.0.0.1".into(),
                port: 29555
            })
        );
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", Some(29555))
        );
        // Static with an explicit endpoint: MASTER_* come from it (IPv6 without brackets).
        let c = ok(&["--rdzv-endpoint", "[::1]:29600", "t.py"]);
        assert!(!c.standalone);
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("::1", Some(29600))
        );
        let c = ok(&["--master-addr", "[::1]", "--master-port", "1", "t.py"]);
        assert_eq!(c.master_addr, "::1");
        // c10d on one node: not standalone, kernel-chosen MASTER_PORT, the user's run id.
        let c = ok(&[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:29400",
            "--rdzv-id",
            "j1",
            "t.py",
        ]);
        assert!(!c.standalone);
        assert_eq!(c.rdzv.backend, RdzvBackend::C10d);
        assert_eq!(c.rdzv.run_id, "j1");
        assert_eq!(c.master_port, None);
        let c = ok(&["--rdzv-backend", "c10d", "--local-addr", "node7", "t.py"]);
        assert_eq!(
            c.rdzv.endpoint,
            Some(Endpoint {
                host: "localhost".into(),
                port: 29400
            })
        );
        assert_eq!(c.master_addr, "node7");
        // Empty run id outside standalone: torchrun's decimal uuid4().int.
        let c = ok(&["--rdzv-backend", "c10d", "--rdzv-id", "", "t.py"]);
        assert!(c.rdzv.run_id.bytes().all(|b| b.is_ascii_digit()) && c.rdzv.run_id.len() > 30);
    }

    /// Issue 17.5: port 0 is "pick a free port" for one node (the host tells itself the port),
    /// a one-line usage error for several (the others cannot learn it).
    #[test]
    fn port_zero_is_one_node_only() {
        let c = ok(&[
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:0",
            "t.py",
        ]);
        assert_eq!(c.rdzv.endpoint.unwrap().port, 0);
        for argv in [
            &[
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "localhost:0",
                "--nnodes",
                "2",
                "t.py",
            ][..],
            &[
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "localhost:0",
                "--nnodes",
                "1:3",
                "t.py",
            ],
            &["--nnodes", "2", "--master-port", "0", "t.py"],
        ] {
            let e = fail(argv);
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{argv:?}");
            let msg = e.to_string();
            assert!(msg.contains("port 0") && msg.contains("one node"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
        // An IPv6 --master-addr is bracketed before its port is added (never ambiguous).
        let c = ok(&[
            "--master-addr",
            "fe80::1:2",
            "--master-port",
            "1234",
            "t.py",
        ]);
        assert_eq!(c.rdzv.endpoint.unwrap().host, "fe80::1:2");
        assert_eq!(c.master_addr, "fe80::1:2");
        let e = parse_endpoint("fe80::1:2940", RdzvBackend::C10d).unwrap_err();
        assert!(e.to_string().contains("brackets"), "{e}");
    }

    #[test]
    fn endpoints() {
        use RdzvBackend::*;
        let ep = |h: &str, p| Endpoint {
            host: h.into(),
            port: p,
        };
        let cases = [
            ("", C10d, ep("localhost", 29400)),
            ("  ", Etcd, ep("localhost", 2379)),
            ("host", C10d, ep("host", 29400)),
            ("host:1234", Static, ep("host", 1234)),
            ("10.0.0.1:0", C10d, ep("10.0.0.1", 0)),
            ("[::1]", EtcdV2, ep("::1", 2379)),
            ("[fe80::1]:29400", Static, ep("fe80::1", 29400)),
            // Issue 10: unbracketed IPv6 literals (they used to be host ":" port 1).
            ("::1", C10d, ep("::1", 29400)),
            ("fe80::1", C10d, ep("fe80::1", 29400)),
            ("2001:db8::7", Etcd, ep("2001:db8::7", 2379)),
            ("::1:29401", C10d, ep("::1", 29401)),
            (
                "node-1.example.com:65535",
                C10d,
                ep("node-1.example.com", 65535),
            ),
        ];
        for (text, b, want) in cases {
            assert_eq!(parse_endpoint(text, b).unwrap(), want, "{text}");
        }
        for (text, b) in [
            ("host", Static),
            ("", Static),
            ("host:65536", C10d),
            ("host:123456", C10d),
            ("host:x", C10d),
            ("host:", C10d),
            ("ho st:1", C10d),
            (":1", C10d),
            ("::1", Static),
            ("fe80::1:2940", C10d),
            ("a:b:c", C10d),
        ] {
            assert!(parse_endpoint(text, b).is_err(), "{text}");
        }
    }

    #[test]
    fn rdzv_conf() {
        let c = parse_rdzv_conf(" join_timeout = 5 ,is_host=1,x=a=b ").unwrap();
        assert_eq!(c.get("join_timeout").map(String::as_str), Some("5"));
        assert_eq!(c.get("is_host").map(String::as_str), Some("1"));
        assert_eq!(c.get("x").map(String::as_str), Some("a=b"));
        assert!(parse_rdzv_conf("").unwrap().is_empty());
        for bad in ["a", "a=", "=1", "a=1,,b=2", "a=1,"] {
            let e = parse_rdzv_conf(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        assert_eq!(
            parse_rdzv_conf("a=").unwrap_err().to_string(),
            "--rdzv-conf 'a=': option 'a' must have a value"
        );
    }

    /// Every backend's `--rdzv-conf` is typed when the run is resolved (etcd's too), so a bad
    /// value stops the run before anything starts, naming its key; a run that holds no
    /// rendezvous types nothing.
    #[test]
    fn rdzv_conf_is_typed_at_resolve_time_for_every_backend() {
        for (backend, endpoint, conf, want) in [
            ("c10d", "h:29400", "join_timeout=x", "rdzv-conf join_timeout=\"x\": expected a number of seconds"),
            ("static", "h:29500", "timeout=-1", "rdzv-conf timeout=\"-1\": expected a number of seconds"),
            ("etcd", "h:2379", "ttl=1", "rdzv-conf ttl=\"1\": expected whole seconds between 2 and 86400 (etcd grants at least 2)"),
            ("etcd-v3", "h:2379", "protocol=ftp", "rdzv-conf protocol=\"ftp\": expected http or https"),
        ] {
            let argv = [
                "--nnodes", "2", "--rdzv-backend", backend, "--rdzv-endpoint", endpoint,
                "--rdzv-conf", conf, "t.py",
            ];
            let e = fail(&argv);
            assert_eq!(
                e.to_string(),
                format!("invalid rendezvous configuration: {want}"),
                "{backend}"
            );
        }
        let c = ok(&[
            "--nnodes",
            "2",
            "--rdzv-backend",
            "etcd",
            "--rdzv-endpoint",
            "h1:2379,h2:2380",
            "--rdzv-conf",
            "ttl=9",
            "t.py",
        ]);
        match &c.rdzv.settings {
            Some(RdzvSettings::Etcd(s)) => {
                assert_eq!(s.endpoints, ["h1:2379", "h2:2380"]);
                assert_eq!(s.ttl, std::time::Duration::from_secs(9));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(ok(&["--standalone", "t.py"]).rdzv.settings, None);
    }

    #[test]
    fn uuid_format() {
        let u = uuid4([0xff; 16]);
        assert_eq!(u, "ffffffff-ffff-4fff-bfff-ffffffffffff");
        let u = uuid4([0; 16]);
        assert_eq!(u, "00000000-0000-4000-8000-000000000000");
        let a = RealHost.random_bytes();
        let b = RealHost.random_bytes();
        assert_ne!(a, b, "two run ids must differ");
    }
}
