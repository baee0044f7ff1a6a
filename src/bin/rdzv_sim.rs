//! `rdrun-rdzv-sim`: many agents' c10d rendezvous in one process (issue 16). Each simulated
//! node is a real [`C10dRendezvous`] with its own store connection and heartbeat keeper; all
//! share one tokio runtime, so thousands of nodes join one round against one store server (run
//! it as its own process, `rdrun-store-bench serve`, and pass `--server-pid` to measure it).
//!
//! One run: connect `--nodes` store clients, have every node join one round (`min = max =
//! nodes`), then hold the round for `--steady-secs` (heartbeats and monitoring only), then drop
//! one node (`--kill-one`: its keeper stops beating) and wait until the others report the lost
//! peer. Prints one `key=value` line: join time, the server's CPU during the join and at steady
//! state (from `/proc/<pid>/stat`), the bytes the store moved per join and per second at steady
//! state, and the detection times.
//!
//! Without `--port` the simulator starts the store itself, as a child process running this
//! binary with `--serve` (so that the server's CPU is its own): the child answers each line on
//! its stdin with the byte counters of its server (`rdrun::store::stats`, socket bytes read and
//! written), which is how bytes per join are measured. With `--port` (another server) bytes are
//! not reported. Each simulated node has its own store connection for the join, and its keeper
//! one for heartbeats and monitoring, as a real agent does; above 9,000 nodes the keepers'
//! connections are shared, so that both sides stay within the 20,000 descriptors a process may
//! hold here: 18,000 connections in all, the keeper of node i on keeper connection
//! i mod (18,000 − n) (at 10,000 nodes 8,000 keeper connections, `keeper_conns=8000`). A keeper
//! sends only short requests (a heartbeat with its poll in one round trip, never a WAIT), so a
//! shared keeper connection delays a beat by one other keeper's round trip at most; a join's
//! connection is never shared (its WAITs would hold the beats). A benchmark, bounded by `--timeout-secs`; `scripts/bench-scale.sh` runs it.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use rdrun::config::NodeRange;
use rdrun::rendezvous::{
    C10dRendezvous, C10dSettings, RdzvEvent, RoundReason, RoundRequest, TcpRdzvStore,
};
use tokio::time::Instant;

#[derive(Parser)]
#[command(
    name = "rdrun-rdzv-sim",
    about = "Simulated c10d rendezvous of many nodes"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// A store server to use; without it a child process serves one (and reports bytes).
    #[arg(long)]
    port: Option<u16>,
    /// Internal: be the store server child (see the module docs).
    #[arg(long, hide = true)]
    serve: bool,
    #[arg(long, default_value_t = 128)]
    nodes: usize,
    /// Workers per node (only sizes the world).
    #[arg(long, default_value_t = 8)]
    nproc: usize,
    /// The store server's pid (its CPU time is read from /proc).
    #[arg(long)]
    server_pid: Option<u32>,
    /// Seconds of steady state (round complete, heartbeats only) to measure.
    #[arg(long, default_value_t = 10.0)]
    steady_secs: f64,
    /// Drop one node after the steady state and time its detection.
    #[arg(long)]
    kill_one: bool,
    /// `--rdzv-conf`-style settings, `key=value,...` (e.g. keep_alive_interval=1).
    #[arg(long, default_value = "")]
    conf: String,
    #[arg(long, default_value_t = 600.0)]
    timeout_secs: f64,
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RDRUN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = rdrun::store::server::raise_nofile_limit() {
        eprintln!("rdrun-rdzv-sim: warning: could not raise the open-file limit: {e}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdrun-rdzv-sim: error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.serve {
        return match rt.block_on(serve(&args.host)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rdrun-rdzv-sim --serve: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let limit = Duration::from_secs_f64(args.timeout_secs.max(1.0));
    match rt.block_on(async { tokio::time::timeout(limit, run(args)).await }) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("rdrun-rdzv-sim: error: {e}");
            ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("rdrun-rdzv-sim: error: did not finish within {limit:?}");
            ExitCode::FAILURE
        }
    }
}

/// The store server child: prints `port=N`, then answers each stdin line with
/// `bytes_read=R bytes_written=W`; stops at stdin's end.
async fn serve(host: &str) -> Res<()> {
    let ip: std::net::IpAddr = host.parse()?;
    let server = rdrun::store::server::StoreServer::bind(
        (ip, 0).into(),
        rdrun::store::server::ServerConfig::default(),
    )?;
    println!("port={}", server.port());
    // Stdin on a thread of its own (blocking reads); its end stops the server.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        for line in std::io::stdin().lock().lines() {
            if line.is_err() {
                break;
            }
            let s = rdrun::store::stats::STATS.snapshot();
            let mut out = std::io::stdout().lock();
            let ops: Vec<String> = s
                .ops
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{k}:{n}"))
                .collect();
            let _ = writeln!(
                out,
                "bytes_read={} bytes_written={} ops={}",
                s.bytes_read,
                s.bytes_written,
                ops.join(",")
            );
            let _ = out.flush();
        }
        let _ = done_tx.send(());
    });
    let _ = done_rx.await;
    server.shutdown().await;
    Ok(())
}

/// The store server child and the line protocol to read its byte counters.
struct Child {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    port: u16,
}

impl Child {
    async fn start(host: &str) -> Res<Child> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--serve", "--host", host])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let mut stdout = tokio::io::BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
        let first = stdout
            .next_line()
            .await?
            .ok_or("store child said nothing")?;
        let port = first
            .strip_prefix("port=")
            .ok_or_else(|| format!("store child said {first:?}"))?
            .parse()?;
        Ok(Child {
            child,
            stdin,
            stdout,
            port,
        })
    }

    /// Socket bytes read + written by the child's server so far.
    async fn bytes(&mut self) -> Res<u64> {
        Ok(self.counters().await?.0)
    }

    /// Socket bytes read + written by the child's server so far, and its requests per opcode.
    async fn counters(&mut self) -> Res<(u64, BTreeMap<String, u64>)> {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(b"?\n").await?;
        self.stdin.flush().await?;
        let line = self.stdout.next_line().await?.ok_or("store child ended")?;
        let mut total = 0;
        let mut ops = BTreeMap::new();
        for kv in line.split(' ') {
            let (k, v) = kv.split_once('=').ok_or("bad stats line")?;
            if k == "ops" {
                for op in v.split(',').filter(|o| !o.is_empty()) {
                    let (name, n) = op.split_once(':').ok_or("bad ops entry")?;
                    ops.insert(name.to_string(), n.parse::<u64>()?);
                }
            } else {
                total += v.parse::<u64>()?;
            }
        }
        Ok((total, ops))
    }
}

/// CPU seconds (utime + stime) of `pid`.
fn usage(pid: Option<u32>) -> Option<f64> {
    let pid = pid?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks / hz)
}

/// A simulated node's address (distinct per node: ranks are ordered by address).
fn node_addr(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

/// What a node task reports once joined: its index, its group rank if the world it got is
/// right (an error's text otherwise), and when.
type Joined = (usize, Result<Option<usize>, String>, Instant);
/// An event a node's rendezvous reported after the join, with the node and when.
type Seen = (usize, RdzvEvent, Instant);

/// The store connections made before the join (so that the join measures the rendezvous, not
/// the connect storm).
struct Conns {
    /// One per node, for its join.
    stores: Vec<TcpRdzvStore>,
    /// The keepers' connections; node i's keeper uses `keepers[i % keepers.len()]`.
    keepers: Vec<Arc<TcpRdzvStore>>,
    connect_s: f64,
}

async fn run(args: Args) -> Res<()> {
    let n = args.nodes.max(1);
    let mut child = match args.port {
        Some(_) => None,
        None => Some(Child::start(&args.host).await?),
    };
    let port = args
        .port
        .or(child.as_ref().map(|c| c.port))
        .expect("a port either way");
    let server_pid = args
        .server_pid
        .or(child.as_ref().and_then(|c| c.child.id()));
    let settings = settings_of(&args.conf, n)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let op_timeout = settings.read_timeout;
    let conns = connect_all(&args.host, port, n, deadline, op_timeout).await?;
    let keeper_conns = conns.keepers.len();
    let connect_s = conns.connect_s;

    let counters0 = counters(&mut child).await?;
    let before = usage(server_pid);
    let t0 = Instant::now();
    let (joined_tx, joined_rx) = tokio::sync::mpsc::unbounded_channel();
    let (event_tx, mut event_rx) = tokio::sync::mpsc::unbounded_channel();
    let (kill_tx, kill_rx) = tokio::sync::watch::channel(None::<usize>);
    let mut nodes = tokio::task::JoinSet::new();
    let node_tx = (joined_tx, event_tx, kill_rx);
    spawn_nodes(&mut nodes, conns, &settings, args.nproc, node_tx);
    // With RDRUN_SIM_PROGRESS set: every 5 s, how many joined and the round's head (stderr).
    let progress = std::env::var_os("RDRUN_SIM_PROGRESS").is_some();
    let probe = if progress {
        Some(TcpRdzvStore::connect(&args.host, port, deadline, op_timeout).await?)
    } else {
        None
    };
    let last = await_joins(joined_rx, n, t0, probe.as_ref()).await?;
    let join_s = last.duration_since(t0).as_secs_f64();
    let after_join = usage(server_pid);
    let counters1 = counters(&mut child).await?;

    let mut line = format!(
        "nodes={n} keeper_conns={keeper_conns} connect_s={connect_s:.3} join_s={join_s:.3}"
    );
    if let (Some(c0), Some(c1)) = (before, after_join) {
        line.push_str(&format!(" join_server_cpu_s={:.2}", c1 - c0));
    }
    if let (Some(c0), Some(c1)) = (counters0, counters1) {
        line.push_str(&join_costs(n, c0, c1));
    }
    if args.steady_secs > 0.0 {
        let secs = args.steady_secs;
        let steady = steady_state(secs, &settings, server_pid, child.as_mut(), &mut event_rx);
        line.push_str(&steady.await?);
    }
    if args.kill_one && n > 1 {
        line.push_str(&kill_one(n, &kill_tx, &mut event_rx, &settings).await?);
    }
    println!("{line}");
    nodes.abort_all();
    Ok(())
}

/// The c10d settings of a round of exactly `n` nodes, `--conf`'s `key=value` pairs applied.
fn settings_of(conf_text: &str, n: usize) -> Res<C10dSettings> {
    let mut conf = BTreeMap::new();
    for kv in conf_text.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv.split_once('=').ok_or("--conf wants key=value pairs")?;
        conf.insert(k.to_string(), v.to_string());
    }
    Ok(C10dSettings::from_conf(
        NodeRange { min: n, max: n },
        &conf,
    )?)
}

/// The child's counters, when there is a child.
async fn counters(child: &mut Option<Child>) -> Res<Option<(u64, BTreeMap<String, u64>)>> {
    Ok(match child.as_mut() {
        Some(c) => Some(c.counters().await?),
        None => None,
    })
}

/// Connects every node's join connection and the keepers' connections, all at once.
async fn connect_all(
    host: &str,
    port: u16,
    n: usize,
    deadline: Instant,
    op_timeout: Duration,
) -> Res<Conns> {
    // Like a real agent, each node's keeper has a connection apart from its join's (heartbeats
    // never queue behind a WAIT or a big read of the join), while both sides stay under the
    // 20,000 descriptors a process may hold here: above 9,000 nodes keepers share their
    // connections (see the module docs); 18,000 connections at most in all.
    let keeper_conns = 18_000usize.saturating_sub(n).clamp(1, n);
    let t_conn = Instant::now();
    let mut connecting = tokio::task::JoinSet::new();
    for i in 0..n + keeper_conns {
        let host = host.to_string();
        connecting.spawn(async move {
            let c = TcpRdzvStore::connect(&host, port, deadline, op_timeout).await?;
            Ok::<_, rdrun::rendezvous::RendezvousError>((i, c))
        });
    }
    let mut conns: Vec<Option<TcpRdzvStore>> = (0..n + keeper_conns).map(|_| None).collect();
    while let Some(r) = connecting.join_next().await {
        let (i, c) = r??;
        conns[i] = Some(c);
    }
    let keepers: Vec<Arc<TcpRdzvStore>> = conns
        .drain(n..)
        .map(|c| Arc::new(c.expect("every keeper connection made")))
        .collect();
    let stores = conns
        .into_iter()
        .map(|c| c.expect("every node connected"))
        .collect();
    Ok(Conns {
        stores,
        keepers,
        connect_s: t_conn.elapsed().as_secs_f64(),
    })
}

/// Starts one task per node: it joins the round, reports how (`Joined`), then reports its
/// rendezvous events (`Seen`) until the kill signal names it (its keeper then stops beating).
fn spawn_nodes(
    nodes: &mut tokio::task::JoinSet<()>,
    conns: Conns,
    settings: &C10dSettings,
    nproc: usize,
    (joined_tx, event_tx, kill_rx): (
        tokio::sync::mpsc::UnboundedSender<Joined>,
        tokio::sync::mpsc::UnboundedSender<Seen>,
        tokio::sync::watch::Receiver<Option<usize>>,
    ),
) {
    let n = conns.stores.len();
    let keeper_conns = conns.keepers.len();
    for (i, store) in conns.stores.into_iter().enumerate() {
        let store = Arc::new(store);
        let keeper = conns.keepers[i % keeper_conns].clone();
        let settings = settings.clone();
        let (joined_tx, event_tx, mut kill_rx) =
            (joined_tx.clone(), event_tx.clone(), kill_rx.clone());
        nodes.spawn(async move {
            let mut rdzv =
                C10dRendezvous::new(store, settings, "sim", &node_addr(i), i as u32, nproc)
                    .with_pid(1)
                    .with_keeper_store(keeper);
            let asg = rdzv
                .next_round(RoundRequest {
                    reason: RoundReason::Initial,
                    master_port: 29500,
                })
                .await;
            // The world, and ranks consistent with the group rank (checked unique later).
            let ok = asg
                .as_ref()
                .map(|a| {
                    let right = a.group_world_size == n
                        && a.world_size == n * nproc
                        && a.base_rank == a.group_rank * nproc
                        && a.local_world_size == nproc;
                    right.then_some(a.group_rank)
                })
                .map_err(|e| e.to_string());
            // A real agent holds its one assignment; 10,000 held here would be 10^8 entries.
            drop(asg);
            let _ = joined_tx.send((i, ok, Instant::now()));
            loop {
                tokio::select! {
                    ev = rdzv.watch() => {
                        let _ = event_tx.send((i, ev, Instant::now()));
                    }
                    r = kill_rx.changed() => {
                        if r.is_err() || *kill_rx.borrow() == Some(i) {
                            // Dropping the handle stops this node's keeper: no more beats.
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// Waits for every node's join, checks that the group ranks are distinct and in range, and
/// returns when the last one joined; with a `probe`, prints the progress every 5 s.
async fn await_joins(
    mut joined_rx: tokio::sync::mpsc::UnboundedReceiver<Joined>,
    n: usize,
    t0: Instant,
    probe: Option<&TcpRdzvStore>,
) -> Res<Instant> {
    let mut last = t0;
    let mut next_report = Instant::now() + Duration::from_secs(5);
    let mut ranks_seen = vec![false; n];
    for done in 0..n {
        let (i, ok, at) = loop {
            match tokio::time::timeout_at(next_report, joined_rx.recv()).await {
                Ok(r) => break r.ok_or("a node task ended early")?,
                Err(_) => {
                    next_report += Duration::from_secs(5);
                    if let Some(p) = probe {
                        report_progress(p, done, t0).await;
                    }
                }
            }
        };
        match ok {
            Ok(Some(g)) => {
                if g >= n || std::mem::replace(&mut ranks_seen[g], true) {
                    return Err(
                        format!("node {i} got group rank {g}, out of range or taken").into(),
                    );
                }
            }
            Ok(None) => return Err(format!("node {i} got a wrong world").into()),
            Err(e) => return Err(format!("node {i} failed to join: {e}").into()),
        }
        last = last.max(at);
    }
    Ok(last)
}

/// One progress line on stderr: how many joined, and the round's head.
async fn report_progress(probe: &TcpRdzvStore, done: usize, t0: Instant) {
    use rdrun::rendezvous::RdzvStore;
    let head = probe
        .compare_set("rdrun.rendezvous.sim/state", b"\0", b"\0")
        .await
        .unwrap_or_default();
    eprintln!(
        "after {:.1}s: {done} joined; head {}",
        t0.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&head)
    );
}

/// The join's bytes and store requests per node, from the child's counters before and after.
fn join_costs(
    n: usize,
    (b0, o0): (u64, BTreeMap<String, u64>),
    (b1, o1): (u64, BTreeMap<String, u64>),
) -> String {
    let mut line = format!(
        " join_bytes={} bytes_per_join={}",
        b1 - b0,
        (b1 - b0) / n as u64
    );
    // Store requests per join, per opcode (what each node's join costs the store).
    let per: Vec<String> = o1
        .iter()
        .map(|(k, v)| (k, v - o0.get(k).copied().unwrap_or(0)))
        .filter(|(_, d)| *d > 0)
        .map(|(k, d)| format!("{k}:{:.2}", d as f64 / n as f64))
        .collect();
    line.push_str(&format!(" requests_per_join={}", per.join(",")));
    line
}

/// Steady state: the round runs; only heartbeats and monitoring reach the store. Measures
/// the server's bytes and CPU over `secs`; any rendezvous event meanwhile is an error.
async fn steady_state(
    secs: f64,
    settings: &C10dSettings,
    server_pid: Option<u32>,
    mut child: Option<&mut Child>,
    event_rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
) -> Res<String> {
    let mut line = String::new();
    // Let the first monitoring passes (started right after each join) go by.
    tokio::time::sleep(settings.poll_interval).await;
    let s0 = usage(server_pid);
    let b0 = match child.as_mut() {
        Some(c) => Some(c.bytes().await?),
        None => None,
    };
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let s1 = usage(server_pid);
    let secs = t.elapsed().as_secs_f64();
    if let Some(c) = child.as_mut() {
        let b1 = c.bytes().await?;
        line.push_str(&format!(
            " steady_bytes_per_s={:.0}",
            (b1 - b0.unwrap_or(b1)) as f64 / secs
        ));
    }
    if let (Some(c0), Some(c1)) = (s0, s1) {
        line.push_str(&format!(" steady_cpu_pct={:.1}", 100.0 * (c1 - c0) / secs));
    }
    if let Ok((i, ev, _)) = event_rx.try_recv() {
        return Err(format!("node {i} saw {ev:?} in steady state").into());
    }
    Ok(line)
}

/// Drops one node and times until every survivor learned of the loss.
async fn kill_one(
    n: usize,
    kill_tx: &tokio::sync::watch::Sender<Option<usize>>,
    event_rx: &mut tokio::sync::mpsc::UnboundedReceiver<Seen>,
    settings: &C10dSettings,
) -> Res<String> {
    let victim = n / 2;
    let t = Instant::now();
    kill_tx.send(Some(victim))?;
    let mut first = None;
    let mut seen = std::collections::HashSet::new();
    // Every survivor learns of the loss: the one that pruned it (PeersLost) and the rest
    // (RoundChanged to the round without it).
    while seen.len() < n - 1 {
        let (i, ev, at) = event_rx.recv().await.ok_or("node tasks ended")?;
        match ev {
            RdzvEvent::PeersLost(_) | RdzvEvent::RoundChanged { .. } => {}
            other => return Err(format!("node {i}: unexpected {other:?}").into()),
        }
        first.get_or_insert(at);
        seen.insert(i);
    }
    Ok(format!(
        " detect_first_s={:.3} detect_all_s={:.3} dead_after_s={:.1}",
        first.map_or(0.0, |f| f.duration_since(t).as_secs_f64()),
        t.elapsed().as_secs_f64(),
        settings.dead_after().as_secs_f64()
    ))
}
