//! Unit tests of `sample.rs` (in a file of their own: they run real tools and print why a step
//! was skipped, which the library itself never does).

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

#[test]
fn stat_parsing_reads_threads_and_start_time() {
    let st = parse_stat(
        "4182 (py (worker) 1) S 4100 4182 4100 0 -1 4194560 1 0 0 0 250 50 7 3 20 0 3 0 1234 2 3",
    )
    .unwrap();
    assert_eq!((st.threads, st.start), (3, 1234));
    // The line of a real process: one thread (this test's `sleep`), started after boot.
    let mut child = Command::new("sleep").arg("100").spawn().unwrap();
    let text = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let st = parse_stat(&text).unwrap();
    assert_eq!(st.ppid, std::process::id() as i32);
    assert_eq!(st.threads, 1);
    assert!(st.start > 0, "{text}");
}

/// Kills a whole process group on drop, even when an assertion panics first.
struct Group(i32);
impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: plain syscall; the group is this test's own child's.
        unsafe { libc::kill(-self.0, libc::SIGKILL) };
    }
}

/// A shell in its own group with a tree below it, killed (and reaped) on drop.
struct Tree {
    child: std::process::Child,
    _group: Group,
}
impl Tree {
    fn spawn(script: &str) -> Tree {
        use std::os::unix::process::CommandExt;
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        Tree {
            child,
            _group: Group(pid),
        }
    }
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    fn rank(&self) -> [RankProcs; 1] {
        [RankProcs {
            rank: 0,
            pid: self.pid(),
            output: OutputCounter::new(),
        }]
    }
}
impl Drop for Tree {
    fn drop(&mut self) {
        // SAFETY: plain syscall on the test's own child's group.
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn comm(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn sorted(v: &[i32]) -> Vec<i32> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v
}

/// The descriptors `held` counts are the ones the kept entries hold.
fn check_held(fs: &ProcFs) {
    assert!(fs.prev.is_empty());
    assert_eq!(fs.held, fs.next.values().map(Proc::fds).sum::<usize>());
}

/// Until `f` holds or 60 s pass; returns whether it held.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// The walk down the `children` files finds the same tree as the full scan of `/proc`:
/// children and grandchildren (a DataLoader-style worker below a subshell), their I/O
/// counted; a known tree is re-read through its open files, not reopened; an exited
/// grandchild and its exited parent drop out, their files closed.
#[test]
fn children_walk_matches_the_full_scan_and_drops_the_exited() {
    let mut fs = ProcFs::new();
    if !fs.children_files {
        eprintln!("no task/<tid>/children files on this kernel: walk not tested");
        return;
    }
    // sh ─┬─ sleep                  (child)
    //     ├─ sh ── sleep            (subshell with a grandchild)
    //     └─ sh ─┬─ cat /dev/zero   (grandchild, blocked writing a full pipe: I/O)
    //            └─ sleep
    let tree =
        Tree::spawn("sleep 1000 & (sleep 1001 & wait) & (cat /dev/zero | sleep 1002) & wait");
    let ranks = tree.rank();
    let mut scan = ProcFs::new();
    scan.children_files = false;
    let mut members = Vec::new();
    let mut io = 0;
    let settled = eventually(|| {
        io = fs.sample(&ranks)[0].sample.unwrap().io_bytes;
        members = sorted(&fs.visited);
        scan.sample(&ranks);
        let names: Vec<String> = members.iter().map(|&p| comm(p)).collect();
        names.iter().filter(|n| *n == "sleep").count() == 3
            && names.iter().any(|n| n == "cat")
            && members == sorted(&scan.visited)
            && io >= 65_536
    });
    assert!(
        settled,
        "walk {members:?} scan {:?} io {io}",
        sorted(&scan.visited)
    );
    assert_eq!(members.len(), 7, "{members:?}");
    check_held(&fs);
    // sleep 1001 is a grandchild (its parent is the subshell, not the worker).
    let grandchild = *members
        .iter()
        .find(|&&p| {
            comm(p) == "sleep" && {
                let st = parse_stat(&fs.read(p, "stat").unwrap()).unwrap();
                st.ppid != tree.pid() && fs.read(p, "cmdline").unwrap().contains("1001")
            }
        })
        .expect("sleep 1001 below its subshell");
    let subshell = parse_stat(&fs.read(grandchild, "stat").unwrap())
        .unwrap()
        .ppid;
    assert!(fs.next.contains_key(&grandchild));

    // A steady tree opens nothing.
    let opened = fs.opened;
    fs.sample(&ranks);
    assert_eq!(members, sorted(&fs.visited));
    assert_eq!(fs.opened, opened, "a known tree was reopened");

    // SAFETY: plain syscall on a process of this test's own tree.
    unsafe { libc::kill(grandchild, libc::SIGKILL) };
    let dropped = eventually(|| {
        fs.sample(&ranks);
        !fs.visited.contains(&grandchild) && !fs.visited.contains(&subshell)
    });
    assert!(dropped, "exited processes still walked: {:?}", fs.visited);
    assert_eq!(fs.visited.len(), 5, "{:?}", fs.visited);
    assert!(!fs.next.contains_key(&grandchild) && !fs.next.contains_key(&subshell));
    check_held(&fs);
    drop(tree);
    assert!(fs.sample(&ranks)[0].sample.is_none());
    assert!(fs.next.is_empty(), "files of a finished rank kept");
    check_held(&fs);
}

/// A child forked by a thread other than the main one is listed under that thread's
/// `task/<tid>/children`, not the process's: the walk lists the threads.
#[test]
fn children_of_other_threads_are_found() {
    let mut fs = ProcFs::new();
    if !fs.children_files {
        eprintln!("no task/<tid>/children files on this kernel: walk not tested");
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // The thread that forks stays alive while the test looks, so the child stays its.
    let forker = std::thread::spawn(move || {
        let mut child = Command::new("sleep").arg("1000").spawn().unwrap();
        tx.send(child.id() as i32).unwrap();
        let _ = done_rx.recv();
        child.kill().unwrap();
        child.wait().unwrap();
    });
    let child = rx.recv().unwrap();
    let me = std::process::id() as i32;
    let main_list = fs.read(me, &format!("task/{me}/children")).unwrap();
    assert!(
        !main_list.split_whitespace().any(|p| p == child.to_string()),
        "the child is the main thread's: {main_list}"
    );
    let ranks = [RankProcs {
        rank: 0,
        pid: me,
        output: OutputCounter::new(),
    }];
    fs.sample(&ranks);
    let found = fs.visited.contains(&child);
    done_tx.send(()).unwrap();
    forker.join().unwrap();
    assert!(found, "child {child} of a non-main thread not walked");
    check_held(&fs);
}

/// A held entry whose process no longer reads as the one it was opened for (another start
/// time) is dropped and the pid's files opened afresh; a pid whose stat names another parent
/// than the one whose list it came from (a pid reused meanwhile) is not counted.
#[test]
fn start_time_and_parent_guard_against_reused_pids() {
    let tree = Tree::spawn("sleep 1000 & wait");
    let ranks = tree.rank();
    let mut fs = ProcFs::new();
    let mut child = 0;
    assert!(
        eventually(|| {
            fs.sample(&ranks);
            child = fs.visited.get(1).copied().unwrap_or(0);
            fs.visited.len() == 2 && comm(child) == "sleep"
        }),
        "{:?}",
        fs.visited
    );
    let cpu = fs.sample(&ranks)[0].sample.unwrap().cpu_secs;
    // Pretend the held entry belongs to an earlier process that had this pid.
    let real = fs.next[&child].start;
    fs.next.get_mut(&child).unwrap().start = real + 1;
    let opened = fs.opened;
    let s = fs.sample(&ranks)[0].sample.unwrap();
    assert_eq!(fs.next[&child].start, real, "stale entry kept");
    assert!(fs.opened > opened, "pid's files not reopened");
    assert_eq!(fs.visited.iter().filter(|&&p| p == child).count(), 1);
    assert!(s.cpu_secs >= cpu);
    check_held(&fs);
    // This test process is nobody's child in the tree: given as the worker's child, it is
    // rejected by its ppid, and with it everything below it.
    let me = std::process::id() as i32;
    fs.stack.clear();
    assert!(fs.visit(me, Some(tree.pid()), false).is_none());
    assert!(fs.stack.is_empty());
    assert!(fs.visit(child, Some(tree.pid()), false).is_some());
}

/// What the held files rely on: once a process is reaped, a file of it opened before reads
/// an error, never the process that gets its pid next.
#[test]
fn held_file_of_a_reaped_process_reads_an_error() {
    let mut child = Command::new("sleep").arg("1000").spawn().unwrap();
    let f = File::open(format!("/proc/{}/stat", child.id())).unwrap();
    let mut buf = Vec::new();
    assert!(read_stat(&f, &mut buf).is_some());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(pread_all(&f, &mut buf, true).is_err());
}

/// With no descriptors to spare (none left in the budget, or new ones numbered past the
/// cap) every file is opened for the visit and closed: the same tree, nothing held.
#[test]
fn over_the_descriptor_budget_nothing_is_held() {
    let tree = Tree::spawn("(sleep 1000 & wait) & wait");
    let ranks = tree.rank();
    let mut held = ProcFs::new();
    let mut none = ProcFs::new();
    none.budget_override = Some((0, usize::MAX));
    let mut high = ProcFs::new();
    high.budget_override = Some((usize::MAX, 3));
    assert!(
        eventually(|| {
            held.sample(&ranks);
            none.sample(&ranks);
            high.sample(&ranks);
            held.visited.len() == 3
                && sorted(&held.visited) == sorted(&none.visited)
                && sorted(&held.visited) == sorted(&high.visited)
        }),
        "{:?} {:?} {:?}",
        held.visited,
        none.visited,
        high.visited
    );
    for fs in [&none, &high] {
        assert!(fs.next.is_empty() && fs.held == 0);
    }
    // stat, io (and children) of each, and the worker's status.
    let per = 2 + usize::from(held.children_files);
    assert_eq!(held.held, 3 * per + 1);
    check_held(&held);
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
