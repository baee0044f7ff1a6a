//! `rdrun-store-bench`: load generator for TCPStore-compatible servers (rdrun's or PyTorch's), and a
//! way to run rdrun's store server on its own. Used by `scripts/bench-store.sh`; every mode is
//! bounded in time and prints one `key=value` result line per measurement on stdout.
//!
//! Modes:
//! - `serve`: run rdrun's store server on `--host`/`--port` (0 = any), print `port=N`, serve until
//!   killed (SIGINT shuts down cleanly, exit 0; a server that stopped by itself exits 1). The store
//!   tests run it under a lowered descriptor limit and read its warnings.
//! - `load`: for each pipeline depth in `--depth` and count in `--conns` (e.g. `1,64,1024`), that
//!   many raw connections of one pool per server in `--ports` each loop SET, GET, ADD (depth
//!   triples per write, answers checked) for `--secs`, servers interleaved, `--rounds` times;
//!   prints `req_per_s` per phase, round and server.
//! - `herd`: `--clients` clients each connect (VALIDATE + PING), ADD a counter and WAIT on a key
//!   the last arrival sets; prints `wall_s`.
//! - `startup`: PyTorch's start-up pattern for `--clients` ranks (connect + VALIDATE, the `init/`
//!   ADD, each rank's own SET, rank 0's shared SET that everyone GETs, an ADD + WAIT barrier),
//!   spread over `--procs` generator processes (children of this binary, `startup-part`, each on
//!   its own loopback source address: one process may hold only so many descriptors); prints
//!   when the last rank finished each phase, the slowest client per phase, connection retries,
//!   the worst latency of a fresh client probing every `--probe-ms`, and with `--server-pid`
//!   the server's CPU time and RSS (issue 16).
//! - `idle`: open `--conns` validated connections, print `ready=N`, hold them until stdin closes or
//!   `--hold-secs` passed.
//!
//! Length: one benchmark binary with one mode per measured pattern (request/reply, pipelined, herd,
//! the start-up storm over several processes and source addresses, serving a store alone). The
//! modes share the raw-request encoder and the result format, so they stay in one file.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use rdrun::store::client::Client;
use rdrun::store::protocol::{Request, VALIDATION_MAGIC};
use rdrun::store::server::{raise_nofile_limit, ServerConfig, StoreServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Parser)]
#[command(
    name = "rdrun-store-bench",
    about = "TCPStore load generator and standalone server"
)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Run rdrun's store server.
    Serve {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Tokio worker threads; 0 = a current-thread runtime (as the launcher may use).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Scheduler ticks between looks at the runtime's global queue, where the accept
        /// thread puts new connections (tokio's default is 31; the launcher uses
        /// `STORE_GLOBAL_QUEUE_INTERVAL`, new connections first).
        #[arg(long, default_value_t = rdrun::store::server::STORE_GLOBAL_QUEUE_INTERVAL)]
        global_queue_interval: u32,
        /// Close connections that have not sent VALIDATE this long after connecting.
        #[arg(long)]
        validate_timeout_secs: Option<f64>,
        /// At most one warning line per kind per this many seconds.
        #[arg(long)]
        log_interval_secs: Option<f64>,
    },
    /// SET/GET/ADD mix over N connections.
    Load {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Comma-separated server ports; phases alternate between them.
        #[arg(long, value_delimiter = ',')]
        ports: Vec<u16>,
        /// Comma-separated connection counts; one phase each, on one pool of connections.
        #[arg(long, default_value = "1", value_delimiter = ',')]
        conns: Vec<usize>,
        /// Seconds per phase.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Comma-separated pipeline depths (SET+GET+ADD triples per write); 1 = one request
        /// waits for its answer, as PyTorch's client does.
        #[arg(long, default_value = "1", value_delimiter = ',')]
        depth: Vec<usize>,
        /// Rounds per phase and server (report the best).
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        /// Key namespace, so that runs against one server do not collide.
        #[arg(long, default_value = "load")]
        tag: String,
    },
    /// Connect storm + ADD + WAIT barrier.
    Herd {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 4096)]
        clients: usize,
        #[arg(long, default_value_t = 120.0)]
        timeout_secs: f64,
        #[arg(long, default_value = "herd")]
        tag: String,
    },
    /// PyTorch's start-up pattern for N ranks.
    Startup {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 4096)]
        clients: usize,
        /// Generator processes (0 = one per 8,000 clients).
        #[arg(long, default_value_t = 0)]
        procs: usize,
        #[arg(long, default_value_t = 120.0)]
        timeout_secs: f64,
        #[arg(long, default_value = "startup")]
        tag: String,
        /// The server's pid: report its CPU time and RSS.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Fresh-client probe period.
        #[arg(long, default_value_t = 10)]
        probe_ms: u64,
        /// Run every generator share in a child process at this nice value (1-19), this
        /// process only coordinating and probing at normal priority: on one machine, the
        /// clients' CPU then yields to the server's, as if they ran on other hosts.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
        gen_nice: i32,
    },
    /// One generator process of `startup` (started by it).
    #[command(hide = true)]
    StartupPart {
        #[arg(long)]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long)]
        source: Option<std::net::IpAddr>,
        #[arg(long)]
        first: usize,
        #[arg(long)]
        count: usize,
        #[arg(long)]
        world: usize,
        #[arg(long)]
        tag: String,
        #[arg(long)]
        timeout_secs: f64,
    },
    /// Hold N idle validated connections.
    Idle {
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        #[arg(long, default_value_t = 10_000)]
        conns: usize,
        #[arg(long, default_value_t = 120.0)]
        hold_secs: f64,
        /// Stop opening connections after this long (report how many are open).
        #[arg(long, default_value_t = 60.0)]
        connect_secs: f64,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RDRUN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = raise_nofile_limit() {
        eprintln!("rdrun-store-bench: warning: could not raise the open-file limit: {e}");
    }
    let rt = match &args.mode {
        Mode::Serve {
            threads: 0,
            global_queue_interval,
            ..
        } => tokio::runtime::Builder::new_current_thread()
            .global_queue_interval((*global_queue_interval).max(1))
            .enable_all()
            .build(),
        Mode::Serve {
            threads,
            global_queue_interval,
            ..
        } => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(*threads)
            .global_queue_interval((*global_queue_interval).max(1))
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdrun-store-bench: error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args.mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdrun-store-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn run(mode: Mode) -> Res {
    match mode {
        Mode::Serve {
            host,
            port,
            validate_timeout_secs,
            log_interval_secs,
            ..
        } => {
            let mut config = ServerConfig::default();
            if let Some(s) = validate_timeout_secs {
                config.validate_timeout = Duration::try_from_secs_f64(s)?;
            }
            if let Some(s) = log_interval_secs {
                config.log_interval = Duration::try_from_secs_f64(s)?;
            }
            serve(&host, port, config).await
        }
        Mode::Load {
            host,
            ports,
            conns,
            depth,
            secs,
            rounds,
            tag,
        } => {
            load(
                &host,
                ports,
                conns,
                depth,
                Duration::from_secs_f64(secs),
                rounds,
                &tag,
            )
            .await
        }
        Mode::Herd {
            host,
            port,
            clients,
            timeout_secs,
            tag,
        } => {
            herd(
                &host,
                port,
                clients,
                Duration::from_secs_f64(timeout_secs),
                &tag,
            )
            .await
        }
        Mode::Startup {
            host,
            port,
            clients,
            procs,
            timeout_secs,
            tag,
            server_pid,
            probe_ms,
            gen_nice,
        } => {
            let procs = if procs == 0 {
                clients.div_ceil(8000)
            } else {
                procs
            };
            startup(
                &host,
                port,
                clients,
                procs,
                Duration::try_from_secs_f64(timeout_secs)?,
                &tag,
                server_pid,
                Duration::from_millis(probe_ms),
                gen_nice,
            )
            .await
        }
        Mode::StartupPart {
            host,
            port,
            source,
            first,
            count,
            world,
            tag,
            timeout_secs,
        } => {
            startup_child(
                &host,
                port,
                source,
                first,
                count,
                world,
                &tag,
                Duration::try_from_secs_f64(timeout_secs)?,
            )
            .await
        }
        Mode::Idle {
            host,
            port,
            conns,
            hold_secs,
            connect_secs,
        } => {
            idle(
                &host,
                port,
                conns,
                Duration::from_secs_f64(hold_secs),
                Duration::from_secs_f64(connect_secs),
            )
            .await
        }
    }
}

/// Resolves when stdin reaches EOF (the parent closed it or exited).
async fn stdin_closed() {
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

async fn serve(host: &str, port: u16, config: ServerConfig) -> Res {
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

async fn load(
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
async fn raw_connect(
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
const TRIPLE_ANSWER: usize = 8 + 16 + 8;

/// `conns` connections each loop SET, GET, ADD on their own keys for `secs`. With `depth` > 1
/// a connection sends `depth` triples in one write before reading their answers (pipelining, as
/// `redis-benchmark -P`): the generator's own cost per request falls, so the servers' cost
/// shows. Answers are checked: the GET returns the value set, ADD counts up by one.
async fn load_phase(
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

async fn herd(host: &str, port: u16, clients: usize, limit: Duration, tag: &str) -> Res {
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

async fn idle(host: &str, port: u16, conns: usize, hold: Duration, connect_limit: Duration) -> Res {
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

// ---------------------------------------------------------------------------------------------
// `startup`: PyTorch's start-up pattern (issue 16).

/// The phases of one rank's start-up, in order (see [`startup_rank`]).
const PHASES: [&str; 5] = ["connect", "init", "own_set", "shared_get", "barrier"];

/// One raw, validated connection speaking just what the start-up pattern needs (pre-encoded
/// requests, no client library: on 2 cores the generator's own CPU must stay small).
struct Raw {
    s: tokio::net::TcpStream,
}

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

impl Raw {
    /// Connects from `source` (port chosen at connect time, so thousands of sockets per source
    /// address do not exhaust ports at bind time), VALIDATE + PING answered.
    async fn connect(
        source: Option<std::net::IpAddr>,
        dest: std::net::SocketAddr,
        limit: Duration,
    ) -> Result<Raw, BoxErr> {
        let deadline = Instant::now() + limit;
        let s = loop {
            let sock = match dest {
                std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            if let Some(src) = source {
                use std::os::fd::AsRawFd;
                let one: libc::c_int = 1;
                // SAFETY: a valid socket and a c_int option value of the right size.
                unsafe {
                    libc::setsockopt(
                        sock.as_raw_fd(),
                        libc::IPPROTO_IP,
                        libc::IP_BIND_ADDRESS_NO_PORT,
                        (&one as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    );
                }
                sock.bind((src, 0).into())?;
            }
            match sock.connect(dest).await {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e.into()),
                Err(e) => {
                    // Counted: the goal is no refused or reset connection at all.
                    CONNECT_RETRIES.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "connect failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        s.set_nodelay(true)?;
        let mut raw = Raw { s };
        let mut buf = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .to_bytes();
        Request::Ping { nonce: 7 }.encode(&mut buf);
        raw.s.write_all(&buf).await?;
        let mut pong = [0u8; 4];
        tokio::time::timeout(limit, raw.s.read_exact(&mut pong)).await??;
        if u32::from_ne_bytes(pong) != 7 {
            return Err("PING answered with the wrong nonce".into());
        }
        Ok(raw)
    }

    async fn send(&mut self, req: Request) -> Result<(), BoxErr> {
        self.s.write_all(&req.to_bytes()).await?;
        Ok(())
    }

    async fn read_i64(&mut self) -> Result<i64, BoxErr> {
        let mut b = [0u8; 8];
        self.s.read_exact(&mut b).await?;
        Ok(i64::from_ne_bytes(b))
    }

    async fn add(&mut self, key: &str, delta: i64) -> Result<i64, BoxErr> {
        self.send(Request::Add {
            key: key.into(),
            delta,
        })
        .await?;
        self.read_i64().await
    }

    async fn set(&mut self, key: &str, value: &[u8]) -> Result<(), BoxErr> {
        self.send(Request::Set {
            key: key.into(),
            value: value.to_vec(),
        })
        .await
    }

    /// PyTorch's `get`: WAIT for the key, then GET it.
    async fn get(&mut self, key: &str) -> Result<Vec<u8>, BoxErr> {
        self.wait(key).await?;
        self.send(Request::Get { key: key.into() }).await?;
        let len = self.read_i64().await? as usize;
        let mut v = vec![0u8; len];
        self.s.read_exact(&mut v).await?;
        Ok(v)
    }

    async fn wait(&mut self, key: &str) -> Result<(), BoxErr> {
        self.send(Request::Wait {
            keys: vec![key.into()],
        })
        .await?;
        let mut b = [0u8; 1];
        self.s.read_exact(&mut b).await?;
        if b[0] != rdrun::store::protocol::STOP_WAITING {
            return Err(format!("WAIT answered {}", b[0]).into());
        }
        Ok(())
    }
}

/// Connection attempts that failed (refused, reset, timed out) and were retried.
static CONNECT_RETRIES: AtomicU64 = AtomicU64::new(0);

fn epoch_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What PyTorch's rank `rank` of `world` does at start-up against one TCPStore, as
/// `TCPStore(..., world_size=world)` + `init_process_group` + a store-based barrier do it:
/// 1. connect: connect, VALIDATE, PING;
/// 2. init: ADD `init/` 1 (every client of a store with a world size); rank 0 then GETs it
///    every 10 ms until it reaches the world size (`TCPStore::waitForWorkers`);
/// 3. own_set: SET its own key (its address, as rendezvous handlers publish);
/// 4. shared_get: rank 0 SETs the shared key (the NCCL unique id); everyone GETs it (WAIT, GET);
/// 5. barrier: ADD a counter; the last arrival SETs the release key; everyone WAITs on it.
///
/// Returns the end of each phase (epoch µs).
async fn startup_rank(
    source: Option<std::net::IpAddr>,
    dest: std::net::SocketAddr,
    rank: usize,
    world: usize,
    tag: Arc<str>,
    limit: Duration,
) -> Result<(Raw, [u64; 5]), BoxErr> {
    let mut ends = [0u64; 5];
    let mut c = Raw::connect(source, dest, limit).await?;
    ends[0] = epoch_us();
    let n = world as i64;
    let init = format!("{tag}/init/");
    c.add(&init, 1).await?;
    if rank == 0 {
        loop {
            let v = c.get(&init).await?;
            if rdrun::store::protocol::parse_stoll(&v).is_some_and(|v| v >= n) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    ends[1] = epoch_us();
    c.set(
        &format!("{tag}/rank/{rank}"),
        format!("127.0.0.1:{}", 40000 + rank).as_bytes(),
    )
    .await?;
    ends[2] = epoch_us();
    let shared = format!("{tag}/nccl_unique_id");
    let id = [0x5au8; 128];
    if rank == 0 {
        c.set(&shared, &id).await?;
    }
    if c.get(&shared).await? != id {
        return Err("shared key read back wrong".into());
    }
    ends[3] = epoch_us();
    let cnt = format!("{tag}/barrier/count");
    let last = format!("{tag}/barrier/last");
    if c.add(&cnt, 1).await? == n {
        c.set(&last, b"1").await?;
    }
    c.wait(&last).await?;
    ends[4] = epoch_us();
    Ok((c, ends))
}

/// One generator process's share: ranks `first..first + count`, started at `go` (epoch µs).
/// Prints per-phase `done_us` (last end) and `max_us` (slowest single client's phase duration)
/// relative to `go`, then holds the connections until stdin closes (so that the server's RSS
/// can be read with every connection open).
#[allow(clippy::too_many_arguments)]
async fn startup_part(
    source: Option<std::net::IpAddr>,
    dest: std::net::SocketAddr,
    first: usize,
    count: usize,
    world: usize,
    tag: &str,
    limit: Duration,
    go: u64,
) -> Result<(Vec<Raw>, PartResult), BoxErr> {
    let now = epoch_us();
    if go > now {
        tokio::time::sleep(Duration::from_micros(go - now)).await;
    }
    let tag: Arc<str> = tag.into();
    let mut tasks = tokio::task::JoinSet::new();
    for rank in first..first + count {
        let tag = tag.clone();
        tasks.spawn(async move {
            let start = epoch_us();
            startup_rank(source, dest, rank, world, tag, limit)
                .await
                .map(|(c, ends)| (c, start, ends))
        });
    }
    let mut conns = Vec::with_capacity(count);
    let mut res = PartResult::default();
    let all = tokio::time::timeout(limit, async {
        while let Some(r) = tasks.join_next().await {
            match r {
                Ok(Ok((c, start, ends))) => {
                    conns.push(c);
                    let mut prev = start;
                    for (i, &e) in ends.iter().enumerate() {
                        res.done_us[i] = res.done_us[i].max(e.saturating_sub(go));
                        res.max_us[i] = res.max_us[i].max(e.saturating_sub(prev));
                        prev = e;
                    }
                    res.ok += 1;
                }
                Ok(Err(e)) => {
                    res.failed += 1;
                    tracing::debug!(error = %e, "start-up client failed");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await;
    tasks.abort_all();
    all.ok().transpose()?;
    res.retries = CONNECT_RETRIES.load(Ordering::Relaxed);
    Ok((conns, res))
}

#[derive(Debug, Default, Clone)]
struct PartResult {
    ok: usize,
    failed: usize,
    retries: u64,
    done_us: [u64; 5],
    max_us: [u64; 5],
}

impl PartResult {
    fn line(&self) -> String {
        let mut s = format!(
            "result ok={} failed={} retries={}",
            self.ok, self.failed, self.retries
        );
        for i in 0..5 {
            s.push_str(&format!(
                " d{i}={} m{i}={}",
                self.done_us[i], self.max_us[i]
            ));
        }
        s
    }

    fn parse(line: &str) -> Option<PartResult> {
        let mut r = PartResult::default();
        let body = line.strip_prefix("result ")?;
        for kv in body.split(' ') {
            let (k, v) = kv.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "ok" => r.ok = v as usize,
                "failed" => r.failed = v as usize,
                "retries" => r.retries = v,
                _ if k.starts_with('d') => r.done_us[k[1..].parse::<usize>().ok()?] = v,
                _ if k.starts_with('m') => r.max_us[k[1..].parse::<usize>().ok()?] = v,
                _ => return None,
            }
        }
        Some(r)
    }

    fn merge(&mut self, o: &PartResult) {
        self.ok += o.ok;
        self.failed += o.failed;
        self.retries += o.retries;
        for i in 0..5 {
            self.done_us[i] = self.done_us[i].max(o.done_us[i]);
            self.max_us[i] = self.max_us[i].max(o.max_us[i]);
        }
    }
}

/// utime + stime of `pid` in seconds, and its VmRSS / VmHWM in KiB.
fn proc_usage(pid: u32) -> Option<(f64, u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((ticks / hz, kb("VmRSS:")?, kb("VmHWM:")?))
}

/// Fresh-client probe: every `every`, a new client does what a PyTorch rank's first store
/// use does: connect, VALIDATE + PING (the `TCPStore` constructor), SET of its own key, then
/// `get` of it, which PyTorch's client sends as WAIT (answered STOP_WAITING) + GET: three round
/// trips on one new connection, the value checked. Returns the worst (connect to the GET's
/// value) and the worst connect alone, the number of probes and of failed ones once `stop` is
/// set. On a thread of its own with blocking sockets: as a task on the generator's runtime it
/// waited behind the storm's own client tasks, so it measured the generator's queue as much as
/// the server.
fn probe_loop(
    dest: std::net::SocketAddr,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> (Duration, Duration, usize, usize) {
    use std::io::{Read, Write};
    let worst_connect = std::cell::Cell::new(Duration::ZERO);
    let mut seq = 0u64;
    let mut once = || -> Result<(), BoxErr> {
        let limit = Duration::from_secs(30);
        let t = Instant::now();
        let mut s = std::net::TcpStream::connect_timeout(&dest, limit)?;
        let t_connect = t.elapsed();
        worst_connect.set(worst_connect.get().max(t_connect));
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(limit))?;
        let mut buf = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .to_bytes();
        Request::Ping { nonce: 7 }.encode(&mut buf);
        s.write_all(&buf)?;
        let mut pong = [0u8; 4];
        s.read_exact(&mut pong)?;
        let t_ping = t.elapsed();
        if u32::from_ne_bytes(pong) != 7 {
            return Err("PING answered with the wrong nonce".into());
        }
        seq += 1;
        let key = format!("probe/{}/{seq}", std::process::id()).into_bytes();
        let value = format!("probe value {seq}").into_bytes();
        s.write_all(
            &Request::Set {
                key: key.clone(),
                value: value.clone(),
            }
            .to_bytes(),
        )?;
        s.write_all(
            &Request::Wait {
                keys: vec![key.clone()],
            }
            .to_bytes(),
        )?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b)?;
        let t_wait = t.elapsed();
        if b[0] != rdrun::store::protocol::STOP_WAITING {
            return Err(format!("WAIT answered {}", b[0]).into());
        }
        s.write_all(&Request::Get { key }.to_bytes())?;
        let mut len = [0u8; 8];
        s.read_exact(&mut len)?;
        let mut got = vec![0u8; u64::from_ne_bytes(len).min(1 << 20) as usize];
        s.read_exact(&mut got)?;
        if got != value {
            return Err("GET of the probe's own key answered the wrong value".into());
        }
        tracing::debug!(
            at_us = epoch_us(),
            connect_ms = t_connect.as_secs_f64() * 1e3,
            ping_ms = t_ping.as_secs_f64() * 1e3,
            wait_ms = t_wait.as_secs_f64() * 1e3,
            get_ms = t.elapsed().as_secs_f64() * 1e3,
            "probe"
        );
        Ok(())
    };
    let (mut worst, mut n, mut failed) = (Duration::ZERO, 0, 0);
    // At least one probe, however short the storm.
    loop {
        let t = Instant::now();
        match once() {
            Ok(()) => {
                worst = worst.max(t.elapsed());
                n += 1;
            }
            Err(e) => {
                failed += 1;
                tracing::debug!(error = %e, "fresh-client probe failed");
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(every);
    }
    (worst, worst_connect.get(), n, failed)
}

/// Parent of a start-up run: spreads `world` ranks over `procs` generator processes (this one
/// and `procs - 1` children of the same binary, each on its own loopback source address),
/// starts them together, and prints one line with every measure.
#[allow(clippy::too_many_arguments)]
async fn startup(
    host: &str,
    port: u16,
    world: usize,
    procs: usize,
    limit: Duration,
    tag: &str,
    server_pid: Option<u32>,
    probe_every: Duration,
    gen_nice: i32,
) -> Res {
    use tokio::io::AsyncBufReadExt;
    let dest: std::net::SocketAddr = (host.parse::<std::net::IpAddr>()?, port).into();
    let loopback_sources = dest.ip().is_loopback() && dest.is_ipv4();
    // Share 0 connects from the default source (127.0.0.1, which /etc/hosts names: PyTorch's
    // server looks the name of every accepted peer up, and an address not there costs it a DNS
    // query per accept); every other share from an address of its own, so that no source runs
    // out of ephemeral ports.
    let source = |k: usize| {
        (loopback_sources && k > 0).then(|| std::net::IpAddr::from([127, 0, 1, (k + 1) as u8]))
    };
    let procs = procs.clamp(1, 200).min(world.max(1));
    let share = |k: usize| {
        (
            k * world / procs,
            (k + 1) * world / procs - k * world / procs,
        )
    };
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    // Niced generators: every share in a child (see `--gen-nice`); else this process runs
    // share 0 itself.
    let own_share = gen_nice == 0;
    for k in usize::from(own_share)..procs {
        let (first, count) = share(k);
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["startup-part", "--host", host])
            .args(["--port", &port.to_string()])
            .args(["--first", &first.to_string(), "--count", &count.to_string()])
            .args(["--world", &world.to_string(), "--tag", tag])
            .args(["--timeout-secs", &limit.as_secs_f64().to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(src) = source(k) {
            cmd.args(["--source", &src.to_string()]);
        }
        if gen_nice > 0 {
            // SAFETY: between fork and exec only setpriority (async-signal-safe) runs.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setpriority(libc::PRIO_PROCESS as _, 0, gen_nice) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take().ok_or("child stdin")?;
        let stdout = tokio::io::BufReader::new(child.stdout.take().ok_or("child stdout")?);
        children.push((child, stdin, stdout.lines()));
    }
    for (_, _, lines) in children.iter_mut() {
        match lines.next_line().await? {
            Some(l) if l == "ready" => {}
            other => return Err(format!("generator process did not start: {other:?}").into()),
        }
    }
    let before = server_pid.and_then(proc_usage);
    let go = epoch_us() + 50_000;
    for (_, stdin, _) in children.iter_mut() {
        stdin.write_all(format!("go {go}\n").as_bytes()).await?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let stop = stop.clone();
        std::thread::spawn(move || probe_loop(dest, probe_every, stop))
    };
    let (conns, mut total) = if own_share {
        let (first, count) = share(0);
        startup_part(source(0), dest, first, count, world, tag, limit, go).await?
    } else {
        (Vec::new(), PartResult::default())
    };
    for (_, _, lines) in children.iter_mut() {
        let line = tokio::time::timeout(limit, lines.next_line())
            .await
            .map_err(|_| "generator process did not report in time")??
            .unwrap_or_default();
        total.merge(&PartResult::parse(&line).ok_or_else(|| format!("bad part line {line:?}"))?);
    }
    let wall = Duration::from_micros(epoch_us().saturating_sub(go));
    stop.store(true, Ordering::Relaxed);
    let (probe_worst, probe_connect_worst, probes, probe_failed) =
        tokio::task::spawn_blocking(move || probe.join())
            .await?
            .map_err(|_| "probe thread panicked")?;
    // Every connection is still open: the server's RSS now is its cost for `world` clients.
    let after = server_pid.and_then(proc_usage);
    // The generators' own CPU (this process and its children, still alive): on one machine
    // the clients' kernel work competes with the server's for the same cores.
    let gen_cpu: f64 = std::iter::once(std::process::id())
        .chain(children.iter().filter_map(|(c, _, _)| c.id()))
        .filter_map(|pid| proc_usage(pid).map(|u| u.0))
        .sum();
    drop(conns);
    for (mut child, stdin, _) in children {
        drop(stdin);
        let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    }
    let mut line = format!(
        "clients={world} procs={procs} gen_nice={gen_nice} ok={} failed={} connect_retries={} wall_s={:.3}",
        total.ok,
        total.failed,
        total.retries,
        wall.as_secs_f64()
    );
    for (i, name) in PHASES.iter().enumerate() {
        line.push_str(&format!(
            " {name}_done_s={:.3} {name}_slowest_s={:.3}",
            total.done_us[i] as f64 / 1e6,
            total.max_us[i] as f64 / 1e6
        ));
    }
    line.push_str(&format!(
        " probe_worst_ms={:.1} probe_connect_worst_ms={:.1} probes={probes} \
         probe_failed={probe_failed} gen_cpu_s={gen_cpu:.2}",
        probe_worst.as_secs_f64() * 1e3,
        probe_connect_worst.as_secs_f64() * 1e3
    ));
    if let (Some((c0, rss0, _)), Some((c1, rss1, hwm))) = (before, after) {
        line.push_str(&format!(
            " server_cpu_s={:.2} server_rss_base_kib={rss0} server_rss_kib={rss1} server_hwm_kib={hwm} \
             per_conn_kib={:.2}",
            c1 - c0,
            (hwm.saturating_sub(rss0)) as f64 / world.max(1) as f64
        ));
    }
    println!("{line}");
    if total.failed > 0 || total.ok != world {
        return Err(format!("{} of {world} clients finished", total.ok).into());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
/// A child generator process: prints `ready`, waits for `go <epoch µs>` on stdin, runs its
/// share, prints its `result` line, holds its connections until stdin closes.
async fn startup_child(
    host: &str,
    port: u16,
    source: Option<std::net::IpAddr>,
    first: usize,
    count: usize,
    world: usize,
    tag: &str,
    limit: Duration,
) -> Res {
    let dest: std::net::SocketAddr = (host.parse::<std::net::IpAddr>()?, port).into();
    // stdin lines through a thread (this crate's tokio has no stdin support).
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    println!("ready");
    let go = match lines.recv().await {
        Some(l) => l
            .strip_prefix("go ")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or("expected `go <epoch us>` on stdin")?,
        None => return Ok(()),
    };
    let (conns, res) = startup_part(source, dest, first, count, world, tag, limit, go).await?;
    println!("{}", res.line());
    while lines.recv().await.is_some() {}
    drop(conns);
    Ok(())
}
