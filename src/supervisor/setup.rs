//! What a run sets up once, before its first attempt: the worker store's listening socket (which
//! address, which port, which MASTER_ADDR workers get) and the host names (the `${hostname}` of
//! log prefixes, the fully qualified name of the failure report).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use crate::config::LaunchConfig;
use crate::store::server::{ServerConfig, StoreServer};

/// The c10d worker store: every interface, dual-stack `[::]` (IPv4 peers too), else `0.0.0.0`
/// where IPv6 is disabled; on `port` (`--master-port`) or one the kernel picks.
pub(crate) fn bind_worker_store_any(port: u16) -> Result<StoreServer, String> {
    let v6 = SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), port);
    match StoreServer::bind(v6, ServerConfig::default()) {
        Ok(s) => Ok(s),
        Err(e6) => {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            tracing::debug!("cannot bind the worker store on {v6}: {e6}; trying {v4}");
            StoreServer::bind(v4, ServerConfig::default())
                .map_err(|err| format!("cannot bind the worker store on {v4}: {err}"))
        }
    }
}

/// `gethostname` up to the first dot (torchrun's `${hostname}` is `socket.gethostname()`).
pub(crate) fn short_host(host: &str) -> String {
    host.split('.').next().unwrap_or(host).to_string()
}

/// Binds the worker store's listening socket and returns it with the MASTER_ADDR workers get.
///
/// Standalone (or a loopback master address): 127.0.0.1 only. The port is `--master-port` (the
/// config's resolved MASTER_PORT) or, when `None`, one the kernel picks; either way the socket
/// stays open from bind to use, so no other process can take it (no probe-then-bind race).
/// torchrun gives its FQDN as MASTER_ADDR in standalone; rdrun gives 127.0.0.1, the address it
/// actually listens on. Any other master address binds every interface, as torchrun's agent
/// store does (`*:port`, spec torchrun-compat §2.3).
pub(crate) fn bind_store(config: &LaunchConfig) -> Result<(TcpListener, String), String> {
    let loopback = config.standalone || is_loopback(&config.master_addr);
    let (ip, master_addr) = if loopback {
        (IpAddr::V4(Ipv4Addr::LOCALHOST), "127.0.0.1".to_string())
    } else {
        (
            IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            config.master_addr.clone(),
        )
    };
    let addr = SocketAddr::new(ip, config.master_port.unwrap_or(0));
    let listener = TcpListener::bind(addr)
        .map_err(|err| format!("cannot bind the worker store on {addr}: {err}"))?;
    Ok((listener, master_addr))
}

pub(crate) fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// The fully qualified name of `host` for the failure report, as torchrun's `socket.getfqdn()`:
/// the resolver's canonical name when it has a dot, else `host` itself. The lookup is blocking
/// (getaddrinfo), so it runs off the agent's thread and is given up after a short bound: a slow
/// resolver only costs the report its domain.
pub(crate) async fn fqdn_of(host: &str) -> String {
    let name = host.to_string();
    let lookup = tokio::task::spawn_blocking(move || canonical_name(&name));
    match tokio::time::timeout(Duration::from_secs(2), lookup).await {
        Ok(Ok(Some(fqdn))) if fqdn.contains('.') || !host.contains('.') => fqdn,
        _ => host.to_string(),
    }
}

/// getaddrinfo(3) with AI_CANONNAME: the canonical name of `host`, if the resolver knows one.
fn canonical_name(host: &str) -> Option<String> {
    let c_host = std::ffi::CString::new(host).ok()?;
    // SAFETY: `hints` is plain data, zero is a valid value for every field.
    let mut hints: libc::addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_flags = libc::AI_CANONNAME;
    hints.ai_socktype = libc::SOCK_STREAM;
    let mut res: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: valid C string, hints and out-pointer; the result is freed below.
    let rc = unsafe { libc::getaddrinfo(c_host.as_ptr(), std::ptr::null(), &hints, &mut res) };
    if rc != 0 || res.is_null() {
        return None;
    }
    // SAFETY: `res` is a valid list from getaddrinfo; ai_canonname is NUL-terminated or null.
    let name = unsafe {
        let canon = (*res).ai_canonname;
        let name = (!canon.is_null()).then(|| {
            std::ffi::CStr::from_ptr(canon)
                .to_string_lossy()
                .into_owned()
        });
        libc::freeaddrinfo(res);
        name
    };
    name.filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        for (addr, want) in [
            ("127.0.0.1", true),
            ("127.1.2.3", true),
            ("localhost", true),
            ("::1", true),
            ("10.0.0.1", false),
            ("node1", false),
        ] {
            assert_eq!(is_loopback(addr), want, "{addr}");
        }
        assert_eq!(short_host("node1.cluster.local"), "node1");
        assert_eq!(short_host("vm"), "vm");
    }

    fn config(standalone: bool, master_addr: &str, master_port: Option<u16>) -> LaunchConfig {
        use crate::config::*;
        LaunchConfig {
            nproc_per_node: 1,
            nnodes: NodeRange { min: 1, max: 1 },
            node_rank: 0,
            rdzv: RdzvConfig {
                backend: RdzvBackend::Static,
                endpoint: None,
                run_id: "t".into(),
                conf: Default::default(),
            },
            standalone,
            master_addr: master_addr.into(),
            master_port,
            local_addr: None,
            max_restarts: 0,
            role: "default".into(),
            command: WorkerCommand {
                kind: EntrypointKind::Exec,
                program: "true".into(),
                args: Vec::new(),
                display_name: "true".into(),
                python: None,
            },
            log: LogConfig::default(),
            signals_to_handle: vec![libc::SIGTERM],
            shutdown_timeout: Duration::from_secs(1),
            virtual_local_rank: false,
            report_json: None,
            exit_barrier_timeout: Duration::from_secs(300),
            leftovers: LeftoverPolicy::Kill,
        }
    }

    #[test]
    fn store_binding() {
        // Standalone: loopback, a kernel-picked port, kept bound.
        let (l, addr) = bind_store(&config(true, "node1", None)).unwrap();
        let local = l.local_addr().unwrap();
        assert_eq!(addr, "127.0.0.1");
        assert!(local.ip().is_loopback() && local.port() != 0);
        // The port stays ours until the listener is dropped.
        assert!(TcpListener::bind(local).is_err());
        // --master-port given: exactly that port.
        let port = local.port();
        drop(l);
        let (l, addr) = bind_store(&config(false, "127.0.0.1", Some(port))).unwrap();
        assert_eq!(
            (addr.as_str(), l.local_addr().unwrap().port()),
            ("127.0.0.1", port)
        );
        // A taken port is a clear error naming the address.
        let err = bind_store(&config(false, "127.0.0.1", Some(port))).unwrap_err();
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    }

    #[test]
    fn report_host_name() {
        // The canonical name of a name the resolver knows (localhost), and the name itself for
        // one it does not.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let unknown = "no-such-host.invalid";
        assert_eq!(rt.block_on(fqdn_of(unknown)), unknown);
        assert!(!rt.block_on(fqdn_of("localhost")).is_empty());
    }
}
