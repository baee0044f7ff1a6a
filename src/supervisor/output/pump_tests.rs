//! Tests of the forwarding pump (`pump.rs`): partial lines and prompts, kills, pipes closed
//! early, pipes held open by a process that outlived the worker.

use super::super::testutil::{id, Scratch, TB};
use super::*;
use std::fs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn last_lines_keep_the_newest_few_and_cut_long_ones() {
    let l = LastLines::default();
    for i in 0..8 {
        l.push(format!("line {i}").as_bytes());
    }
    let got = l.snapshot();
    assert_eq!(got.len(), LAST_LINES);
    assert_eq!(got.first().map(String::as_str), Some("line 3"));
    assert_eq!(got.last().map(String::as_str), Some("line 7"));
    l.push(&[b'x'; 1000]);
    assert_eq!(l.snapshot().last().unwrap().len(), LAST_LINE_CHARS);
}

/// A read's last lines reach `LastLines` once per read, oldest first, cut as before; a read
/// with fewer lines keeps the older reads' newest ones before them.
#[test]
fn read_tail_hands_over_each_reads_last_lines() {
    let l = LastLines::default();
    let mut t = ReadTail::default();
    for i in 0..12 {
        t.push(format!("a{i}").as_bytes());
    }
    t.publish(&l);
    assert_eq!(l.snapshot(), ["a7", "a8", "a9", "a10", "a11"]);
    t.publish(&l);
    assert_eq!(l.snapshot().len(), LAST_LINES, "an empty read adds nothing");
    t.push(&"é".repeat(1000).into_bytes());
    t.push(b"b1");
    t.publish(&l);
    let got = l.snapshot();
    assert_eq!(got[..3], ["a9", "a10", "a11"]);
    assert_eq!(
        got[3],
        "é".repeat(LAST_LINE_CHARS),
        "cut at the same chars as before"
    );
    assert_eq!(got[4], "b1");
}

/// An in-memory console stream.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);
impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
impl Buf {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("lock")).into_owned()
    }
}

fn console() -> (Console, Buf, Buf) {
    let (out, err) = (Buf::default(), Buf::default());
    let c = Console::new(Box::new(out.clone()), Box::new(err.clone())).expect("console");
    (c, out, err)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs `forward_to` over real pipes fed by `write(stdout_w, stderr_w)` on a thread.
fn run_forward(
    console: Console,
    ident: RankIdentity,
    sink: RankSink,
    write: impl FnOnce(File, File) + Send + 'static,
) -> OutputSummary {
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
    let writer = std::thread::spawn(move || write(File::from(out_w), File::from(err_w)));
    let summary = rt().block_on(async {
        let h = forward_to(console, ident, sink, out_r, err_r, None);
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("forward finished in time")
            .expect("forward task")
    });
    writer.join().expect("writer thread");
    summary
}

fn plain() -> RankSink {
    RankSink {
        stdout_console: true,
        stderr_console: true,
        prefix: Some("[default0]:".into()),
        ..RankSink::default()
    }
}

#[test]
fn forward_plain_console_unprefixed_with_last_line() {
    let (c, out, err) = console();
    let s = run_forward(c, id(0), plain(), |mut o, mut e| {
        o.write_all(b"hello\nwor").expect("w");
        o.write_all(b"ld\nno newline").expect("w");
        e.write_all(b"err1\n").expect("w");
        e.write_all(TB.as_bytes()).expect("w");
        e.write_all(b"partial").expect("w");
    });
    assert_eq!(out.text(), "hello\nworld\nno newline\n");
    assert_eq!(err.text(), format!("err1\n{TB}partial\n"));
    assert_eq!(s.stderr_tail.first().map(String::as_str), Some("err1"));
    assert_eq!(s.stderr_tail.last().map(String::as_str), Some("partial"));
    assert_eq!(
        s.traceback.expect("tb").last().map(String::as_str),
        Some("ValueError: bad value")
    );
}

#[test]
fn forward_tee_redirect_and_filters() {
    let scratch = Scratch::new();
    let f = |n: &str| scratch.0.join(n);
    for n in ["out.log", "err.log", "filtered.log"] {
        File::create(f(n)).expect("create");
    }
    let (c, out, err) = console();
    // stdout tee'd (file + console, prefixed, filtered); stderr redirected (file only).
    let sink = RankSink {
        stdout_file: Some(f("out.log")),
        stderr_file: Some(f("err.log")),
        stdout_console: true,
        stderr_console: false,
        prefix: Some("[0|vm]".into()),
        filtered_stdout: Some(f("filtered.log")),
        stdout_filters: vec!["loss".into()],
        ..RankSink::default()
    };
    let s = run_forward(c, id(0), sink, |mut o, mut e| {
        o.write_all(b"step 1 loss=3\r\nstep 2\nloss tail")
            .expect("w");
        e.write_all(b"warn\nlast").expect("w");
    });
    assert_eq!(
        out.text(),
        "[0|vm]step 1 loss=3\r\n[0|vm]step 2\n[0|vm]loss tail\n"
    );
    assert_eq!(err.text(), "");
    assert_eq!(
        fs::read(f("out.log")).expect("r"),
        b"step 1 loss=3\r\nstep 2\nloss tail"
    );
    assert_eq!(fs::read(f("err.log")).expect("r"), b"warn\nlast");
    assert_eq!(
        fs::read_to_string(f("filtered.log")).expect("r"),
        "[0|vm]step 1 loss=3\r\n[0|vm]loss tail\n"
    );
    // The stderr tail is kept even when stderr goes only to a file.
    assert_eq!(s.stderr_tail, vec!["warn", "last"]);
}

#[test]
fn forward_filtered_out_rank_still_writes_files() {
    let scratch = Scratch::new();
    let path = scratch.0.join("out.log");
    let (c, out, err) = console();
    let sink = RankSink {
        stdout_file: Some(path.clone()),
        stdout_console: false,
        stderr_console: false,
        prefix: Some("[default1]:".into()),
        ..RankSink::default()
    };
    run_forward(c, id(1), sink, |mut o, mut e| {
        o.write_all(b"a\nb\n").expect("w");
        e.write_all(b"dropped\n").expect("w");
    });
    assert_eq!(out.text(), "");
    assert_eq!(err.text(), "");
    assert_eq!(fs::read(&path).expect("r"), b"a\nb\n");
}

#[test]
fn forward_long_line_in_pieces() {
    let (c, out, _) = console();
    let n = MAX_LINE * 2 + 10;
    run_forward(c, id(0), plain(), move |mut o, _e| {
        let line = vec![b'z'; n];
        for chunk in line.chunks(7777) {
            o.write_all(chunk).expect("w");
        }
        o.write_all(b"\nend\n").expect("w");
    });
    let text = out.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[0].len(), MAX_LINE);
    assert_eq!(lines[1].len(), MAX_LINE);
    assert_eq!(lines[2].len(), 10);
    assert_eq!(lines[3], "end");
}

#[test]
fn ranks_never_interleave_mid_line() {
    let (c, out, _) = console();
    const RANKS: usize = 4;
    const LINES: usize = 2000;
    let handles = rt().block_on(async {
        let mut handles = Vec::new();
        let mut writers = Vec::new();
        for r in 0..RANKS {
            let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
            let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
            handles.push(forward_to(c.clone(), id(r), plain(), out_r, err_r, None));
            writers.push(std::thread::spawn(move || {
                let mut o = File::from(out_w);
                drop(err_w);
                // Lines written in odd-sized pieces so that reads end mid-line.
                let mut all = Vec::new();
                for i in 0..LINES {
                    all.extend_from_slice(
                        format!("rank{r}-line{i}-{}\n", "x".repeat(i % 50)).as_bytes(),
                    );
                }
                for piece in all.chunks(97) {
                    o.write_all(piece).expect("w");
                }
            }));
        }
        let mut done = Vec::new();
        for h in handles {
            done.push(
                tokio::time::timeout(Duration::from_secs(120), h)
                    .await
                    .expect("in time")
                    .expect("task"),
            );
        }
        for w in writers {
            w.join().expect("writer");
        }
        done
    });
    assert_eq!(handles.len(), RANKS);
    let text = out.text();
    let mut next = [0usize; RANKS];
    for line in text.lines() {
        let (r, rest) = line
            .strip_prefix("rank")
            .and_then(|l| l.split_once("-line"))
            .unwrap_or_else(|| panic!("mangled line {line:?}"));
        let r: usize = r.parse().expect("rank");
        let i = next[r];
        assert_eq!(
            rest,
            format!("{i}-{}", "x".repeat(i % 50)),
            "rank {r} line {i}"
        );
        next[r] += 1;
    }
    assert_eq!(next, [LINES; RANKS]);
}

#[test]
fn forward_stops_on_request_with_open_pipes() {
    let (c, out, err) = console();
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
    // The write ends stay open (an escaped grandchild holds them).
    let mut o = File::from(out_w);
    let mut e = File::from(err_w);
    o.write_all(b"a\nparti").expect("w");
    e.write_all(b"oops\n").expect("w");
    let summary = rt().block_on(async {
        let (tx, rx) = watch::channel(false);
        let h = forward_to(c, id(0), plain(), out_r, err_r, Some(rx));
        tx.send(true).expect("send");
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("stopped in time")
            .expect("task")
    });
    assert_eq!(out.text(), "a\nparti\n");
    assert_eq!(err.text(), "oops\n");
    assert_eq!(summary.stderr_tail, vec!["oops"]);
    drop((o, e));
}

#[test]
fn forward_reads_a_non_pipe_fd() {
    let scratch = Scratch::new();
    let path = scratch.0.join("in");
    fs::write(&path, "from a file\n").expect("w");
    let (c, out, _) = console();
    let summary = rt().block_on(async {
        let o = OwnedFd::from(File::open(&path).expect("open"));
        let e = OwnedFd::from(File::open("/dev/null").expect("open"));
        tokio::time::timeout(
            Duration::from_secs(60),
            forward_to(c, id(0), plain(), o, e, None),
        )
        .await
        .expect("in time")
        .expect("task")
    });
    assert_eq!(out.text(), "from a file\n");
    assert!(summary.stderr_tail.is_empty());
}

/// Waits (bounded) until `buf` shows `want`.
fn wait_for_text(buf: &Buf, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while buf.text() != want {
        assert!(
            std::time::Instant::now() < deadline,
            "console shows {:?}, want {want:?}",
            buf.text()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn prompt_without_newline_is_shown_before_its_rest() {
    let (c, out, _) = console();
    let sink = RankSink {
        stdout_console: true,
        stderr_console: true,
        prefix: None,
        ..RankSink::default()
    };
    let seen = out.clone();
    run_forward(c, id(0), sink, move |mut o, _e| {
        o.write_all(b"line\nName? ").expect("w");
        // The worker waits for input: its prompt must reach the console first.
        wait_for_text(&seen, "line\nName? ");
        o.write_all(b"(y/n) ").expect("w");
        wait_for_text(&seen, "line\nName? (y/n) ");
        o.write_all(b"bob\nnext\n").expect("w");
    });
    // The continuation is written as is: no prefix, no added newline.
    assert_eq!(out.text(), "line\nName? (y/n) bob\nnext\n");
}

#[test]
fn tee_prompt_continues_unprefixed() {
    let scratch = Scratch::new();
    let file = scratch.0.join("out.log");
    File::create(&file).expect("create");
    let (c, out, _) = console();
    let sink = RankSink {
        stdout_file: Some(file.clone()),
        stdout_console: true,
        prefix: Some("[default0]:".into()),
        ..RankSink::default()
    };
    let seen = out.clone();
    run_forward(c, id(0), sink, move |mut o, _e| {
        o.write_all(b"(Pdb) ").expect("w");
        wait_for_text(&seen, "[default0]:(Pdb) ");
        o.write_all(b"done\nlast").expect("w");
    });
    assert_eq!(out.text(), "[default0]:(Pdb) done\n[default0]:last\n");
    assert_eq!(fs::read(&file).expect("r"), b"(Pdb) done\nlast");
}

/// A console stream that fails with EPIPE after `ok` bytes.
struct Closed {
    ok: usize,
    written: Arc<Mutex<Vec<u8>>>,
}
impl Write for Closed {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let mut v = self.written.lock().expect("lock");
        if v.len() >= self.ok {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        v.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn closed_console_closes_console_only_pipes() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let scratch = Scratch::new();
    let file = scratch.0.join("out.log");
    File::create(&file).expect("create");
    let written = Arc::new(Mutex::new(Vec::new()));
    let closed = Closed {
        ok: 1,
        written: written.clone(),
    };
    let c = Console::new(Box::new(closed), Box::new(Buf::default())).expect("console");
    // Worker 0 writes to the console only: it gets SIGPIPE as under torchrun. Worker 1 is
    // tee'd: its file keeps everything and it runs to its end.
    // Killed (by PID) and reaped if the test fails half-way.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let spawn = |script: &str| {
        let mut child = Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let o = OwnedFd::from(child.stdout.take().expect("stdout"));
        let e = OwnedFd::from(child.stderr.take().expect("stderr"));
        (Reap(child), o, e)
    };
    let (mut w0, o0, e0) = spawn("while :; do echo spam; done");
    let (mut w1, o1, e1) = spawn("i=0; while [ $i -lt 3000 ]; do echo l$i; i=$((i+1)); done");
    let tee = RankSink {
        stdout_file: Some(file.clone()),
        stdout_console: true,
        stderr_console: true,
        prefix: Some("[default1]:".into()),
        ..RankSink::default()
    };
    rt().block_on(async {
        let h0 = forward_to(c.clone(), id(0), plain(), o0, e0, None);
        let h1 = forward_to(c.clone(), id(1), tee, o1, e1, None);
        for h in [h0, h1] {
            tokio::time::timeout(Duration::from_secs(60), h)
                .await
                .expect("forwarding ended in time")
                .expect("task");
        }
    });
    let kill_bound = |child: &mut std::process::Child| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "worker still running");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert_eq!(kill_bound(&mut w0.0).signal(), Some(libc::SIGPIPE));
    assert!(kill_bound(&mut w1.0).success());
    let logged = fs::read_to_string(&file).expect("read");
    assert_eq!(logged.lines().count(), 3000);
    assert!(logged.ends_with("l2999\n"));
}

/// A console stream that takes its time with every write (a slow terminal).
#[derive(Clone, Default)]
struct SlowBuf(Buf);
impl Write for SlowBuf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        std::thread::sleep(Duration::from_millis(3));
        self.0.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The worker ended (its processes are gone) long before a slow console took what it wrote:
/// everything still in the pipe is forwarded, however long that takes, and nothing is given up
/// (issue 24: the pipe used to be read "for what is there" with a zero timeout, then closed on a
/// clock while the reader was behind).
#[test]
fn ended_worker_with_a_reader_far_behind_loses_nothing() {
    use std::os::fd::AsRawFd;
    let out = SlowBuf::default();
    let c = Console::new(Box::new(out.clone()), Box::new(Buf::default())).expect("console");
    let (out_r, out_w) = nix::unistd::pipe().expect("pipe");
    let (err_r, err_w) = nix::unistd::pipe().expect("pipe");
    drop(err_w);
    // Room for all of it, so the worker can write everything and exit before rdrun reads.
    // SAFETY: fcntl on a pipe fd we own.
    let size = unsafe { libc::fcntl(out_w.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    assert!(size >= 1 << 19, "cannot grow the pipe: {size}");
    const LINES: usize = 3000;
    let mut o = File::from(out_w);
    let mut want = Vec::new();
    for i in 0..LINES {
        let line = format!("line {i} {}", "y".repeat(i % 90));
        o.write_all(format!("{line}\n").as_bytes()).expect("w");
        want.push(line);
    }
    o.write_all(b"last without newline").expect("w");
    want.push("last without newline".into());
    drop(o);
    rt().block_on(async {
        let (tx, rx) = watch::channel(true);
        let h = forward_to(c, id(0), plain(), out_r, err_r, Some(rx));
        tokio::time::timeout(Duration::from_secs(120), h)
            .await
            .expect("forwarded in time")
            .expect("task");
        drop(tx);
    });
    let text = out.0.text();
    assert_eq!(text.lines().collect::<Vec<_>>(), want);
}

/// `--progress` on a stream: a tqdm-like bar (`\r` states written with pauses longer than the
/// prompt's idle time, then a newline) is never shown as a prompt or as `\r` segments; the
/// console gets the stage's line for it and the bar's final state as the rank's line, lines
/// without `\r` as always; the log file gets every byte.
#[test]
fn progress_bars_go_to_the_stage_and_end_as_a_line() {
    let scratch = Scratch::new();
    let log = scratch.0.join("err.log");
    let (c, _out, err) = console();
    c.set_progress([None, Some((false, Duration::from_secs(60)))]);
    let sink = RankSink {
        stderr_file: Some(log.clone()),
        stderr_progress: true,
        ..plain()
    };
    let mut written = Vec::new();
    let parts: Vec<&[u8]> = vec![
        b"start\n",
        b"\r  0%|     | 0/3",
        b"\r 33%|#    | 1/3",
        b"\r 67%|##   | 2/3",
        b"\r100%|#####| 3/3",
        b"\n",
        b"after\n",
        b"\r 50%|left open",
    ];
    for p in &parts {
        written.extend_from_slice(p);
    }
    run_forward(c.clone(), id(0), sink, move |_o, mut e| {
        for p in parts {
            e.write_all(p).expect("w");
            // Longer than PARTIAL_IDLE: a prompt would have been shown by now.
            std::thread::sleep(PARTIAL_IDLE * 2);
        }
    });
    rt().block_on(c.flush());
    // Tee'd (file and console): prefixed lines. The first bar state is the stage's line (one
    // per 60 s); the final state and the bar left open at EOF are the rank's lines.
    assert_eq!(
        err.text(),
        "[default0]:start\n[default0]:  0%|     | 0/3\n[default0]:100%|#####| 3/3\n\
         [default0]:after\n[default0]: 50%|left open\n"
    );
    assert_eq!(std::fs::read(&log).expect("log"), written, "log byte-exact");
}
