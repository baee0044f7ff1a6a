//! Addresses, binding and endpoints (issues 9, 10, 11.2, 17.5, 17.8): MASTER_ADDR reaches
//! workers as the user gave it and the store listens there (and only there), endpoint ports
//! and names that cannot work fail at once with a message that names the real cause.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::netns::{bounded, Netns};
use crate::util::{free_port, parse_env0, wait_for_file, worker, Rdrun, TempDir};

fn has_ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// The addresses with a listening TCP socket on `port` in this network namespace, from
/// /proc/net/tcp{,6} (state 0A; addresses are 32-bit words in host byte order).
fn listening_on(port: u16) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 4 || f[3] != "0A" {
                continue;
            }
            let Some((a, p)) = f[1].split_once(':') else {
                continue;
            };
            if u16::from_str_radix(p, 16).ok() != Some(port) {
                continue;
            }
            let words: Vec<[u8; 4]> = (0..a.len() / 8)
                .filter_map(|i| u32::from_str_radix(&a[i * 8..i * 8 + 8], 16).ok())
                .map(u32::to_le_bytes)
                .collect();
            let ip = if v6 && words.len() == 4 {
                let b: Vec<u8> = words.concat();
                IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).expect("16 bytes")))
            } else if !v6 && words.len() == 1 {
                IpAddr::V4(Ipv4Addr::from(words[0]))
            } else {
                continue;
            };
            out.push(ip);
        }
    }
    out
}

/// Issue 11.2: a loopback `--master-addr` reaches workers as given (torchrun passes
/// `localhost`, `127.0.0.2`, `::1`) and the store listens where it resolves: the worker connects
/// to MASTER_ADDR:MASTER_PORT. rdrun used to give 127.0.0.1 and listen only there.
#[test]
fn loopback_master_addr_reaches_workers_as_given_and_they_connect() {
    let mut cases = vec![("127.0.0.2", "127.0.0.2"), ("localhost", "localhost")];
    if has_ipv6_loopback() {
        cases.push(("[::1]", "::1"));
    } else {
        eprintln!("no IPv6 loopback on this machine: --master-addr [::1] not checked");
    }
    for (flag, want) in cases {
        let dir = TempDir::new("master-addr");
        let out = Rdrun::new()
            .args([
                "--nproc-per-node",
                "2",
                "--master-addr",
                flag,
                "--master-port",
            ])
            .arg(free_port().to_string())
            .arg(worker("connect_master"))
            .arg(dir.path())
            .timeout(Duration::from_secs(60))
            .run();
        out.assert_code(0);
        for rank in 0..2 {
            let got = std::fs::read_to_string(dir.join(format!("ok.{rank}")))
                .unwrap_or_else(|e| panic!("{flag}: rank {rank} did not connect ({e}): {out:?}"));
            assert_eq!(got, want, "{flag}: MASTER_ADDR");
        }
    }
}

/// Runs `agents` (each an `Rdrun` whose worker is `hold_until_stop DIR`) until every one of
/// `nproc` ranks has started, returns the listening addresses of `ports` plus the workers'
/// MASTER_PORT, then lets the job finish.
fn listeners_while_running(
    dir: &TempDir,
    agents: Vec<Rdrun>,
    nproc: usize,
    ports: &[u16],
) -> Vec<(u16, Vec<IpAddr>)> {
    let running: Vec<_> = agents.iter().map(Rdrun::spawn).collect();
    for rank in 0..nproc {
        assert!(
            wait_for_file(&dir.join(format!("env.{rank}")), Duration::from_secs(60)),
            "rank {rank} never started"
        );
    }
    let env = parse_env0(&std::fs::read_to_string(dir.join("env.0")).expect("env.0"));
    let master_port: u16 = env["MASTER_PORT"].parse().expect("MASTER_PORT");
    let mut seen = Vec::new();
    for &p in ports.iter().chain([master_port].iter()) {
        seen.push((p, listening_on(p)));
    }
    std::fs::write(dir.join("stop"), b"").expect("stop file");
    for r in running {
        r.wait().assert_code(0);
    }
    seen
}

fn assert_loopback_only(seen: &[(u16, Vec<IpAddr>)], want: IpAddr) {
    for (port, ips) in seen {
        assert!(!ips.is_empty(), "nothing listens on port {port}");
        assert!(
            ips.iter().all(|ip| *ip == want),
            "port {port} listens on {ips:?}, not only on {want}"
        );
    }
}

/// Issue 10 (binding): a c10d endpoint on 127.0.0.1 serves the rendezvous store and the worker
/// store on 127.0.0.1 only (both used to listen on every interface).
#[test]
fn c10d_endpoint_on_loopback_listens_on_loopback_only() {
    let dir = TempDir::new("bind-c10d");
    let port = free_port();
    let agent = Rdrun::new()
        .args([
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg(worker("hold_until_stop"))
        .arg(dir.path())
        .timeout(Duration::from_secs(90));
    let seen = listeners_while_running(&dir, vec![agent], 1, &[port]);
    assert_loopback_only(&seen, Ipv4Addr::LOCALHOST.into());
}

/// Issue 10 (binding): a static two-node job with `--master-addr 127.0.0.1` listens on
/// 127.0.0.1 only (it used to listen on every interface).
#[test]
fn static_two_nodes_on_loopback_listen_on_loopback_only() {
    let dir = TempDir::new("bind-static");
    let port = free_port();
    let agents = (0..2)
        .map(|rank| {
            Rdrun::new()
                .args(["--nproc-per-node", "1", "--nnodes", "2", "--node-rank"])
                .arg(rank.to_string())
                .args(["--master-addr", "127.0.0.1", "--master-port"])
                .arg(port.to_string())
                .arg(worker("hold_until_stop"))
                .arg(dir.path())
                .timeout(Duration::from_secs(90))
        })
        .collect();
    let seen = listeners_while_running(&dir, agents, 2, &[]);
    assert_eq!(
        seen.len(),
        1,
        "static: MASTER_PORT is the rendezvous store's port"
    );
    assert_eq!(seen[0].0, port);
    assert_loopback_only(&seen, Ipv4Addr::LOCALHOST.into());
}

/// Issue 17.5: `--rdzv-endpoint localhost:0` on one node picks a port and uses it (it used to
/// serve on a kernel-picked port and then connect to port 0 until the join timeout); on
/// several nodes it is a one-line usage error at once.
#[test]
fn rdzv_endpoint_port_zero_one_node_runs_several_nodes_fail_at_once() {
    let out = Rdrun::new()
        .args(["--nproc-per-node", "1", "--rdzv-backend", "c10d"])
        .args(["--rdzv-endpoint", "localhost:0", "/bin/true"])
        .timeout(Duration::from_secs(60))
        .run();
    out.assert_code(0);
    let out = Rdrun::new()
        .args([
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
        ])
        .args(["--rdzv-endpoint", "localhost:0", "/bin/true"])
        .timeout(Duration::from_secs(30))
        .run();
    out.assert_code(2);
    let err = out.stderr.trim();
    assert!(
        err.contains("port 0") && err.contains("one node"),
        "{out:?}"
    );
    assert_eq!(err.lines().count(), 1, "{out:?}");
}

/// Issue 10: a rendezvous endpoint name that does not resolve is said to be unresolvable, at
/// once at WARN and in the final error (it used to wait silently, then say "resolve timed out").
#[test]
fn unresolvable_endpoint_says_cannot_resolve_the_name() {
    let out = Rdrun::new()
        .args([
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
        ])
        .args(["--rdzv-endpoint", "no-such-host.invalid:29400"])
        .args(["--rdzv-conf", "join_timeout=4", "/bin/true"])
        .timeout(Duration::from_secs(60))
        .run();
    out.assert_code(1);
    assert!(
        out.stderr.contains("WARN") && out.stderr.contains("cannot resolve no-such-host.invalid"),
        "{out:?}"
    );
    assert!(
        out.stderr
            .contains("error: cannot resolve rendezvous endpoint no-such-host.invalid:29400"),
        "{out:?}"
    );
    assert!(!out.stderr.contains("timed out"), "{out:?}");
}

/// Issues 11.6 and 17.8: a store that refuses connections is reported as refused, not as
/// "resolve timed out" (the last retry started after its deadline had passed).
#[test]
fn refused_store_is_reported_as_refused() {
    let port = free_port();
    let out = Rdrun::new()
        .args([
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--rdzv-backend",
            "c10d",
        ])
        .arg("--rdzv-endpoint")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--rdzv-conf", "is_host=0,join_timeout=3", "/bin/true"])
        .timeout(Duration::from_secs(60))
        .run();
    out.assert_code(1);
    assert!(out.stderr.to_lowercase().contains("refused"), "{out:?}");
    assert!(!out.stderr.contains("timed out"), "{out:?}");
}

/// Issue 9 (defect): a single-node run with a non-loopback IPv6 `--master-addr` served the
/// store on 0.0.0.0 only, so workers got an address nothing listened on. In a network namespace
/// with its own IPv6 address (skipped where namespaces cannot be created).
#[test]
fn single_node_non_loopback_ipv6_master_addr_is_served() {
    bounded(Duration::from_secs(120), || {
        let Some(net) = Netns::create(1) else { return };
        let v6 = net.addr6(0);
        let dir = TempDir::new("master-addr-v6");
        let out = Rdrun::new()
            .netns(&net.name(0))
            .args(["--nproc-per-node", "1", "--master-addr"])
            .arg(format!("[{v6}]"))
            .args(["--master-port", "29577"])
            .arg(worker("connect_master"))
            .arg(dir.path())
            .timeout(Duration::from_secs(60))
            .run();
        out.assert_code(0);
        let got = std::fs::read_to_string(dir.join("ok.0"))
            .unwrap_or_else(|e| panic!("rank 0 did not connect ({e}): {out:?}"));
        assert_eq!(got, v6);
    });
}

/// Issue 17.9: the endpoint's host whose port is blocked while nothing answers there (client
/// sockets in TIME_WAIT; here a socket bound without SO_REUSEADDR that never listens) keeps
/// trying (saying so at WARN after 1 s) and hosts once the port is free. It used to join as a client of nobody and wait
/// until its join timeout.
#[test]
fn endpoint_host_with_a_blocked_port_hosts_once_it_is_free() {
    use socket2::{Domain, Socket, Type};
    let blocker = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    blocker
        .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let port = blocker
        .local_addr()
        .expect("local addr")
        .as_socket()
        .expect("inet")
        .port();
    let running = Rdrun::new()
        .args([
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--rdzv-conf", "join_timeout=30", "/bin/true"])
        .timeout(Duration::from_secs(90))
        .spawn();
    // Whenever the port frees up (before or after rdrun first tries it), rdrun must host.
    std::thread::sleep(Duration::from_secs(3));
    drop(blocker);
    let out = running.wait();
    out.assert_code(0);
}
