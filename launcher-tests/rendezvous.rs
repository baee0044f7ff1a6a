//! Multi-node rendezvous over real sockets: several agents on loopback (127.0.0.x) and on
//! separate network hosts made with network namespaces (`scripts/netns.sh`).
//!
//! Namespace tests need root and iproute2; where either is missing they print why and pass
//! without running (CI runs as root and must run them). Each simulated host is a thread that
//! entered its namespace with `setns(CLONE_NEWNET)`, so every socket it opens lives on that host;
//! [`Netns`] removes every namespace, link and process it made when dropped, also on panic, and
//! reaps what a killed earlier run left behind.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use rdrun::rendezvous::addr;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn netns_script() -> Command {
    Command::new(repo_root().join("scripts/netns.sh"))
}

/// Runs `f` on its own thread and fails the test if it takes longer than `limit`.
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test body exceeded {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("test body panicked"),
    }
}

/// A set of simulated hosts: namespaces `rdrun-<tag>-0..n-1` on one bridge; node `i` has
/// 10.231.0.(i+1) and fd00:231::(i+1).
pub struct Netns {
    tag: String,
}

static NEXT_TAG: AtomicU32 = AtomicU32::new(0);

impl Netns {
    /// Creates `n` hosts, or returns `None` after printing why namespaces are unavailable.
    pub fn create(n: usize) -> Option<Netns> {
        let check = netns_script()
            .arg("check")
            .output()
            .expect("run scripts/netns.sh");
        if !check.status.success() {
            eprintln!(
                "SKIP: {}",
                String::from_utf8_lossy(&check.stdout).trim().to_string()
                    + String::from_utf8_lossy(&check.stderr).trim()
            );
            return None;
        }
        // Namespaces of earlier runs that were killed before cleaning up.
        let _ = netns_script().arg("reap").status();
        // pid and per-process counter in hex, split by a non-hex 'x': unique across processes.
        let tag = format!(
            "t{:x}x{:x}",
            std::process::id(),
            NEXT_TAG.fetch_add(1, Ordering::SeqCst)
        );
        let out = netns_script()
            .args(["up", &tag, &n.to_string()])
            .env("RDRUN_NETNS_OWNER", std::process::id().to_string())
            .output()
            .expect("run scripts/netns.sh up");
        assert!(
            out.status.success(),
            "netns.sh up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(Netns { tag })
    }

    /// Node `i`'s IPv4 address.
    pub fn addr(&self, i: usize) -> String {
        format!("10.231.0.{}", i + 1)
    }

    /// Node `i`'s IPv6 address.
    pub fn addr6(&self, i: usize) -> String {
        format!("fd00:231::{}", i + 1)
    }

    /// Node `i`'s namespace name (for `ip netns exec`).
    pub fn name(&self, i: usize) -> String {
        format!("rdrun-{}-{i}", self.tag)
    }

    /// The hub namespace holding the bridge the nodes' links are on.
    pub fn hub(&self) -> String {
        format!("rdrun-{}-hub", self.tag)
    }

    fn ns_path(&self, i: usize) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/rdrun-{}-{i}", self.tag))
    }

    /// Takes node `i`'s link down (a pulled cable: no FIN, no RST, packets vanish).
    pub fn cut(&self, i: usize) {
        let st = netns_script()
            .args(["cut", &self.tag, &i.to_string()])
            .status()
            .expect("run netns.sh cut");
        assert!(st.success());
    }

    /// Rate-limits node `i`'s egress to `rate` (tc tbf, `20mbit`): a slow NIC or link.
    pub fn slow(&self, i: usize, rate: &str) {
        let st = netns_script()
            .args(["slow", &self.tag, &i.to_string(), rate])
            .status()
            .expect("run netns.sh slow");
        assert!(st.success(), "tc tbf on node {i} failed");
    }

    /// Removes node `i`'s rate limit.
    pub fn unslow(&self, i: usize) {
        let st = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name(i),
                "tc",
                "qdisc",
                "del",
                "dev",
                "eth0",
                "root",
            ])
            .status()
            .expect("run tc");
        assert!(st.success(), "removing node {i}'s rate limit failed");
    }

    /// Runs `f` on a new thread living in node `i`'s network namespace.
    pub fn spawn_in<T: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let path = self.ns_path(i);
        thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open the namespace file");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("setns into the test namespace");
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = netns_script().args(["down", &self.tag]).status();
    }
}

fn ns_exists(tag_prefix: &str) -> bool {
    let out = Command::new("ip").args(["netns", "list"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).contains(tag_prefix))
        .unwrap_or(false)
}

#[test]
fn netns_hosts_talk_tcp_and_advertise_their_route_address() {
    bounded(Duration::from_secs(60), || {
        let Some(net) = Netns::create(3) else { return };
        let tag = format!("rdrun-{}-", net.tag);
        let server_addr = net.addr(2);
        let (ready_tx, ready_rx) = mpsc::channel();
        let server = net.spawn_in(2, move || {
            let l = TcpListener::bind("0.0.0.0:7777").expect("bind in node 2");
            ready_tx.send(()).expect("test alive");
            let (mut c, peer) = l.accept().expect("accept");
            let mut buf = [0u8; 4];
            c.read_exact(&mut buf).expect("read ping");
            c.write_all(b"pong").expect("write pong");
            (peer.ip().to_string(), buf)
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server ready");
        let target = server_addr.clone();
        let client = net.spawn_in(0, move || {
            let mut s = TcpStream::connect((target.as_str(), 7777)).expect("connect across hosts");
            s.write_all(b"ping").expect("write");
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).expect("read");
            buf
        });
        assert_eq!(&client.join().expect("client thread"), b"pong");
        let (peer, got) = server.join().expect("server thread");
        assert_eq!((peer.as_str(), &got), (net.addr(0).as_str(), b"ping"));

        // Address selection inside host 1: the route address towards the endpoint host, for IPv4
        // and IPv6, and is_host only where the endpoint address is local.
        let (e4, e6) = (net.addr(0), net.addr6(0));
        let (me4, me6) = (net.addr(1), net.addr6(1));
        let me4_in = me4.clone();
        let probe = net.spawn_in(1, move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                let a4 = addr::advertised_addr(None, &e4, 29400, deadline).await;
                let a6 = addr::advertised_addr(None, &format!("[{e6}]"), 29400, deadline).await;
                (
                    a4,
                    a6,
                    addr::is_host(&e4, None).await,
                    addr::is_host(&me4_in, None).await,
                )
            })
        });
        let (a4, a6, host_other, host_self) = probe.join().expect("probe thread");
        assert_eq!(a4.expect("route v4"), me4);
        assert_eq!(
            a6.expect("route v6").parse::<IpAddr>().ok(),
            me6.parse().ok()
        );
        assert!(!host_other, "another host's address is not local");
        assert!(host_self, "own address is local");
        drop(net);
        assert!(!ns_exists(&tag), "namespaces removed on drop");
    });
}

#[test]
fn netns_cleanup_happens_even_when_the_test_body_panics() {
    bounded(Duration::from_secs(60), || {
        type Seen = (String, Option<std::process::Child>);
        let seen: std::sync::Arc<std::sync::Mutex<Seen>> = Default::default();
        let s2 = seen.clone();
        let r = std::panic::catch_unwind(move || {
            let Some(net) = Netns::create(2) else {
                return;
            };
            // A process left running inside a namespace is killed by the cleanup too.
            let child = net
                .spawn_in(1, || {
                    Command::new("sleep")
                        .arg("300")
                        .spawn()
                        .expect("spawn sleep")
                })
                .join()
                .expect("spawn thread");
            *s2.lock().expect("lock") = (format!("rdrun-{}-", net.tag), Some(child));
            panic!("simulated test failure");
        });
        let (tag, child) = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
        let Some(mut child) = child else {
            return; // Skipped: namespaces unavailable.
        };
        assert!(r.is_err());
        assert!(
            !ns_exists(&tag),
            "namespaces of a panicking test are removed"
        );
        let status = child.wait().expect("reap sleep");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "process inside the namespace was killed"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Agents over a real store: each agent is a thread with its own tokio runtime (and, for the
// namespace tests, its own network host). The test drives them with commands and reads reports.

use rdrun::config::NodeRange;
use rdrun::config::{Endpoint, RdzvBackend, RdzvConfig};
use rdrun::rendezvous::{
    tcp, Assignment, C10dRendezvous, C10dSettings, NodeSpec, RdzvEvent, Rendezvous, RoundReason,
    RoundRequest,
};
use std::collections::BTreeMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What an agent tells the test.
#[derive(Debug, Clone)]
enum Report {
    Round(usize, Assignment),
    /// A non-zero group rank reached MASTER_ADDR:MASTER_PORT of this round and got an answer.
    Pong(usize, u64),
    Event(usize, RdzvEvent),
    Barrier(usize, Result<(), String>),
    Error(usize, String),
}

/// What the test tells an agent.
#[derive(Debug)]
enum Cmd {
    /// Vanish at once (sockets close, heartbeats stop), like a SIGKILLed agent.
    Die,
    /// This agent's workers failed: start a new round charged to the restart budget.
    Fail,
    /// Workers succeeded: exit barrier, then close the rendezvous.
    Finish,
}

#[derive(Clone)]
struct AgentSpec {
    idx: usize,
    host: String,
    port: u16,
    nodes: NodeRange,
    conf: BTreeMap<String, String>,
    local_addr: Option<String>,
    nproc: usize,
    /// Static backend: this node rank; `None` = c10d.
    static_rank: Option<usize>,
}

fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A port for a store that an agent binds later. Taken below the kernel's ephemeral range, so
/// the outgoing connections of concurrent tests cannot occupy it in between (a port from
/// `bind(0)` can be handed to some client's `connect` before our server binds it).
fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(12000, 65000);
    let span = low - 10000;
    let start = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let p = 10000 + (start + NEXT.fetch_add(1, Ordering::SeqCst)) % span;
        let port = u16::try_from(p).expect("below 65536");
        if TcpListener::bind(("0.0.0.0", port)).is_ok() && TcpListener::bind(("::", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// Rank 0 answers every ping on its MASTER_PORT listener; the others ping it.
async fn ping_pong(
    asg: Assignment,
    listener: tokio::net::TcpListener,
    idx: usize,
    tx: mpsc::Sender<Report>,
) {
    if asg.group_rank == 0 {
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4];
                if c.read_exact(&mut buf).await.is_ok() && &buf == b"ping" {
                    let _ = c.write_all(b"pong").await;
                }
            });
        }
    }
    drop(listener);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::time::Instant::now() < deadline {
        let target = (asg.master_addr.as_str(), asg.master_port);
        if let Ok(Ok(mut s)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect(target),
        )
        .await
        {
            let mut buf = [0u8; 4];
            if s.write_all(b"ping").await.is_ok()
                && s.read_exact(&mut buf).await.is_ok()
                && &buf == b"pong"
            {
                let _ = tx.send(Report::Pong(idx, asg.round));
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One c10d or static agent's loop over [`Rendezvous`] (the supervisor's entry point):
/// rendezvous, ping MASTER, react to events and commands.
async fn run_agent(
    spec: AgentSpec,
    tx: mpsc::Sender<Report>,
    mut cmds: tokio::sync::mpsc::UnboundedReceiver<Cmd>,
) {
    let idx = spec.idx;
    let err = |e: String| {
        let _ = tx.send(Report::Error(idx, e));
    };
    let rdzv_config = match RdzvConfig::typed(
        if spec.static_rank.is_some() {
            RdzvBackend::Static
        } else {
            RdzvBackend::C10d
        },
        Endpoint {
            host: spec.host.clone(),
            port: spec.port,
        },
        "job",
        spec.conf.clone(),
        spec.nodes,
    ) {
        Ok(c) => c,
        Err(e) => return err(e.to_string()),
    };
    let node = NodeSpec {
        nnodes: spec.nodes,
        node_rank: spec.static_rank.unwrap_or(0),
        nproc_per_node: spec.nproc,
        local_addr: spec.local_addr.clone(),
    };
    let mut rdzv = match Rendezvous::start_with(&rdzv_config, node).await {
        Ok(r) => r,
        Err(e) => return err(error_chain(&e)),
    };
    let mut reason = RoundReason::Initial;
    loop {
        // The worker-store stand-in listens on every interface, IPv6 and IPv4 (dual-stack), as
        // the real worker store must: MASTER_ADDR may be either family.
        let listener = match tokio::net::TcpListener::bind("[::]:0").await {
            Ok(l) => l,
            Err(_) => tokio::net::TcpListener::bind("0.0.0.0:0")
                .await
                .expect("bind the worker-store stand-in"),
        };
        let master_port = listener.local_addr().expect("local addr").port();
        let res = tokio::select! {
            r = rdzv.next_round(RoundRequest { reason, master_port }) => r,
            c = cmds.recv() => {
                if matches!(c, Some(Cmd::Die) | None) { return; }
                continue;
            }
        };
        let asg = match res {
            Ok(a) => a,
            Err(e) => return err(error_chain(&e)),
        };
        let _ = tx.send(Report::Round(idx, asg.clone()));
        let pp = tokio::spawn(ping_pong(asg.clone(), listener, idx, tx.clone()));
        let next = tokio::select! {
            ev = rdzv.watch() => Ok(ev),
            c = cmds.recv() => Err(c),
        };
        pp.abort();
        match next {
            Ok(ev) => {
                let _ = tx.send(Report::Event(idx, ev.clone()));
                match ev {
                    RdzvEvent::Closed | RdzvEvent::StoreUnreachable(_) => return,
                    _ => reason = RoundReason::Membership,
                }
            }
            Err(Some(Cmd::Fail)) => reason = RoundReason::WorkerFailure,
            Err(Some(Cmd::Finish)) => {
                let r = rdzv
                    .exit_barrier(&asg, Duration::from_secs(20))
                    .await
                    .map_err(|e| e.to_string());
                let _ = rdzv.close().await;
                let _ = tx.send(Report::Barrier(idx, r));
                // The host keeps the store up until the test is done with every agent.
                let _ = cmds.recv().await;
                return;
            }
            Err(Some(Cmd::Die) | None) => return,
        }
    }
}

/// The error and its causes on one line, as the binary prints them.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// A set of agents and the reports they send.
struct Cluster {
    tx: mpsc::Sender<Report>,
    rx: mpsc::Receiver<Report>,
    cmds: Vec<Option<tokio::sync::mpsc::UnboundedSender<Cmd>>>,
    threads: Vec<thread::JoinHandle<()>>,
    /// Reports read while looking for something else, in order.
    backlog: Vec<Report>,
}

impl Cluster {
    fn new() -> Self {
        let (tx, rx) = mpsc::channel();
        Cluster {
            tx,
            rx,
            cmds: Vec::new(),
            threads: Vec::new(),
            backlog: Vec::new(),
        }
    }

    /// Starts agent `spec.idx` on a thread made by `spawn` (plain, or inside a namespace).
    fn start(
        &mut self,
        spec: AgentSpec,
        spawn: impl FnOnce(Box<dyn FnOnce() + Send>) -> thread::JoinHandle<()>,
    ) {
        let (ctx, crx) = tokio::sync::mpsc::unbounded_channel();
        let tx = self.tx.clone();
        let idx = spec.idx;
        let body: Box<dyn FnOnce() + Send> = Box::new(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(run_agent(spec, tx, crx));
        });
        self.threads.push(spawn(body));
        if self.cmds.len() <= idx {
            self.cmds.resize_with(idx + 1, || None);
        }
        self.cmds[idx] = Some(ctx);
    }

    fn send(&self, idx: usize, cmd: Cmd) {
        if let Some(Some(c)) = self.cmds.get(idx) {
            let _ = c.send(cmd);
        }
    }

    /// Waits (up to `limit`) for a report matching `pick`; keeps the others in the backlog.
    fn wait_for<T>(
        &mut self,
        limit: Duration,
        what: &str,
        mut pick: impl FnMut(&Report) -> Option<T>,
    ) -> T {
        if let Some(pos) = self.backlog.iter().position(|r| pick(r).is_some()) {
            let r = self.backlog.remove(pos);
            return pick(&r).expect("matched");
        }
        let deadline = std::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(r) => {
                    if let Report::Error(i, e) = &r {
                        eprintln!("agent {i} error: {e}");
                    }
                    if let Some(v) = pick(&r) {
                        return v;
                    }
                    self.backlog.push(r);
                }
                Err(_) => panic!(
                    "timed out after {limit:?} waiting for {what}; other reports: {:#?}",
                    self.backlog
                ),
            }
        }
    }

    /// The assignments of round `round` from each of `idxs`, keyed by agent.
    fn round(
        &mut self,
        round: u64,
        idxs: &[usize],
        limit: Duration,
    ) -> BTreeMap<usize, Assignment> {
        let mut out = BTreeMap::new();
        for &i in idxs {
            let a = self.wait_for(limit, &format!("agent {i} in round {round}"), |r| match r {
                Report::Round(j, a) if *j == i && a.round == round => Some(a.clone()),
                _ => None,
            });
            out.insert(i, a);
        }
        out
    }

    fn pongs(&mut self, round: u64, idxs: &[usize], limit: Duration) {
        for &i in idxs {
            self.wait_for(
                limit,
                &format!("pong from agent {i} in round {round}"),
                |r| matches!(r, Report::Pong(j, rr) if *j == i && *rr == round).then_some(()),
            );
        }
    }

    fn finish(&mut self, idxs: &[usize]) {
        for &i in idxs {
            self.send(i, Cmd::Finish);
        }
        for &i in idxs {
            let r = self.wait_for(Duration::from_secs(30), "exit barrier", |r| match r {
                Report::Barrier(j, res) if *j == i => Some(res.clone()),
                _ => None,
            });
            assert_eq!(r, Ok(()), "agent {i} exit barrier");
        }
    }

    fn stop(&mut self) {
        for i in 0..self.cmds.len() {
            self.send(i, Cmd::Die);
        }
        self.cmds.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Ranks unique and contiguous, world sizes right, one MASTER for everyone.
fn check_round(asgs: &BTreeMap<usize, Assignment>, nprocs: &BTreeMap<usize, usize>) {
    let world: usize = asgs.keys().map(|i| nprocs[i]).sum();
    let mut ranks = Vec::new();
    let mut groups = Vec::new();
    for (i, a) in asgs {
        assert_eq!(a.world_size, world, "agent {i}: {a:?}");
        assert_eq!(a.group_world_size, asgs.len(), "agent {i}");
        assert_eq!(a.local_world_size, nprocs[i]);
        ranks.extend(a.base_rank..a.base_rank + a.local_world_size);
        groups.push(a.group_rank);
    }
    ranks.sort();
    groups.sort();
    assert_eq!(
        ranks,
        (0..world).collect::<Vec<_>>(),
        "ranks unique and contiguous"
    );
    assert_eq!(groups, (0..asgs.len()).collect::<Vec<_>>());
    let first = asgs.values().next().expect("at least one agent");
    for a in asgs.values() {
        assert_eq!(
            (&a.master_addr, a.master_port, a.restart_count),
            (&first.master_addr, first.master_port, first.restart_count)
        );
    }
}

fn loopback_spec(
    idx: usize,
    port: u16,
    nodes: NodeRange,
    c: &[(&str, &str)],
    nproc: usize,
) -> AgentSpec {
    AgentSpec {
        idx,
        host: "127.0.0.1".into(),
        port,
        nodes,
        conf: conf(c),
        local_addr: Some(format!("127.0.0.{}", idx + 1)),
        nproc,
        static_rank: None,
    }
}

fn plain(body: Box<dyn FnOnce() + Send>) -> thread::JoinHandle<()> {
    thread::spawn(body)
}

const FAST: &[(&str, &str)] = &[
    ("keep_alive_interval", "0.5"),
    ("keep_alive_max_attempt", "4"),
    ("poll_interval", "0.25"),
    ("last_call_timeout", "1"),
];

#[test]
fn c10d_loopback_heterogeneous_ranks_master_reachable_and_exit_barrier() {
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        let nodes = NodeRange { min: 3, max: 3 };
        let nprocs: BTreeMap<usize, usize> = [(0, 2), (1, 1), (2, 3)].into();
        let mut c = Cluster::new();
        for (&i, &n) in &nprocs {
            c.start(loopback_spec(i, port, nodes, FAST, n), plain);
        }
        let r0 = c.round(0, &[0, 1, 2], Duration::from_secs(60));
        check_round(&r0, &nprocs);
        // Group ranks follow the addresses 127.0.0.1 < .2 < .3.
        let got: Vec<(usize, usize)> = r0.values().map(|a| (a.group_rank, a.base_rank)).collect();
        assert_eq!(got, [(0, 0), (1, 2), (2, 3)]);
        assert_eq!(r0[&0].master_addr, "127.0.0.1");
        c.pongs(0, &[1, 2], Duration::from_secs(30));
        c.finish(&[0, 1, 2]);
    });
}

#[test]
fn c10d_loopback_late_joiner_grows_the_world_and_over_max_waits_until_closed() {
    bounded(Duration::from_secs(180), || {
        let port = free_port();
        let nodes = NodeRange { min: 2, max: 3 };
        let mut c = Cluster::new();
        for i in 0..2 {
            c.start(loopback_spec(i, port, nodes, FAST, 1), plain);
        }
        let r0 = c.round(0, &[0, 1], Duration::from_secs(60));
        check_round(&r0, &[(0, 1), (1, 1)].into());
        c.start(loopback_spec(2, port, nodes, FAST, 1), plain);
        let r1 = c.round(1, &[0, 1, 2], Duration::from_secs(60));
        check_round(&r1, &[(0, 1), (1, 1), (2, 1)].into());
        assert!(
            r1.values().all(|a| a.restart_count == 0),
            "scale-up is not charged"
        );
        // Each running agent learnt it from the wait list, or from the other one's new round.
        for i in 0..2 {
            c.wait_for(Duration::from_secs(5), "scale-up event", |r| {
                matches!(r, Report::Event(j, RdzvEvent::NodesWaiting(1) | RdzvEvent::RoundChanged {
                    round: 1,
                    reason: RoundReason::Membership
                }) if *j == i)
                .then_some(())
            });
        }
        // A fourth node is over MAX: it waits, and the running round is left alone.
        c.start(loopback_spec(3, port, nodes, FAST, 1), plain);
        thread::sleep(Duration::from_secs(3));
        while let Ok(r) = c.rx.try_recv() {
            assert!(
                !matches!(r, Report::Round(..) | Report::Event(..)),
                "redundant node disturbed the job: {r:?}"
            );
        }
        c.finish(&[0, 1, 2]);
        let e = c.wait_for(
            Duration::from_secs(20),
            "redundant node closed",
            |r| match r {
                Report::Error(3, e) => Some(e.clone()),
                _ => None,
            },
        );
        assert!(e.contains("closed"), "{e}");
    });
}

#[test]
fn c10d_loopback_worker_failures_restart_every_node_with_one_shared_count() {
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        let nodes = NodeRange { min: 3, max: 3 };
        let nprocs: BTreeMap<usize, usize> = [(0, 1), (1, 2), (2, 1)].into();
        let mut c = Cluster::new();
        for (&i, &n) in &nprocs {
            c.start(loopback_spec(i, port, nodes, FAST, n), plain);
        }
        c.round(0, &[0, 1, 2], Duration::from_secs(60));
        c.send(1, Cmd::Fail);
        let r1 = c.round(1, &[0, 1, 2], Duration::from_secs(60));
        check_round(&r1, &nprocs);
        assert!(r1.values().all(|a| a.restart_count == 1), "{r1:?}");
        // Two nodes fail at the same time: one restart for the job.
        c.send(0, Cmd::Fail);
        c.send(2, Cmd::Fail);
        let r2 = c.round(2, &[0, 1, 2], Duration::from_secs(60));
        assert!(r2.values().all(|a| a.restart_count == 2), "{r2:?}");
        c.pongs(2, &[1, 2], Duration::from_secs(30));
        c.finish(&[0, 1, 2]);
    });
}

#[test]
fn c10d_loopback_dead_agent_is_detected_and_survivors_continue() {
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        let nodes = NodeRange { min: 2, max: 3 };
        let mut c = Cluster::new();
        for i in 0..3 {
            let mut spec = loopback_spec(i, port, nodes, FAST, 1);
            // Agent 0 hosts the store: the one that dies must not be the host.
            spec.conf.insert("is_host".into(), (i == 0).to_string());
            c.start(spec, plain);
        }
        c.round(0, &[0, 1, 2], Duration::from_secs(60));
        let t0 = std::time::Instant::now();
        c.send(2, Cmd::Die);
        let r1 = c.round(1, &[0, 1], Duration::from_secs(30));
        let took = t0.elapsed();
        // Budget: 4 missed beats of 0.5 s, plus polling; generous for a loaded machine.
        assert!(
            took < Duration::from_secs(10),
            "survivors restarted after {took:?}"
        );
        check_round(&r1, &[(0, 1), (1, 1)].into());
        assert!(r1
            .values()
            .all(|a| a.restart_count == 0 && a.reason == RoundReason::PeerLost));
        c.pongs(1, &[1], Duration::from_secs(30));
        c.finish(&[0, 1]);
    });
}

fn static_spec(
    idx: usize,
    host: &str,
    port: u16,
    nnodes: usize,
    c: &[(&str, &str)],
    nproc: usize,
) -> AgentSpec {
    AgentSpec {
        idx,
        host: host.into(),
        port,
        nodes: NodeRange {
            min: nnodes,
            max: nnodes,
        },
        conf: conf(c),
        local_addr: None,
        nproc,
        static_rank: Some(idx),
    }
}

#[test]
fn static_loopback_heterogeneous_ranks_restart_and_timeouts() {
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        let nprocs: BTreeMap<usize, usize> = [(0, 2), (1, 3), (2, 1)].into();
        let mut c = Cluster::new();
        // Node 2 starts first: it retries connecting until node 0 hosts the store.
        for i in [2, 1, 0] {
            c.start(
                static_spec(i, "127.0.0.1", port, 3, FAST, nprocs[&i]),
                plain,
            );
        }
        let r0 = c.round(0, &[0, 1, 2], Duration::from_secs(60));
        check_round(&r0, &nprocs);
        let got: Vec<(usize, usize)> = r0.values().map(|a| (a.group_rank, a.base_rank)).collect();
        assert_eq!(got, [(0, 0), (1, 2), (2, 5)]);
        assert_eq!(
            (r0[&1].master_addr.as_str(), r0[&1].master_port),
            ("127.0.0.1", port)
        );
        c.send(2, Cmd::Fail);
        let r1 = c.round(1, &[0, 1, 2], Duration::from_secs(60));
        assert!(r1.values().all(|a| a.restart_count == 1), "{r1:?}");
        c.finish(&[0, 1, 2]);

        // Nobody hosts: the error names the endpoint after the rendezvous timeout.
        let mut c = Cluster::new();
        let p2 = free_port();
        c.start(
            static_spec(1, "127.0.0.1", p2, 2, &[("timeout", "1")], 1),
            plain,
        );
        let e = c.wait_for(Duration::from_secs(30), "unreachable error", |r| match r {
            Report::Error(1, e) => Some(e.clone()),
            _ => None,
        });
        assert!(
            e.starts_with(&format!(
                "rendezvous store 127.0.0.1:{p2} unreachable after"
            )),
            "{e}"
        );
        // The host alone: the other node never comes.
        c.start(
            static_spec(0, "127.0.0.1", p2, 2, &[("timeout", "2")], 1),
            plain,
        );
        let e = c.wait_for(Duration::from_secs(30), "timeout error", |r| match r {
            Report::Error(0, e) => Some(e.clone()),
            _ => None,
        });
        assert!(
            e.starts_with("rendezvous timed out after 2s: 1 node(s) joined, at least 2 needed"),
            "{e}"
        );
    });
}

#[test]
fn netns_static_three_hosts() {
    bounded(Duration::from_secs(120), || {
        let Some(net) = Netns::create(3) else { return };
        let net = std::sync::Arc::new(net);
        let nprocs: BTreeMap<usize, usize> = [(0, 1), (1, 2), (2, 2)].into();
        let mut c = Cluster::new();
        for i in 0..3 {
            let n = net.clone();
            c.start(
                static_spec(i, &net.addr(0), 29500, 3, FAST, nprocs[&i]),
                move |b| n.spawn_in(i, b),
            );
        }
        let r0 = c.round(0, &[0, 1, 2], Duration::from_secs(60));
        check_round(&r0, &nprocs);
        assert_eq!(r0[&2].master_addr, net.addr(0));
        c.finish(&[0, 1, 2]);
    });
}

#[test]
fn netns_c10d_kill_late_join_and_link_cut() {
    bounded(Duration::from_secs(240), || {
        let Some(net) = Netns::create(4) else { return };
        let net = std::sync::Arc::new(net);
        let nodes = NodeRange { min: 2, max: 4 };
        let ones: BTreeMap<usize, usize> = (0..4).map(|i| (i, 1)).collect();
        let spec = |i: usize| AgentSpec {
            idx: i,
            host: net.addr(0),
            port: 29400,
            nodes,
            conf: conf(FAST),
            // Default address selection: the route towards the endpoint.
            local_addr: None,
            nproc: 1,
            static_rank: None,
        };
        let mut c = Cluster::new();
        for i in 0..3 {
            let n = net.clone();
            c.start(spec(i), move |b| n.spawn_in(i, b));
        }
        let r0 = c.round(0, &[0, 1, 2], Duration::from_secs(60));
        check_round(
            &r0,
            &ones
                .iter()
                .filter(|(i, _)| **i < 3)
                .map(|(a, b)| (*a, *b))
                .collect(),
        );
        for (i, a) in &r0 {
            assert_eq!(a.group_rank, *i, "ordered by address 10.231.0.1 < .2 < .3");
        }
        assert_eq!(r0[&1].master_addr, net.addr(0));
        c.pongs(0, &[1, 2], Duration::from_secs(30));

        // Host 2's agent vanishes: hosts 0 and 1 go on as a 2-node job within the heartbeat budget.
        let t0 = std::time::Instant::now();
        c.send(2, Cmd::Die);
        let r1 = c.round(1, &[0, 1], Duration::from_secs(30));
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t0.elapsed()
        );
        check_round(&r1, &[(0, 1), (1, 1)].into());
        c.pongs(1, &[1], Duration::from_secs(30));

        // Host 3 joins late: the job grows to 3 without a charged restart.
        let n = net.clone();
        c.start(spec(3), move |b| n.spawn_in(3, b));
        let r2 = c.round(2, &[0, 1, 3], Duration::from_secs(60));
        check_round(&r2, &[(0, 1), (1, 1), (3, 1)].into());
        assert!(r2.values().all(|a| a.restart_count == 0));
        assert_eq!(r2[&3].group_rank, 2, "the newcomer follows the survivors");
        c.pongs(2, &[1, 3], Duration::from_secs(30));

        // Host 3's cable is pulled: the others detect the silence and continue.
        let t0 = std::time::Instant::now();
        net.cut(3);
        let r3 = c.round(3, &[0, 1], Duration::from_secs(30));
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t0.elapsed()
        );
        check_round(&r3, &[(0, 1), (1, 1)].into());
        c.pongs(3, &[1], Duration::from_secs(30));
        c.finish(&[0, 1]);
    });
}

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

// ---------------------------------------------------------------------------------------------
// Agents as real processes (this test binary re-executed), so that "kill the agent" is a real
// SIGKILL: the kernel closes its sockets and its heartbeats stop mid-flight.

const AGENT_ENV: &str = "RDRUN_TEST_AGENT";

/// The body of an agent process (run with `--ignored` by a parent test that sets [`AGENT_ENV`]).
/// Spec: `host|port|min|max|nproc|local_addr or -|is_host or -`. Prints `RDZV <round> <group_rank>
/// <group_world_size> <world_size> <restart_count> <master_addr>` per completed round.
#[test]
#[ignore = "entry point of the agent processes the SIGKILL tests start"]
fn agent_process_main() {
    let Ok(spec) = std::env::var(AGENT_ENV) else {
        return;
    };
    let f: Vec<&str> = spec.split('|').collect();
    let nnodes = NodeRange {
        min: f[2].parse().expect("min"),
        max: f[3].parse().expect("max"),
    };
    let rdzv_config = RdzvConfig::typed(
        RdzvBackend::C10d,
        Endpoint {
            host: f[0].into(),
            port: f[1].parse().expect("port"),
        },
        "proc",
        {
            let mut c = conf(FAST);
            if f[6] != "-" {
                c.insert("is_host".into(), f[6].into());
            }
            c
        },
        nnodes,
    )
    .expect("typed");
    let node = NodeSpec {
        nnodes,
        node_rank: 0,
        nproc_per_node: f[4].parse().expect("nproc"),
        local_addr: (f[5] != "-").then(|| f[5].to_string()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let mut rdzv = Rendezvous::start_with(&rdzv_config, node)
            .await
            .expect("start the rendezvous");
        let mut reason = RoundReason::Initial;
        loop {
            let asg = rdzv
                .rdzv
                .next_round(RoundRequest {
                    reason,
                    master_port: 1,
                })
                .await
                .expect("round");
            println!(
                "RDZV {} {} {} {} {} {}",
                asg.round,
                asg.group_rank,
                asg.group_world_size,
                asg.world_size,
                asg.restart_count,
                asg.master_addr
            );
            match rdzv.watch().await {
                RdzvEvent::Closed | RdzvEvent::StoreUnreachable(_) => return,
                _ => reason = RoundReason::Membership,
            }
        }
    });
}

/// A running agent process and the `RDZV` lines it printed.
struct AgentProc {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl AgentProc {
    /// Starts an agent process, inside namespace file `netns` if given.
    fn spawn(spec: &str, netns: Option<&str>) -> AgentProc {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([
            "--exact",
            "rendezvous::agent_process_main",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AGENT_ENV, spec)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().expect("spawn agent process");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                // libtest may print "test … ... " before the first line on the same line.
                if let Some(pos) = line.find("RDZV ") {
                    let _ = tx.send(line[pos + 5..].to_string());
                }
            }
        });
        AgentProc { child, lines: rx }
    }

    /// The next round this agent reports: `(round, group_rank, group_world_size, world_size,
    /// restart_count, master_addr)`.
    fn next_round(&self, limit: Duration) -> (u64, usize, usize, usize, u32, String) {
        let line = self.lines.recv_timeout(limit).unwrap_or_else(|e| {
            panic!(
                "no round from agent pid {} within {limit:?}: {e}",
                self.child.id()
            )
        });
        let f: Vec<&str> = line.split(' ').collect();
        (
            f[0].parse().expect("round"),
            f[1].parse().expect("group rank"),
            f[2].parse().expect("group world size"),
            f[3].parse().expect("world size"),
            f[4].parse().expect("restart count"),
            f[5].to_string(),
        )
    }

    fn sigkill(&mut self) {
        // Our own child, by pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.sigkill();
    }
}

/// Three agent processes (2:3 nodes); the third is SIGKILLed; the first two must go on as a
/// 2-node job within the heartbeat budget.
fn sigkill_scenario(specs: [String; 3], netns: [Option<String>; 3], master: &str) {
    let mut agents: Vec<AgentProc> = specs
        .iter()
        .zip(&netns)
        .map(|(s, ns)| AgentProc::spawn(s, ns.as_deref()))
        .collect();
    let mut ranks = Vec::new();
    for a in &agents {
        let (round, gr, gws, world, restarts, m) = a.next_round(Duration::from_secs(60));
        assert_eq!(
            (round, gws, world, restarts, m.as_str()),
            (0, 3, 3, 0, master)
        );
        ranks.push(gr);
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2]);
    let t0 = std::time::Instant::now();
    agents[2].sigkill();
    for a in &agents[..2] {
        let (round, _, gws, world, restarts, m) = a.next_round(Duration::from_secs(30));
        assert_eq!(
            (round, gws, world, restarts, m.as_str()),
            (1, 2, 2, 0, master)
        );
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "survivors restarted after {took:?}"
    );
    eprintln!("SIGKILL -> survivors in a new round: {took:?}");
}

#[test]
fn c10d_loopback_sigkilled_agent_process() {
    bounded(Duration::from_secs(120), || {
        let port = free_port();
        // Agent 0 hosts the store (explicit is_host): the one killed must not be the host.
        let specs =
            [0, 1, 2].map(|i| format!("127.0.0.1|{port}|2|3|1|127.0.0.{}|{}", i + 1, i == 0));
        sigkill_scenario(specs, [None, None, None], "127.0.0.1");
    });
}

#[test]
fn netns_c10d_sigkilled_agent_process() {
    bounded(Duration::from_secs(120), || {
        let Some(net) = Netns::create(3) else { return };
        let host = net.addr(0);
        let specs = [0, 1, 2].map(|_| format!("{host}|29400|2|3|1|-|-"));
        let ns = [0, 1, 2].map(|i| Some(format!("rdrun-{}-{i}", net.tag)));
        sigkill_scenario(specs, ns, &host);
    });
}

// ---------------------------------------------------------------------------------------------
// Against real PyTorch torchrun agents (from the compatibility suite's venv; skipped without it).

fn torchrun_path() -> Option<PathBuf> {
    let cache = std::env::var_os("RDRUN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdrun")))?;
    let p = cache.join("torch-venv/bin/torchrun");
    p.exists().then_some(p)
}

/// A torchrun agent waiting in a c10d rendezvous for a second node (killed on drop, by pid).
struct Torchrun(std::process::Child);

impl Torchrun {
    fn start(torchrun: &std::path::Path, port: u16, is_host: bool) -> Torchrun {
        let child = Command::new(torchrun)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                &format!("127.0.0.1:{port}"),
                "--rdzv-id",
                "job",
                "--rdzv-conf",
                &format!("is_host={},join_timeout=60", u8::from(is_host)),
                "--no-python",
                "true",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn torchrun");
        Torchrun(child)
    }
}

impl Drop for Torchrun {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn torchrun_agent_on_the_same_rendezvous_is_reported_clearly() {
    let Some(torchrun) = torchrun_path() else {
        eprintln!("SKIP: no torchrun in the torch venv (scripts/torch-venv.sh installs it)");
        return;
    };
    bounded(Duration::from_secs(180), move || {
        // rdrun hosts, torchrun joins as a client; then torchrun hosts (PyTorch's own TCPStore
        // server) and rdrun joins as a client. Either way rdrun names the problem.
        for rdrun_hosts in [true, false] {
            let port = free_port();
            let _tr = (!rdrun_hosts).then(|| Torchrun::start(&torchrun, port, true));
            let mut c = Cluster::new();
            let mut spec = loopback_spec(0, port, NodeRange { min: 2, max: 2 }, FAST, 1);
            spec.conf.insert("is_host".into(), rdrun_hosts.to_string());
            spec.conf.insert("join_timeout".into(), "90".into());
            c.start(spec, plain);
            let _tr = rdrun_hosts.then(|| Torchrun::start(&torchrun, port, false));
            let e = c.wait_for(
                Duration::from_secs(120),
                "torchrun peer error",
                |r| match r {
                    Report::Error(0, e) => Some(e.clone()),
                    _ => None,
                },
            );
            assert!(
                e.starts_with(
                    "a PyTorch torchrun agent uses this rendezvous (torch.rendezvous.job exists)"
                ),
                "rdrun hosts: {rdrun_hosts}: {e}"
            );
        }
    });
}
