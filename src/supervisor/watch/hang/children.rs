//! A rank's child processes at a capture: its Python descendants found in `/proc` (DataLoader
//! workers, multiprocessing pools), at most [`MAX_CHILDREN`] of them, and each one's Python
//! stack (`py-spy dump`, bounded like the rank's own), so a rank stuck because one of its
//! workers is stuck shows that worker's stack under the rank.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::path::Path;
use std::time::Duration;

use super::frames::child_is_stuck;
use super::pyspy::{parse_py_spy_main_frames, run_py_spy, StackStatus};
use super::sample::parse_stat;

/// Most descendants captured per rank: a DataLoader's default worker counts stay below it, and
/// it bounds the py-spy runs one capture starts.
pub const MAX_CHILDREN: usize = 8;

/// One child process of a rank, as captured.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildCapture {
    pub pid: i32,
    /// Its parent (the rank's worker, or another descendant).
    pub ppid: i32,
    pub stack_status: StackStatus,
    /// py-spy's text dump.
    pub stack: String,
    /// Its main thread's frames, innermost first.
    pub main_frames: Vec<String>,
}

impl ChildCapture {
    /// Whether the user's code is stuck in it ([`child_is_stuck`]); an idle worker is not.
    pub fn stuck(&self) -> bool {
        child_is_stuck(&self.main_frames)
    }
}

/// `pid`'s descendants as (pid, ppid), nearest first (breadth first), at most `max`, from one
/// pass over `proc_root`'s process directories.
pub fn descendants(proc_root: &Path, pid: i32, max: usize) -> Vec<(i32, i32)> {
    let mut kids: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in fs::read_dir(proc_root).into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(st) = fs::read_to_string(e.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        {
            kids.entry(st.ppid).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut queue = VecDeque::from([pid]);
    while let Some(p) = queue.pop_front() {
        let mut children = kids.remove(&p).unwrap_or_default();
        children.sort_unstable();
        for c in children {
            if out.len() == max {
                return out;
            }
            out.push((c, p));
            queue.push_back(c);
        }
    }
    out
}

/// Whether `pid` runs a Python interpreter: its executable's name starts with `python` (a
/// forked DataLoader worker keeps its parent's). Anything else is not worth a py-spy run.
pub fn is_python(proc_root: &Path, pid: i32) -> bool {
    fs::read_link(proc_root.join(pid.to_string()).join("exe")).is_ok_and(|exe| {
        exe.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"))
    })
}

/// The rank's Python descendants to capture, as (pid, ppid); blocking (`/proc` reads).
pub fn python_children(proc_root: &Path, pid: i32) -> Vec<(i32, i32)> {
    // Non-Python descendants (a shell, `sleep`) are looked past, not counted: a larger window.
    descendants(proc_root, pid, MAX_CHILDREN * 4)
        .into_iter()
        .filter(|&(c, _)| is_python(proc_root, c))
        .take(MAX_CHILDREN)
        .collect()
}

/// Each child's stack, all in parallel, each bounded by `bound`.
pub async fn capture_children(
    py_spy: Option<&Path>,
    children: &[(i32, i32)],
    bound: Duration,
) -> Vec<ChildCapture> {
    let Some(bin) = py_spy else {
        return Vec::new();
    };
    let mut set = tokio::task::JoinSet::new();
    for (i, &(pid, ppid)) in children.iter().enumerate() {
        let bin = bin.to_path_buf();
        set.spawn(async move {
            let (stack_status, stack) = run_py_spy(&bin, pid, bound).await;
            let main_frames = if stack_status == StackStatus::Ok {
                parse_py_spy_main_frames(&stack)
            } else {
                Vec::new()
            };
            (
                i,
                ChildCapture {
                    pid,
                    ppid,
                    stack_status,
                    stack,
                    main_frames,
                },
            )
        });
    }
    let mut out: Vec<(usize, ChildCapture)> = set.join_all().await;
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    struct Kid(std::process::Child);
    impl Drop for Kid {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A shell with two sleeping children and a grandchild: every descendant is found, nearest
    /// first with its parent, and the count bound holds.
    #[test]
    fn descendants_of_a_real_tree() {
        let kid = Kid(Command::new("sh")
            .args(["-c", "sleep 300 & sh -c 'sleep 300 & wait' & wait"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap());
        let pid = kid.0.id() as i32;
        let root = Path::new("/proc");
        // Polled (bounded): the shells fork after spawn returns.
        let mut found = Vec::new();
        for _ in 0..600 {
            found = descendants(root, pid, 10);
            if found.len() >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found.iter().filter(|(_, p)| *p == pid).count(), 2);
        let inner = found.iter().find(|(_, p)| *p != pid).unwrap();
        assert!(
            found.iter().any(|(c, _)| *c == inner.1),
            "the grandchild's parent is a child: {found:?}"
        );
        assert_eq!(descendants(root, pid, 1).len(), 1);
        assert!(!is_python(root, pid), "sh is not python");
        assert!(python_children(root, pid).is_empty(), "no python below");
    }

    #[tokio::test]
    async fn without_py_spy_no_child_stacks() {
        assert!(capture_children(None, &[(1, 0)], Duration::from_secs(1))
            .await
            .is_empty());
    }
}
