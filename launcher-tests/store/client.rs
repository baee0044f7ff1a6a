//! The Rust store clients against the real server: every operation of the async `Client`
//! (key prefixes included), WAIT and barrier timeouts that cancel and keep the connection usable
//! (in real and in paused time), the `BlockingClient` from several threads, and connecting:
//! retries until the server appears, clean errors when nothing or a mute peer listens.

use std::sync::Arc;
use std::time::Duration;

use rdrun::store::server::{ServerConfig, StoreServer};
use rdrun::store::{BlockingClient, Client, StoreError};

use super::{bounded, eventually_no_waiters, loopback0, start, BOUND, IO};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_every_operation() {
    bounded(async {
        let server = start();
        let c = Client::connect("127.0.0.1", server.port(), IO)
            .await
            .expect("connect");
        c.set_timeout(Duration::from_secs(30));
        c.ping().await.expect("ping");
        c.set("a", "1").await.expect("set");
        assert_eq!(c.get("a").await.expect("get"), b"1");
        assert_eq!(c.try_get("a").await.expect("try_get"), Some(b"1".to_vec()));
        assert_eq!(c.try_get("zz").await.expect("try_get"), None);
        assert_eq!(c.get_nowait("zz").await.expect("get_nowait"), b"");
        assert_eq!(c.add("n", 3).await.expect("add"), 3);
        assert_eq!(c.add("n", -5).await.expect("add"), -2);
        assert_eq!(c.compare_set("cs", "", "x").await.expect("cas"), b"x");
        assert_eq!(c.compare_set("cs", "x", "y").await.expect("cas"), b"y");
        assert!(c.check(&["a", "n"]).await.expect("check"));
        assert!(!c.check(&["a", "none"]).await.expect("check"));
        c.append("ap", "ab").await.expect("append");
        c.append("ap", "cd").await.expect("append");
        assert_eq!(c.get("ap").await.expect("get"), b"abcd");
        c.multi_set(&[("m1", "x"), ("m2", "yy")])
            .await
            .expect("mset");
        assert_eq!(
            c.multi_get(&["m1", "m2"]).await.expect("mget"),
            vec![b"x".to_vec(), b"yy".to_vec()]
        );
        assert!(c.delete_key("ap").await.expect("delete"));
        assert!(!c.delete_key("ap").await.expect("delete"));
        assert_eq!(c.num_keys().await.expect("num_keys"), 5);
        c.queue_push("q", "i1").await.expect("push");
        c.queue_push("q", "i2").await.expect("push");
        assert_eq!(c.queue_len("q").await.expect("len"), 2);
        assert_eq!(c.queue_pop("q").await.expect("pop"), Some(b"i1".to_vec()));
        assert_eq!(
            c.queue_pop_wait("q", IO).await.expect("pop"),
            b"i2".to_vec()
        );
        assert_eq!(c.queue_pop("q").await.expect("pop"), None);
        let mut keys = c.list_keys().await.expect("list");
        keys.sort();
        assert_eq!(keys, ["a", "cs", "m1", "m2", "n"]);
        c.barrier("bar", 1, IO).await.expect("barrier");
        // Keys are on the wire with TCPStore's "/" prefix; prefixes nest like PrefixStore.
        let raw = c.raw_keys();
        assert_eq!(raw.get_nowait("/a").await.expect("raw get"), b"1");
        let p = c.with_prefix("default_pg").with_prefix("0/");
        assert_eq!(p.wire_key("K"), b"/default_pg/0//K");
        p.set("K", "v").await.expect("set");
        assert_eq!(raw.get_nowait("/default_pg/0//K").await.expect("get"), b"v");
        assert_eq!(p.list_keys().await.expect("list"), ["K"]);
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_wait_timeout_cancels_and_connection_stays_usable() {
    bounded(async {
        let server = start();
        let c = Client::connect("127.0.0.1", server.port(), IO)
            .await
            .expect("connect");
        let e = c
            .wait(&["missing"], Duration::from_millis(200))
            .await
            .expect_err("times out");
        assert!(
            matches!(e, StoreError::Timeout { op: "wait", ref key } if key == "missing"),
            "{e:?}"
        );
        eventually_no_waiters(&server).await;
        c.set("x", "1").await.expect("set after timeout");
        assert_eq!(c.get("x").await.expect("get"), b"1");
        let e = c
            .barrier("b", 2, Duration::from_millis(200))
            .await
            .expect_err("times out");
        assert!(
            matches!(e, StoreError::Timeout { op: "barrier", .. }),
            "{e:?}"
        );
        eventually_no_waiters(&server).await;
        // A dropped in-flight request poisons the connection instead of desynchronizing it.
        let pending = c.wait(&["never"], Duration::from_secs(60));
        let _ = tokio::time::timeout(Duration::from_millis(100), pending).await;
        assert!(matches!(
            c.ping().await,
            Err(StoreError::ConnectionLost { .. })
        ));
        server.shutdown().await;
    })
    .await;
}

/// Paused time: an hour-long WAIT times out at once in virtual time, and the CANCEL_WAIT reaches
/// the server (its waiter table empties). The server runs on its own runtime in real time.
#[test]
fn client_wait_timeout_in_paused_time() {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let server = server_rt.block_on(async { start() });
    let port = server.port();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let started = std::time::Instant::now();
    let r = client_rt.block_on(async {
        let c = Client::connect("127.0.0.1", port, Duration::from_secs(3600))
            .await
            .expect("connect");
        c.set_timeout(Duration::from_secs(10 * 3600));
        // Connected in real time; from here on the clock only moves when the runtime idles.
        tokio::time::pause();
        c.wait(&["never"], Duration::from_secs(3600)).await
    });
    assert!(
        matches!(r, Err(StoreError::Timeout { op: "wait", .. })),
        "{r:?}"
    );
    assert!(started.elapsed() < BOUND);
    server_rt.block_on(async {
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    });
}

#[test]
fn blocking_client_from_threads() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt.block_on(async { start() });
    let port = server.port();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let c = BlockingClient::connect("127.0.0.1", port, IO).expect("connect");
                c.set_timeout(IO);
                c.set(&format!("r{i}"), i.to_string()).expect("set");
                c.barrier("all", 4, IO).expect("barrier");
                let vals = c.multi_get(&["r0", "r1", "r2", "r3"]).expect("mget");
                assert_eq!(vals, [b"0", b"1", b"2", b"3"]);
                let shared = Arc::new(c);
                let c2 = shared.clone();
                std::thread::spawn(move || c2.add("n", 1).expect("add"))
                    .join()
                    .expect("join");
                shared.add("n", 0).expect("add")
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().expect("thread") >= 1);
    }
    rt.block_on(server.shutdown());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_retries_until_server_appears_and_times_out_cleanly() {
    bounded(async {
        // Reserve a port, free it, start the server on it a little later.
        let port = loopback0().local_addr().expect("addr").port();
        let late = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("rebind");
            StoreServer::start(l, ServerConfig::default()).expect("start")
        });
        let c = Client::connect("127.0.0.1", port, Duration::from_secs(30))
            .await
            .expect("connect after retries");
        c.ping().await.expect("ping");
        let server = late.await.expect("server task");
        server.shutdown().await;
        // Nothing listening: a Connect error after about the timeout.
        let port = loopback0().local_addr().expect("addr").port();
        let t = std::time::Instant::now();
        let e = Client::connect("127.0.0.1", port, Duration::from_millis(500))
            .await
            .err()
            .expect("no server");
        assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
        assert!(t.elapsed() >= Duration::from_millis(450));
        // A peer that is not a store (never echoes the ping) times out too.
        let mute = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let mport = mute.local_addr().expect("addr").port();
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = mute.accept().await {
                held.push(s);
            }
        });
        let e = Client::connect("127.0.0.1", mport, Duration::from_millis(500))
            .await
            .err()
            .expect("mute peer");
        assert!(matches!(e, StoreError::Connect { .. }), "{e:?}");
    })
    .await;
}
