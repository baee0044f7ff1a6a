//! The store server and clients over real sockets on 127.0.0.1. Every test runs under a hard
//! wall-clock bound.
//!
//! This file: the shared helpers (a raw TCP conversation, servers on an ephemeral port, the
//! waiter-table check) and the wire protocol itself: raw-byte conversations for every opcode
//! (bytes observed with torch 2.15.0, see the TCPStore protocol spec), split and pipelined
//! requests, bad input closing only its connection, PyTorch's default key and value limits.
//! The children:
//! - `waits`: WAIT and BARRIER waiters woken by each op, CANCEL_WAIT races, disconnects
//!   mid-wait, 2,000 concurrent clients.
//! - `client`: the Rust clients (async and blocking): every operation, timeouts, connect retries.
//! - `server`: the server's life and limits: shutdown, dual-stack bind, start outside a runtime,
//!   and issue 10's defences (descriptor exhaustion, rate-limited warnings, unvalidated and slow
//!   connections, the global buffer cap, rdrun's open-file limit).

use std::future::Future;
use std::time::Duration;

use rdrun::store::protocol::{Limits, Request, VALIDATION_MAGIC};
use rdrun::store::server::{ServerConfig, StoreServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod client;
mod server;
mod waits;

const BOUND: Duration = Duration::from_secs(120);

const IO: Duration = Duration::from_secs(20);

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("test exceeded its wall-clock bound")
}

fn loopback0() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

fn start() -> StoreServer {
    StoreServer::start(loopback0(), ServerConfig::default()).expect("start server")
}

fn start_with(limits: Limits) -> StoreServer {
    StoreServer::start(
        loopback0(),
        ServerConfig {
            limits,
            ..ServerConfig::default()
        },
    )
    .expect("start server")
}

/// A raw TCP conversation.
struct Raw {
    s: TcpStream,
}

impl Raw {
    async fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Raw { s }
    }

    async fn validated(port: u16) -> Raw {
        let mut r = Raw::connect(port).await;
        r.send(&[0x00, 0xce, 0xf7, 0x85, 0x3c]).await;
        r
    }

    async fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).await.expect("write");
    }

    async fn req(&mut self, r: Request) {
        self.send(&r.to_bytes()).await;
    }

    async fn expect(&mut self, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(IO, self.s.read_exact(&mut got))
            .await
            .expect("reply in time")
            .expect("read reply");
        assert_eq!(got, want);
    }

    /// Nothing arrives for a little while (no reply expected).
    async fn expect_silent(&mut self) {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_millis(200), self.s.read(&mut b)).await;
        assert!(r.is_err(), "unexpected bytes or EOF: {r:?} {b:?}");
    }

    /// The server closes the connection (EOF or reset), possibly after some pending bytes.
    async fn expect_closed(&mut self) {
        let mut b = [0u8; 256];
        loop {
            match tokio::time::timeout(IO, self.s.read(&mut b))
                .await
                .expect("server closes in time")
            {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    }

    /// A round trip proving the connection is alive and the server answers.
    async fn alive(&mut self) {
        self.send(&[0x0d, 9, 8, 7, 6]).await;
        self.expect(&[9, 8, 7, 6]).await;
    }
}

fn s(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

fn i64b(v: i64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn key(k: &str) -> Vec<u8> {
    k.as_bytes().to_vec()
}

async fn eventually_no_waiters(server: &StoreServer) {
    for _ in 0..500 {
        if server.store().waiter_counts() == (0, 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "waiter state left behind: {:?}",
        server.store().waiter_counts()
    );
}

#[tokio::test]
async fn raw_every_opcode_current_thread() {
    bounded(async {
        let server = start();
        let mut c = Raw::connect(server.port()).await;
        // VALIDATE + PING coalesced, as the torch client sends them (observed bytes).
        c.send(&[0x00, 0xce, 0xf7, 0x85, 0x3c, 0x0d, 1, 2, 3, 4])
            .await;
        c.expect(&[1, 2, 3, 4]).await;
        // SET (observed) - no reply.
        c.send(&[
            0x01, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31, 2, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31,
        ])
        .await;
        c.expect_silent().await;
        // WAIT on a present key -> 00; GET -> value (observed).
        c.send(&[
            0x06, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31,
        ])
        .await;
        c.expect(&[0x00]).await;
        c.send(&[0x03, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b, 0x31])
            .await;
        c.expect(&[2, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31]).await;
        // GET of a missing key -> empty value (libuv).
        c.req(Request::Get { key: key("/none") }).await;
        c.expect(&s(b"")).await;
        // ADD (observed: /cnt += 5 -> 5), then -2 -> 3.
        c.send(&[
            0x04, 4, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x63, 0x6e, 0x74, 5, 0, 0, 0, 0, 0, 0, 0,
        ])
        .await;
        c.expect(&i64b(5)).await;
        c.req(Request::Add {
            key: key("/cnt"),
            delta: -2,
        })
        .await;
        c.expect(&i64b(3)).await;
        c.req(Request::Get { key: key("/cnt") }).await;
        c.expect(&s(b"3")).await;
        // COMPARE_SET missing-key rules.
        c.req(Request::CompareSet {
            key: key("/cs"),
            expected: key("x"),
            desired: key("d"),
        })
        .await;
        c.expect(&s(b"x")).await;
        c.req(Request::CompareSet {
            key: key("/cs"),
            expected: vec![],
            desired: key("d"),
        })
        .await;
        c.expect(&s(b"d")).await;
        c.req(Request::CompareSet {
            key: key("/cs"),
            expected: key("d"),
            desired: key("e"),
        })
        .await;
        c.expect(&s(b"e")).await;
        c.req(Request::CompareSet {
            key: key("/cs"),
            expected: key("zz"),
            desired: key("f"),
        })
        .await;
        c.expect(&s(b"e")).await;
        // CHECK: n=0 READY, present READY, missing NOT_READY.
        c.send(&[0x05, 0, 0, 0, 0, 0, 0, 0, 0]).await;
        c.expect(&[0]).await;
        c.req(Request::Check {
            keys: vec![key("/k1"), key("/cnt")],
        })
        .await;
        c.expect(&[0]).await;
        c.req(Request::Check {
            keys: vec![key("/k1"), key("/nope")],
        })
        .await;
        c.expect(&[1]).await;
        // GETNUMKEYS: /k1 /cnt /cs.
        c.send(&[0x07]).await;
        c.expect(&i64b(3)).await;
        // APPEND creates then extends.
        c.req(Request::Append {
            key: key("/ap"),
            value: key("ab"),
        })
        .await;
        c.req(Request::Append {
            key: key("/ap"),
            value: key("cd"),
        })
        .await;
        c.req(Request::Get { key: key("/ap") }).await;
        c.expect(&s(b"abcd")).await;
        // MULTI_SET (observed bytes), MULTI_GET with a missing key.
        c.send(&[
            0x0b, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6d, 0x31, 1, 0, 0, 0, 0,
            0, 0, 0, 0x78, 3, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6d, 0x32, 2, 0, 0, 0, 0, 0, 0, 0, 0x79,
            0x79,
        ])
        .await;
        c.req(Request::MultiGet {
            keys: vec![key("/m1"), key("/missing"), key("/m2")],
        })
        .await;
        let mut want = s(b"x");
        want.extend(s(b""));
        want.extend(s(b"yy"));
        c.expect(&want).await;
        // DELETE_KEY: 1 then 0.
        c.req(Request::DeleteKey { key: key("/ap") }).await;
        c.expect(&i64b(1)).await;
        c.req(Request::DeleteKey { key: key("/ap") }).await;
        c.expect(&i64b(0)).await;
        // CANCEL_WAIT with nothing pending -> 01.
        c.send(&[0x0c]).await;
        c.expect(&[0x01]).await;
        // Queues: empty pop -> 0 only; push, len, pop (observed reply bytes), CHECK sees queue.
        c.req(Request::QueuePop { key: key("/q") }).await;
        c.expect(&i64b(0)).await;
        c.req(Request::QueuePush {
            key: key("/q"),
            value: key("item1"),
        })
        .await;
        c.req(Request::QueuePush {
            key: key("/q"),
            value: key("item2"),
        })
        .await;
        c.req(Request::QueueLen { key: key("/q") }).await;
        c.expect(&i64b(2)).await;
        c.req(Request::Check {
            keys: vec![key("/q")],
        })
        .await;
        c.expect(&[0]).await;
        c.req(Request::QueuePop { key: key("/q") }).await;
        c.expect(&[
            2, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0x69, 0x74, 0x65, 0x6d, 0x31,
        ])
        .await;
        c.req(Request::QueueLen { key: key("/none") }).await;
        c.expect(&i64b(0)).await;
        // LIST_KEYS: count + keys (order arbitrary); queues not listed.
        c.send(&[0x11]).await;
        let mut n = [0u8; 8];
        c.s.read_exact(&mut n).await.expect("count");
        let n = i64::from_le_bytes(n);
        let mut keys = Vec::new();
        for _ in 0..n {
            let mut l = [0u8; 8];
            c.s.read_exact(&mut l).await.expect("len");
            let mut k = vec![0u8; u64::from_le_bytes(l) as usize];
            c.s.read_exact(&mut k).await.expect("key");
            keys.push(String::from_utf8(k).expect("utf8"));
        }
        keys.sort();
        assert_eq!(keys, ["/cnt", "/cs", "/k1", "/m1", "/m2"]);
        // BARRIER world 1 (observed) -> 00; the counter reads "1".
        c.send(&[
            0x12, 4, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x62, 0x61, 0x72, 1, 0, 0, 0, 0, 0, 0, 0,
        ])
        .await;
        c.expect(&[0x00]).await;
        c.req(Request::Get { key: key("/bar") }).await;
        c.expect(&s(b"1")).await;
        // WAIT on a missing key: deferred; CANCEL_WAIT -> 01 (observed `0c` -> `01`).
        c.send(&[
            0x06, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6e, 0x6f, 0x70, 0x65,
        ])
        .await;
        c.expect_silent().await;
        // Another request is answered while the WAIT is pending (observed with GETNUMKEYS).
        c.send(&[0x07]).await;
        c.expect(&i64b(6)).await;
        c.send(&[0x0c]).await;
        c.expect(&[0x01]).await;
        eventually_no_waiters(&server).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_and_pipelined_requests() {
    bounded(async {
        let server = start();
        let mut stream = Vec::new();
        Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .encode(&mut stream);
        let reqs = [
            Request::Set {
                key: key("/a"),
                value: vec![7u8; 5000],
            },
            Request::Add {
                key: key("/n"),
                delta: 41,
            },
            Request::Add {
                key: key("/n"),
                delta: 1,
            },
            Request::Get { key: key("/a") },
            Request::Ping { nonce: 77 },
            Request::GetNumKeys,
        ];
        for r in &reqs {
            r.encode(&mut stream);
        }
        let mut want = i64b(41);
        want.extend(i64b(42));
        want.extend(s(&[7u8; 5000]));
        want.extend(77u32.to_le_bytes());
        want.extend(i64b(2));
        // All in one write.
        let mut c = Raw::connect(server.port()).await;
        c.send(&stream).await;
        c.expect(&want).await;
        // One byte per write (TCP_NODELAY: many tiny segments).
        server.clear();
        let mut c = Raw::connect(server.port()).await;
        for b in &stream {
            c.send(&[*b]).await;
        }
        c.expect(&want).await;
        server.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_that_connection() {
    bounded(async {
        let limits = Limits {
            max_key_len: 16,
            max_value_len: 64,
            max_keys_per_request: 4,
            max_request_len: 4096,
        };
        let server = start_with(limits);
        let port = server.port();
        let mut good = Raw::validated(port).await;
        good.req(Request::Set {
            key: key("/x"),
            value: key("abc"),
        })
        .await;
        let cases: Vec<(&str, Vec<u8>, bool)> = vec![
            ("unknown opcode", vec![0x13], true),
            (
                "missing VALIDATE",
                Request::Ping { nonce: 1 }.to_bytes(),
                false,
            ),
            ("HTTP probe", b"GET / HTTP/1.1\r\n\r\n".to_vec(), false),
            (
                "wrong magic",
                Request::Validate { magic: 0xdeadbeef }.to_bytes(),
                false,
            ),
            (
                "second VALIDATE",
                Request::Validate {
                    magic: VALIDATION_MAGIC,
                }
                .to_bytes(),
                true,
            ),
            (
                "non-numeric ADD",
                Request::Add {
                    key: key("/x"),
                    delta: 1,
                }
                .to_bytes(),
                true,
            ),
            (
                "key too long",
                Request::Get {
                    key: vec![b'k'; 17],
                }
                .to_bytes(),
                true,
            ),
            (
                "value too long (header only)",
                {
                    let mut b = vec![0x01];
                    b.extend(s(b"/k"));
                    b.extend(65u64.to_le_bytes());
                    b
                },
                true,
            ),
            (
                "too many keys",
                Request::Wait {
                    keys: vec![key("/a"); 5],
                }
                .to_bytes(),
                true,
            ),
            (
                "huge key count",
                {
                    let mut b = vec![0x0a];
                    b.extend(u64::MAX.to_le_bytes());
                    b
                },
                true,
            ),
        ];
        for (name, bytes, validate_first) in cases {
            let mut bad = if validate_first {
                Raw::validated(port).await
            } else {
                Raw::connect(port).await
            };
            bad.send(&bytes).await;
            bad.expect_closed().await;
            // The other client still works and its data is intact.
            good.req(Request::Get { key: key("/x") }).await;
            good.expect(&s(b"abc")).await;
            good.alive().await;
            eprintln!("ok: {name}");
        }
        // Pipelined WAITs beyond the per-connection cap close the connection.
        let mut waits = Raw::validated(port).await;
        let mut many = Vec::new();
        for _ in 0..ServerConfig::default().max_pending_waits + 1 {
            Request::Wait {
                keys: vec![key("/never")],
            }
            .encode(&mut many);
        }
        waits.send(&many).await;
        waits.expect_closed().await;
        good.alive().await;
        // At the limits exactly: accepted.
        let mut c = Raw::validated(port).await;
        c.req(Request::Set {
            key: vec![b'k'; 16],
            value: vec![1; 64],
        })
        .await;
        c.req(Request::Get {
            key: vec![b'k'; 16],
        })
        .await;
        c.expect(&s(&[1; 64])).await;
        server.shutdown().await;
    })
    .await;
}

/// Default limits are PyTorch's: a key of 8192 bytes and a value of 8 MiB pass, one more closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_limits_match_pytorch() {
    bounded(async {
        let server = start();
        let port = server.port();
        let mut c = Raw::validated(port).await;
        c.req(Request::Set {
            key: vec![b'k'; 8192],
            value: vec![3; 8 << 20],
        })
        .await;
        c.req(Request::Get {
            key: vec![b'k'; 8192],
        })
        .await;
        let mut want = s(&[]);
        want[..8].copy_from_slice(&(8u64 << 20).to_le_bytes());
        c.expect(&want[..8]).await;
        let mut v = vec![0u8; 8 << 20];
        c.s.read_exact(&mut v).await.expect("value");
        assert!(v.iter().all(|b| *b == 3));
        let mut bad = Raw::validated(port).await;
        bad.req(Request::Get {
            key: vec![b'k'; 8193],
        })
        .await;
        bad.expect_closed().await;
        let mut bad = Raw::validated(port).await;
        let mut b = vec![0x01];
        b.extend(s(b"/k"));
        b.extend(((8u64 << 20) + 1).to_le_bytes());
        bad.send(&b).await;
        bad.expect_closed().await;
        c.alive().await;
        server.shutdown().await;
    })
    .await;
}
