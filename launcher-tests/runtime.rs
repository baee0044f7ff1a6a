//! Multi-process tests of the worker runtime: real processes, one per rank, joined through a
//! directory store (`RDRUN_FILE_STORE`) so they do not depend on the launcher. Every run has a
//! hard wall-clock bound; children are killed by PID on timeout.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A temp directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "rdrun-it-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One finished rank.
#[derive(Debug)]
pub struct RankResult {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

/// Starts `n` ranks of `exe` with the launcher's environment contract.
pub struct Ranks {
    kids: Vec<Child>,
    dir: PathBuf,
    started: Instant,
}

pub fn spawn_ranks(
    exe: &str,
    n: usize,
    args: &[&str],
    env: &[(&str, String)],
    run_id: &str,
    restart: u32,
    dir: &Path,
) -> Ranks {
    spawn_ranks_store(exe, n, args, env, run_id, restart, dir, None)
}

/// [`spawn_ranks`] joining through the TCP store at 127.0.0.1:`port` when given (else a
/// directory store).
#[allow(clippy::too_many_arguments)]
pub fn spawn_ranks_store(
    exe: &str,
    n: usize,
    args: &[&str],
    env: &[(&str, String)],
    run_id: &str,
    restart: u32,
    dir: &Path,
    store_port: Option<u16>,
) -> Ranks {
    let store = dir.join(format!("store-{restart}"));
    let mut kids = Vec::new();
    for r in 0..n {
        let out = std::fs::File::create(dir.join(format!("out-{restart}-{r}"))).expect("out file");
        let err = std::fs::File::create(dir.join(format!("err-{restart}-{r}"))).expect("err file");
        let mut c = Command::new(exe);
        c.args(args)
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("TORCHELASTIC_RUN_ID", run_id)
            .env("TORCHELASTIC_RESTART_COUNT", restart.to_string())
            .env("RDRUN_TIMEOUT_SECS", "30")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        match store_port {
            Some(p) => {
                c.env("MASTER_PORT", p.to_string())
                    .env_remove("RDRUN_FILE_STORE");
            }
            None => {
                c.env("MASTER_PORT", "1").env("RDRUN_FILE_STORE", &store);
            }
        }
        for (k, v) in env {
            c.env(k, v);
        }
        kids.push(c.spawn().expect("spawn rank"));
    }
    Ranks {
        kids,
        dir: dir.to_path_buf(),
        started: Instant::now(),
    }
}

impl Ranks {
    pub fn pid(&self, r: usize) -> u32 {
        self.kids[r].id()
    }

    /// Waits for every rank (killing all of them and failing the test past `bound`).
    pub fn wait(mut self, restart: u32, bound: Duration) -> Vec<RankResult> {
        let mut done: Vec<Option<(ExitStatus, Duration)>> =
            self.kids.iter().map(|_| None).collect();
        while done.iter().any(|d| d.is_none()) {
            for (r, k) in self.kids.iter_mut().enumerate() {
                if done[r].is_none() {
                    if let Ok(Some(st)) = k.try_wait() {
                        done[r] = Some((st, self.started.elapsed()));
                    }
                }
            }
            if self.started.elapsed() > bound {
                for k in self.kids.iter_mut() {
                    let _ = k.kill();
                    let _ = k.wait();
                }
                panic!(
                    "ranks did not finish within {bound:?}: {:?}",
                    self.read_all(restart)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let texts = self.read_all(restart);
        done.into_iter()
            .zip(texts)
            .map(|(d, (stdout, stderr))| {
                let (status, took) = d.expect("finished");
                RankResult {
                    status,
                    stdout,
                    stderr,
                    took,
                }
            })
            .collect()
    }

    fn read_all(&self, restart: u32) -> Vec<(String, String)> {
        (0..self.kids.len())
            .map(|r| {
                let rd = |p: String| std::fs::read_to_string(self.dir.join(p)).unwrap_or_default();
                (
                    rd(format!("out-{restart}-{r}")),
                    rd(format!("err-{restart}-{r}")),
                )
            })
            .collect()
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for k in self.kids.iter_mut() {
            if let Ok(None) = k.try_wait() {
                let _ = k.kill();
                let _ = k.wait();
            }
        }
    }
}

fn bench() -> &'static str {
    env!("CARGO_BIN_EXE_rdrun-allreduce-bench")
}

/// Segments of `run_id` still present in /dev/shm.
pub fn shm_leftovers(run_id: &str) -> Vec<String> {
    let prefix = rdrun::runtime::shm::run_shm_prefix(run_id);
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Every backend and world size 2..4 as separate processes: the bench checks the all-reduce
/// result at every size (it exits 1 on a wrong sum) and prints one row per size.
#[test]
fn multiprocess_all_reduce_tcp_and_shm() {
    for backend in ["tcp", "shm"] {
        for n in [2usize, 3, 4] {
            let dir = TempDir::new("bench");
            let run = format!("mp-{backend}-{n}-{}", std::process::id());
            let args = [
                "--backend",
                backend,
                "--min-bytes",
                "4",
                "--max-bytes",
                "4194304",
                "--iters-scale",
                "0.002",
            ];
            let res = spawn_ranks(bench(), n, &args, &[], &run, 0, &dir.0)
                .wait(0, Duration::from_secs(120));
            for (r, rr) in res.iter().enumerate() {
                assert!(rr.status.success(), "{backend} n={n} rank {r}: {rr:?}");
            }
            assert!(
                res[0]
                    .stdout
                    .contains(&format!("# backend {backend} world {n}")),
                "{}",
                res[0].stdout
            );
            let rows = res[0]
                .stdout
                .lines()
                .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .count();
            assert_eq!(rows, 11, "{}", res[0].stdout);
            assert!(shm_leftovers(&run).is_empty(), "shm segment left behind");
        }
    }
}

/// The bench launching itself (no launcher, no store server) works end to end.
#[test]
fn bench_self_launch() {
    let out = Command::new(bench())
        .args([
            "--nproc",
            "2",
            "--max-bytes",
            "65536",
            "--json",
            "--iters-scale",
            "0.01",
        ])
        .env_remove("RANK")
        .output()
        .expect("run bench");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    // 4 KiB, 16 KiB, 64 KiB.
    assert_eq!(
        text.lines().filter(|l| l.starts_with('{')).count(),
        3,
        "{text}"
    );
    assert!(text.contains("\"world\":2"), "{text}");
}

/// A crash (SIGKILL) after setup leaves no shared-memory file: rank 0 unlinks the segment as
/// soon as every rank has mapped it. The launcher-side sweep removes setup-time leftovers.
#[test]
fn shm_cleanup_after_kill_and_sweep() {
    let dir = TempDir::new("shmkill");
    let run = format!("shmkill-{}", std::process::id());
    let args = [
        "--backend",
        "shm",
        "--min-bytes",
        "4096",
        "--max-bytes",
        "4096",
        "--iters-scale",
        "1000",
    ];
    let ranks = spawn_ranks(bench(), 2, &args, &[], &run, 0, &dir.0);
    // Wait until the group is up (rank 0 prints its header), then kill rank 1.
    let t = Instant::now();
    while !std::fs::read_to_string(dir.0.join("out-0-0"))
        .unwrap_or_default()
        .contains("# backend")
    {
        assert!(t.elapsed() < Duration::from_secs(60), "group never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = ranks.pid(1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill rank 1");
    let res = ranks.wait(0, Duration::from_secs(60));
    assert!(
        !res[0].status.success(),
        "rank 0 must fail when rank 1 dies"
    );
    assert!(
        res[0].took < Duration::from_secs(30),
        "bounded: {:?}",
        res[0].took
    );
    assert!(
        res[0].stderr.contains("peer rank 1"),
        "error names the dead peer: {}",
        res[0].stderr
    );
    assert!(shm_leftovers(&run).is_empty());
    // A leftover from a crash during setup is removed by the sweep.
    let p = rdrun::runtime::shm::segment_path(&run, 3, "x");
    std::fs::write(&p, b"stale").expect("write fake segment");
    assert_eq!(rdrun::runtime::cleanup_run_shm(&run).expect("sweep"), 1);
    assert!(!p.exists());
}

/// The real path: ranks join through rdrun's TCPStore server (`init_from_env` with
/// MASTER_ADDR/MASTER_PORT), for every backend.
#[test]
fn ranks_join_through_the_tcp_store() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = rt.block_on(async {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        rdrun::store::server::StoreServer::start(l, rdrun::store::server::ServerConfig::default())
            .expect("start store")
    });
    let port = server.port();
    for (backend, n) in [("tcp", 3usize), ("shm", 4), ("auto", 2)] {
        let dir = TempDir::new("tcpstore");
        let run = format!("tcpstore-{backend}-{}", std::process::id());
        let args = [
            "--backend",
            backend,
            "--max-bytes",
            "65536",
            "--iters-scale",
            "0.01",
        ];
        let res = spawn_ranks_store(bench(), n, &args, &[], &run, 0, &dir.0, Some(port))
            .wait(0, Duration::from_secs(120));
        for (r, rr) in res.iter().enumerate() {
            assert!(rr.status.success(), "{backend} rank {r}: {rr:?}");
        }
        let want = if backend == "auto" { "shm" } else { backend };
        assert!(
            res[0]
                .stdout
                .contains(&format!("# backend {want} world {n}")),
            "{}",
            res[0].stdout
        );
    }
    rt.block_on(server.shutdown());
}

/// No store at MASTER_ADDR:MASTER_PORT: a one-line error within the timeout, not a hang.
#[test]
fn missing_store_is_a_bounded_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let dir = TempDir::new("nostore");
    let res = spawn_ranks_store(
        bench(),
        1,
        &["--max-bytes", "4096"],
        &[("RDRUN_TIMEOUT_SECS", "2".to_string())],
        "nostore",
        0,
        &dir.0,
        Some(port),
    )
    .wait(0, Duration::from_secs(60));
    assert!(!res[0].status.success());
    assert!(
        res[0].stderr.contains("rank 0: init: store"),
        "{}",
        res[0].stderr
    );
    assert!(res[0].took < Duration::from_secs(30), "{:?}", res[0].took);
}
