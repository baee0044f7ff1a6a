//! Agents as real processes (this test binary re-run as one agent, `agent_process_main`):
//! one SIGKILLed mid-run on loopback and in namespaces; and a torchrun agent on the same
//! rendezvous, which must be reported clearly. A child module of `rendezvous` (its harness).

use super::*;

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
        let mut rdzv = Rendezvous::start(&rdzv_config, node)
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
            "rendezvous::procs::agent_process_main",
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
