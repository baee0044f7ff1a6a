//! Addresses: which address an agent advertises to its peers, whether it hosts the rendezvous
//! store, where a store listens, and name lookups that say why they failed.
//!
//! torchrun advertises `socket.getfqdn()`, a name that often resolves only locally (pain points
//! 10-12). rdrun advertises `--local-addr` as given, or else the local IP address of the route to
//! the rendezvous endpoint: it `connect`s a UDP socket to the endpoint (no packet is sent; the
//! kernel only picks the route and source address, see udp(7) and ip(7)) and reads `local_addr`.
//! That address is by construction reachable from the network the endpoint is on, for IPv4 and
//! IPv6 alike. Resolution is retried until a deadline, since peers' names often appear only when
//! their pods start; a name that does not exist (NXDOMAIN) is said at once at WARN, and every
//! few seconds while it lasts, so that a typo is visible long before the deadline.
//!
//! `is_host` inference (torchrun's `_matches_machine_hostname`, spec §4.2): the endpoint host is
//! this machine if it is `localhost`, a loopback address, this machine's hostname, or resolves to
//! an address that can be bound here (bindability is the precise test for "assigned to one of my
//! interfaces", also inside network namespaces).
//!
//! Where a store listens ([`listen_plan`]; every store rdrun hosts binds through it): what the
//! user named. `localhost` → every loopback address it resolves to; a loopback or local address
//! → exactly that address; the wildcard `0.0.0.0` / `::` → every interface (the way to ask for
//! it); a name → the non-loopback addresses of this machine it resolves to here. A name that
//! resolves here only to loopback (Debian's `127.0.1.1 hostname` line) or to no address of this
//! machine, and an address that is not this machine's (a NAT or virtual address), fall back to
//! every interface, since peers reach this node by some address the name does not show here.
//! Lookups run on tokio's blocking pool: the agent's single-threaded runtime keeps handling
//! signals while getaddrinfo waits for a resolver.

use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::time::Duration;

use tokio::time::Instant;

/// How often a lookup that keeps failing is reported while it is retried.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

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

/// Why a name lookup failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// The name does not exist (NXDOMAIN: `EAI_NONAME`, `EAI_NODATA`).
    NotFound(String),
    /// The resolver did not answer or failed (`EAI_AGAIN`, `EAI_FAIL`, ...): may pass.
    Transient(String),
}

impl LookupError {
    /// The resolver's words.
    pub fn reason(&self) -> &str {
        match self {
            LookupError::NotFound(r) | LookupError::Transient(r) => r,
        }
    }
}

/// `host` without IPv6 brackets.
pub fn bare(host: &str) -> &str {
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

/// getaddrinfo(3) for `host` (blocking), keeping its error code: std's `ToSocketAddrs` turns it
/// into a localized message only, and "does not exist" must be told from "no answer yet".
pub fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, LookupError> {
    let h = bare(host);
    if let Ok(ip) = h.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let c_host = CString::new(h)
        .map_err(|_| LookupError::NotFound("the name contains a NUL byte".into()))?;
    // SAFETY: an all-zero addrinfo is the documented "no hints" value; fields set below.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_family = libc::AF_UNSPEC;
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated name, no service, valid hints; `res` is freed below.
    let rc = unsafe { libc::getaddrinfo(c_host.as_ptr(), std::ptr::null(), &hints, &mut res) };
    if rc != 0 {
        let reason = if rc == libc::EAI_SYSTEM {
            std::io::Error::last_os_error().to_string()
        } else {
            // SAFETY: gai_strerror returns a static NUL-terminated string for any code.
            unsafe { CStr::from_ptr(libc::gai_strerror(rc)) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(match rc {
            libc::EAI_NONAME | libc::EAI_NODATA => LookupError::NotFound(reason),
            _ => LookupError::Transient(reason),
        });
    }
    let mut out = Vec::new();
    let mut p = res;
    while !p.is_null() {
        // SAFETY: `p` walks the list getaddrinfo returned, which stays valid until freed.
        let ai = unsafe { &*p };
        if !ai.ai_addr.is_null() {
            match ai.ai_family {
                libc::AF_INET => {
                    // SAFETY: AF_INET entries carry a sockaddr_in.
                    let sa = unsafe { &*(ai.ai_addr as *const libc::sockaddr_in) };
                    let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
                    out.push(SocketAddr::new(IpAddr::V4(ip), port));
                }
                libc::AF_INET6 => {
                    // SAFETY: AF_INET6 entries carry a sockaddr_in6.
                    let sa = unsafe { &*(ai.ai_addr as *const libc::sockaddr_in6) };
                    let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
                    out.push(SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        port,
                        sa.sin6_flowinfo,
                        sa.sin6_scope_id,
                    )));
                }
                _ => {}
            }
        }
        p = ai.ai_next;
    }
    // SAFETY: `res` came from a successful getaddrinfo and is freed once.
    unsafe { libc::freeaddrinfo(res) };
    if out.is_empty() {
        return Err(LookupError::NotFound("no addresses".into()));
    }
    Ok(out)
}

/// [`lookup`] on tokio's blocking pool (never stalls the caller's runtime).
pub async fn lookup_async(host: &str, port: u16) -> Result<Vec<SocketAddr>, LookupError> {
    let h = host.to_string();
    tokio::task::spawn_blocking(move || lookup(&h, port))
        .await
        .unwrap_or_else(|e| Err(LookupError::Transient(e.to_string())))
}

/// Resolves `host:port` once (blocking getaddrinfo), IPv4 results first.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, AddrError> {
    lookup(host, port)
        .map(sorted)
        .map_err(|e| AddrError::Resolve {
            host: bare(host).to_string(),
            port,
            reason: e.reason().to_string(),
        })
}

/// Stable: IPv4 first (as getaddrinfo's default preference on most systems), then IPv6.
fn sorted(mut addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    addrs.sort_by_key(|a| a.is_ipv6());
    addrs.dedup();
    addrs
}

/// Resolves `host:port`, retrying every `retry` until `deadline` (peers still starting). A
/// failure is logged at WARN at once and then every few seconds while it lasts, saying whether
/// the name does not exist or the resolver did not answer; the error at the deadline gives the
/// resolver's last reason and how long it was tried.
pub async fn resolve_until(
    host: &str,
    port: u16,
    deadline: Instant,
    retry: Duration,
) -> Result<Vec<SocketAddr>, AddrError> {
    let started = Instant::now();
    let mut reported: Option<Instant> = None;
    loop {
        let err = match lookup_async(host, port).await {
            Ok(a) => {
                if reported.is_some() {
                    tracing::warn!(
                        "resolved {} after {:.0}s",
                        bare(host),
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(sorted(a));
            }
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            let waited = started.elapsed().as_secs_f64();
            return Err(AddrError::Resolve {
                host: bare(host).to_string(),
                port,
                reason: if waited >= 1.0 {
                    format!("{} (tried for {waited:.0}s)", err.reason())
                } else {
                    err.reason().to_string()
                },
            });
        }
        if reported.map_or(true, |t| now - t >= PROGRESS_EVERY) {
            let left = deadline.saturating_duration_since(now).as_secs_f64();
            match (&err, reported) {
                (LookupError::NotFound(r), None) => tracing::warn!(
                    "cannot resolve {}: {r}; retrying for {left:.0}s more, as a peer's name may \
                     appear only once it starts",
                    bare(host)
                ),
                (LookupError::Transient(r), None) => tracing::warn!(
                    "cannot resolve {} yet: {r}; retrying for {left:.0}s more",
                    bare(host)
                ),
                (e, Some(_)) => tracing::warn!(
                    "still cannot resolve {} after {:.0}s: {}; retrying for {left:.0}s more",
                    bare(host),
                    started.elapsed().as_secs_f64(),
                    e.reason()
                ),
            }
            reported = Some(now);
        }
        tokio::time::sleep(retry.min(deadline.saturating_duration_since(Instant::now()))).await;
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

/// This machine's hostname (empty when unknown).
fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

/// The addresses `host` resolves to here (none for a literal or a failed lookup), off-thread.
async fn resolved_here(host: &str) -> Vec<IpAddr> {
    if bare(host).parse::<IpAddr>().is_ok() {
        return Vec::new();
    }
    lookup_async(host, 0)
        .await
        .map(|v| v.into_iter().map(|a| a.ip()).collect())
        .unwrap_or_default()
}

/// `is_host` for the endpoint `host`: the explicit conf value, or the inference on this machine.
/// The lookup runs on the blocking pool, so a slow resolver never stalls signal handling.
pub async fn is_host(host: &str, explicit: Option<bool>) -> bool {
    if let Some(v) = explicit {
        return v;
    }
    let resolved = resolved_here(host).await;
    infer_is_host(host, &hostname(), &resolved, &is_local_ip)
}

/// Where a store listens (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenOn {
    /// Every interface: dual-stack `[::]`, or `0.0.0.0` where IPv6 is unavailable.
    Any,
    /// Every IPv4 interface (`0.0.0.0` named by the user).
    AnyV4,
    /// Exactly these addresses (one listening socket each, one port).
    Ips(Vec<IpAddr>),
}

impl ListenOn {
    /// The addresses a local probe can reach a listener of this plan on.
    pub fn probe_ips(&self) -> Vec<IpAddr> {
        match self {
            ListenOn::Any => vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()],
            ListenOn::AnyV4 => vec![Ipv4Addr::LOCALHOST.into()],
            ListenOn::Ips(ips) => ips.clone(),
        }
    }
}

impl std::fmt::Display for ListenOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenOn::Any => f.write_str("every interface"),
            ListenOn::AnyV4 => f.write_str("every IPv4 interface"),
            ListenOn::Ips(ips) => {
                let v: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
                f.write_str(&v.join(", "))
            }
        }
    }
}

/// Pure: where a store named by `host` listens, given what `host` resolves to here and which
/// addresses are this machine's, with the reason when it falls back to every interface.
pub fn listen_plan(
    host: &str,
    resolved: &[IpAddr],
    is_local: &dyn Fn(IpAddr) -> bool,
) -> (ListenOn, Option<String>) {
    let h = bare(host);
    if let Ok(ip) = h.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(v4) if v4.is_unspecified() => (ListenOn::AnyV4, None),
            IpAddr::V6(v6) if v6.is_unspecified() => (ListenOn::Any, None),
            ip if ip.is_loopback() || is_local(ip) => (ListenOn::Ips(vec![ip]), None),
            ip => (
                ListenOn::Any,
                Some(format!(
                    "{ip} is not an address of this machine (a NAT or virtual address?)"
                )),
            ),
        };
    }
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in resolved {
        if !ips.contains(ip) {
            ips.push(*ip);
        }
    }
    if h.eq_ignore_ascii_case("localhost") {
        ips.retain(IpAddr::is_loopback);
        if ips.is_empty() {
            ips.push(Ipv4Addr::LOCALHOST.into());
        }
        return (ListenOn::Ips(ips), None);
    }
    let local: Vec<IpAddr> = ips
        .iter()
        .copied()
        .filter(|ip| !ip.is_loopback() && is_local(*ip))
        .collect();
    if !local.is_empty() {
        return (ListenOn::Ips(local), None);
    }
    let why = if ips.is_empty() {
        format!("{h} does not resolve on this machine")
    } else if ips.iter().all(IpAddr::is_loopback) {
        format!("{h} resolves here only to loopback, which peers cannot reach")
    } else {
        format!("{h} resolves to no address of this machine")
    };
    (ListenOn::Any, Some(why))
}

/// [`listen_plan`] on this machine (`None`: a standalone run, loopback 127.0.0.1 only); the
/// fallback to every interface is logged at INFO with its reason.
pub async fn listen_on(host: Option<&str>) -> ListenOn {
    let Some(host) = host else {
        return ListenOn::Ips(vec![Ipv4Addr::LOCALHOST.into()]);
    };
    let resolved = resolved_here(host).await;
    let (plan, why) = listen_plan(host, &resolved, &is_local_ip);
    if let Some(why) = why {
        tracing::info!("{why}: the store listens on every interface");
    }
    plan
}

#[cfg(test)]
#[path = "addr_tests.rs"]
mod tests;
