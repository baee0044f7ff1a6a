//! Unit tests of the TCP store client (`tcp.rs`).
use super::*;

/// Two agents that both infer they host, started at the same instant: exactly one serves
/// (both used to lose the bind/listen race now and then, and nobody served the store).
#[test]
fn two_simultaneous_hosts_one_serves() {
    for _ in 0..30 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let go = Arc::new(std::sync::Barrier::new(2));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (go, tx) = (go.clone(), tx.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        go.wait();
                        let served = host_c10d_store("127.0.0.1", port, None).await.unwrap();
                        tx.send(served.is_some()).unwrap();
                        // Keep serving until both have decided.
                        go.wait();
                        if let Some(s) = served {
                            s.shutdown().await;
                        }
                    });
                })
            })
            .collect();
        let a = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let b = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        for t in threads {
            t.join().unwrap();
        }
        assert!(a ^ b, "port {port}: hosts {a} {b}");
    }
}

#[tokio::test]
async fn reconnects_after_the_server_restarts_and_maps_wait_timeout() {
    let server = serve_on(&ListenOn::Any, 0).unwrap();
    let port = server.port();
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = TcpRdzvStore::connect("127.0.0.1", port, deadline, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(s.add("n", 2).await.unwrap(), 2);
    assert!(!s
        .wait(&["missing".into()], Duration::from_millis(100))
        .await
        .unwrap());
    assert_eq!(s.compare_set("k", b"", b"v").await.unwrap(), b"v");
    assert_eq!(
        s.multi_get(&["k".into(), "n".into()]).await.unwrap(),
        [b"v".to_vec(), b"2".to_vec()]
    );
    server.shutdown().await;
    assert!(s.add("n", 1).await.is_err(), "server gone");
    // A new server on the same port: the adapter reconnects by itself.
    let server = StoreServer::bind(
        SocketAddr::from(([0, 0, 0, 0], port)),
        ServerConfig::default(),
    )
    .unwrap();
    let mut ok = false;
    for _ in 0..20 {
        if s.add("n", 1).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "reconnected");
    server.shutdown().await;
}

/// Issue 38 item 17: a wait dropped mid-way (the exit barrier ended early) costs the connection,
/// not the next request: the close after it used to fail with "an earlier request was
/// abandoned mid-way".
#[tokio::test]
async fn a_wait_dropped_mid_way_does_not_fail_the_next_request() {
    let server = serve_on(&ListenOn::Any, 0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = TcpRdzvStore::connect("127.0.0.1", server.port(), deadline, Duration::from_secs(5))
        .await
        .unwrap();
    let keys = ["never".to_string()];
    let waiting = s.wait(&keys, Duration::from_secs(30));
    assert!(tokio::time::timeout(Duration::from_millis(200), waiting)
        .await
        .is_err());
    s.set("closed", b"1").await.expect("the next request");
    assert_eq!(s.add("n", 1).await.unwrap(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn inferred_host_falls_back_to_client_when_port_is_taken_explicit_does_not() {
    let first = host_c10d_store("127.0.0.1", 0, None)
        .await
        .unwrap()
        .expect("loopback hosts");
    let port = first.port();
    assert!(host_c10d_store("127.0.0.1", port, None)
        .await
        .unwrap()
        .is_none());
    let err = host_c10d_store("127.0.0.1", port, Some(true))
        .await
        .err()
        .expect("explicit host: no fallback");
    assert_eq!(
        err.to_string(),
        format!("cannot serve the rendezvous store on port {port}")
    );
    assert!(
        host_c10d_store("192.0.2.1", port, None)
            .await
            .unwrap()
            .is_none(),
        "not this machine"
    );
    assert!(host_static_store(1, "127.0.0.1", port)
        .await
        .unwrap()
        .is_none());
    assert!(host_static_store(0, "127.0.0.1", port).await.is_err());
    first.shutdown().await;
}

#[tokio::test]
async fn unreachable_endpoint_error_names_host_and_port() {
    // Bind then drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let deadline = Instant::now() + Duration::from_millis(600);
    let err = connect("127.0.0.1", port, deadline, Duration::from_secs(1))
        .await
        .err()
        .expect("nobody listens");
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "rendezvous store 127.0.0.1:{port} unreachable after"
        )),
        "{msg}"
    );
}

/// A socket bound to `127.0.0.1:port` without SO_REUSEADDR and never listening: like the
/// client sockets in TIME_WAIT of issue 17.9, it makes a store's bind fail with EADDRINUSE
/// while nothing answers on the port.
fn port_blocker() -> (socket2::Socket, u16) {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = s.local_addr().unwrap().as_socket().unwrap().port();
    (s, port)
}

fn refused(a: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_err()
}

fn has_ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// Issue 17.9: the endpoint's host whose port is blocked while nothing answers there keeps
/// trying and hosts once the port is free (it used to become a client of nobody and wait
/// for its join timeout).
#[tokio::test]
async fn host_whose_port_is_blocked_while_nothing_answers_hosts_once_it_is_free() {
    let (blocker, port) = port_blocker();
    let release = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(blocker);
    });
    let served = tokio::time::timeout(
        Duration::from_secs(60),
        host_c10d_store("127.0.0.1", port, None),
    )
    .await
    .expect("bounded")
    .unwrap()
    .expect("the endpoint's host hosts");
    assert_eq!(served.port(), port);
    release.await.unwrap();
    served.shutdown().await;
}

/// Issue 17.9: when the port stays blocked, the error names the port and the reason (in
/// the test, after a 1 s retry bound instead of the 65 s one).
#[tokio::test]
async fn host_whose_port_stays_blocked_fails_naming_the_port_and_the_reason() {
    let (_blocker, port) = port_blocker();
    let plan = ListenOn::Ips(vec![Ipv4Addr::LOCALHOST.into()]);
    let err = host_on(&plan, port, true, Duration::from_secs(1))
        .await
        .err()
        .expect("no host");
    let chain = format!("{err}: {}", err.source);
    assert!(chain.contains(&format!("port {port}")), "{chain}");
    assert!(chain.contains("nothing answers"), "{chain}");
    assert!(chain.contains("TIME_WAIT"), "{chain}");
    // Another program (not a store) on the port: for a host that must host, an error at
    // once, naming it; an inferred host tries it as a client (said at WARN).
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let sport = squatter.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let err = host_on(&plan, sport, false, Duration::from_secs(30))
        .await
        .err()
        .expect("taken by a non-store");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        err.source.to_string().contains("not a rendezvous store"),
        "{err:?}"
    );
}

/// Issue 9: hosting never blocks the agent's single-threaded runtime (it used to
/// `std::thread::sleep` and connect synchronously), so a signal is handled at once: a
/// timeout of 300 ms around a host that keeps retrying ends within a few seconds.
#[test]
fn hosting_does_not_block_a_current_thread_runtime() {
    let (_blocker, port) = port_blocker();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let res = rt.block_on(async {
        let ticks = tokio::spawn(async {
            let mut n = 0u32;
            let mut every = tokio::time::interval(Duration::from_millis(50));
            for _ in 0..10 {
                every.tick().await;
                n += 1;
            }
            n
        });
        let hosted = tokio::time::timeout(
            Duration::from_millis(300),
            host_c10d_store("127.0.0.1", port, None),
        )
        .await;
        (hosted.is_err(), ticks.await.unwrap())
    });
    assert!(
        res.0,
        "still retrying after 300 ms (the port stays blocked)"
    );
    assert_eq!(res.1, 10);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "runtime blocked for {:?}",
        started.elapsed()
    );
}

/// Issue 10 (binding) and 11.2: the store listens where the user's address is.
#[tokio::test]
async fn stores_listen_where_the_address_names() {
    // Standalone: 127.0.0.1 only.
    let s = serve_at(None, 0).await.unwrap();
    assert_eq!(s.local_addr().ip(), IpAddr::from(Ipv4Addr::LOCALHOST));
    assert!(refused(SocketAddr::from(([127, 0, 0, 2], s.port()))));
    s.shutdown().await;
    // Another loopback address: exactly it (workers get 127.0.0.2 and connect there).
    let s = serve_at(Some("127.0.0.2"), 0).await.unwrap();
    assert_eq!(s.local_addr(), SocketAddr::from(([127, 0, 0, 2], s.port())));
    assert!(!refused(SocketAddr::from(([127, 0, 0, 2], s.port()))));
    assert!(refused(SocketAddr::from(([127, 0, 0, 1], s.port()))));
    s.shutdown().await;
    // `localhost`: every loopback address it resolves to, one port, one store.
    let s = serve_at(Some("localhost"), 0).await.unwrap();
    let port = s.port();
    let v4 = Client::connect("127.0.0.1", port, Duration::from_secs(10))
        .await
        .expect("127.0.0.1");
    v4.set("k", b"v").await.unwrap();
    let six = lookup_has_v6_localhost();
    if six && has_ipv6_loopback() {
        let v6 = Client::connect("::1", port, Duration::from_secs(10))
            .await
            .expect("::1");
        assert_eq!(v6.get("k").await.unwrap(), b"v");
    } else {
        eprintln!("localhost has no IPv6 loopback here; ::1 not checked");
    }
    drop(v4);
    s.shutdown().await;
    // The wildcard, when asked for: both families.
    let s = serve_at(Some("0.0.0.0"), 0).await.unwrap();
    assert!(s.local_addr().ip().is_unspecified());
    s.shutdown().await;
    if has_ipv6_loopback() {
        let s = serve_at(Some("::1"), 0).await.unwrap();
        assert_eq!(s.local_addr().ip(), IpAddr::from(Ipv6Addr::LOCALHOST));
        assert!(refused(SocketAddr::from(([127, 0, 0, 1], s.port()))));
        s.shutdown().await;
    } else {
        eprintln!("no IPv6 loopback here; [::1] not checked");
    }
}

fn lookup_has_v6_localhost() -> bool {
    addr::lookup("localhost", 0)
        .map(|v| v.iter().any(SocketAddr::is_ipv6))
        .unwrap_or(false)
}

/// Moved from the agent with the binder: a fixed port is that port, kept bound; a taken
/// port is a clear error naming the address.
#[tokio::test]
async fn fixed_port_is_kept_and_a_taken_port_names_the_address() {
    let s = serve_at(None, 0).await.unwrap();
    let local = s.local_addr();
    assert!(local.ip().is_loopback() && local.port() != 0);
    assert!(std::net::TcpListener::bind(local).is_err(), "kept bound");
    let port = local.port();
    s.shutdown().await;
    let s = serve_at(Some("127.0.0.1"), port).await.unwrap();
    assert_eq!(s.port(), port);
    let err = serve_at(Some("127.0.0.1"), port)
        .await
        .err()
        .expect("taken");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    s.shutdown().await;
}

/// Issue 28's clock check: the store answers its clock key with its time (through the
/// rendezvous' non-creating read, as the health check asks), and stores nothing under it.
#[tokio::test]
async fn the_store_tells_its_time_on_the_clock_key() {
    let server = serve_on(&ListenOn::Any, 0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = TcpRdzvStore::connect("127.0.0.1", server.port(), deadline, Duration::from_secs(5))
        .await
        .unwrap();
    let before = std::time::SystemTime::now();
    let answer = crate::rendezvous::store::try_get(&s, crate::store::CLOCK_KEY)
        .await
        .unwrap()
        .expect("the clock key answers");
    let after = std::time::SystemTime::now();
    let ns = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let host: u128 = String::from_utf8(answer).unwrap().parse().unwrap();
    // Same machine, same clock: the answer is between the request and the reply.
    assert!(
        ns(before) <= host && host <= ns(after),
        "{} {host} {}",
        ns(before),
        ns(after)
    );
    // Nothing was stored: the key is not among the store's keys.
    assert!(!s
        .wait(&[crate::store::CLOCK_KEY.into()], Duration::from_millis(50))
        .await
        .unwrap());
}
