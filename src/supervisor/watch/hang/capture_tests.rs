//! Unit tests of `capture.rs` (in a file of their own: they run real tools and print why a step
//! was skipped, which the library itself never does).

use super::*;
use crate::supervisor::watch::hang::detector::{Phase, RankView};
use crate::supervisor::watch::hang::sample::ProcState;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

fn verdict(ranks: &[(u32, i32)]) -> Verdict {
    Verdict {
        reason: HangReason::Quiescence,
        phase: Phase::Steady,
        quiet_for: Duration::from_secs(900),
        budget: Duration::from_secs(900),
        action: HangMode::Kill,
        ranks: ranks
            .iter()
            .map(|&(rank, pid)| RankView {
                rank,
                pid,
                alive: true,
                exempt: false,
                state: Some(ProcState::Sleeping),
                cpu_pct: 0.4,
                io_bytes: 0,
                quiet_for: Duration::from_secs(900),
                exit_code: None,
            })
            .collect(),
    }
}

use crate::supervisor::watch::hang::suspect::tests::rc;

/// A FileTimer expiry's block: the watchdog in the header, the timer's rank, pid and scope,
/// no sampler figures (there are none), the expired rank as the suspect, and the action is
/// the timer's signal to that process alone.
#[test]
fn file_timer_block_names_the_timer_and_its_signal() {
    use crate::supervisor::watch::hang::detector::TimerExpiry;
    let v = Verdict {
        reason: HangReason::FileTimer {
            expired: vec![TimerExpiry {
                rank: 1,
                pid: 101,
                scopes: vec!["train/step".into()],
                signal: "SIGKILL".into(),
            }],
        },
        phase: Phase::Steady,
        quiet_for: Duration::from_secs(1),
        budget: Duration::ZERO,
        action: HangMode::Kill,
        ranks: vec![],
    };
    let ranks = vec![rc(1, &["<module> (train.py:34)"], "hrtimer_nanosleep")];
    let rep = HangReport {
        verdict: v,
        ranks,
        suspects: vec![1],
        suspect_reason: "its FileTimer expired".to_string(),
        duration: Duration::from_millis(300),
        files_dir: None,
    };
    let block = rep.render();
    let lines: Vec<&str> = block.lines().collect();
    assert_eq!(
            lines[0],
            "[rdrun] HANG (FileTimer): torch FileTimer expired (rank 1 pid 101 scope \"train/step\"), 1s past its expiration; captured diagnostics in 0.3s",
            "{block}"
        );
    assert!(
        lines[1]
            .starts_with("[rdrun]   rank 1 pid 101 S hrtimer_nanosleep  <module> (train.py:34)")
            && lines[1].ends_with("<- suspect: its FileTimer expired"),
        "{block}"
    );
    assert!(
        !block.contains(" cpu "),
        "no made-up sampler figures: {block}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("[rdrun]   sending SIGKILL to rank 1 pid 101 only (the process that armed the timer)"),
        "{block}"
    );
}

/// The capture names the expired ranks as suspects whatever their stacks look like.
#[tokio::test]
async fn file_timer_capture_suspects_the_expired_rank() {
    use crate::supervisor::watch::hang::detector::TimerExpiry;
    let v = Verdict {
        reason: HangReason::FileTimer {
            expired: vec![TimerExpiry {
                rank: 3,
                pid: i32::MAX - 7,
                scopes: vec!["s".into()],
                signal: "SIGTERM".into(),
            }],
        },
        phase: Phase::Steady,
        quiet_for: Duration::ZERO,
        budget: Duration::ZERO,
        action: HangMode::Kill,
        ranks: vec![],
    };
    let targets = [CaptureTarget {
        rank: 3,
        pid: i32::MAX - 7,
        last_output: vec![],
        store_waits: vec![],
    }];
    let rep = capture(&v, &targets, &opts(None)).await;
    assert_eq!(rep.suspects, vec![3]);
    assert_eq!(rep.suspect_reason, "its FileTimer expired");
}

const DUMP: &str = "Process 4183: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n\
Thread 4190 (idle): \"Thread-1\"\n    wait (threading.py:320)\n\
Thread 4183 (idle): \"MainThread\"\n    all_reduce (torch/distributed/distributed_c10d.py:4181)\n    train_step (train.py:88)\n    <module> (train.py:95)\n";

#[test]
fn py_spy_text_main_thread_frames() {
    let f = parse_py_spy_main_frames(DUMP);
    assert_eq!(
        f[0],
        "all_reduce (torch/distributed/distributed_c10d.py:4181)"
    );
    assert_eq!(f.len(), 3);
    assert!(parse_py_spy_main_frames("").is_empty());
}

#[test]
fn proc_net_addresses_and_wait_mapping() {
    let v4 = parse_proc_net_addr("0100007F:1F90").unwrap();
    #[cfg(target_endian = "little")]
    assert_eq!(v4, "127.0.0.1:8080".parse().unwrap());
    let v6 = parse_proc_net_addr("0000000000000000FFFF00000100007F:0050").unwrap();
    #[cfg(target_endian = "little")]
    assert_eq!(
        v6,
        "127.0.0.1:80".parse().unwrap(),
        "v4-mapped comes back as v4"
    );
    assert!(parse_proc_net_addr("zz:1").is_none());
    let now = Instant::now();
    let peer: std::net::SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
    let waits = vec![
        (Some(peer), vec![b"/ready/1".to_vec()], now),
        (None, vec![], now),
    ];
    let socks = vec![
        (0, vec!["127.0.0.1:5000".parse().unwrap()]),
        (1, vec!["127.0.0.1:5001".parse().unwrap()]),
    ];
    let m = store_waits_of(&waits, &socks, now + Duration::from_secs(3));
    assert_eq!(m.len(), 1);
    assert_eq!(m[&0][0].key, "/ready/1");
    assert_eq!(m[&0][0].age, Duration::from_secs(3));
}

/// This process's own connected socket is found through /proc.
#[test]
fn own_tcp_socket_is_found() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let mine = c.local_addr().unwrap();
    let found = tcp_sockets_of(Path::new("/proc"), std::process::id() as i32);
    assert!(found.contains(&mine), "{mine} not in {found:?}");
}

#[test]
fn py_spy_lookup_order() {
    let tmp = tempdir("lookup");
    let dir = tmp.path().to_path_buf();
    let bin = dir.join("bin");
    fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("py-spy");
    fs::write(&exe, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let dirs = [dir.clone(), bin.clone()];
    // In the worker's bin directories.
    assert_eq!(find_py_spy(None, Some(OsStr::new("")), &dirs).unwrap(), exe);
    // On PATH.
    assert_eq!(find_py_spy(None, Some(bin.as_os_str()), &[]).unwrap(), exe);
    // Explicit, and an explicit one that is missing is an error naming it.
    assert_eq!(find_py_spy(Some(&exe), None, &[]).unwrap(), exe);
    let e = find_py_spy(Some(&dir.join("nope")), Some(bin.as_os_str()), &[]).unwrap_err();
    assert!(e.contains("nope"), "{e}");
    assert!(find_py_spy(None, Some(OsStr::new("/nonexistent")), &[]).is_err());

    // argv[0]'s directory comes first: a child started by absolute path.
    let kid = sleeper_at(Path::new("/bin/sleep"));
    // Polled (bounded): right after spawn the child may not have finished its exec.
    let pid = kid.0.id() as i32;
    let mut d = Vec::new();
    for _ in 0..600 {
        d = worker_bin_dirs(Path::new("/proc"), pid);
        if d.first().map(PathBuf::as_path) == Some(Path::new("/bin")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        d.first().map(PathBuf::as_path),
        Some(Path::new("/bin")),
        "{d:?}"
    );
    drop(kid);
}

/// A scratch directory, removed when the returned guard drops.
fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("rdrun-hang-{tag}-"))
        .tempdir()
        .unwrap()
}

/// Runs a freshly written script once with a probe argument, retrying while another test
/// thread's fork still holds the write descriptor (ETXTBSY), so the real run cannot hit it.
fn settle_exec(p: &Path) {
    for _ in 0..200 {
        match std::process::Command::new(p)
            .arg("probe")
            .stdin(Stdio::null())
            .status()
        {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => {
                r.unwrap();
                return;
            }
        }
    }
    panic!("{} stayed busy", p.display());
}

struct Kid(std::process::Child);
impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Kid {
    sleeper_at(Path::new("sleep"))
}

fn sleeper_at(p: &Path) -> Kid {
    Kid(std::process::Command::new(p)
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .unwrap())
}

/// Waits (bounded) until the child sleeps in the kernel, so the /proc reads are meaningful.
fn wait_sleeping(pid: i32) {
    for _ in 0..600 {
        let st = fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        if st.as_deref().and_then(parse_stat).map(|s| s.state) == Some(ProcState::Sleeping) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("child {pid} never slept");
}

fn opts(py_spy: Option<PathBuf>) -> CaptureOptions {
    CaptureOptions {
        py_spy,
        search_path: Some(OsString::new()),
        timeout: Duration::from_secs(20),
        tool_timeout: Duration::from_secs(10),
        proc_root: PathBuf::from("/proc"),
    }
}

#[tokio::test]
async fn real_sleeping_child_without_py_spy() {
    let kid = sleeper();
    let pid = kid.0.id() as i32;
    wait_sleeping(pid);
    let targets = [CaptureTarget {
        rank: 0,
        pid,
        last_output: vec!["epoch 3 step 1200".into()],
        store_waits: vec![],
    }];
    let mut rep = capture(&verdict(&[(0, pid)]), &targets, &opts(None)).await;
    let r = &rep.ranks[0];
    assert!(
        matches!(r.stack_status, StackStatus::Unavailable(_)),
        "{:?}",
        r.stack_status
    );
    assert_eq!(r.state, Some(ProcState::Sleeping));
    assert_eq!(r.threads.len(), 1);
    assert_eq!(r.threads[0].tid, pid);
    assert_eq!(r.threads[0].name, "sleep");
    // sleep(1) waits in clock_nanosleep (230) or nanosleep (35) on x86_64.
    #[cfg(target_arch = "x86_64")]
    assert!(
        matches!(r.threads[0].syscall, Some(230) | Some(35)),
        "{:?}",
        r.threads[0]
    );
    let tmp = tempdir("files");
    let dir = tmp.path().to_path_buf();
    let files = rep.write_files(&dir).unwrap();
    let text = fs::read_to_string(&files[0]).unwrap();
    assert!(
        text.contains(&format!("rank 0 pid {pid} state S")),
        "{text}"
    );
    assert!(
        text.contains("python stack: unavailable") && text.contains("epoch 3 step 1200"),
        "{text}"
    );
    let block = rep.render();
    assert!(
        block.starts_with(
            "[rdrun] HANG (steady): no activity on any of 1 ranks for 15m00s (budget 15m00s)"
        ),
        "{block}"
    );
    assert!(
        block.contains("(stack unavailable)")
            && block.contains("last output: \"epoch 3 step 1200\""),
        "{block}"
    );
    assert!(
        block.contains(&format!("stacks: {}/rank<R>.txt", dir.display())),
        "{block}"
    );
}

/// A stand-in py-spy (a shell script) exercises the real subprocess path, the parsing and
/// the suspect; a second one that never ends proves the capture is bounded.
#[tokio::test]
async fn fake_py_spy_output_and_bound() {
    let tmp = tempdir("fake");
    let dir = tmp.path().to_path_buf();
    let dump_file = dir.join("dump.txt");
    fs::write(&dump_file, DUMP).unwrap();
    let good = dir.join("good");
    fs::write(
            &good,
            format!(
                "#!/bin/sh\n[ \"$1 $2 $3\" = \"dump --nonblocking --pid\" ] || exit 3\nsed \"s/4183/$4/\" '{}'\n",
                dump_file.display()
            ),
        )
        .unwrap();
    let slow = dir.join("slow");
    fs::write(
        &slow,
        "#!/bin/sh\n[ \"$1\" = dump ] || exit 0\nexec sleep 300\n",
    )
    .unwrap();
    for p in [&good, &slow] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
        settle_exec(p);
    }
    let (a, b) = (sleeper(), sleeper());
    let (pa, pb) = (a.0.id() as i32, b.0.id() as i32);
    let targets = [
        CaptureTarget {
            rank: 0,
            pid: pa,
            last_output: vec![],
            store_waits: vec![],
        },
        CaptureTarget {
            rank: 1,
            pid: pb,
            last_output: vec![],
            store_waits: vec![],
        },
    ];
    let rep = capture(
        &verdict(&[(0, pa), (1, pb)]),
        &targets,
        &opts(Some(good.clone())),
    )
    .await;
    for r in &rep.ranks {
        assert_eq!(r.stack_status, StackStatus::Ok, "{:?}", r);
        assert_eq!(
            r.top_frame(),
            Some("all_reduce (torch/distributed/distributed_c10d.py:4181)")
        );
        assert!(
            r.stack.contains(&format!("Thread {} (idle)", r.pid)),
            "{}",
            r.stack
        );
    }
    assert!(rep.suspects.is_empty(), "identical ranks: no suspect");
    assert!(rep.render().contains("suspect: none identified"));

    let mut o = opts(Some(slow));
    o.tool_timeout = Duration::from_millis(500);
    let t = Instant::now();
    let rep = capture(&verdict(&[(0, pa), (1, pb)]), &targets, &o).await;
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "capture not bounded: {:?}",
        t.elapsed()
    );
    assert!(rep
        .ranks
        .iter()
        .all(|r| r.stack_status == StackStatus::Timeout));
    // The /proc part still ran.
    assert!(rep.ranks.iter().all(|r| !r.threads.is_empty()));
}

/// The real py-spy, when this machine has one (`RDRUN_PY_SPY` or PATH); skipped, saying so,
/// otherwise. When py-spy sits next to a python, that python runs the worker by absolute
/// path and the lookup must find py-spy from the worker alone.
#[tokio::test]
async fn real_py_spy_on_a_python_child_when_available() {
    let found = find_py_spy(
        std::env::var_os("RDRUN_PY_SPY").as_deref().map(Path::new),
        std::env::var_os("PATH").as_deref(),
        &[],
    );
    let Ok(py_spy) = found else {
        eprintln!("SKIPPED real_py_spy_on_a_python_child_when_available: py-spy absent");
        return;
    };
    let beside = py_spy.with_file_name("python3");
    let (python, explicit) = if beside.exists() {
        (beside, None)
    } else {
        (PathBuf::from("python3"), Some(py_spy.clone()))
    };
    let script = "import time\ndef inner_wait():\n    time.sleep(300)\ndef train_step():\n    inner_wait()\nprint('ready', flush=True)\ntrain_step()\n";
    let mut child = std::process::Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let kid = Kid(child);
    let pid = kid.0.id() as i32;
    assert_eq!(line.trim(), "ready");
    wait_sleeping(pid);
    let targets = [CaptureTarget {
        rank: 1,
        pid,
        last_output: vec![],
        store_waits: vec![],
    }];
    let rep = capture(&verdict(&[(1, pid)]), &targets, &opts(explicit)).await;
    let r = &rep.ranks[0];
    if let StackStatus::Failed(why) = &r.stack_status {
        // No ptrace rights here (Yama, containers): recorded, never fatal. Say so loudly.
        eprintln!("SKIPPED stack assertions: py-spy failed: {why}");
        return;
    }
    assert_eq!(r.stack_status, StackStatus::Ok, "{:?}", r.stack_status);
    assert!(
        r.top_frame().unwrap().starts_with("inner_wait ("),
        "{:?}",
        r.main_frames
    );
    assert!(
        r.main_frames.iter().any(|f| f.starts_with("train_step (")),
        "{:?}",
        r.main_frames
    );
    assert!(rep.render().contains("inner_wait ("));
}
