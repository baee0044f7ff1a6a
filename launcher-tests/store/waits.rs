//! Waiting in the store over raw sockets: WAIT and BARRIER waiters woken by each waking op,
//! CANCEL_WAIT against a wait that finished meanwhile (`00 01`), a client that disconnects
//! mid-wait leaving no waiter behind, and 2,000 concurrent clients through ADD, WAIT and a
//! barrier.

use std::time::Duration;

use rdrun::store::protocol::Request;
use rdrun::store::server::raise_nofile_limit;
use rdrun::store::Client;
use tokio::io::AsyncReadExt;

use super::{bounded, eventually_no_waiters, i64b, key, s, start, Raw, IO};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_woken_by_each_waking_op() {
    bounded(async {
        let server = start();
        let port = server.port();
        let ops: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            (
                "SET",
                Request::Set {
                    key: key("/w"),
                    value: key("1"),
                }
                .to_bytes(),
                vec![],
            ),
            (
                "ADD",
                Request::Add {
                    key: key("/w"),
                    delta: 1,
                }
                .to_bytes(),
                i64b(1),
            ),
            (
                "APPEND",
                Request::Append {
                    key: key("/w"),
                    value: key("1"),
                }
                .to_bytes(),
                vec![],
            ),
            (
                "MULTI_SET",
                Request::MultiSet {
                    pairs: vec![(key("/w"), key("1"))],
                }
                .to_bytes(),
                vec![],
            ),
            (
                "COMPARE_SET",
                Request::CompareSet {
                    key: key("/w"),
                    expected: vec![],
                    desired: key("1"),
                }
                .to_bytes(),
                s(b"1"),
            ),
            (
                "BARRIER",
                Request::Barrier {
                    key: key("/w"),
                    world_size: 1,
                }
                .to_bytes(),
                vec![0],
            ),
            (
                "QUEUE_PUSH",
                Request::QueuePush {
                    key: key("/w"),
                    value: key("1"),
                }
                .to_bytes(),
                vec![],
            ),
        ];
        for (name, bytes, reply) in ops {
            server.clear();
            let mut w1 = Raw::validated(port).await;
            let mut w2 = Raw::validated(port).await;
            // Register w1 before w2 (the PING reply proves the WAIT before it was processed), so
            // that "the oldest registration" of QUEUE_PUSH is w1 on every scheduling.
            w1.req(Request::Wait {
                keys: vec![key("/w")],
            })
            .await;
            w1.alive().await;
            w2.req(Request::Wait {
                keys: vec![key("/w")],
            })
            .await;
            w2.alive().await;
            let mut writer = Raw::validated(port).await;
            writer.send(&bytes).await;
            writer.expect(&reply).await;
            writer.alive().await;
            if name == "QUEUE_PUSH" {
                // Wakes exactly one: the oldest registration.
                w1.expect(&[0]).await;
                w2.expect_silent().await;
                w2.send(&[0x0c]).await;
                w2.expect(&[1]).await;
            } else {
                w1.expect(&[0]).await;
                w2.expect(&[0]).await;
            }
            eprintln!("ok: {name}");
        }
        // DELETE_KEY wakes nobody.
        server.clear();
        let mut w = Raw::validated(port).await;
        w.req(Request::Wait {
            keys: vec![key("/d")],
        })
        .await;
        let mut writer = Raw::validated(port).await;
        writer.req(Request::DeleteKey { key: key("/d") }).await;
        writer.expect(&i64b(0)).await;
        w.expect_silent().await;
        // A multi-key WAIT needs every key.
        w.send(&[0x0c]).await;
        w.expect(&[1]).await;
        w.req(Request::Wait {
            keys: vec![key("/a"), key("/b")],
        })
        .await;
        writer
            .req(Request::Set {
                key: key("/a"),
                value: vec![],
            })
            .await;
        writer.alive().await;
        w.expect_silent().await;
        writer
            .req(Request::Set {
                key: key("/b"),
                value: vec![],
            })
            .await;
        w.expect(&[0]).await;
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_over_sockets() {
    bounded(async {
        let server = start();
        let port = server.port();
        let mut a = Raw::validated(port).await;
        let mut b = Raw::validated(port).await;
        let mut c = Raw::validated(port).await;
        let bar = Request::Barrier {
            key: key("/bar"),
            world_size: 3,
        };
        a.req(bar.clone()).await;
        b.req(bar.clone()).await;
        a.alive().await;
        b.alive().await;
        a.expect_silent().await;
        c.req(bar.clone()).await;
        c.expect(&[0]).await;
        a.expect(&[0]).await;
        b.expect(&[0]).await;
        // CANCEL_WAIT clears a pending barrier registration.
        let mut d = Raw::validated(port).await;
        d.req(Request::Barrier {
            key: key("/bar2"),
            world_size: 2,
        })
        .await;
        d.expect_silent().await;
        d.send(&[0x0c]).await;
        d.expect(&[1]).await;
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_wait_races() {
    bounded(async {
        let server = start();
        let port = server.port();
        // Deterministic race: the wait finished before CANCEL_WAIT is read -> `00 01`.
        let mut w = Raw::validated(port).await;
        let mut writer = Raw::validated(port).await;
        w.req(Request::Wait {
            keys: vec![key("/r")],
        })
        .await;
        w.alive().await;
        writer
            .req(Request::Set {
                key: key("/r"),
                value: vec![],
            })
            .await;
        writer.alive().await;
        w.send(&[0x0c]).await;
        w.expect(&[0, 1]).await;
        // Many racing rounds: set and cancel at the same time; the reply is always `01` or
        // `00 01` and nothing is left registered.
        for i in 0..200 {
            let k = format!("/race{i}");
            w.req(Request::Wait {
                keys: vec![key(&k)],
            })
            .await;
            let set = Request::Set {
                key: key(&k),
                value: vec![],
            }
            .to_bytes();
            let (r1, _) = tokio::join!(w.send(&[0x0c]), writer.send(&set));
            let _: () = r1;
            let mut b = [0u8; 1];
            tokio::time::timeout(IO, w.s.read_exact(&mut b))
                .await
                .expect("in time")
                .expect("read");
            if b[0] == 0 {
                w.expect(&[1]).await;
            } else {
                assert_eq!(b[0], 1, "round {i}");
            }
            w.alive().await;
        }
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_wait_leaves_no_state() {
    bounded(async {
        let server = start();
        let port = server.port();
        for _ in 0..20 {
            let mut w = Raw::validated(port).await;
            w.req(Request::Wait {
                keys: vec![key("/never"), key("/never2")],
            })
            .await;
            w.req(Request::Barrier {
                key: key("/bb"),
                world_size: 1000,
            })
            .await;
            w.alive().await;
            assert_ne!(server.store().waiter_counts(), (0, 0));
            drop(w);
        }
        eventually_no_waiters(&server).await;
        // A later SET on those keys finds nobody to wake and the server is fine.
        let c = Client::connect("127.0.0.1", port, IO)
            .await
            .expect("connect");
        c.set("never", "x").await.expect("set");
        c.ping().await.expect("ping");
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_clients_add_wait_barrier() {
    bounded(async {
        let limit = raise_nofile_limit().expect("raise RLIMIT_NOFILE");
        assert!(
            limit >= 4200,
            "need 4,200 fds for 2,000 loopback pairs, have {limit}"
        );
        let server = start();
        let port = server.port();
        const N: i64 = 2000;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..N {
            tasks.spawn(async move {
                let c = Client::connect("127.0.0.1", port, Duration::from_secs(60))
                    .await
                    .expect("connect");
                let n = c.add("arrived", 1).await.expect("add");
                if n == N {
                    c.set("go", "1").await.expect("set");
                }
                c.wait(&["go"], Duration::from_secs(60))
                    .await
                    .expect("wait");
                c.add("left", 1).await.expect("add")
            });
        }
        let mut done = 0;
        while let Some(r) = tasks.join_next().await {
            r.expect("client task");
            done += 1;
        }
        assert_eq!(done, N);
        let c = Client::connect("127.0.0.1", port, IO)
            .await
            .expect("connect");
        assert_eq!(c.add("left", 0).await.expect("add"), N);
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    })
    .await;
}
