//! Per-rank activity sampling: what the detector sees of each rank at one poll.
//!
//! [`ProcSource`] is the seam between the detector and the machine; [`ProcFs`] reads `/proc`
//! (one scan of `/proc/*/stat` per poll to find every worker's descendants), tests use
//! synthetic samples. Counters are cumulative; the detector takes the deltas.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of output one rank has written, bumped by the output pump, read by the sampler.
/// Cloning shares the counter.
#[derive(Debug, Clone, Default)]
pub struct OutputCounter(Arc<AtomicU64>);

impl OutputCounter {
    pub fn new() -> Self {
        Self::default()
    }
    /// Records `n` more bytes of output.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Total bytes so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
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
pub trait ProcSource: Send {
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
}

/// Parses a stat line: the command name can hold spaces and parentheses, so fields are
/// counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // f[0] = field 3 (state), f[1] = ppid, f[11..15] = utime stime cutime cstime.
    let num = |i: usize| f.get(i)?.parse::<i64>().ok();
    Some(Stat {
        state: ProcState::from_letter(f.first()?.chars().next()?),
        ppid: num(1)? as i32,
        ticks: (num(11)? + num(12)?).max(0) as u64,
        child_ticks: (num(13)? + num(14)?).max(0) as u64,
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

/// The real sampler, reading a procfs mounted at `root` (normally `/proc`).
#[derive(Debug, Clone)]
pub struct ProcFs {
    root: PathBuf,
    ticks_per_sec: f64,
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
        ProcFs {
            root: PathBuf::from("/proc"),
            ticks_per_sec: if tck > 0 { tck as f64 } else { 100.0 },
        }
    }

    fn read(&self, pid: i32, file: &str) -> Option<String> {
        fs::read_to_string(self.root.join(pid.to_string()).join(file)).ok()
    }

    /// ppid → children over every process, from one pass over `/proc`.
    fn children_map(&self) -> (HashMap<i32, Vec<i32>>, HashMap<i32, Stat>) {
        let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
        let mut stats = HashMap::new();
        if let Ok(dir) = fs::read_dir(&self.root) {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                    continue;
                };
                if let Some(st) = self.read(pid, "stat").as_deref().and_then(parse_stat) {
                    children.entry(st.ppid).or_default().push(pid);
                    stats.insert(pid, st);
                }
            }
        }
        (children, stats)
    }
}

impl ProcSource for ProcFs {
    fn sample(&mut self, ranks: &[RankProcs]) -> Vec<RankSample> {
        let (children, stats) = self.children_map();
        ranks
            .iter()
            .map(|r| {
                let sample = stats.get(&r.pid).and_then(|root| {
                    if matches!(root.state, ProcState::Zombie | ProcState::Dead) {
                        return None;
                    }
                    let mut ticks = root.ticks + root.child_ticks;
                    let mut io = self
                        .read(r.pid, "io")
                        .as_deref()
                        .and_then(parse_io)
                        .unwrap_or(0);
                    // Walk the tree; a visited set guards against pid reuse making a cycle.
                    let mut stack = children.get(&r.pid).cloned().unwrap_or_default();
                    let mut seen = vec![r.pid];
                    while let Some(p) = stack.pop() {
                        if seen.contains(&p) {
                            continue;
                        }
                        seen.push(p);
                        if let Some(st) = stats.get(&p) {
                            ticks += st.ticks;
                        }
                        io = io.saturating_add(
                            self.read(p, "io")
                                .as_deref()
                                .and_then(parse_io)
                                .unwrap_or(0),
                        );
                        if let Some(c) = children.get(&p) {
                            stack.extend(c);
                        }
                    }
                    let traced = self
                        .read(r.pid, "status")
                        .as_deref()
                        .and_then(parse_tracer_pid)
                        .is_some_and(|t| t != 0);
                    Some(ProcSample {
                        cpu_secs: ticks as f64 / self.ticks_per_sec,
                        io_bytes: io,
                        output_bytes: r.output.get(),
                        state: root.state,
                        traced,
                    })
                });
                RankSample {
                    rank: r.rank,
                    pid: r.pid,
                    sample,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let line =
            "4182 (py (worker) 1) S 4100 4182 4100 0 -1 4194560 1 0 0 0 250 50 7 3 20 0 3 0 1 2 3";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.state, ProcState::Sleeping);
        assert_eq!(st.ppid, 4100);
        assert_eq!(st.ticks, 300);
        assert_eq!(st.child_ticks, 10);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S 0").is_none());
    }

    #[test]
    fn io_and_status_parsing() {
        let io = "rchar: 100\nwchar: 23\nsyscr: 1\nsyscw: 1\nread_bytes: 0\nwrite_bytes: 0\n";
        assert_eq!(parse_io(io), Some(123));
        assert_eq!(parse_io("rchar: 1\n"), None);
        assert_eq!(parse_tracer_pid("Name:\tx\nTracerPid:\t77\n"), Some(77));
        assert_eq!(parse_tracer_pid("Name:\tx\n"), None);
    }

    #[test]
    fn output_counter_is_shared() {
        let c = OutputCounter::new();
        let d = c.clone();
        d.add(5);
        c.add(2);
        assert_eq!(c.get(), 7);
    }

    /// A real process tree: a shell whose child burns CPU. The tree's CPU time grows although the
    /// worker itself (the shell, blocked in wait) uses none; a SIGSTOPped worker reads as exempt.
    #[test]
    fn procfs_counts_the_whole_tree_and_sees_stop() {
        use std::os::unix::process::CommandExt;
        // Own process group, so cleanup reaches the busy grandchild whatever happens.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("i=0; (while :; do i=$((i+1)); done) & wait")
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        /// Kills the whole group even when an assertion panics first.
        struct Group(i32);
        impl Drop for Group {
            fn drop(&mut self) {
                // SAFETY: plain syscall; the group is this test's own child's.
                unsafe { libc::kill(-self.0, libc::SIGKILL) };
            }
        }
        let group = Group(pid);
        let ranks = [RankProcs {
            rank: 0,
            pid,
            output: OutputCounter::new(),
        }];
        let mut fs = ProcFs::new();
        let first = fs.sample(&ranks)[0].sample.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut grew = false;
        while std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let s = fs.sample(&ranks)[0].sample.unwrap();
            if s.cpu_secs >= first.cpu_secs + 0.05 {
                // The shell itself only waits: the growth is its child's.
                let own = parse_stat(&fs.read(pid, "stat").unwrap()).unwrap();
                let own_secs = (own.ticks + own.child_ticks) as f64 / fs.ticks_per_sec;
                assert!(
                    own_secs + 0.04 < s.cpu_secs,
                    "own {own_secs} tree {}",
                    s.cpu_secs
                );
                grew = true;
                break;
            }
        }
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let mut stopped = false;
        for _ in 0..600 {
            if let Some(s) = fs.sample(&ranks)[0].sample {
                if s.exempt() {
                    stopped = true;
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        drop(group);
        child.wait().unwrap();
        assert!(grew, "tree CPU time did not grow within 60 s");
        assert!(stopped, "SIGSTOPped worker never read as exempt");
        assert!(
            fs.sample(&ranks)[0].sample.is_none(),
            "reaped worker still sampled"
        );
    }
}
