//! The etcd v3 client as the rendezvous uses it: connect within a bound, check that the key
//! space can be read and written, and a few operations (get, compare-and-set on a key's
//! `mod_revision`, leased puts, prefix reads, watches, leases), each with a one-line error that
//! names the endpoints or the key prefix.
//!
//! Built on the `etcd-client` crate (gRPC through tonic): it balances requests over every
//! member given, and brings leases with keep-alive streams, watches, transactions, TLS and auth.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, Error, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions, WatchStream,
};

use super::EtcdSettings;
use crate::rendezvous::error::RendezvousError;
use crate::rendezvous::store::StoreOpError;

/// How long the first contact with etcd may take before the start fails: etcd is an existing
/// service, not a peer that is still starting, so an unreachable cluster is reported soon.
pub const CONNECT_BOUND: Duration = Duration::from_secs(10);

/// Timeout of one request (a member that stopped answering must not hang an operation).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected client and what messages name.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    endpoints: String,
    prefix: String,
}

/// One key's value and revisions as read.
#[derive(Debug, Clone)]
pub struct Read {
    pub value: Option<Vec<u8>>,
    /// The key's `mod_revision` (0 when absent): the fencing token of a compare-and-set.
    pub mod_revision: i64,
    /// The store's revision at the read (a watch from `revision + 1` misses nothing after it).
    pub revision: i64,
}

fn url(endpoint: &str, tls: bool) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

impl Etcd {
    /// Connects to every member of `s` and checks (read + write of `<prefix>/<run_id>/probe`)
    /// that this user may use the key space, within [`CONNECT_BOUND`].
    pub async fn connect(s: &EtcdSettings, run_id: &str) -> Result<Etcd, RendezvousError> {
        let endpoints = s.describe_endpoints();
        let fail = |why: String| {
            RendezvousError::Unsupported(format!("etcd rendezvous at {endpoints}: {why}"))
        };
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            // A member cut off from the leader fails requests (and cancels watches) instead
            // of answering from a stale copy.
            .with_require_leader(true);
        if let Some((u, p)) = &s.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        if s.tls {
            opts = tls_options(s, opts).map_err(fail)?;
        }
        let urls: Vec<String> = s.endpoints.iter().map(|e| url(e, s.tls)).collect();
        let started = tokio::time::Instant::now();
        let probe = format!("{}/{run_id}/probe", s.prefix);
        let last_seen = std::sync::Mutex::new(String::new());
        let remember = |why: String| *last_seen.lock().unwrap_or_else(|e| e.into_inner()) = why;
        let attempt = async {
            loop {
                match Client::connect(&urls, Some(opts.clone())).await {
                    Ok(client) => {
                        let etcd = Etcd {
                            client,
                            endpoints: endpoints.clone(),
                            prefix: s.prefix.clone(),
                        };
                        match etcd.probe(&probe).await {
                            Ok(()) => return Ok(etcd),
                            Err(e) if e.fatal => return Err(e.why),
                            Err(e) => remember(e.why),
                        }
                    }
                    Err(e) => {
                        let e = classify(&e, &s.prefix, s.user.as_ref().map(|u| u.0.as_str()));
                        if e.fatal {
                            return Err(e.why);
                        }
                        remember(e.why);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        match tokio::time::timeout(CONNECT_BOUND, attempt).await {
            Ok(Ok(etcd)) => Ok(etcd),
            Ok(Err(why)) => Err(fail(why)),
            Err(_) => {
                let why = last_seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
                Err(fail(format!(
                    "no member answered within {:.0}s{}",
                    started.elapsed().as_secs_f64(),
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why})")
                    }
                )))
            }
        }
    }

    async fn probe(&self, key: &str) -> Result<(), Classified> {
        let mut c = self.client.clone();
        let user = None;
        c.put(key, "1", None)
            .await
            .map_err(|e| classify(&e, &self.prefix, user))?;
        c.get(key, None)
            .await
            .map_err(|e| classify(&e, &self.prefix, user))?;
        c.delete(key, None)
            .await
            .map_err(|e| classify(&e, &self.prefix, user))?;
        Ok(())
    }

    /// `h1:2379, h2:2379`.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    fn op_error(&self, e: Error) -> StoreOpError {
        StoreOpError(classify(&e, &self.prefix, None).why)
    }

    /// One key.
    pub async fn get(&self, key: &str) -> Result<Read, StoreOpError> {
        let mut c = self.client.clone();
        let resp = c.get(key, None).await.map_err(|e| self.op_error(e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let kv = resp.kvs().first();
        Ok(Read {
            value: kv.map(|kv| kv.value().to_vec()),
            mod_revision: kv.map_or(0, |kv| kv.mod_revision()),
            revision,
        })
    }

    /// Every key under `prefix` (keys without the prefix) with its value, and the revision.
    pub async fn get_prefix(
        &self,
        prefix: &str,
    ) -> Result<(Vec<(String, Vec<u8>)>, i64), StoreOpError> {
        let mut c = self.client.clone();
        let resp = c
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| self.op_error(e))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let kvs = resp
            .kvs()
            .iter()
            .map(|kv| {
                let k = String::from_utf8_lossy(kv.key());
                (
                    k.strip_prefix(prefix).unwrap_or(&k).to_string(),
                    kv.value().to_vec(),
                )
            })
            .collect();
        Ok((kvs, revision))
    }

    /// Every key under `prefix` (keys without the prefix) with the lease it is attached to.
    pub async fn leases_under(&self, prefix: &str) -> Result<Vec<(String, i64)>, StoreOpError> {
        let mut c = self.client.clone();
        let resp = c
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(|e| self.op_error(e))?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                let k = String::from_utf8_lossy(kv.key());
                (k.strip_prefix(prefix).unwrap_or(&k).to_string(), kv.lease())
            })
            .collect())
    }

    /// The whole seconds `lease` has left (etcd truncates: it expires in under that + 1 s);
    /// -1 when it expired or was revoked.
    pub async fn lease_ttl(&self, lease: i64) -> Result<i64, StoreOpError> {
        let mut c = self.client.clone();
        match c.lease_time_to_live(lease, None).await {
            Ok(resp) => Ok(resp.ttl()),
            Err(Error::GRpcStatus(st)) if st.code() == tonic::Code::NotFound => Ok(-1),
            Err(e) => Err(self.op_error(e)),
        }
    }

    /// Writes `value` if `key`'s `mod_revision` is still `seen` (0: the key does not exist);
    /// false when another writer came first.
    pub async fn compare_and_set(
        &self,
        key: &str,
        seen: i64,
        value: Vec<u8>,
    ) -> Result<bool, StoreOpError> {
        let mut c = self.client.clone();
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, seen)])
            .and_then([TxnOp::put(key, value, None)]);
        let resp = c.txn(txn).await.map_err(|e| self.op_error(e))?;
        Ok(resp.succeeded())
    }

    /// Puts `key` (attached to `lease` when given).
    pub async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<i64>,
    ) -> Result<(), StoreOpError> {
        let mut c = self.client.clone();
        let opts = lease.map(|l| PutOptions::new().with_lease(l));
        c.put(key, value, opts)
            .await
            .map_err(|e| self.op_error(e))?;
        Ok(())
    }

    /// A new lease of `ttl`.
    pub async fn grant(&self, ttl: Duration) -> Result<i64, StoreOpError> {
        let mut c = self.client.clone();
        let resp = c
            .lease_grant(ttl.as_secs().max(2) as i64, None)
            .await
            .map_err(|e| self.op_error(e))?;
        Ok(resp.id())
    }

    /// Revokes `lease` (its keys vanish at once); best effort.
    pub async fn revoke(&self, lease: i64) {
        let mut c = self.client.clone();
        let _ = tokio::time::timeout(REQUEST_TIMEOUT, c.lease_revoke(lease)).await;
    }

    /// One keep-alive of `lease` on a fresh stream: the remaining TTL (0: the lease expired).
    /// A stream is bound to one member; a fresh one per beat fails over with the client.
    pub async fn keep_alive_once(&self, lease: i64) -> Result<i64, StoreOpError> {
        let mut c = self.client.clone();
        let beat = async {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(resp) => Ok(resp.ttl()),
                None => Err(Error::LeaseKeepAliveError(
                    "the keep-alive stream ended".into(),
                )),
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, beat).await {
            Ok(r) => r.map_err(|e| self.op_error(e)),
            Err(_) => Err(StoreOpError(format!(
                "no etcd member at {} renewed the lease within {}s",
                self.endpoints,
                REQUEST_TIMEOUT.as_secs()
            ))),
        }
    }

    /// A watch of every key under `prefix` from `start_revision` on.
    pub async fn watch_prefix(
        &self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<WatchStream, StoreOpError> {
        let mut c = self.client.clone();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(start_revision);
        let fut = c.watch(prefix, Some(opts));
        match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
            Ok(r) => r.map_err(|e| self.op_error(e)),
            Err(_) => Err(StoreOpError(format!(
                "no etcd member at {} accepted a watch within {}s",
                self.endpoints,
                REQUEST_TIMEOUT.as_secs()
            ))),
        }
    }
}

#[cfg(feature = "etcd-tls")]
fn tls_options(s: &EtcdSettings, opts: ConnectOptions) -> Result<ConnectOptions, String> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("cannot read rdzv-conf {what}={path:?}: {e}"))
    };
    let mut tls = TlsOptions::new();
    if let Some(ca) = &s.cacert {
        tls = tls.ca_certificate(Certificate::from_pem(read("cacert", ca)?));
    }
    if let (Some(cert), Some(key)) = (&s.cert, &s.key) {
        tls = tls.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
    }
    Ok(opts.with_tls(tls))
}

#[cfg(not(feature = "etcd-tls"))]
fn tls_options(_: &EtcdSettings, _: ConnectOptions) -> Result<ConnectOptions, String> {
    Err(
        "TLS (protocol=https, cacert, cert, key) needs rdrun built with the `etcd-tls` cargo \
         feature (cargo install --path . --features etcd-tls)"
            .into(),
    )
}

/// An error turned into one line, and whether retrying cannot help.
struct Classified {
    why: String,
    fatal: bool,
}

fn classify(e: &Error, prefix: &str, user: Option<&str>) -> Classified {
    use std::error::Error as _;
    use tonic::Code;
    let who = user.map_or(String::new(), |u| format!(" (user {u})"));
    match e {
        Error::GRpcStatus(st) => match st.code() {
            Code::Unauthenticated => Classified {
                why: format!("authentication failed{who}: {}", st.message()),
                fatal: true,
            },
            Code::PermissionDenied => Classified {
                why: format!(
                    "permission denied for keys under {prefix}/{who}: check rdzv-conf \
                     key_prefix and the etcd user's role ({})",
                    st.message()
                ),
                fatal: true,
            },
            Code::InvalidArgument | Code::FailedPrecondition
                if st.message().contains("user name") || st.message().contains("auth") =>
            {
                Classified {
                    why: format!("authentication failed{who}: {}", st.message()),
                    fatal: true,
                }
            }
            _ => {
                let chain = full_chain(st.message().to_string(), st.source());
                if is_tls_failure(&chain) {
                    return tls_failure(&chain);
                }
                Classified {
                    why: format!("etcd answered {:?}: {}", st.code(), st.message()),
                    fatal: false,
                }
            }
        },
        Error::InvalidArgs(m) | Error::EndpointError(m) => Classified {
            why: m.clone(),
            fatal: true,
        },
        Error::InvalidUri(u) => Classified {
            why: format!("invalid endpoint: {u}"),
            fatal: true,
        },
        other => {
            let chain = full_chain(other.to_string(), other.source());
            if is_tls_failure(&chain) {
                return tls_failure(&chain);
            }
            Classified {
                why: other.to_string(),
                fatal: false,
            }
        }
    }
}

/// A message and its sources' (`a: b: c`; a source that repeats a text already there is left
/// out).
fn full_chain(first: String, mut src: Option<&dyn std::error::Error>) -> String {
    let mut out = first;
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        src = s.source();
    }
    out
}

/// Whether an error (with its sources) is a failed TLS handshake or certificate check: the
/// transport only says "transport error"; the cause is deeper (rustls's words).
fn is_tls_failure(chain: &str) -> bool {
    let t = chain.to_ascii_lowercase();
    ["certificate", "tls", "handshake", "alert"]
        .iter()
        .any(|m| t.contains(m))
}

/// A TLS failure: retrying cannot help (wrong CA, no or unaccepted client certificate).
fn tls_failure(chain: &str) -> Classified {
    Classified {
        why: format!("TLS failed: {chain} (check rdzv-conf cacert, cert, key)"),
        fatal: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Endpoint, NodeRange};

    fn settings(pairs: &[(&str, &str)]) -> EtcdSettings {
        let conf = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let ep = Endpoint {
            host: "h".into(),
            port: 2379,
        };
        EtcdSettings::from_conf(NodeRange { min: 2, max: 2 }, &ep, &conf).unwrap()
    }

    #[test]
    fn a_tls_failure_is_found_in_the_sources_and_is_fatal() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let e = Outer(inner);
        let chain = full_chain(e.to_string(), std::error::Error::source(&e));
        assert_eq!(
            chain,
            "transport error: invalid peer certificate: UnknownIssuer"
        );
        assert!(is_tls_failure(&chain));
        let c = tls_failure(&chain);
        assert!(c.fatal);
        assert!(c
            .why
            .starts_with("TLS failed: transport error: invalid peer"));
        assert!(!is_tls_failure(
            "transport error: Connection refused (os error 111)"
        ));
    }

    #[cfg(not(feature = "etcd-tls"))]
    #[test]
    fn tls_settings_without_the_feature_name_it() {
        let s = settings(&[("cacert", "/ca.pem")]);
        let err = tls_options(&s, ConnectOptions::new()).unwrap_err();
        assert!(err.contains("`etcd-tls` cargo feature"), "{err}");
    }

    #[cfg(feature = "etcd-tls")]
    #[test]
    fn an_unreadable_certificate_file_is_named() {
        let s = settings(&[("cacert", "/nonexistent/ca.pem")]);
        let Err(err) = tls_options(&s, ConnectOptions::new()) else {
            panic!("a missing CA file is an error");
        };
        assert!(
            err.starts_with("cannot read rdzv-conf cacert=\"/nonexistent/ca.pem\""),
            "{err}"
        );
    }
}
