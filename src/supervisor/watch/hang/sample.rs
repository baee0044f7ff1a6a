//! Per-rank activity sampling: what the detector sees of each rank at one poll.
//!
//! [`ProcSource`] is the seam between the detector and the machine; [`ProcFs`] reads `/proc`
//! (each worker's descendants found down the kernel's `children` lists, the files of known
//! processes kept open and re-read, see [`ProcFs`]), tests use synthetic samples. Counters are
//! cumulative; the detector takes the deltas.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of output one rank has written, bumped by the output pump, read by the sampler; and
/// when its first byte came (a restarted rank back in user code: `report::restart_cost::BackWatch`).
/// Cloning shares the counter.
#[derive(Debug, Clone, Default)]
pub struct OutputCounter(Arc<Counted>);

#[derive(Debug, Default)]
struct Counted {
    bytes: AtomicU64,
    first: std::sync::OnceLock<std::time::SystemTime>,
}

impl OutputCounter {
    pub fn new() -> Self {
        Self::default()
    }
    /// Records `n` more bytes of output.
    pub fn add(&self, n: u64) {
        if n > 0 && self.0.first.get().is_none() {
            let _ = self.0.first.set(std::time::SystemTime::now());
        }
        self.0.bytes.fetch_add(n, Ordering::Relaxed);
    }
    /// Total bytes so far.
    pub fn get(&self) -> u64 {
        self.0.bytes.load(Ordering::Relaxed)
    }
    /// When the first byte of output came, if one did.
    pub fn first(&self) -> Option<std::time::SystemTime> {
        self.0.first.get().copied()
    }
}

/// One rank as the agent knows it: its global rank, its worker pid and its output counter.
#[derive(Debug, Clone)]
pub struct RankProcs {
    pub rank: u32,
    pub pid: i32,
    pub output: OutputCounter,
}

/// Scheduler state of the worker's main process (`/proc/<pid>/stat` field 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcState {
    Running,
    Sleeping,
    /// Uninterruptible wait (`D`).
    DiskSleep,
    /// `T`: stopped by a signal (SIGSTOP, ^Z).
    Stopped,
    /// `t`: stopped by a tracer.
    TracingStop,
    Zombie,
    Dead,
    Other(char),
}

impl ProcState {
    pub fn from_letter(c: char) -> Self {
        match c {
            'R' => ProcState::Running,
            'S' | 'I' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            'T' => ProcState::Stopped,
            't' => ProcState::TracingStop,
            'Z' => ProcState::Zombie,
            'X' | 'x' => ProcState::Dead,
            c => ProcState::Other(c),
        }
    }
    pub fn letter(self) -> char {
        match self {
            ProcState::Running => 'R',
            ProcState::Sleeping => 'S',
            ProcState::DiskSleep => 'D',
            ProcState::Stopped => 'T',
            ProcState::TracingStop => 't',
            ProcState::Zombie => 'Z',
            ProcState::Dead => 'X',
            ProcState::Other(c) => c,
        }
    }
}

/// Cumulative counters of one rank's whole process tree at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// utime+stime of the worker and every live descendant, plus cutime+cstime of the worker
    /// (children that already exited), in seconds.
    pub cpu_secs: f64,
    /// rchar+wchar of the worker and every live descendant whose `io` is readable.
    pub io_bytes: u64,
    /// The rank's [`OutputCounter`].
    pub output_bytes: u64,
    /// State of the worker process itself.
    pub state: ProcState,
    /// `TracerPid` ≠ 0: a debugger (or py-spy in blocking mode) is attached.
    pub traced: bool,
}

impl ProcSample {
    /// Stopped or traced ranks are exempt from the quiet rule.
    pub fn exempt(&self) -> bool {
        self.traced || matches!(self.state, ProcState::Stopped | ProcState::TracingStop)
    }
}

/// One rank at one poll; `sample` is None when the worker is gone (exited or reaped).
#[derive(Debug, Clone, PartialEq)]
pub struct RankSample {
    pub rank: u32,
    pub pid: i32,
    pub sample: Option<ProcSample>,
}

/// Where samples come from.
pub trait ProcSource: Send + Sync {
    fn sample(&mut self, ranks: &[RankProcs]) -> Vec<RankSample>;
}

/// Fields of `/proc/<pid>/stat` the sampler needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    pub state: ProcState,
    pub ppid: i32,
    /// utime+stime in clock ticks.
    pub ticks: u64,
    /// cutime+cstime in clock ticks (waited-for children).
    pub child_ticks: u64,
    /// Number of threads (field 20; 0 when the line has none).
    pub threads: u64,
    /// Start time after boot in clock ticks (field 22; 0 when the line has none): with the pid,
    /// what tells one process from a later one that got the same pid.
    pub start: u64,
}

/// Parses a stat line: the command name can hold spaces and parentheses, so fields are
/// counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    parse_stat_bytes(text.as_bytes())
}

/// [`parse_stat`] on the bytes as read, without allocating.
fn parse_stat_bytes(b: &[u8]) -> Option<Stat> {
    let rest = &b[b.iter().rposition(|&c| c == b')')? + 1..];
    let mut f = rest
        .split(|c| c.is_ascii_whitespace())
        .filter(|s| !s.is_empty());
    let num = |s: Option<&[u8]>| std::str::from_utf8(s?).ok()?.parse::<i64>().ok();
    // Fields after the name, from 0: 0 = state (field 3), 1 = ppid, 11..=14 = utime stime
    // cutime cstime, 17 = num_threads, 19 = starttime.
    let state = ProcState::from_letter(*f.next()?.first()? as char);
    let ppid = num(f.next())? as i32;
    let utime = num(f.nth(9))?;
    let stime = num(f.next())?;
    let cutime = num(f.next())?;
    let cstime = num(f.next())?;
    let threads = num(f.nth(2)).unwrap_or(0).max(0) as u64;
    let start = num(f.nth(1)).unwrap_or(0).max(0) as u64;
    Some(Stat {
        state,
        ppid,
        ticks: (utime + stime).max(0) as u64,
        child_ticks: (cutime + cstime).max(0) as u64,
        threads,
        start,
    })
}

/// rchar+wchar from `/proc/<pid>/io`.
pub fn parse_io(text: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut seen = 0;
    for line in text.lines() {
        if let Some(v) = line
            .strip_prefix("rchar:")
            .or_else(|| line.strip_prefix("wchar:"))
        {
            total = total.saturating_add(v.trim().parse().ok()?);
            seen += 1;
        }
    }
    (seen == 2).then_some(total)
}

/// `TracerPid` from `/proc/<pid>/status`.
pub fn parse_tracer_pid(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Reads `file` from offset 0 into `buf` (grown as needed, never shrunk) and returns the
/// length read. procfs builds a file's content afresh on every read at offset 0, so a file
/// kept open reads like a new open. `single`: the file is one record that the kernel hands over
/// whole (`stat`, `io`, `status`), so a read shorter than the buffer is the end and saves the
/// read that would return 0; other files (`children`, one record per child) read until 0.
fn pread_all(file: &File, buf: &mut Vec<u8>, single: bool) -> io::Result<usize> {
    if buf.len() < 4096 {
        buf.resize(4096, 0);
    }
    let mut n = 0;
    loop {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => return Ok(n),
            Ok(k) => {
                n += k;
                if n == buf.len() {
                    buf.resize(2 * n, 0);
                } else if single {
                    return Ok(n);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn read_stat(file: &File, buf: &mut Vec<u8>) -> Option<Stat> {
    let n = pread_all(file, buf, true).ok()?;
    parse_stat_bytes(&buf[..n])
}

fn read_text<T>(
    file: Option<&File>,
    buf: &mut Vec<u8>,
    parse: impl Fn(&str) -> Option<T>,
) -> Option<T> {
    let n = pread_all(file?, buf, true).ok()?;
    parse(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Pushes the pids of a `children` file (space-separated) as children of `parent`.
fn push_children(text: &[u8], parent: i32, stack: &mut Vec<(i32, i32)>) {
    for word in text.split(|&c| c == b' ' || c == b'\n') {
        if let Some(pid) = std::str::from_utf8(word)
            .ok()
            .and_then(|w| w.parse::<i32>().ok())
        {
            stack.push((pid, parent));
        }
    }
}

/// The files of one process the sampler keeps open between polls. They were all opened while
/// `stat` kept reading the same process (see [`ProcFs::open`]), so none belongs to another
/// process that later got the same pid: once the process is reaped its open files read ESRCH.
#[derive(Debug)]
struct Proc {
    /// starttime at the first read: a held `stat` reading another start is not this process.
    start: u64,
    stat: File,
    io: Option<File>,
    /// Only for a rank's worker (its `TracerPid`).
    status: Option<File>,
    /// `task/<pid>/children`: the children of the main thread.
    children: Option<File>,
}

impl Proc {
    fn fds(&self) -> usize {
        1 + usize::from(self.io.is_some())
            + usize::from(self.status.is_some())
            + usize::from(self.children.is_some())
    }
    fn max_fd(&self) -> usize {
        use std::os::fd::AsRawFd;
        [
            Some(&self.stat),
            self.io.as_ref(),
            self.status.as_ref(),
            self.children.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|f| f.as_raw_fd().max(0) as usize)
        .max()
        .unwrap_or(0)
    }
}

/// What one visit read of one process.
struct Visit {
    stat: Stat,
    io: u64,
    traced: bool,
}

/// The real sampler, reading a procfs mounted at `root` (normally `/proc`).
///
/// Cost per poll, in proportion to the ranks' process trees, not to the machine: each tree is
/// walked down the kernel's per-thread `task/<tid>/children` lists, and each member's `stat`
/// and `io` (and the worker's `status`) stay open between polls and are re-read with `pread` at
/// offset 0 into one reused buffer, parsed in place: about four reads per single-threaded
/// process and no `open` once the tree is known. A process with several threads also has its
/// `task/` listed and each other thread's `children` read, since a child's parent is the thread
/// that forked it. Without `children` files (a kernel built without `CONFIG_PROC_CHILDREN`) one
/// scan of `/proc/*/stat` per poll gives the tree instead. Held descriptors are capped at a
/// quarter of the open-file soft limit, and none is kept whose number is past half of it; past
/// either a process's files are opened for the visit and closed again.
#[derive(Debug)]
pub struct ProcFs {
    root: PathBuf,
    ticks_per_sec: f64,
    /// Whether this kernel has `task/<tid>/children` files (else: the full scan).
    children_files: bool,
    /// Files kept from the last poll, by pid; each visit moves its process's files to `next`,
    /// and what is left here at the end of a poll (processes gone or left the trees) is closed.
    prev: HashMap<i32, Proc>,
    next: HashMap<i32, Proc>,
    /// Descriptors held in `prev` and `next`.
    held: usize,
    /// Caps for this poll ([`ProcFs::fd_budget`]): on `held`, and on the descriptor numbers a
    /// kept file may have (the kernel hands out the lowest free one, so a new file numbered
    /// past it means the agent already holds that many). `budget_override` replaces both in tests.
    budget: usize,
    fd_high: usize,
    budget_override: Option<(usize, usize)>,
    /// Reused between reads and polls: the read buffer, the walk's (pid, parent) stack and the
    /// pids one rank's walk has visited (a guard against cycles through a reused pid).
    buf: Vec<u8>,
    stack: Vec<(i32, i32)>,
    visited: Vec<i32>,
    /// The full scan's ppid → children, rebuilt each poll (only without `children` files).
    scan: HashMap<i32, Vec<i32>>,
    /// Files opened so far (tests check that a known tree is re-read, not reopened).
    opened: u64,
}

impl Default for ProcFs {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcFs {
    pub fn new() -> Self {
        // SAFETY: sysconf has no memory-safety preconditions.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let root = PathBuf::from("/proc");
        let me = std::process::id();
        let children_files = root.join(format!("{me}/task/{me}/children")).exists();
        ProcFs {
            root,
            ticks_per_sec: if tck > 0 { tck as f64 } else { 100.0 },
            children_files,
            prev: HashMap::new(),
            next: HashMap::new(),
            held: 0,
            budget: 0,
            fd_high: 0,
            budget_override: None,
            buf: Vec::new(),
            stack: Vec::new(),
            visited: Vec::new(),
            scan: HashMap::new(),
            opened: 0,
        }
    }

    fn read(&self, pid: i32, file: &str) -> Option<String> {
        fs::read_to_string(self.root.join(pid.to_string()).join(file)).ok()
    }

    /// How many descriptors the sampler may keep open: a quarter of the open-file soft limit
    /// (the agent also holds pipes and store connections per worker), at most 65,536; and none
    /// numbered past half the limit, so that the sampler never takes the agent's last ones.
    fn fd_budget(&self) -> (usize, usize) {
        if let Some(b) = self.budget_override {
            return b;
        }
        use nix::sys::resource::{getrlimit, Resource};
        let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(s, _)| s);
        (
            (soft / 4).min(65_536) as usize,
            (soft / 2).min(1 << 30) as usize,
        )
    }

    /// ppid → children over every process, from one pass over `/proc` (the fallback).
    fn scan_children(&mut self) {
        self.scan.clear();
        if let Ok(dir) = fs::read_dir(&self.root) {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                    continue;
                };
                if let Some(st) = self.read(pid, "stat").as_deref().and_then(parse_stat) {
                    self.scan.entry(st.ppid).or_default().push(pid);
                }
            }
        }
    }

    /// Opens a process's files. `stat` is opened first and read last: a process that still
    /// exists when its `stat` reads existed while the other files were opened, so they are its
    /// own and not those of a successor with the same pid.
    fn open(&mut self, pid: i32, worker: bool) -> Option<(Proc, Stat)> {
        let dir = self.root.join(pid.to_string());
        let stat = File::open(dir.join("stat")).ok()?;
        let io = File::open(dir.join("io")).ok();
        let children = if self.children_files {
            File::open(dir.join(format!("task/{pid}/children"))).ok()
        } else {
            None
        };
        let status = if worker {
            File::open(dir.join("status")).ok()
        } else {
            None
        };
        let st = read_stat(&stat, &mut self.buf)?;
        let p = Proc {
            start: st.start,
            stat,
            io,
            status,
            children,
        };
        self.opened += p.fds() as u64;
        Some((p, st))
    }

    /// Reads one process (`worker`: a rank's worker, whose `status` is read too) and pushes
    /// its children onto `self.stack`. None when it is gone, or when `parent` is given and the
    /// process is not its child (its pid was reused since `parent`'s list was read).
    fn visit(&mut self, pid: i32, parent: Option<i32>, worker: bool) -> Option<Visit> {
        let mut known = None;
        if let Some(p) = self.prev.remove(&pid).or_else(|| self.next.remove(&pid)) {
            match read_stat(&p.stat, &mut self.buf) {
                Some(st) if st.start == p.start => known = Some((p, st)),
                // Gone (a held file of a reaped process reads ESRCH) or not the same process.
                _ => self.held -= p.fds(),
            }
        }
        let (p, st, keep) = match known {
            Some((p, st)) => (p, st, true),
            None => {
                let (p, st) = self.open(pid, worker)?;
                let keep = self.held + p.fds() <= self.budget && p.max_fd() < self.fd_high;
                if keep {
                    self.held += p.fds();
                }
                (p, st, keep)
            }
        };
        let visit = if parent.is_some_and(|q| q != st.ppid) {
            None
        } else {
            Some(self.read_proc(pid, &p, st, worker))
        };
        if keep {
            if let Some(old) = self.next.insert(pid, p) {
                self.held -= old.fds();
            }
        }
        visit
    }

    /// The reads of one known process: io, status, children.
    fn read_proc(&mut self, pid: i32, p: &Proc, stat: Stat, worker: bool) -> Visit {
        let io = read_text(p.io.as_ref(), &mut self.buf, parse_io).unwrap_or(0);
        let traced = worker
            && match &p.status {
                Some(f) => read_text(Some(f), &mut self.buf, parse_tracer_pid),
                None => self
                    .read(pid, "status")
                    .as_deref()
                    .and_then(parse_tracer_pid),
            }
            .is_some_and(|t| t != 0);
        if !self.children_files {
            if let Some(c) = self.scan.get(&pid) {
                self.stack.extend(c.iter().map(|&c| (c, pid)));
            }
        } else {
            if let Some(n) = p
                .children
                .as_ref()
                .and_then(|f| pread_all(f, &mut self.buf, false).ok())
            {
                push_children(&self.buf[..n], pid, &mut self.stack);
            }
            if stat.threads != 1 {
                self.other_threads_children(pid, p);
            }
        }
        Visit { stat, io, traced }
    }

    /// Children forked by the threads other than the main one, from `task/<tid>/children`.
    fn other_threads_children(&mut self, pid: i32, p: &Proc) {
        let mark = self.stack.len();
        let task = self.root.join(pid.to_string()).join("task");
        let Ok(dir) = fs::read_dir(&task) else {
            return;
        };
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if tid == pid {
                continue;
            }
            let Ok(f) = File::open(task.join(format!("{tid}/children"))) else {
                continue;
            };
            self.opened += 1;
            if let Ok(n) = pread_all(&f, &mut self.buf, false) {
                push_children(&self.buf[..n], pid, &mut self.stack);
            }
        }
        // `task/` was opened by path: if the process is still there now, it was its own.
        if read_stat(&p.stat, &mut self.buf).map(|st| st.start) != Some(p.start) {
            self.stack.truncate(mark);
        }
    }

    /// One rank's tree: the worker and every live descendant.
    fn sample_rank(&mut self, r: &RankProcs) -> Option<ProcSample> {
        self.stack.clear();
        self.visited.clear();
        self.visited.push(r.pid);
        let root = self.visit(r.pid, None, true)?;
        if matches!(root.stat.state, ProcState::Zombie | ProcState::Dead) {
            return None;
        }
        let mut ticks = root.stat.ticks + root.stat.child_ticks;
        let mut io = root.io;
        // The visited list guards against pid reuse making a cycle.
        while let Some((p, parent)) = self.stack.pop() {
            if self.visited.contains(&p) {
                continue;
            }
            self.visited.push(p);
            if let Some(v) = self.visit(p, Some(parent), false) {
                ticks += v.stat.ticks;
                io = io.saturating_add(v.io);
            }
        }
        Some(ProcSample {
            cpu_secs: ticks as f64 / self.ticks_per_sec,
            io_bytes: io,
            output_bytes: r.output.get(),
            state: root.stat.state,
            traced: root.traced,
        })
    }
}

impl ProcSource for ProcFs {
    fn sample(&mut self, ranks: &[RankProcs]) -> Vec<RankSample> {
        // Last poll's files become `prev`; what this poll does not visit is closed below.
        std::mem::swap(&mut self.prev, &mut self.next);
        (self.budget, self.fd_high) = self.fd_budget();
        if !self.children_files {
            self.scan_children();
        }
        let mut out = Vec::with_capacity(ranks.len());
        for r in ranks {
            out.push(RankSample {
                rank: r.rank,
                pid: r.pid,
                sample: self.sample_rank(r),
            });
        }
        for (_, p) in self.prev.drain() {
            self.held -= p.fds();
        }
        out
    }
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
