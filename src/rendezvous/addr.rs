//! Which address an agent advertises to its peers, and whether it hosts the rendezvous store.
//!
//! torchrun advertises `socket.getfqdn()`, a name that often resolves only locally (pain points
//! 10-12). rdrun advertises `--local-addr` as given, or else the local IP address of the route to
//! the rendezvous endpoint: it `connect`s a UDP socket to the endpoint (no packet is sent; the
//! kernel only picks the route and source address, see udp(7) and ip(7)) and reads `local_addr`.
//! That address is by construction reachable from the network the endpoint is on, for IPv4 and
//! IPv6 alike. Resolution is retried until a deadline, since peers' names often appear only when
//! their pods start.
//!
//! `is_host` inference (torchrun's `_matches_machine_hostname`, spec §4.2): the endpoint host is
//! this machine if it is `localhost`, a loopback address, this machine's hostname, or resolves to
//! an address that can be bound here (bindability is the precise test for "assigned to one of my
//! interfaces", also inside network namespaces).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use tokio::time::Instant;

/// Why no address could be chosen.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddrError {
    #[error("cannot resolve rendezvous endpoint {host}:{port}: {reason}")]
    Resolve {
        host: String,
        port: u16,
        reason: String,
    },
    #[error("no route to rendezvous endpoint {host}:{port} ({addr}): {reason}")]
    Route {
        host: String,
        port: u16,
        addr: SocketAddr,
        reason: String,
    },
}

/// `host` without IPv6 brackets.
fn bare(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `host:port` for messages and connecting, with brackets around IPv6 literals.
pub fn host_port(host: &str, port: u16) -> String {
    let h = bare(host);
    if h.contains(':') {
        format!("[{h}]:{port}")
    } else {
        format!("{h}:{port}")
    }
}

/// Resolves `host:port` once (blocking getaddrinfo), IPv4 results first.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, AddrError> {
    let err = |reason: String| AddrError::Resolve {
        host: bare(host).to_string(),
        port,
        reason,
    };
    let mut addrs: Vec<SocketAddr> = (bare(host), port)
        .to_socket_addrs()
        .map_err(|e| err(e.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(err("no addresses".into()));
    }
    // Stable: IPv4 first (as getaddrinfo's default preference on most systems), then IPv6.
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs.dedup();
    Ok(addrs)
}

/// Resolves `host:port`, retrying every `retry` until `deadline` (peers still starting).
pub async fn resolve_until(
    host: &str,
    port: u16,
    deadline: Instant,
    retry: Duration,
) -> Result<Vec<SocketAddr>, AddrError> {
    loop {
        let h = host.to_string();
        let res = tokio::task::spawn_blocking(move || resolve(&h, port))
            .await
            .unwrap_or_else(|e| {
                Err(AddrError::Resolve {
                    host: host.to_string(),
                    port,
                    reason: e.to_string(),
                })
            });
        match res {
            Ok(a) => return Ok(a),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, "resolving the rendezvous endpoint; retrying");
                tokio::time::sleep(retry.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
            }
        }
    }
}

/// The local source address the kernel uses to reach `peer` (UDP connect, no traffic).
pub fn route_addr(peer: SocketAddr) -> std::io::Result<IpAddr> {
    let bind: SocketAddr = if peer.is_ipv6() {
        "[::]:0".parse().expect("literal")
    } else {
        "0.0.0.0:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(peer)?;
    Ok(sock.local_addr()?.ip())
}

/// The address to advertise: `local_addr` if given, else the route address towards the endpoint
/// (resolved with retry until `deadline`). Never a name that only resolves locally.
pub async fn advertised_addr(
    local_addr: Option<&str>,
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<String, AddrError> {
    if let Some(a) = local_addr.filter(|a| !a.trim().is_empty()) {
        return Ok(bare(a.trim()).to_string());
    }
    let addrs = resolve_until(host, port, deadline, Duration::from_millis(500)).await?;
    let mut last = None;
    for a in &addrs {
        match route_addr(*a) {
            Ok(ip) => return Ok(ip.to_string()),
            Err(e) => last = Some((*a, e.to_string())),
        }
    }
    let (addr, reason) = last.expect("resolve returns at least one address");
    Err(AddrError::Route {
        host: bare(host).to_string(),
        port,
        addr,
        reason,
    })
}

/// Whether `ip` is assigned to an interface of this machine (network namespace): it can be bound.
pub fn is_local_ip(ip: IpAddr) -> bool {
    ip.is_loopback() || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Pure `is_host` inference: `host` names this machine (see the module docs).
pub fn infer_is_host(
    host: &str,
    hostname: &str,
    resolved: &[IpAddr],
    is_local: &dyn Fn(IpAddr) -> bool,
) -> bool {
    let host = bare(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback() || is_local(ip);
    }
    if !hostname.is_empty() && host.eq_ignore_ascii_case(hostname) {
        return true;
    }
    resolved.iter().any(|ip| ip.is_loopback() || is_local(*ip))
}

/// `is_host` for the endpoint `host`: the explicit conf value, or the inference on this machine.
pub fn is_host(host: &str, explicit: Option<bool>) -> bool {
    if let Some(v) = explicit {
        return v;
    }
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    let resolved: Vec<IpAddr> = if bare(host).parse::<IpAddr>().is_ok() {
        Vec::new()
    } else {
        resolve(host, 0)
            .map(|v| v.into_iter().map(|a| a.ip()).collect())
            .unwrap_or_default()
    };
    infer_is_host(host, &hostname, &resolved, &is_local_ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_brackets_ipv6() {
        assert_eq!(host_port("::1", 29400), "[::1]:29400");
        assert_eq!(host_port("[::1]", 29400), "[::1]:29400");
        assert_eq!(host_port("node1", 1), "node1:1");
        assert_eq!(host_port("10.0.0.1", 5), "10.0.0.1:5");
    }

    #[test]
    fn infer_is_host_table() {
        let local = |ip: IpAddr| ip == "10.1.2.3".parse::<IpAddr>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases: &[(&str, &[IpAddr], bool)] = &[
            ("localhost", &[], true),
            ("LOCALHOST", &[], true),
            ("127.0.0.1", &[], true),
            ("127.0.0.5", &[], true),
            ("::1", &[], true),
            ("[::1]", &[], true),
            ("10.1.2.3", &[], true),
            ("10.1.2.4", &[], false),
            ("myhost", &[], true),
            ("MyHost", &[], true),
            ("other", &[], false),
            ("other", &[ip("10.9.9.9")], false),
            ("alias", &[ip("10.9.9.9"), ip("10.1.2.3")], true),
            ("loop-alias", &[ip("127.0.1.1")], true),
        ];
        for (host, resolved, want) in cases {
            assert_eq!(
                infer_is_host(host, "myhost", resolved, &local),
                *want,
                "{host} {resolved:?}"
            );
        }
    }

    #[test]
    fn route_to_loopback_is_loopback_and_local() {
        let v4 = route_addr("127.0.0.1:9".parse().unwrap()).unwrap();
        assert_eq!(v4, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(is_local_ip(v4));
        // IPv6 may be disabled on a CI machine; only check when ::1 exists.
        if is_local_ip("::1".parse().unwrap()) {
            if let Ok(v6) = route_addr("[::1]:9".parse().unwrap()) {
                assert_eq!(v6, "::1".parse::<IpAddr>().unwrap());
            }
        }
        assert!(
            !is_local_ip("192.0.2.1".parse().unwrap()),
            "TEST-NET-1 is never local"
        );
    }

    #[tokio::test]
    async fn advertised_addr_prefers_local_addr_and_names_the_endpoint_on_error() {
        let soon = Instant::now() + Duration::from_millis(200);
        assert_eq!(
            advertised_addr(Some("[fd00::2]"), "x", 1, soon)
                .await
                .unwrap(),
            "fd00::2"
        );
        assert_eq!(
            advertised_addr(None, "127.0.0.1", 29400, soon)
                .await
                .unwrap(),
            "127.0.0.1"
        );
        let err = advertised_addr(None, "no-such-host.invalid", 29400, soon)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot resolve rendezvous endpoint no-such-host.invalid:29400: "),
            "{err}"
        );
    }

    #[test]
    fn resolve_orders_ipv4_first() {
        let a = resolve("127.0.0.1", 80).unwrap();
        assert_eq!(a, ["127.0.0.1:80".parse::<SocketAddr>().unwrap()]);
        let a = resolve("[::1]", 80).unwrap();
        assert!(a[0].is_ipv6());
    }
}
