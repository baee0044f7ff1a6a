//! Unit tests of `addr.rs` (in a file of their own: they run real tools and print why a step
//! was skipped, which the library itself never does).

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

/// Issue 10 (binding) and 11.2: a store listens where the user's address is, not on every
/// interface and not on 127.0.0.1 for every loopback spelling.
#[test]
fn listen_plan_binds_what_the_user_named() {
    let local = |ip: IpAddr| ip == "10.1.2.3".parse::<IpAddr>().unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let ips = |v: &[&str]| ListenOn::Ips(v.iter().map(|s| ip(s)).collect());
    let cases: &[(&str, &[IpAddr], ListenOn, bool)] = &[
        ("127.0.0.1", &[], ips(&["127.0.0.1"]), false),
        ("127.0.0.2", &[], ips(&["127.0.0.2"]), false),
        ("::1", &[], ips(&["::1"]), false),
        ("[::1]", &[], ips(&["::1"]), false),
        ("10.1.2.3", &[], ips(&["10.1.2.3"]), false),
        ("0.0.0.0", &[], ListenOn::AnyV4, false),
        ("::", &[], ListenOn::Any, false),
        ("[::]", &[], ListenOn::Any, false),
        ("10.9.9.9", &[], ListenOn::Any, true),
        (
            "localhost",
            &[ip("::1"), ip("127.0.0.1"), ip("127.0.0.1")],
            ips(&["::1", "127.0.0.1"]),
            false,
        ),
        ("localhost", &[], ips(&["127.0.0.1"]), false),
        ("node0", &[ip("10.1.2.3")], ips(&["10.1.2.3"]), false),
        (
            "node0",
            &[ip("127.0.1.1"), ip("10.1.2.3")],
            ips(&["10.1.2.3"]),
            false,
        ),
        ("node0", &[ip("127.0.1.1")], ListenOn::Any, true),
        ("node0", &[ip("10.9.9.9")], ListenOn::Any, true),
        ("node0", &[], ListenOn::Any, true),
    ];
    for (host, resolved, want, falls_back) in cases {
        let (plan, why) = listen_plan(host, resolved, &local);
        assert_eq!(&plan, want, "{host} {resolved:?}");
        assert_eq!(why.is_some(), *falls_back, "{host} {resolved:?}: {why:?}");
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

/// `.invalid` never resolves (RFC 6761): the lookup says "does not exist", not "try again"
/// (a resolver that cannot be reached at all gives Transient, which is also not Ok).
#[test]
fn lookup_tells_a_missing_name_and_passes_literals_through() {
    match lookup("no-such-host.invalid", 1) {
        Err(LookupError::NotFound(reason)) => assert!(!reason.is_empty()),
        Err(LookupError::Transient(reason)) => {
            eprintln!("resolver unavailable here ({reason}); NotFound not checked")
        }
        Ok(a) => panic!("resolved {a:?}"),
    }
    assert_eq!(
        lookup("[::1]", 7).unwrap(),
        ["[::1]:7".parse::<SocketAddr>().unwrap()]
    );
    let a = lookup("localhost", 7).unwrap();
    assert!(
        a.iter().all(|a| a.ip().is_loopback() && a.port() == 7),
        "{a:?}"
    );
}

#[test]
fn resolve_orders_ipv4_first() {
    let a = resolve("127.0.0.1", 80).unwrap();
    assert_eq!(a, ["127.0.0.1:80".parse::<SocketAddr>().unwrap()]);
    let a = resolve("[::1]", 80).unwrap();
    assert!(a[0].is_ipv6());
}
