//! The store server's tests: the listener, the fresh stage and the connection task, through
//! real sockets.

use super::accept::{accept_error_is_fatal, FIRST_BYTES_HOLD};
use super::conn::Held;
use super::*;
use crate::store::protocol::{Request, STOP_WAITING, VALIDATION_MAGIC};

/// A flood of bad connections: the first is printed, then at most one summary line per
/// interval, and the counts add up to every event.
#[test]
fn log_limiter_prints_at_most_one_line_per_interval() {
    let t0 = Instant::now();
    let interval = Duration::from_secs(10);
    let mut l = LogLimiter::new(interval, "bad store connections closed");
    let mut lines = Vec::new();
    // 60 s of events every 10 ms, flushed every second as the accept loop does.
    for ms in (0..60_000u64).step_by(10) {
        let now = t0 + Duration::from_millis(ms);
        lines.extend(l.event(now, format!("event at {ms} ms")));
        if ms % 1000 == 0 {
            lines.extend(l.flush(now));
        }
    }
    lines.extend(l.flush(t0 + Duration::from_secs(75)));
    assert_eq!(lines[0], "event at 0 ms");
    assert!(lines.len() <= 60 / 10 + 2, "{lines:#?}");
    let counted: u64 = lines[1..]
        .iter()
        .map(|l| {
            l.split(' ')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("summary line {l:?}"))
        })
        .sum();
    assert_eq!(counted + 1, 6000);
    assert!(lines[1].contains("more bad store connections closed in the last 10s"));
    assert!(lines
        .last()
        .is_some_and(|l| l.contains("latest: event at 59990 ms")));
    // At shutdown everything held back is printed at once.
    assert_eq!(
        l.event(t0 + Duration::from_secs(90), "a".into()),
        Some("a".into())
    );
    assert_eq!(l.event(t0 + Duration::from_secs(91), "b".into()), None);
    assert_eq!(l.flush(t0 + Duration::from_secs(92)), None);
    assert_eq!(
        l.flush_all(),
        Some("1 more bad store connections closed in the last 10s (latest: b)".into())
    );
    // Nothing held back: nothing to flush; a quiet period prints the next event at once.
    assert_eq!(l.flush(t0 + Duration::from_secs(110)), None);
    assert_eq!(
        l.event(t0 + Duration::from_secs(110), "again".into()),
        Some("again".into())
    );
}

#[test]
fn held_bytes_are_capped_globally_and_given_back() {
    let total = AtomicU64::new(0);
    let mut a = Held {
        total: &total,
        mine: 0,
    };
    let mut b = Held {
        total: &total,
        mine: 0,
    };
    assert!(a.set(600, 1000).is_ok());
    assert!(b.set(400, 1000).is_ok());
    assert!(b.set(401, 1000).is_err());
    drop(b);
    assert_eq!(total.load(Ordering::Relaxed), 600);
    assert!(a.set(100, 1000).is_ok());
    assert_eq!(total.load(Ordering::Relaxed), 100);
    drop(a);
    assert_eq!(total.load(Ordering::Relaxed), 0);
}

/// Connecting to `addr` is refused within 10 s (the listener was closed).
fn refused_soon(addr: SocketAddr) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if std::net::TcpStream::connect(addr).is_err() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The accept thread ends (and closes the listener) on shutdown, and also when the runtime
/// the server lives on goes away without a shutdown (its wake-up socket reads EOF).
#[test]
fn accept_thread_ends_on_shutdown_and_with_the_runtime() {
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let addr = rt.block_on(async {
        let s = StoreServer::bind(loopback, ServerConfig::default()).expect("bind");
        let addr = s.local_addr();
        let c = std::net::TcpStream::connect(addr).expect("served while running");
        drop(c);
        s.shutdown().await;
        addr
    });
    assert!(refused_soon(addr), "listener still open after shutdown");
    let addr = rt.block_on(async {
        let s = StoreServer::bind(loopback, ServerConfig::default()).expect("bind");
        let addr = s.local_addr();
        // No shutdown and no drop: only the runtime's end can stop it.
        std::mem::forget(s);
        addr
    });
    drop(rt);
    assert!(
        refused_soon(addr),
        "listener still open after the runtime ended"
    );
}

/// The accept thread's first-bytes stage hands every connection over: one that speaks at
/// once (served from the bytes the accept thread read), one that stays silent past
/// `FIRST_BYTES_HOLD` (handed over without bytes, then read by its task), while one that
/// hung up before speaking is in the same stage.
#[test]
fn first_bytes_stage_hands_over_prompt_silent_and_closed_clients() {
    use std::io::{Read, Write};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = rt.block_on(async { StoreServer::bind(loopback, ServerConfig::default()) });
    let server = server.expect("bind");
    let addr = server.local_addr();
    let hello = {
        let mut b = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .to_bytes();
        Request::Ping { nonce: 42 }.encode(&mut b);
        b
    };
    let client = std::thread::spawn(move || {
        let pong = |s: &mut std::net::TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            let mut b = [0u8; 4];
            s.read_exact(&mut b).expect("pong");
            u32::from_ne_bytes(b)
        };
        let closed = std::net::TcpStream::connect(addr).expect("connect");
        drop(closed);
        let mut silent = std::net::TcpStream::connect(addr).expect("connect");
        let mut prompt = std::net::TcpStream::connect(addr).expect("connect");
        prompt.write_all(&hello).expect("write");
        let prompt_pong = pong(&mut prompt);
        std::thread::sleep(FIRST_BYTES_HOLD + Duration::from_millis(300));
        silent.write_all(&hello).expect("write");
        (prompt_pong, pong(&mut silent))
    });
    let (prompt, silent) = rt.block_on(async {
        let r = tokio::task::spawn_blocking(move || client.join()).await;
        r.expect("join").expect("client thread")
    });
    assert_eq!((prompt, silent), (42, 42));
    rt.block_on(server.shutdown());
}

/// The fresh stage serves a client's first round trips itself and hands connections over in
/// mid-conversation without losing or reordering anything: a WAIT on a present key
/// (answered in the stage), a WAIT that must wait with a PING pipelined behind it (the PING
/// answered first; the WAIT once another fresh client SETs the key), and a value bigger
/// than one read sent right after VALIDATE (handed over with the decoder's partial state).
#[test]
fn fresh_stage_hands_over_waits_and_big_values_intact() {
    use std::io::{Read, Write};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = rt.block_on(async { StoreServer::bind(loopback, ServerConfig::default()) });
    let server = server.expect("bind");
    let addr = server.local_addr();
    let client = std::thread::spawn(move || {
        let open = || {
            let s = std::net::TcpStream::connect(addr).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(30)))
                .expect("timeout");
            s
        };
        let validate = || {
            Request::Validate {
                magic: VALIDATION_MAGIC,
            }
            .to_bytes()
        };
        let read_n = |s: &mut std::net::TcpStream, n: usize| {
            let mut b = vec![0u8; n];
            s.read_exact(&mut b).expect("reply");
            b
        };
        let get = |s: &mut std::net::TcpStream, key: &[u8]| {
            s.write_all(&Request::Get { key: key.to_vec() }.to_bytes())
                .expect("write");
            let len = u64::from_ne_bytes(read_n(s, 8).try_into().expect("8 bytes"));
            read_n(s, len as usize)
        };
        let mut a = open();
        let mut hello = validate();
        Request::Ping { nonce: 1 }.encode(&mut hello);
        a.write_all(&hello).expect("write");
        assert_eq!(read_n(&mut a, 4), 1u32.to_ne_bytes());
        let mut b = Request::Set {
            key: b"k1".to_vec(),
            value: b"v1".to_vec(),
        }
        .to_bytes();
        Request::Wait {
            keys: vec![b"k1".to_vec()],
        }
        .encode(&mut b);
        a.write_all(&b).expect("write");
        assert_eq!(read_n(&mut a, 1), [STOP_WAITING]);
        let mut b = Request::Wait {
            keys: vec![b"k2".to_vec()],
        }
        .to_bytes();
        Request::Ping { nonce: 2 }.encode(&mut b);
        a.write_all(&b).expect("write");
        assert_eq!(read_n(&mut a, 4), 2u32.to_ne_bytes());
        let mut setter = open();
        let mut b = validate();
        Request::Set {
            key: b"k2".to_vec(),
            value: b"v2".to_vec(),
        }
        .encode(&mut b);
        setter.write_all(&b).expect("write");
        assert_eq!(read_n(&mut a, 1), [STOP_WAITING]);
        assert_eq!(get(&mut a, b"k2"), b"v2");
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut c = open();
        let mut b = validate();
        Request::Set {
            key: b"big".to_vec(),
            value: big.clone(),
        }
        .encode(&mut b);
        c.write_all(&b).expect("write");
        assert_eq!(get(&mut c, b"big"), big);
        assert_eq!(get(&mut setter, b"k1"), b"v1");
    });
    rt.block_on(async {
        let r = tokio::task::spawn_blocking(move || client.join()).await;
        r.expect("join").expect("client thread");
    });
    rt.block_on(server.shutdown());
}

#[test]
fn only_a_broken_listener_is_fatal() {
    for errno in [
        libc::EMFILE,
        libc::ENFILE,
        libc::ENOBUFS,
        libc::ENOMEM,
        libc::ECONNABORTED,
    ] {
        assert!(!accept_error_is_fatal(&io::Error::from_raw_os_error(errno)));
    }
    assert!(accept_error_is_fatal(&io::Error::from_raw_os_error(
        libc::EBADF
    )));
}
