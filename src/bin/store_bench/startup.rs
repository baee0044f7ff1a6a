//! `startup`: PyTorch's start-up pattern (issue 16) for many ranks, spread over generator
//! processes (children of this binary, each on its own loopback source address), with a fresh
//! client probing the server's latency and the server's CPU and RSS.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdrun::store::protocol::{Request, VALIDATION_MAGIC};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::Res;

/// The phases of one rank's start-up, in order (see [`startup_rank`]).
pub(crate) const PHASES: [&str; 5] = ["connect", "init", "own_set", "shared_get", "barrier"];

/// One raw, validated connection speaking just what the start-up pattern needs (pre-encoded
/// requests, no client library: on 2 cores the generator's own CPU must stay small).
pub(crate) struct Raw {
    s: tokio::net::TcpStream,
}

pub(crate) type BoxErr = Box<dyn std::error::Error + Send + Sync>;

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

pub(crate) fn epoch_us() -> u64 {
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
pub(crate) async fn startup_rank(
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
pub(crate) async fn startup_part(
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
pub(crate) struct PartResult {
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
pub(crate) fn proc_usage(pid: u32) -> Option<(f64, u64, u64)> {
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
pub(crate) fn probe_loop(
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

/// A generator child: its process, its stdin (the `go` line; closed: drop the connections) and
/// its stdout's lines (`ready`, then the `result` line).
type Generator = (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
);

/// The generators' shape: how the `world` ranks are spread, and from which source addresses.
struct Spread<'a> {
    host: &'a str,
    port: u16,
    world: usize,
    procs: usize,
    limit: Duration,
    tag: &'a str,
    gen_nice: i32,
    loopback_sources: bool,
}

impl Spread<'_> {
    /// Share 0 connects from the default source (127.0.0.1, which /etc/hosts names: PyTorch's
    /// server looks the name of every accepted peer up, and an address not there costs it a
    /// DNS query per accept); every other share from an address of its own, so that no source
    /// runs out of ephemeral ports.
    fn source(&self, k: usize) -> Option<std::net::IpAddr> {
        (self.loopback_sources && k > 0).then(|| std::net::IpAddr::from([127, 0, 1, (k + 1) as u8]))
    }

    /// Share `k`: its first rank and rank count.
    fn share(&self, k: usize) -> (usize, usize) {
        let (world, procs) = (self.world, self.procs);
        (
            k * world / procs,
            (k + 1) * world / procs - k * world / procs,
        )
    }

    /// Starts the generator child of share `k` (niced by `gen_nice`).
    fn spawn(&self, exe: &std::path::Path, k: usize) -> Result<Generator, BoxErr> {
        use tokio::io::AsyncBufReadExt;
        let (first, count) = self.share(k);
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["startup-part", "--host", self.host])
            .args(["--port", &self.port.to_string()])
            .args(["--first", &first.to_string(), "--count", &count.to_string()])
            .args(["--world", &self.world.to_string(), "--tag", self.tag])
            .args(["--timeout-secs", &self.limit.as_secs_f64().to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        if let Some(src) = self.source(k) {
            cmd.args(["--source", &src.to_string()]);
        }
        let gen_nice = self.gen_nice;
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
        Ok((child, stdin, stdout.lines()))
    }
}

/// Parent of a start-up run: spreads `world` ranks over `procs` generator processes (this one
/// and `procs - 1` children of the same binary, each on its own loopback source address),
/// starts them together, and prints one line with every measure.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn startup(
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
    let dest: std::net::SocketAddr = (host.parse::<std::net::IpAddr>()?, port).into();
    let spread = Spread {
        host,
        port,
        world,
        procs: procs.clamp(1, 200).min(world.max(1)),
        limit,
        tag,
        gen_nice,
        loopback_sources: dest.ip().is_loopback() && dest.is_ipv4(),
    };
    let procs = spread.procs;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    // Niced generators: every share in a child (see `--gen-nice`); else this process runs
    // share 0 itself.
    let own_share = gen_nice == 0;
    for k in usize::from(own_share)..procs {
        children.push(spread.spawn(&exe, k)?);
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
        let (first, count) = spread.share(0);
        startup_part(spread.source(0), dest, first, count, world, tag, limit, go).await?
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
    let probed = tokio::task::spawn_blocking(move || probe.join())
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
    line.push_str(&measures(&total, probed, gen_cpu, (before, after), world));
    println!("{line}");
    if total.failed > 0 || total.ok != world {
        return Err(format!("{} of {world} clients finished", total.ok).into());
    }
    Ok(())
}

/// A process's CPU seconds, RSS and RSS high-water mark in KiB ([`proc_usage`]).
type Usage = (f64, u64, u64);

/// The result line's measures after its counts: each phase's end and slowest rank, the probe's,
/// the generators' CPU, and the server's CPU and memory (`usage`: before and after, when known).
fn measures(
    total: &PartResult,
    (probe_worst, probe_connect_worst, probes, probe_failed): (Duration, Duration, usize, usize),
    gen_cpu: f64,
    usage: (Option<Usage>, Option<Usage>),
    world: usize,
) -> String {
    let mut line = String::new();
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
    if let (Some((c0, rss0, _)), Some((c1, rss1, hwm))) = usage {
        line.push_str(&format!(
            " server_cpu_s={:.2} server_rss_base_kib={rss0} server_rss_kib={rss1} server_hwm_kib={hwm} \
             per_conn_kib={:.2}",
            c1 - c0,
            (hwm.saturating_sub(rss0)) as f64 / world.max(1) as f64
        ));
    }
    line
}

#[allow(clippy::too_many_arguments)]
/// A child generator process: prints `ready`, waits for `go <epoch µs>` on stdin, runs its
/// share, prints its `result` line, holds its connections until stdin closes.
pub(crate) async fn startup_child(
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
