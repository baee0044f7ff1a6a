//! rdrun's view of the process table: one `/proc` line as the stop logic needs it, the tree of
//! a process, and rdrun's own tree — which leaves out the children rdrun inherited and every
//! process of rdrun's own session (it signals only what it started). Used by the stop, the
//! leftover check and the watchdog; kept apart from `worker.rs` so that the watchdog, which
//! `worker.rs` registers process groups with, does not import the spawner back.

/// One line of /proc as the stop logic needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    /// Session id: every worker leads a session of its own, so nothing a worker started can be
    /// in rdrun's session (see [`own_tree`]).
    pub sid: i32,
    /// State `Z`: already dead, waiting to be reaped.
    pub zombie: bool,
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid pgrp …` (proc(5)); comm may hold spaces and
/// parentheses, so the fields are read after the last `)`.
pub fn parse_stat(line: &str) -> Option<ProcEntry> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let mut fields = line.get(close + 1..)?.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgid = fields.next()?.parse().ok()?;
    let sid = fields.next()?.parse().ok()?;
    Some(ProcEntry {
        pid,
        ppid,
        pgid,
        sid,
        zombie: state == "Z" || state == "X",
    })
}

/// Every process visible in /proc (processes that vanish during the scan are skipped).
pub fn scan_procs() -> Vec<ProcEntry> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .collect()
}

/// The processes below `root` (its children, their children, …), zombies included.
///
/// Walks `/proc/<pid>/task/<tid>/children` (proc(5), Linux ≥ 3.5 with CONFIG_PROC_CHILDREN), so
/// the cost follows the size of rdrun's own tree, not of the machine's process table; falls back
/// to a full `/proc` scan where that file does not exist.
pub fn scan_tree(root: i32) -> Vec<ProcEntry> {
    let probe = format!("/proc/{root}/task/{root}/children");
    if std::fs::metadata(&probe).is_err() {
        let procs = scan_procs();
        let below = descendants_all(root, &procs);
        return procs
            .into_iter()
            .filter(|p| below.contains(&p.pid))
            .collect();
    }
    let mut out: Vec<ProcEntry> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.filter_map(|t| t.ok()) {
            let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
                continue;
            };
            for pid in children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if out.iter().any(|p| p.pid == pid) {
                    continue;
                }
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
                if let Some(entry) = stat.as_deref().and_then(parse_stat) {
                    out.push(entry);
                    frontier.push(pid);
                }
            }
        }
    }
    out
}

/// rdrun's children before it spawned anything (see [`note_inherited`]).
static INHERITED: std::sync::OnceLock<Vec<i32>> = std::sync::OnceLock::new();

/// Records the children this process has before it spawns any (issue 24.3): a shell that execs
/// rdrun leaves it the children it had, e.g. the `logger` of `rdrun … > >(logger)`. They are
/// not rdrun's to signal, count as left behind or kill when it dies. Call it first thing.
pub fn note_inherited() -> &'static [i32] {
    INHERITED.get_or_init(|| {
        let me = std::process::id() as i32;
        scan_tree(me)
            .into_iter()
            .filter(|p| p.ppid == me)
            .map(|p| p.pid)
            .collect()
    })
}

/// The processes below `root` that rdrun started: [`scan_tree`] without `root`'s own session
/// (workers lead sessions of their own and nothing can join another session, so a process in
/// it is one rdrun inherited or a descendant of one) and without the `inherited` pids and their
/// descendants (an inherited process may have made a session of its own).
pub fn own_tree(root: i32, inherited: &[i32]) -> Vec<ProcEntry> {
    // SAFETY: plain syscall; a pid that is gone gives -1, which matches no session.
    let sid = unsafe { libc::getsid(root) };
    let tree = scan_tree(root);
    let mut skip = inherited.to_vec();
    // A helper is rdrun's child leading its own session; a pid of the list that no longer
    // looks like that was reused after the helper died, and is not skipped.
    let helpers = helpers();
    skip.extend(
        tree.iter()
            .filter(|p| helpers.contains(&p.pid) && p.ppid == root && p.sid == p.pid)
            .map(|p| p.pid),
    );
    filter_own(tree, sid, &skip)
}

/// rdrun's own long-lived helper processes that outlive attempts (the warm-start template):
/// never part of an attempt's tree, so a stop does not signal them and a finished attempt
/// does not count them as left behind. The watchdog (a fork taken before any helper exists)
/// does not see this list, so a killed rdrun's helpers are still killed.
static HELPERS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// Adds a helper (see [`HELPERS`]).
pub fn note_helper(pid: i32) {
    let mut h = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
    if !h.contains(&pid) {
        h.push(pid);
    }
}

/// Removes a helper that ended.
pub fn forget_helper(pid: i32) {
    HELPERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

fn helpers() -> Vec<i32> {
    HELPERS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The pure part of [`own_tree`].
fn filter_own(tree: Vec<ProcEntry>, root_sid: i32, inherited: &[i32]) -> Vec<ProcEntry> {
    let mut foreign: Vec<i32> = tree
        .iter()
        .filter(|p| p.sid == root_sid || inherited.contains(&p.pid))
        .map(|p| p.pid)
        .collect();
    // Descendants of foreign processes, whatever order the scan listed them in.
    loop {
        let more: Vec<i32> = tree
            .iter()
            .filter(|p| !foreign.contains(&p.pid) && foreign.contains(&p.ppid))
            .map(|p| p.pid)
            .collect();
        if more.is_empty() {
            break;
        }
        foreign.extend(more);
    }
    tree.into_iter()
        .filter(|p| !foreign.contains(&p.pid))
        .collect()
}

/// Pids of every descendant of `root` in `procs`, zombies included.
fn descendants_all(root: i32, procs: &[ProcEntry]) -> Vec<i32> {
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent && p.pid != root) {
            if !out.contains(&p.pid) {
                out.push(p.pid);
                frontier.push(p.pid);
            }
        }
    }
    out
}

/// `/proc/<pid>/cmdline` with spaces between arguments and secret-looking values masked
/// (`redact.rs`) (`[comm]` for a process without one,
/// `?` when it is gone).
///
/// A live process in the middle of `execve` has an empty command line for a moment (its new
/// memory is in place before its arguments are): it is read again for up to 50 ms, so that
/// the process is named by the command it is becoming rather than by `[comm]`. A zombie (no
/// memory at all) is named by `[comm]` at once.
pub(crate) fn command_line(pid: i32) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
    loop {
        match std::fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(raw) if !raw.is_empty() => {
                // Every line rdrun writes with a command line goes through here: secrets are
                // masked at the source (issue 38 item 8).
                return crate::supervisor::report::redact::redacted_cmdline(
                    &String::from_utf8_lossy(&raw),
                );
            }
            Ok(_) if !is_zombie(pid) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            _ => {
                return match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
                    Ok(comm) => format!("[{}]", comm.trim_end()),
                    Err(_) => "?".to_string(),
                }
            }
        }
    }
}

/// Whether `pid` is a zombie (or gone): state `Z`/`X` in `/proc/<pid>/stat`.
fn is_zombie(pid: i32) -> bool {
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => match stat.iter().rposition(|b| *b == b')') {
            Some(i) => matches!(stat.get(i + 2), Some(b'Z' | b'X')),
            None => true,
        },
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing() {
        let e = parse_stat("42 (my (odd) name) S 7 42 41 0 -1 4194560").unwrap();
        assert_eq!(
            e,
            ProcEntry {
                pid: 42,
                ppid: 7,
                pgid: 42,
                sid: 41,
                zombie: false
            }
        );
        assert!(parse_stat("43 (z) Z 1 43 43").unwrap().zombie);
        assert_eq!(parse_stat("44 (short) S 1 44"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn tree_scan_sees_own_children() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let me = std::process::id() as i32;
        let pid = child.id() as i32;
        let tree = scan_tree(me);
        let _ = child.kill();
        let _ = child.wait();
        let entry = tree.iter().find(|p| p.pid == pid).expect("child in tree");
        assert_eq!(entry.ppid, me);
        assert!(!entry.zombie);
    }

    #[test]
    fn descendant_walk() {
        let p = |pid, ppid, zombie| ProcEntry {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            zombie,
        };
        let procs = [
            p(1, 0, false),
            p(10, 1, false),
            p(11, 10, false),
            p(12, 11, false),
            p(13, 10, true),
            p(20, 1, false),
        ];
        let mut d = descendants_all(10, &procs);
        d.sort();
        assert_eq!(d, vec![11, 12, 13]);
        assert!(descendants_all(20, &procs).is_empty());
    }

    /// Issue 24.3: what rdrun inherited (in its session, or named at start) is not its own,
    /// nor is anything below it; a worker's tree is, also where a member made a new session.
    #[test]
    fn own_tree_leaves_out_inherited_processes() {
        let p = |pid, ppid, sid| ProcEntry {
            pid,
            ppid,
            pgid: pid,
            sid,
            zombie: false,
        };
        // rdrun is 1 in session 100; 2 a logger from its shell; 3 its child in another session;
        // 5 an inherited process that made a session of its own, 6 its child; 10 a worker
        // (session 10) with child 11 and 12, which made session 12.
        let tree = vec![
            p(6, 5, 5),
            p(2, 1, 100),
            p(3, 2, 3),
            p(5, 1, 5),
            p(10, 1, 10),
            p(11, 10, 10),
            p(12, 11, 12),
        ];
        let mut own: Vec<i32> = filter_own(tree, 100, &[5])
            .into_iter()
            .map(|p| p.pid)
            .collect();
        own.sort();
        assert_eq!(own, vec![10, 11, 12]);
    }

    #[test]
    fn own_command_line() {
        let me = std::process::id() as i32;
        let line = command_line(me);
        assert!(!line.is_empty() && !line.contains('\0'), "{line}");
        assert_eq!(command_line(-1), "?");
    }

    /// A zombie has no command line: it is named by `[comm]`, without the wait meant for a
    /// process in the middle of exec.
    #[test]
    fn a_zombie_is_named_by_its_comm() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_zombie(pid) {
            assert!(std::time::Instant::now() < deadline, "true never exited");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(command_line(pid), "[true]");
        child.wait().expect("reap true");
    }
}
