//! Network hosts for the multi-node tests: network namespaces (`scripts/netns.sh`) joined by a
//! bridge, each simulated host a thread that entered its namespace with `setns(CLONE_NEWNET)`,
//! so every socket it opens lives on that host; [`Netns`] removes every namespace, link and
//! process it made when dropped, also on panic, and reaps what a killed earlier run left
//! behind. [`bounded`] runs a test body under a wall-clock bound. Namespace tests need root and
//! iproute2; where either is missing they print why and pass without running (CI runs as root
//! and must run them).

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
    pub(crate) tag: String,
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
