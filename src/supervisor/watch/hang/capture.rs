//! Capture after a verdict: per rank, in parallel and bounded in wall time, the Python stack
//! (`py-spy dump --nonblocking`) of the rank and of its Python descendants (`children.rs`),
//! each thread's kernel wait (`wchan`, `syscall`) and the last output lines, and the store keys
//! the rank waits on (rdrun hosts the store: [`store_waits_of`] maps the store's pending waits
//! to ranks through the workers' sockets); then the suspect (`suspect.rs`), the one stderr
//! block, and `rank<R>.txt` files.
//!
//! What a capture records is in `record.rs`; running py-spy and reading its text in `pyspy.rs`.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::children::{capture_children, python_children};
use super::detector::{HangReason, Verdict};
use super::frames::describe;
use super::pyspy::run_py_spy;
pub use super::pyspy::{parse_py_spy_main_frames, StackStatus};
pub use super::record::{RankCapture, StoreWait, ThreadWait};
use super::sample::parse_stat;
use super::settings::HangMode;
use super::suspect::pick_suspects;

/// One rank to capture.
#[derive(Debug, Clone)]
pub struct CaptureTarget {
    pub rank: u32,
    pub pid: i32,
    /// The rank's last output lines, oldest first (from the output pump's tail).
    pub last_output: Vec<String>,
    /// Store keys the rank waits on (WAIT, or torch's blocking get), oldest first.
    pub store_waits: Vec<StoreWait>,
}

/// How to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// `--py-spy` / `$RDRUN_PY_SPY`, tried first.
    pub py_spy: Option<PathBuf>,
    /// The PATH to search for `py-spy` (production: rdrun's `PATH`, read by the config).
    pub search_path: Option<OsString>,
    /// Bound of the whole capture.
    pub timeout: Duration,
    /// Bound of one py-spy run.
    pub tool_timeout: Duration,
    /// Procfs root (`/proc`).
    pub proc_root: PathBuf,
}

impl CaptureOptions {
    /// Options from the settings and this process's PATH.
    pub fn from_settings(s: &super::settings::HangSettings) -> Self {
        CaptureOptions {
            py_spy: s.py_spy.clone(),
            search_path: s.search_path.clone(),
            timeout: s.capture_timeout,
            tool_timeout: s.tool_timeout.min(s.capture_timeout),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// The capture's result: what to print, put in the report, and write to files.
#[derive(Debug, Clone)]
pub struct HangReport {
    pub verdict: Verdict,
    pub ranks: Vec<RankCapture>,
    pub suspects: Vec<u32>,
    /// Why those ranks are suspects ("not in a collective", ...); empty without suspects.
    pub suspect_reason: String,
    pub duration: Duration,
    /// Where [`HangReport::write_files`] put the per-rank files.
    pub files_dir: Option<PathBuf>,
}

/// Directories the worker's python was started from: the directory of `argv[0]` when it names
/// a path (a venv's `bin/`; `/proc/<pid>/exe` resolves the venv symlink away), then the
/// directory of `/proc/<pid>/exe`.
pub fn worker_bin_dirs(proc_root: &Path, pid: i32) -> Vec<PathBuf> {
    let base = proc_root.join(pid.to_string());
    let mut dirs = Vec::new();
    if let Ok(cmdline) = fs::read(base.join("cmdline")) {
        let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        let argv0 = Path::new(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(argv0));
        if argv0.components().count() > 1 {
            let full = if argv0.is_absolute() {
                argv0.to_path_buf()
            } else {
                fs::read_link(base.join("cwd"))
                    .unwrap_or_default()
                    .join(argv0)
            };
            if let Some(d) = full.parent() {
                dirs.push(d.to_path_buf());
            }
        }
    }
    if let Some(d) = fs::read_link(base.join("exe"))
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Finds py-spy: the explicit path, then `search_path`, then in the worker's bin directories
/// ([`worker_bin_dirs`]: a venv's `bin/`, where `pip install py-spy` puts it).
pub fn find_py_spy(
    explicit: Option<&Path>,
    search_path: Option<&OsStr>,
    worker_dirs: &[PathBuf],
) -> Result<PathBuf, String> {
    let is_exe = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if let Some(p) = explicit {
        return if is_exe(p) {
            Ok(p.to_path_buf())
        } else {
            Err(format!("py-spy {} is not an executable file", p.display()))
        };
    }
    if let Some(path) = search_path {
        for dir in std::env::split_paths(path) {
            let c = dir.join("py-spy");
            if is_exe(&c) {
                return Ok(c);
            }
        }
    }
    for dir in worker_dirs {
        let c = dir.join("py-spy");
        if is_exe(&c) {
            return Ok(c);
        }
    }
    Err("py-spy not found (set --py-spy or RDRUN_PY_SPY, or pip install py-spy)".to_string())
}

fn read_threads(root: &Path, pid: i32) -> Vec<ThreadWait> {
    let task = root.join(pid.to_string()).join("task");
    let mut tids: Vec<i32> = fs::read_dir(&task)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    // Main thread (tid == pid) first.
    tids.sort_by_key(|&t| t != pid);
    tids.into_iter()
        .map(|tid| {
            let dir = task.join(tid.to_string());
            let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
            let wchan = read("wchan")
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty() && w != "0");
            let syscall = read("syscall").and_then(|s| s.split_whitespace().next()?.parse().ok());
            ThreadWait {
                tid,
                name: read("comm")
                    .map(|c| c.trim().to_string())
                    .unwrap_or_default(),
                state: read("stat")
                    .as_deref()
                    .and_then(parse_stat)
                    .map(|s| s.state),
                wchan,
                // -1 = not in a syscall (running).
                syscall: syscall.filter(|&n: &i64| n >= 0),
            }
        })
        .collect()
}

async fn capture_rank(t: CaptureTarget, opts: CaptureOptions) -> RankCapture {
    let dirs = worker_bin_dirs(&opts.proc_root, t.pid);
    let root = opts.proc_root.clone();
    let pid = t.pid;
    let kids = tokio::task::spawn_blocking(move || python_children(&root, pid))
        .await
        .unwrap_or_default();
    let bin = find_py_spy(opts.py_spy.as_deref(), opts.search_path.as_deref(), &dirs);
    // The rank and its children at once: the rank's bound is one tool run, not one per child.
    let ((stack_status, stack), children) = match &bin {
        Ok(bin) => {
            tokio::join!(
                run_py_spy(bin, t.pid, opts.tool_timeout),
                capture_children(Some(bin), &kids, opts.tool_timeout)
            )
        }
        Err(why) => (
            (StackStatus::Unavailable(why.clone()), String::new()),
            Vec::new(),
        ),
    };
    let main_frames = if stack_status == StackStatus::Ok {
        parse_py_spy_main_frames(&stack)
    } else {
        Vec::new()
    };
    let root = opts.proc_root.clone();
    let pid = t.pid;
    let (state, threads) = tokio::task::spawn_blocking(move || {
        let st = fs::read_to_string(root.join(pid.to_string()).join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
            .map(|s| s.state);
        (st, read_threads(&root, pid))
    })
    .await
    .unwrap_or((None, Vec::new()));
    RankCapture {
        rank: t.rank,
        pid: t.pid,
        state,
        threads,
        stack_status,
        stack,
        main_frames,
        last_output: t.last_output,
        store_waits: t.store_waits,
        children,
    }
}

/// Captures every target in parallel; returns within `opts.timeout` (plus scheduling): a rank
/// whose capture did not finish is reported with `StackStatus::Timeout` and no thread data.
pub async fn capture(
    verdict: &Verdict,
    targets: &[CaptureTarget],
    opts: &CaptureOptions,
) -> HangReport {
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for t in targets {
        set.spawn(capture_rank(t.clone(), opts.clone()));
    }
    let mut done: Vec<RankCapture> = Vec::new();
    let deadline = tokio::time::Instant::now() + opts.timeout;
    while let Ok(Some(r)) = tokio::time::timeout_at(deadline, set.join_next()).await {
        if let Ok(c) = r {
            done.push(c);
        }
    }
    // Dropping the set aborts what is left; kill_on_drop ends their py-spy children.
    set.abort_all();
    for t in targets {
        if !done.iter().any(|c| c.rank == t.rank) {
            done.push(RankCapture {
                rank: t.rank,
                pid: t.pid,
                state: None,
                threads: Vec::new(),
                stack_status: StackStatus::Timeout,
                stack: String::new(),
                main_frames: Vec::new(),
                last_output: t.last_output.clone(),
                store_waits: t.store_waits.clone(),
                children: Vec::new(),
            });
        }
    }
    done.sort_by_key(|c| c.rank);
    let (suspects, suspect_reason) = match &verdict.reason {
        HangReason::Heartbeat { rank } => (vec![*rank], "heartbeat past its budget".to_string()),
        HangReason::FileTimer { expired } => {
            let mut ranks: Vec<u32> = expired.iter().map(|e| e.rank).collect();
            ranks.dedup();
            (ranks, "its FileTimer expired".to_string())
        }
        _ => pick_suspects(&done),
    };
    HangReport {
        verdict: verdict.clone(),
        ranks: done,
        suspects,
        suspect_reason,
        duration: started.elapsed(),
        files_dir: None,
    }
}

/// Local socket addresses of `pid`'s TCP sockets (its `fd/` links, looked up in its network
/// namespace's `net/tcp` and `net/tcp6`). IPv4-mapped IPv6 addresses come back as IPv4.
pub fn tcp_sockets_of(proc_root: &Path, pid: i32) -> Vec<std::net::SocketAddr> {
    let base = proc_root.join(pid.to_string());
    let inodes: std::collections::HashSet<u64> = fs::read_dir(base.join("fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| {
                    let l = fs::read_link(e.path()).ok()?;
                    let l = l.to_str()?;
                    l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        let Ok(text) = fs::read_to_string(base.join(table)) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (f.get(1), f.get(9)) else {
                continue;
            };
            if inode.parse::<u64>().is_ok_and(|i| inodes.contains(&i)) {
                if let Some(a) = parse_proc_net_addr(local) {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// `0100007F:1F90` (IPv4) or 32 hex digits + port (IPv6), as `/proc/net/tcp{,6}` prints them:
/// each 32-bit word of the address in host byte order.
pub fn parse_proc_net_addr(s: &str) -> Option<std::net::SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::to_ne_bytes);
    let ip: std::net::IpAddr = match addr.len() {
        8 => std::net::Ipv4Addr::from(word(addr)?).into(),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(&addr[i * 8..i * 8 + 8])?);
            }
            std::net::Ipv6Addr::from(b).to_canonical()
        }
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// Maps the store's pending waits (peer address, missing keys, since) to ranks: a wait belongs
/// to the rank one of whose sockets has the peer's address. `sockets`: each rank's local TCP
/// addresses ([`tcp_sockets_of`]).
pub fn store_waits_of(
    waits: &[crate::store::state::PendingWait],
    sockets: &[(u32, Vec<std::net::SocketAddr>)],
    now: Instant,
) -> std::collections::BTreeMap<u32, Vec<StoreWait>> {
    let canon =
        |a: std::net::SocketAddr| std::net::SocketAddr::new(a.ip().to_canonical(), a.port());
    let mut out: std::collections::BTreeMap<u32, Vec<StoreWait>> = Default::default();
    for (peer, keys, since) in waits {
        let Some(peer) = peer.map(canon) else {
            continue;
        };
        let Some((rank, _)) = sockets
            .iter()
            .find(|(_, addrs)| addrs.iter().any(|a| canon(*a) == peer))
        else {
            continue;
        };
        for k in keys {
            out.entry(*rank).or_default().push(StoreWait {
                key: String::from_utf8_lossy(k).into_owned(),
                age: now.saturating_duration_since(*since),
            });
        }
    }
    out
}

fn secs(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl HangReport {
    /// Writes `rank<R>.txt` (state, threads, stack, last output) for every rank into `dir`
    /// (created 0700 if missing) and remembers `dir` for the rendering.
    pub fn write_files(&mut self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut out = Vec::new();
        for r in &self.ranks {
            let mut s = String::new();
            let _ = writeln!(
                s,
                "rank {} pid {} state {}",
                r.rank,
                r.pid,
                r.state.map_or('?', |s| s.letter())
            );
            let _ = writeln!(s, "\nthreads (tid, name, state, wchan, syscall):");
            for t in &r.threads {
                let _ = writeln!(
                    s,
                    "  {} {} {} {} {}",
                    t.tid,
                    t.name,
                    t.state.map_or('?', |s| s.letter()),
                    t.wchan.as_deref().unwrap_or("-"),
                    t.syscall.map_or("-".to_string(), |n| n.to_string())
                );
            }
            let _ = writeln!(s, "\npython stack: {}", r.stack_status.name());
            match &r.stack_status {
                StackStatus::Unavailable(w) | StackStatus::Failed(w) => {
                    let _ = writeln!(s, "  {w}");
                }
                _ => {}
            }
            s.push_str(&r.stack);
            for c in &r.children {
                let _ = writeln!(
                    s,
                    "\nchild process {} (parent {}) python stack: {}{}",
                    c.pid,
                    c.ppid,
                    c.stack_status.name(),
                    if c.stuck() {
                        " (stuck in user code)"
                    } else {
                        ""
                    }
                );
                if let StackStatus::Unavailable(w) | StackStatus::Failed(w) = &c.stack_status {
                    let _ = writeln!(s, "  {w}");
                }
                s.push_str(&c.stack);
            }
            if !r.store_waits.is_empty() {
                let _ = writeln!(s, "\nstore waits (key, age):");
                for w in &r.store_waits {
                    let _ = writeln!(s, "  {:?} {}", w.key, secs(w.age));
                }
            }
            let _ = writeln!(s, "\nlast output:");
            for l in &r.last_output {
                let _ = writeln!(s, "  {l}");
            }
            let p = dir.join(format!("rank{}.txt", r.rank));
            fs::write(&p, s)?;
            out.push(p);
        }
        self.files_dir = Some(dir.to_path_buf());
        Ok(out)
    }

    /// The one stderr block: the hang, the budget, each rank's state and top frame, the
    /// suspect, and where the full stacks are.
    pub fn render(&self) -> String {
        let v = &self.verdict;
        let mut s = String::new();
        let what = self.what();
        // A FileTimer expiry is not a phase of the sampler's: its header names the watchdog.
        let phase = match &v.reason {
            HangReason::FileTimer { .. } => "FileTimer",
            _ => v.phase.as_str(),
        };
        let _ = writeln!(
            s,
            "[rdrun] HANG ({phase}): {what}; captured diagnostics in {:.1}s",
            self.duration.as_secs_f64()
        );
        for r in &self.ranks {
            self.render_rank(&mut s, r);
        }
        if self.suspects.is_empty() {
            let _ = writeln!(s, "[rdrun]   suspect: none identified");
        }
        if let Some(d) = &self.files_dir {
            let _ = writeln!(s, "[rdrun]   stacks: {}/rank<R>.txt", d.display());
        }
        let _ = writeln!(s, "[rdrun]   {}", self.action());
        s
    }

    /// The header's account of the hang: what was quiet (or expired) for how long.
    fn what(&self) -> String {
        let v = &self.verdict;
        match &v.reason {
            HangReason::Quiescence => format!(
                "no activity on any of {} ranks for {} (budget {})",
                v.ranks.iter().filter(|r| r.alive).count(),
                secs(v.quiet_for),
                secs(v.budget)
            ),
            HangReason::ExitSkew { exited } => format!(
                "rank(s) {exited:?} exited 0 and the others were quiet for {} (budget {})",
                secs(v.quiet_for),
                secs(v.budget)
            ),
            HangReason::Heartbeat { rank } => format!(
                "rank {rank} sent no heartbeat for {} (budget {})",
                secs(v.quiet_for),
                secs(v.budget)
            ),
            HangReason::Cluster { nodes, by } => format!(
                "no activity on any of {nodes} nodes for {} (budget {}), declared by node {by}; {} ranks on this node",
                secs(v.quiet_for),
                secs(v.budget),
                v.ranks.iter().filter(|r| r.alive).count(),
            ),
            HangReason::FileTimer { expired } => {
                let each: Vec<String> = expired
                    .iter()
                    .map(|e| format!("rank {} pid {} scope {:?}", e.rank, e.pid, e.scopes.join(",")))
                    .collect();
                format!(
                    "torch FileTimer expired ({}), {} past its expiration",
                    each.join("; "),
                    secs(v.quiet_for)
                )
            }
        }
    }

    /// One rank's lines of the block: state, top frame and suspect mark, stuck children, its
    /// last output line, the store key it waits on.
    fn render_rank(&self, s: &mut String, r: &RankCapture) {
        let view = self.verdict.ranks.iter().find(|x| x.rank == r.rank);
        let top = match (&r.stack_status, describe(&r.main_frames)) {
            (StackStatus::Ok, Some(f)) => f,
            (st, _) => format!("(stack {})", st.name()),
        };
        let _ = write!(
            s,
            "[rdrun]   rank {} pid {} {} {}",
            r.rank,
            r.pid,
            r.state.map_or('?', |s| s.letter()),
            r.main_wchan().unwrap_or("-"),
        );
        // The sampler's view of the last interval, when a sampler's verdict has one (a
        // FileTimer expiry does not: no made-up zeros).
        if let Some(x) = view {
            let _ = write!(s, " cpu {:.1}% io {}B", x.cpu_pct, x.io_bytes);
        }
        let _ = write!(s, "  {top}");
        if self.suspects.contains(&r.rank) {
            let _ = write!(s, "   <- suspect: {}", self.suspect_reason);
        }
        s.push('\n');
        // Only stuck children: idle DataLoader workers are in the rank's file.
        for c in r.children.iter().filter(|c| c.stuck()) {
            let _ = writeln!(
                s,
                "[rdrun]   rank {} child pid {} stuck in {}",
                r.rank,
                c.pid,
                describe(&c.main_frames).unwrap_or_default()
            );
        }
        if let Some(l) = r.last_output.last() {
            let _ = writeln!(s, "[rdrun]   rank {} last output: {:?}", r.rank, l);
        }
        if let Some(w) = r.store_waits.first() {
            let more = match r.store_waits.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            };
            let _ = writeln!(
                s,
                "[rdrun]   rank {} waits on store key {:?} for {}{more}",
                r.rank,
                w.key,
                secs(w.age)
            );
        }
    }

    /// What rdrun does about it: the FileTimer's signal, stopping the group, or nothing.
    fn action(&self) -> String {
        let v = &self.verdict;
        match &v.reason {
            HangReason::FileTimer { expired } => expired
                .iter()
                .map(|e| {
                    format!(
                        "sending {} to rank {} pid {} only (the process that armed the timer)",
                        e.signal, e.rank, e.pid
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ if v.action == HangMode::Kill => "stopping the worker group".to_string(),
            _ => "observe mode: workers left running".to_string(),
        }
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
