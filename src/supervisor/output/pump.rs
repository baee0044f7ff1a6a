//! The forwarding pump: one task per worker reads both pipes, writes log files byte for byte as
//! soon as bytes are read (a killed worker loses nothing), splits lines for the console and the
//! filtered logs, and feeds the stderr tracker; it ends at EOF on both pipes or on a stop request.
//!
//! A console stream whose worker stops mid-line for [`PARTIAL_IDLE`] (a prompt) has the line's
//! start sent as an open [`Chunk`]; the rest follows as its continuation (rules in `console`).
//! When the console becomes a closed pipe, a stream with no other destination has its pipe
//! closed (the worker's next write fails as under torchrun); a tee'd one keeps its log file.
//!
//! Length: about 415 lines of code; the rest are its tests (partial lines, kills, pipes closed
//! early).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use super::console::{Chunk, Console, Stream};
use super::lines::{content, End, Splitter, MAX_LINE};
use super::logdir::RankSink;
use super::prefix::RankIdentity;
use super::tail::{OutputSummary, StderrTracker};
use crate::supervisor::hang::OutputCounter;

/// Read size from a worker pipe.
const READ_CHUNK: usize = 64 << 10;
/// A console stream whose worker wrote nothing for this long in the middle of a line gets the
/// line's start shown (prompts); a line written in one burst is never cut.
pub const PARTIAL_IDLE: std::time::Duration = std::time::Duration::from_millis(100);

/// How many of a worker's last output lines [`LastLines`] keeps, and how much of each.
const LAST_LINES: usize = 5;
const LAST_LINE_CHARS: usize = 200;

/// A worker's last few output lines (both streams, in the order read), for the hang capture.
/// Cloning shares the buffer.
#[derive(Debug, Clone, Default)]
pub struct LastLines(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl LastLines {
    fn push(&self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text: String = text.chars().take(LAST_LINE_CHARS).collect();
        if let Ok(mut q) = self.0.lock() {
            if q.len() == LAST_LINES {
                q.pop_front();
            }
            q.push_back(text);
        }
    }

    /// The lines kept, oldest first.
    pub fn snapshot(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What the hang detector learns from a worker's output: its byte count and last lines.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    pub bytes: OutputCounter,
    pub last: LastLines,
}

/// Destinations of one stream of one worker.
struct StreamPlan {
    stream: Stream,
    file: Option<File>,
    console: bool,
    /// Console prefix (tee'd streams only; empty otherwise).
    prefix: Vec<u8>,
    /// Aggregated filtered log and its filters (tee'd streams only).
    filtered: Option<(File, Vec<String>)>,
}

impl StreamPlan {
    fn new(
        stream: Stream,
        id: &RankIdentity,
        file: &Option<PathBuf>,
        console: bool,
        prefix: &Option<String>,
        filtered: &Option<PathBuf>,
        filters: &[String],
    ) -> StreamPlan {
        let open = |path: &PathBuf| -> Option<File> {
            match OpenOptions::new().append(true).create(true).open(path) {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::warn!(local_rank = id.local_rank, path = %path.display(), error = %e,
                        "cannot open worker log file; that output goes nowhere");
                    None
                }
            }
        };
        let tee = file.is_some() && console;
        StreamPlan {
            stream,
            file: file.as_ref().and_then(open),
            console,
            prefix: match prefix {
                Some(p) if tee => p.clone().into_bytes(),
                _ => Vec::new(),
            },
            filtered: match filtered {
                Some(path) if tee && !filters.is_empty() => {
                    open(path).map(|f| (f, filters.to_vec()))
                }
                _ => None,
            },
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn into_reader(fd: OwnedFd) -> Box<dyn AsyncRead + Unpin + Send> {
    use std::os::unix::fs::FileTypeExt;
    let file = File::from(fd);
    let is_fifo = file
        .metadata()
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false);
    if !is_fifo {
        // Not a pipe (a file or /dev/null passed by a caller): read it on the blocking pool.
        return Box::new(tokio::fs::File::from_std(file));
    }
    // from_owned_fd checks that the fd is readable and sets O_NONBLOCK itself.
    match tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(file)) {
        Ok(rx) => Box::new(rx),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read a worker output pipe");
            Box::new(tokio::io::empty())
        }
    }
}

/// How one wait on a worker pipe ended.
enum Step {
    Read(io::Result<usize>),
    Stop,
    ConsoleBroken,
    Idle,
}

async fn pump(
    id: RankIdentity,
    fd: OwnedFd,
    mut plan: StreamPlan,
    console: Console,
    mut tracker: Option<StderrTracker>,
    mut stop: Option<watch::Receiver<bool>>,
    activity: Option<Activity>,
) -> Option<StderrTracker> {
    let mut reader = into_reader(fd);
    let mut splitter = Splitter::new(MAX_LINE);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut stopping = false;
    let source = Console::source_id();
    let mut broken = console.broken(plan.stream);
    // Bytes of the held (unfinished) line already on the console.
    let mut shown = 0usize;
    loop {
        let idle_armed = plan.console && splitter.held_len() > shown;
        let step = if stopping {
            // Stop requested: take only what is already in the pipe, then end as at EOF.
            match tokio::time::timeout(std::time::Duration::ZERO, reader.read(&mut buf)).await {
                Ok(r) => Step::Read(r),
                Err(_) => Step::Read(Ok(0)),
            }
        } else {
            tokio::select! {
                r = reader.read(&mut buf) => Step::Read(r),
                _ = wait_stop(&mut stop) => Step::Stop,
                _ = wait_true(&mut broken), if plan.console => Step::ConsoleBroken,
                _ = tokio::time::sleep(PARTIAL_IDLE), if idle_armed => Step::Idle,
            }
        };
        let n = match step {
            Step::Read(Ok(n)) => n,
            Step::Read(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Step::Read(Err(e)) => {
                tracing::warn!(local_rank = id.local_rank, error = %e, "cannot read worker output");
                0
            }
            Step::Stop => {
                stopping = true;
                continue;
            }
            Step::ConsoleBroken => {
                plan.console = false;
                if plan.file.is_none() {
                    // The console was this stream's only destination: close the pipe so that
                    // the worker's next write fails as it would under torchrun (SIGPIPE/EPIPE).
                    drop(std::mem::replace(&mut reader, Box::new(tokio::io::empty())));
                    tracing::debug!(local_rank = id.local_rank, stream = ?plan.stream,
                        "console closed: worker pipe closed");
                }
                continue;
            }
            Step::Idle => {
                // The worker stopped mid-line (a prompt): show what it wrote so far; the line
                // stays open on the console until its rest comes (see `console`).
                let held = &splitter.held()[..splitter.held_len()];
                let chunk = if shown > 0 {
                    Chunk {
                        continues: true,
                        cont: held[shown..].to_vec(),
                        prefix: plan.prefix.clone(),
                        ..Chunk::default()
                    }
                } else {
                    let mut body = plan.prefix.clone();
                    body.extend_from_slice(held);
                    Chunk {
                        body,
                        ..Chunk::default()
                    }
                };
                shown = held.len();
                console
                    .send(Chunk {
                        source,
                        stream: Some(plan.stream),
                        open: true,
                        ..chunk
                    })
                    .await;
                continue;
            }
        };
        if n > 0 {
            // Output is activity for the hang detector, whatever its destination.
            if let Some(a) = &activity {
                a.bytes.add(n as u64);
            }
            if let Some(f) = &mut plan.file {
                // Bytes exactly as written, as soon as read: a killed worker loses nothing.
                if let Err(e) = f.write_all(&buf[..n]) {
                    tracing::warn!(local_rank = id.local_rank, error = %e, "cannot write worker log");
                    plan.file = None;
                }
            }
        }
        let mut chunk = Chunk {
            source,
            stream: Some(plan.stream),
            prefix: plan.prefix.clone(),
            ..Chunk::default()
        };
        let mut filtered = Vec::new();
        let mut sink = |seg: &[u8], end: End| {
            let nl: &[u8] = if end.needs_newline() { b"\n" } else { b"" };
            if plan.console {
                if shown > 0 {
                    // The first segment ends the line whose start is already on the console.
                    chunk.continues = true;
                    chunk.cont.extend_from_slice(&seg[shown.min(seg.len())..]);
                    chunk.cont.extend_from_slice(nl);
                    shown = 0;
                } else {
                    chunk.body.extend_from_slice(&plan.prefix);
                    chunk.body.extend_from_slice(seg);
                    chunk.body.extend_from_slice(nl);
                }
            }
            if let Some((_, filters)) = &plan.filtered {
                let text = content(seg, end);
                if filters.iter().any(|f| contains(text, f.as_bytes())) {
                    filtered.extend_from_slice(&plan.prefix);
                    filtered.extend_from_slice(seg);
                    filtered.extend_from_slice(nl);
                }
            }
            if let Some(t) = &mut tracker {
                t.segment(seg, end);
            }
            if let Some(a) = &activity {
                if end != End::Cap {
                    a.last.push(content(seg, end));
                }
            }
        };
        if n > 0 {
            splitter.push(&buf[..n], &mut sink);
        } else {
            splitter.finish(&mut sink);
        }
        if !plan.console {
            shown = 0;
        }
        if !filtered.is_empty() {
            if let Some((f, _)) = &mut plan.filtered {
                // O_APPEND: one write per batch of whole lines, shared by all ranks.
                let _ = f.write_all(&filtered);
            }
        }
        console.send(chunk).await;
        if n == 0 {
            return tracker;
        }
    }
}

/// Resolves when `rx` holds `true`; never if there is none or its sender is gone.
async fn wait_stop(rx: &mut Option<watch::Receiver<bool>>) {
    match rx {
        Some(rx) => wait_true(rx).await,
        None => std::future::pending::<()>().await,
    }
}

/// Resolves when `rx` holds `true`; never if its sender is gone without setting it.
async fn wait_true(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Forwards one worker's stdout and stderr (pipe read ends) line by line according to `sink`,
/// onto the process-wide console, until both reach EOF or `stop` becomes `true`: what is already in the pipes is
/// forwarded, then the task ends as at EOF (a partial last line is emitted). For a worker whose
/// descendants escaped its process group and keep the pipes open after it was reaped: the agent
/// sets `stop` after a short wait instead of waiting for an EOF that may never come.
pub fn forward_until(
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stop: watch::Receiver<bool>,
    activity: Activity,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_counted(
        Console::global(),
        id,
        sink,
        stdout,
        stderr,
        Some(stop),
        Some(activity),
    )
}

/// [`forward_until`] onto a given console, `stop` optional (tests use in-memory consoles).
pub fn forward_to(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stop: Option<watch::Receiver<bool>>,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_counted(console, id, sink, stdout, stderr, stop, None)
}

/// [`forward_to`], every byte read from either pipe also counted in `activity` and every line
/// kept in its tail (the hang detector's output signal and capture).
fn forward_counted(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stop: Option<watch::Receiver<bool>>,
    activity: Option<Activity>,
) -> tokio::task::JoinHandle<OutputSummary> {
    let out_plan = StreamPlan::new(
        Stream::Stdout,
        &id,
        &sink.stdout_file,
        sink.stdout_console,
        &sink.prefix,
        &sink.filtered_stdout,
        &sink.stdout_filters,
    );
    let err_plan = StreamPlan::new(
        Stream::Stderr,
        &id,
        &sink.stderr_file,
        sink.stderr_console,
        &sink.prefix,
        &sink.filtered_stderr,
        &sink.stderr_filters,
    );
    tokio::spawn(async move {
        let out = pump(
            id.clone(),
            stdout,
            out_plan,
            console.clone(),
            None,
            stop.clone(),
            activity.clone(),
        );
        let err = pump(
            id,
            stderr,
            err_plan,
            console.clone(),
            Some(StderrTracker::default()),
            stop,
            activity,
        );
        let (_, tracker) = tokio::join!(out, err);
        console.flush().await;
        tracker.map(StderrTracker::summary).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
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
}
