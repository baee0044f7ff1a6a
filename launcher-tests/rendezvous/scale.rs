//! Rendezvous at scale (32 and 128 loopback agents) and over IPv6 (loopback, two namespace
//! hosts). A child module of `rendezvous` (its harness).

use super::*;

/// `n` c10d agents as tasks of one runtime, each with its own store connection; returns the
/// wall time from start to every agent holding its assignment.
fn scale_run(n: usize) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let server = tcp::serve_on(&addr::ListenOn::Any, 0).expect("serve");
        let port = server.port();
        let nodes = NodeRange { min: n, max: n };
        let settings = C10dSettings::from_conf(nodes, &conf(&[])).expect("conf");
        let t0 = std::time::Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let settings = settings.clone();
                tokio::spawn(async move {
                    let dl = tokio::time::Instant::now() + Duration::from_secs(60);
                    let store = tcp::connect("127.0.0.1", port, dl, Duration::from_secs(60))
                        .await
                        .expect("connect");
                    let mut r =
                        C10dRendezvous::new(store, settings, "scale", "127.0.0.1", i as u32, 1);
                    let a = r
                        .next_round(RoundRequest {
                            reason: RoundReason::Initial,
                            master_port: 1,
                        })
                        .await
                        .expect("round");
                    (a, r)
                })
            })
            .collect();
        let mut asgs = BTreeMap::new();
        let mut keep = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            let (a, r) = t.await.expect("agent task");
            asgs.insert(i, a);
            keep.push(r);
        }
        let took = t0.elapsed();
        check_round(&asgs, &(0..n).map(|i| (i, 1)).collect());
        drop(keep);
        server.shutdown().await;
        took
    })
}

#[test]
fn c10d_loopback_32_agents_rendezvous() {
    let took = bounded(Duration::from_secs(120), || scale_run(32));
    eprintln!("32 agents: {took:?}");
}

#[test]
#[ignore = "benchmark: cargo test --release --test launcher -- --ignored rendezvous::scale"]
fn scale_c10d_loopback_128_agents() {
    for n in [2, 8, 32, 128] {
        let took = bounded(Duration::from_secs(300), move || scale_run(n));
        eprintln!("c10d rendezvous, {n} agents in one process: {took:?}");
    }
}

#[test]
fn c10d_ipv6_loopback_endpoint() {
    if !addr::is_local_ip("::1".parse().expect("literal")) {
        eprintln!("SKIP: no IPv6 loopback here");
        return;
    }
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        let nodes = NodeRange { min: 2, max: 2 };
        let mut c = Cluster::new();
        for i in 0..2 {
            let mut spec = loopback_spec(i, port, nodes, FAST, 1);
            spec.host = "::1".into();
            // Default address selection: the route to [::1] is ::1.
            spec.local_addr = None;
            c.start(spec, plain);
        }
        let r0 = c.round(0, &[0, 1], Duration::from_secs(60));
        check_round(&r0, &[(0, 1), (1, 1)].into());
        assert_eq!(r0[&0].master_addr, "::1");
        c.pongs(
            0,
            &[r0.iter()
                .find(|(_, a)| a.group_rank == 1)
                .map(|(i, _)| *i)
                .expect("rank 1")],
            Duration::from_secs(30),
        );
        c.finish(&[0, 1]);
    });
}

#[test]
fn netns_c10d_ipv6_two_hosts() {
    bounded(Duration::from_secs(120), || {
        let Some(net) = Netns::create(2) else { return };
        let net = std::sync::Arc::new(net);
        let mut c = Cluster::new();
        for i in 0..2 {
            let n = net.clone();
            let spec = AgentSpec {
                idx: i,
                host: net.addr6(0),
                port: 29400,
                nodes: NodeRange { min: 2, max: 2 },
                conf: conf(FAST),
                local_addr: None,
                nproc: 2,
                static_rank: None,
            };
            c.start(spec, move |b| n.spawn_in(i, b));
        }
        let r0 = c.round(0, &[0, 1], Duration::from_secs(60));
        check_round(&r0, &[(0, 2), (1, 2)].into());
        assert_eq!(
            r0[&1].master_addr,
            net.addr6(0),
            "advertised IPv6 route address"
        );
        assert_eq!(r0[&1].nodes[1].0, net.addr6(1));
        c.pongs(0, &[1], Duration::from_secs(30));
        c.finish(&[0, 1]);
    });
}
