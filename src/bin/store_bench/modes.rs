//! The single-process patterns of `rdrun-store-bench`: serving rdrun's store alone, the
//! request/reply and pipelined load over raw connections, the herd, idle connections.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdrun::store::client::Client;
use rdrun::store::protocol::{Request, VALIDATION_MAGIC};
use rdrun::store::server::{ServerConfig, StoreServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{stdin_closed, Res};

pub(crate) async fn serve(host: &str, port: u16, config: ServerConfig) -> Res {
    let ip: std::net::IpAddr = host.parse()?;
    let server = StoreServer::bind((ip, port).into(), config)?;
    println!("port={}", server.port());
    let closed = server.closed();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        exit = closed => return Err(format!("server stopped: {exit:?}").into()),
    }
    server.shutdown().await;
    Ok(())
}

pub(crate) async fn load(
    host: &str,
    ports: Vec<u16>,
    phases: Vec<usize>,
    depths: Vec<usize>,
    secs: Duration,
    rounds: usize,
    tag: &str,
) -> Res {
    let max = phases.iter().copied().max().unwrap_or(0);
    // One pool per server, all opened before any phase so that every phase of every server runs
    // under the same machine conditions (phases are interleaved across servers).
    let mut pools = Vec::new();
    for &port in &ports {
        let t0 = Instant::now();
        let mut connecting = tokio::task::JoinSet::new();
        for _ in 0..max {
            let host = host.to_string();
            connecting
                .spawn(async move { raw_connect(&host, port, Duration::from_secs(300)).await });
        }
        let mut pool = Vec::with_capacity(max);
        while let Some(c) = connecting.join_next().await {
            pool.push(c??);
        }
        eprintln!(
            "load: port {port}: {max} connections open in {:.2}s",
            t0.elapsed().as_secs_f64()
        );
        pools.push((port, pool));
    }
    for &depth in &depths {
        for (phase, &conns) in phases.iter().enumerate() {
            for round in 0..rounds {
                for (port, pool) in pools.iter_mut() {
                    let name = format!("{tag}/{depth}/{phase}/{round}");
                    let rate = load_phase(pool, conns, depth, secs, &name).await?;
                    println!(
                        "port={port} conns={conns} depth={depth} round={round} req_per_s={rate:.0}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// A validated raw connection (VALIDATE, then a PING round trip as PyTorch's client does).
pub(crate) async fn raw_connect(
    host: &str,
    port: u16,
    limit: Duration,
) -> Result<tokio::net::TcpStream, Box<dyn std::error::Error + Send + Sync>> {
    let deadline = Instant::now() + limit;
    let mut s = loop {
        match tokio::net::TcpStream::connect((host, port)).await {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    s.set_nodelay(true)?;
    let mut buf = Vec::new();
    Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode(&mut buf);
    Request::Ping { nonce: 7 }.encode(&mut buf);
    s.write_all(&buf).await?;
    let mut pong = [0u8; 4];
    tokio::time::timeout(limit, s.read_exact(&mut pong)).await??;
    if u32::from_ne_bytes(pong) != 7 {
        return Err("PING answered with the wrong nonce".into());
    }
    Ok(s)
}

/// Bytes of the answers to one SET + GET (16-byte value) + ADD triple: SET has no answer, GET a
/// u64 length and the value, ADD the new i64 (tcpstore-protocol spec).
pub(crate) const TRIPLE_ANSWER: usize = 8 + 16 + 8;

/// `conns` connections each loop SET, GET, ADD on their own keys for `secs`. With `depth` > 1
/// a connection sends `depth` triples in one write before reading their answers (pipelining, as
/// `redis-benchmark -P`): the generator's own cost per request falls, so the servers' cost
/// shows. Answers are checked: the GET returns the value set, ADD counts up by one.
pub(crate) async fn load_phase(
    pool: &mut Vec<tokio::net::TcpStream>,
    conns: usize,
    depth: usize,
    secs: Duration,
    tag: &str,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(tokio::sync::Barrier::new(conns + 1));
    let mut tasks = tokio::task::JoinSet::new();
    let mut rest = pool.split_off(conns.min(pool.len()));
    for (i, mut s) in std::mem::take(pool).into_iter().enumerate() {
        let (count, stop, start) = (count.clone(), stop.clone(), start.clone());
        let key = format!("{tag}/k{i}").into_bytes();
        let ctr = format!("{tag}/c{i}").into_bytes();
        tasks.spawn(async move {
            let value = vec![b'v'; 16];
            let mut batch = Vec::new();
            for _ in 0..depth {
                Request::Set {
                    key: key.clone(),
                    value: value.clone(),
                }
                .encode(&mut batch);
                Request::Get { key: key.clone() }.encode(&mut batch);
                Request::Add {
                    key: ctr.clone(),
                    delta: 1,
                }
                .encode(&mut batch);
            }
            let mut answers = vec![0u8; TRIPLE_ANSWER * depth];
            let mut expect_ctr = 0i64;
            start.wait().await;
            let limit = Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) {
                s.write_all(&batch).await?;
                tokio::time::timeout(limit, s.read_exact(&mut answers)).await??;
                for a in answers.chunks_exact(TRIPLE_ANSWER) {
                    expect_ctr += 1;
                    let len = u64::from_ne_bytes(a[..8].try_into().expect("8 bytes"));
                    let got = i64::from_ne_bytes(a[24..].try_into().expect("8 bytes"));
                    if len != 16 || a[8..24] != value[..] || got != expect_ctr {
                        return Err::<
                            tokio::net::TcpStream,
                            Box<dyn std::error::Error + Send + Sync>,
                        >(
                            format!(
                                "wrong answer: GET length {len}, ADD {got} (want {expect_ctr})"
                            )
                            .into(),
                        );
                    }
                }
                count.fetch_add(3 * depth as u64, Ordering::Relaxed);
            }
            Ok(s)
        });
    }
    start.wait().await;
    let t0 = Instant::now();
    tokio::time::sleep(secs).await;
    let n = count.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut back = Vec::with_capacity(conns + rest.len());
    while let Some(r) = tasks.join_next().await {
        back.push(r??);
    }
    back.append(&mut rest);
    *pool = back;
    Ok(n as f64 / elapsed)
}

pub(crate) async fn herd(host: &str, port: u16, clients: usize, limit: Duration, tag: &str) -> Res {
    let t0 = Instant::now();
    let n = clients as i64;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let host = host.to_string();
        let cnt = format!("{tag}/cnt");
        let go = format!("{tag}/go");
        tasks.spawn(async move {
            let c = Client::connect(&host, port, limit).await?;
            c.set_timeout(limit);
            if c.add(&cnt, 1).await? == n {
                c.set(&go, "1").await?;
            }
            c.wait(&[go.as_str()], limit).await?;
            Ok::<Client, rdrun::store::StoreError>(c)
        });
    }
    let mut done = Vec::with_capacity(clients);
    let mut failed = 0usize;
    let all = tokio::time::timeout(limit, async {
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok(c)) => done.push(c),
                Ok(Err(e)) => {
                    failed += 1;
                    tracing::debug!(error = %e, "herd client failed");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    let wall = t0.elapsed().as_secs_f64();
    // Abandon stragglers: dropping their tasks closes their sockets.
    tasks.abort_all();
    match all {
        Ok(Ok(())) if failed == 0 => println!("clients={clients} wall_s={wall:.3}"),
        Ok(Err(e)) => return Err(e.into()),
        _ => println!(
            "clients={clients} wall_s=unfinished finished={} failed={failed} limit_s={:.0}",
            done.len(),
            limit.as_secs_f64()
        ),
    }
    Ok(())
}

pub(crate) async fn idle(
    host: &str,
    port: u16,
    conns: usize,
    hold: Duration,
    connect_limit: Duration,
) -> Res {
    let mut hello = Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .to_bytes();
    Request::Ping { nonce: 7 }.encode(&mut hello);
    let mut held = Vec::with_capacity(conns);
    let t0 = Instant::now();
    let deadline = tokio::time::Instant::now() + connect_limit;
    // Batches of 256 in flight: fast, without overflowing the listen backlog.
    'outer: for chunk_start in (0..conns).step_by(256) {
        let mut set = tokio::task::JoinSet::new();
        for _ in chunk_start..(chunk_start + 256).min(conns) {
            let host = host.to_string();
            let hello = hello.clone();
            set.spawn(async move {
                let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                s.write_all(&hello).await?;
                let mut echo = [0u8; 4];
                s.read_exact(&mut echo).await?;
                std::io::Result::Ok(s)
            });
        }
        loop {
            match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(Some(r)) => held.push(r??),
                Ok(None) => break,
                Err(_) => break 'outer,
            }
        }
    }
    println!(
        "ready={} of={conns} connect_s={:.2}",
        held.len(),
        t0.elapsed().as_secs_f64()
    );
    tokio::select! {
        _ = stdin_closed() => {}
        _ = tokio::time::sleep(hold) => {}
    }
    drop(held);
    Ok(())
}
