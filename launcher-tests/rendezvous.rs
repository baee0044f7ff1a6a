//! Multi-node rendezvous over real sockets: several agents on loopback (127.0.0.x) and on
//! separate network hosts ([`crate::netns::Netns`]); agents as threads driven by the test, as
//! processes SIGKILLed mid-run, and beside a torchrun agent on the same rendezvous.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::netns::{bounded, Netns};
use rdrun::rendezvous::addr;

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
    let mut rdzv = match Rendezvous::start(&rdzv_config, node).await {
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

mod procs;
mod scale;
