//! The forwarding pump: one task per worker reads both pipes, writes log files byte for byte as
//! soon as bytes are read (a killed worker loses nothing), splits lines for the console and the
//! filtered logs, and feeds the stderr tracker; it ends at EOF on both pipes, or when a process
//! that outlived the worker holds a pipe open (below).
//!
//! A console stream whose worker stops mid-line for [`PARTIAL_IDLE`] (a prompt) has the line's
//! start sent as an open [`Chunk`]; the rest follows as its continuation (rules in `console`).
//!
//! With the progress stage on for a stream (`--progress`, rules in `progress`), a `\r` segment
//! is not a console line: the text after the last `\r` of the line is sent as the rank's bar
//! (as soon as it is read, not after the prompt's idle time, and never as an open line), and the
//! line that a newline then ends is sent as an ordinary line marked as ending the bar.
//!
//! # The end of a worker
//! Every byte a worker wrote before it ended is forwarded, however far behind the console is: no
//! clock runs while there is data to read. Once the agent says the worker's processes are gone
//! (the `ended` signal of [`forward_until`]), a pipe still without EOF is one that a process rdrun
//! could not stop still holds open (a descendant that escaped): the kernel ends a pipe as soon as
//! its last writer closes it. That is decided from the pipe itself: `poll(2)` finds it empty (all
//! the worker wrote has been read) and not hung up (a writer is left). From that moment every
//! byte still to come is the outliver's; the pipe gets [`LINGER`] more, then is closed with a
//! warning, after the worker's last line (ended with a newline) is on the console.
//! When the console becomes a closed pipe, a stream with no other destination has its pipe
//! closed (the worker's next write fails as under torchrun); a tee'd one keeps its log file.
//!
//! Its tests are in `pump_tests.rs`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;

use super::console::{Chunk, Console};
use super::lines::{content, End, Splitter, MAX_LINE};
use super::logdir::RankSink;
use super::own::Stream;
use super::prefix::RankIdentity;
use super::tail::{OutputSummary, StderrTracker};
use crate::supervisor::watch::hang::OutputCounter;

/// Read size from a worker pipe.
const READ_CHUNK: usize = 64 << 10;
/// A console stream whose worker wrote nothing for this long in the middle of a line gets the
/// line's start shown (prompts); a line written in one burst is never cut.
pub const PARTIAL_IDLE: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a pipe held open by a process that outlived the worker is still read, counted from
/// the moment everything the worker wrote was read (see the module docs).
pub const LINGER: std::time::Duration = std::time::Duration::from_secs(2);
/// How often a pipe without EOF is looked at once the worker ended.
const LINGER_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// How many of a worker's last output lines [`LastLines`] keeps, and how much of each.
const LAST_LINES: usize = 5;
const LAST_LINE_CHARS: usize = 200;

/// A worker's last few output lines (both streams, in the order read), for the hang capture.
/// Cloning shares the buffer.
#[derive(Debug, Clone, Default)]
pub struct LastLines(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>);

impl LastLines {
    #[cfg(test)]
    fn push(&self, line: &[u8]) {
        self.push_all([line]);
    }

    /// Keeps `lines` (oldest first) as the newest: one lock for all of them (a read's lines
    /// arrive together, see [`ReadTail`]).
    fn push_all<'a>(&self, lines: impl IntoIterator<Item = &'a [u8]>) {
        if let Ok(mut q) = self.0.lock() {
            for line in lines {
                let text = String::from_utf8_lossy(line);
                let text: String = text.chars().take(LAST_LINE_CHARS).collect();
                if q.len() == LAST_LINES {
                    q.pop_front();
                }
                q.push_back(text);
            }
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

/// The last [`LAST_LINES`] lines of one read, copied into buffers that are reused (no
/// allocation and no lock per line: the forwarder splits millions of lines a second), and
/// handed to [`LastLines`] once the read is split.
#[derive(Default)]
struct ReadTail {
    lines: [Vec<u8>; LAST_LINES],
    /// The slot the next line takes, and how many lines this read had (up to `LAST_LINES`).
    next: usize,
    count: usize,
}

impl ReadTail {
    fn push(&mut self, line: &[u8]) {
        // A char is at most 4 bytes: enough bytes for `LAST_LINE_CHARS` chars.
        let keep = line.len().min(LAST_LINE_CHARS * 4);
        let slot = &mut self.lines[self.next];
        slot.clear();
        slot.extend_from_slice(&line[..keep]);
        self.next = (self.next + 1) % LAST_LINES;
        self.count = (self.count + 1).min(LAST_LINES);
    }

    /// Hands this read's last lines to `to`, oldest first, and starts the next read empty.
    fn publish(&mut self, to: &LastLines) {
        if self.count == 0 {
            return;
        }
        let first = (self.next + LAST_LINES - self.count) % LAST_LINES;
        let lines = &self.lines;
        to.push_all((0..self.count).map(|k| lines[(first + k) % LAST_LINES].as_slice()));
        self.count = 0;
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
    /// `--progress`: `\r` segments go to the console's progress stage as bar updates.
    progress: bool,
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
            progress: false,
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
    /// The agent says the worker's processes are gone.
    Ended,
    ConsoleBroken,
    Idle,
    /// Time to look whether the pipe is drained and still held (after `Ended`).
    Check,
}

/// What `poll(2)` says about a pipe without waiting.
#[derive(Debug, PartialEq, Eq)]
enum PipeState {
    /// Bytes to read, or no writer left (EOF comes): the reader will see it.
    Pending,
    /// Empty, and some process still holds its write end.
    HeldEmpty,
}

fn pipe_state(fd: std::os::fd::RawFd) -> PipeState {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, zero timeout; the fd stays open while the reader owns it.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n == 0 {
        PipeState::HeldEmpty
    } else {
        // Readable, hung up, or an error the next read reports: the reader goes on.
        PipeState::Pending
    }
}

/// One pipe's forwarding state between two waits: the reader, the line splitter, and where the
/// console stands (a line shown in part, a bar) across reads.
struct Pump {
    id: RankIdentity,
    plan: StreamPlan,
    console: Console,
    tracker: Option<StderrTracker>,
    ended_rx: Option<watch::Receiver<bool>>,
    activity: Option<Activity>,
    /// The read end's number, for `poll(2)`; `None` once the reader no longer owns it.
    raw_fd: Option<std::os::fd::RawFd>,
    reader: Box<dyn AsyncRead + Unpin + Send>,
    splitter: Splitter,
    buf: Vec<u8>,
    ended: bool,
    /// When everything the worker wrote had been read and the pipe was still held open.
    held_since: Option<tokio::time::Instant>,
    outlived: bool,
    /// When a line left unfinished is shown as a prompt (armed while one is held).
    idle_at: Option<tokio::time::Instant>,
    source: u64,
    broken: watch::Receiver<bool>,
    /// Bytes of the held (unfinished) line already on the console.
    shown: usize,
    /// Progress stage: the held line follows a `\r` (a bar), and the bar text last sent.
    after_cr: bool,
    bar_sent: Option<Vec<u8>>,
    /// The last lines of each read, for the hang detector's `LastLines`.
    read_tail: ReadTail,
}

/// What the segments of one read add up to.
struct ReadOut {
    /// The console's chunk (whole lines, or the end of a line shown in part).
    chunk: Chunk,
    /// The filtered log's lines.
    filtered: Vec<u8>,
    /// The bar a `\r` segment of this read left (its text), for the progress stage.
    latest_bar: Option<Vec<u8>>,
}

async fn pump(
    id: RankIdentity,
    fd: OwnedFd,
    plan: StreamPlan,
    console: Console,
    tracker: Option<StderrTracker>,
    ended_rx: Option<watch::Receiver<bool>>,
    activity: Option<Activity>,
) -> Option<StderrTracker> {
    let mut p = Pump::new(id, fd, plan, console, tracker, ended_rx, activity);
    loop {
        let n = match p.wait().await {
            Step::Read(Ok(n)) => n,
            Step::Read(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
            Step::Read(Err(e)) => {
                tracing::warn!(local_rank = p.id.local_rank, error = %e, "cannot read worker output");
                0
            }
            Step::Ended => {
                p.ended = true;
                continue;
            }
            Step::Check => {
                p.check_held();
                continue;
            }
            Step::ConsoleBroken => {
                p.console_broken();
                continue;
            }
            Step::Idle => {
                p.show_partial().await;
                continue;
            }
        };
        p.forward(n).await;
        if n == 0 {
            p.finish().await;
            return p.tracker;
        }
    }
}

impl Pump {
    fn new(
        id: RankIdentity,
        fd: OwnedFd,
        plan: StreamPlan,
        console: Console,
        tracker: Option<StderrTracker>,
        ended_rx: Option<watch::Receiver<bool>>,
        activity: Option<Activity>,
    ) -> Pump {
        use std::os::fd::AsRawFd;
        let raw_fd = Some(fd.as_raw_fd());
        let broken = console.broken(plan.stream);
        Pump {
            id,
            raw_fd,
            reader: into_reader(fd),
            splitter: Splitter::new(MAX_LINE),
            buf: vec![0u8; READ_CHUNK],
            ended: false,
            held_since: None,
            outlived: false,
            idle_at: None,
            source: Console::source_id(),
            broken,
            shown: 0,
            after_cr: false,
            bar_sent: None,
            read_tail: ReadTail::default(),
            plan,
            console,
            tracker,
            ended_rx,
            activity,
        }
    }

    /// Waits for what comes first: bytes (or EOF), the worker's end, a broken console, a
    /// prompt's idle time, or the next look at a pipe still held after the end.
    async fn wait(&mut self) -> Step {
        let idle_armed = self.plan.console
            && self.splitter.held_len() > self.shown
            && !(self.plan.progress && self.after_cr);
        let idle = match idle_armed {
            true => *self
                .idle_at
                .get_or_insert_with(|| tokio::time::Instant::now() + PARTIAL_IDLE),
            false => tokio::time::Instant::now(),
        };
        let step = if self.outlived {
            Step::Read(Ok(0))
        } else {
            tokio::select! {
                // Data first: a pipe with bytes to read is never given up (see `Check`).
                biased;
                r = self.reader.read(&mut self.buf) => Step::Read(r),
                _ = wait_stop(&mut self.ended_rx), if !self.ended => Step::Ended,
                _ = wait_true(&mut self.broken), if self.plan.console => Step::ConsoleBroken,
                _ = tokio::time::sleep_until(idle), if idle_armed => Step::Idle,
                _ = tokio::time::sleep(LINGER_CHECK), if self.ended => Step::Check,
            }
        };
        if matches!(step, Step::Read(_) | Step::Idle) {
            self.idle_at = None;
        }
        step
    }

    /// After the worker's end: a pipe found drained and still held is the outliver's, and is
    /// given [`LINGER`] from that moment.
    fn check_held(&mut self) {
        let Some(fd) = self.raw_fd else {
            return;
        };
        if pipe_state(fd) == PipeState::HeldEmpty {
            let now = tokio::time::Instant::now();
            let since = *self.held_since.get_or_insert(now);
            // Everything the worker wrote was read at `since`; what came after is the
            // outliver's, and it is not waited for without end.
            self.outlived = now >= since + LINGER;
        }
    }

    /// The console became a closed pipe: stop sending to it, and close the worker's pipe if
    /// the console was its only destination.
    fn console_broken(&mut self) {
        self.plan.console = false;
        if self.plan.file.is_none() {
            // The console was this stream's only destination: close the pipe so that the
            // worker's next write fails as it would under torchrun (SIGPIPE/EPIPE).
            self.raw_fd = None;
            drop(std::mem::replace(
                &mut self.reader,
                Box::new(tokio::io::empty()),
            ));
            tracing::debug!(local_rank = self.id.local_rank, stream = ?self.plan.stream,
                "console closed: worker pipe closed");
        }
    }

    /// The worker stopped mid-line (a prompt): show what it wrote so far; the line stays open
    /// on the console until its rest comes (see `console`).
    async fn show_partial(&mut self) {
        let held = &self.splitter.held()[..self.splitter.held_len()];
        let chunk = if self.shown > 0 {
            Chunk {
                continues: true,
                cont: held[self.shown..].to_vec(),
                prefix: self.plan.prefix.clone(),
                ..Chunk::default()
            }
        } else {
            let mut body = self.plan.prefix.clone();
            body.extend_from_slice(held);
            Chunk {
                body,
                ..Chunk::default()
            }
        };
        self.shown = held.len();
        self.console
            .send(Chunk {
                source: self.source,
                stream: Some(self.plan.stream),
                open: true,
                ..chunk
            })
            .await;
    }

    /// Forwards one read of `n` bytes (0: EOF, the held line is finished): the log file, the
    /// split lines to the console, the filtered log and the tracker, then the bar.
    async fn forward(&mut self, n: usize) {
        if n > 0 {
            self.write_raw(n);
        }
        let out = self.split(n);
        if let Some(a) = &self.activity {
            self.read_tail.publish(&a.last);
        }
        if !self.plan.console {
            self.shown = 0;
        }
        if !out.filtered.is_empty() {
            if let Some((f, _)) = &mut self.plan.filtered {
                // O_APPEND: one write per batch of whole lines, shared by all ranks.
                let _ = f.write_all(&out.filtered);
            }
        }
        self.console.send(out.chunk).await;
        if self.plan.progress && self.plan.console && n > 0 {
            self.send_bar(out.latest_bar).await;
        }
    }

    /// Counts the bytes read as activity and writes them to the log file as read.
    fn write_raw(&mut self, n: usize) {
        // Output is activity for the hang detector, whatever its destination.
        if let Some(a) = &self.activity {
            a.bytes.add(n as u64);
        }
        if let Some(f) = &mut self.plan.file {
            // Bytes exactly as written, as soon as read: a killed worker loses nothing.
            if let Err(e) = f.write_all(&self.buf[..n]) {
                tracing::warn!(local_rank = self.id.local_rank, error = %e, "cannot write worker log");
                self.plan.file = None;
            }
        }
    }

    /// Splits one read (or, `n == 0`, the held rest) and routes each segment.
    fn split(&mut self, n: usize) -> ReadOut {
        let mut out = ReadOut {
            chunk: Chunk {
                source: self.source,
                stream: Some(self.plan.stream),
                prefix: self.plan.prefix.clone(),
                rank: Some(self.id.rank),
                ..Chunk::default()
            },
            filtered: Vec::new(),
            latest_bar: None,
        };
        let plan = &self.plan;
        let tracker = &mut self.tracker;
        let shown = &mut self.shown;
        let after_cr = &mut self.after_cr;
        let bar_sent = &mut self.bar_sent;
        let read_tail = &mut self.read_tail;
        let keep_tail = self.activity.is_some();
        let mut sink = |seg: &[u8], end: End| {
            if plan.console {
                console_segment(plan, shown, after_cr, bar_sent, &mut out, seg, end);
            }
            if let Some((_, filters)) = &plan.filtered {
                filter_segment(&plan.prefix, filters, &mut out.filtered, seg, end);
            }
            if let Some(t) = tracker {
                t.segment(seg, end);
            }
            if keep_tail && end != End::Cap {
                read_tail.push(content(seg, end));
            }
        };
        if n > 0 {
            self.splitter.push(&self.buf[..n], &mut sink);
        } else {
            self.splitter.finish(&mut sink);
        }
        out
    }

    /// The bar as it reads now: the held text after a `\r`, else what the last `\r` segment of
    /// this read left; sent when it changed.
    async fn send_bar(&mut self, latest_bar: Option<Vec<u8>>) {
        let held = &self.splitter.held()[..self.splitter.held_len()];
        let now = if self.after_cr && !held.is_empty() {
            Some(held.to_vec())
        } else {
            latest_bar
        };
        if let Some(mut text) = now {
            text.truncate(super::progress::MAX_BAR);
            if self.bar_sent.as_ref() != Some(&text) {
                self.bar_sent = Some(text.clone());
                self.console
                    .send(Chunk {
                        source: self.source,
                        stream: Some(self.plan.stream),
                        prefix: self.plan.prefix.clone(),
                        rank: Some(self.id.rank),
                        bar: Some(text),
                        ..Chunk::default()
                    })
                    .await;
            }
        }
    }

    /// At EOF (or closing an outlived pipe): the warning, after the worker's last line.
    async fn finish(&mut self) {
        if self.outlived {
            // After the worker's last line is on the console, never inside it.
            self.console.flush().await;
            tracing::warn!(local_rank = self.id.local_rank, stream = ?self.plan.stream,
                "a process that outlived the worker still holds its output pipe {LINGER:?} \
                 after all the worker wrote was forwarded; closing it");
        }
    }
}

/// One segment's share of the console chunk: a bar state, the end of a line shown in part, or
/// a whole line (which ends a bar it was on).
fn console_segment(
    plan: &StreamPlan,
    shown: &mut usize,
    after_cr: &mut bool,
    bar_sent: &mut Option<Vec<u8>>,
    out: &mut ReadOut,
    seg: &[u8],
    end: End,
) {
    let nl: &[u8] = if end.needs_newline() { b"\n" } else { b"" };
    let chunk = &mut out.chunk;
    if plan.progress && *shown == 0 && end == End::Return {
        // A bar's state, not a line (a lone `\r` only starts the next state).
        let text = content(seg, end);
        if !text.is_empty() {
            out.latest_bar = Some(text.to_vec());
        }
        *after_cr = true;
    } else if *shown > 0 {
        // The first segment ends the line whose start is already on the console.
        chunk.continues = true;
        chunk
            .cont
            .extend_from_slice(&seg[(*shown).min(seg.len())..]);
        chunk.cont.extend_from_slice(nl);
        *shown = 0;
    } else {
        if plan.progress && *after_cr {
            // The line a `\r` bar was on ends here: its final state, a line of its own; the
            // stage forgets the rank's bar.
            chunk.ends_bar = true;
            out.latest_bar = None;
            *bar_sent = None;
            *after_cr = false;
        }
        chunk.body.extend_from_slice(&plan.prefix);
        chunk.body.extend_from_slice(seg);
        chunk.body.extend_from_slice(nl);
        // Line boundaries for the collapse stage (a chunk is at most a few MiB).
        chunk.line_ends.push(chunk.body.len() as u32);
    }
}

/// One segment into the filtered log's batch when it holds one of the filters.
fn filter_segment(prefix: &[u8], filters: &[String], to: &mut Vec<u8>, seg: &[u8], end: End) {
    let nl: &[u8] = if end.needs_newline() { b"\n" } else { b"" };
    let text = content(seg, end);
    if filters.iter().any(|f| contains(text, f.as_bytes())) {
        to.extend_from_slice(prefix);
        to.extend_from_slice(seg);
        to.extend_from_slice(nl);
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
/// onto `console` (the terminal's), until both reach EOF. `ended` becomes `true` once the worker's
/// processes are gone: a pipe then found drained and still held open (by a descendant that
/// escaped the stop) is read for [`LINGER`] more and closed (a partial last line is emitted); a
/// pipe with data to read is read to its end first, however long that takes.
pub fn forward_until(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    ended: watch::Receiver<bool>,
    activity: Activity,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_counted(
        console,
        id,
        sink,
        stdout,
        stderr,
        Some(ended),
        Some(activity),
    )
}

/// [`forward_until`] onto a given console, `ended` optional (tests use in-memory consoles).
pub fn forward_to(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    ended: Option<watch::Receiver<bool>>,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_counted(console, id, sink, stdout, stderr, ended, None)
}

/// [`forward_to`], every byte read from either pipe also counted in `activity` and every line
/// kept in its tail (the hang detector's output signal and capture).
fn forward_counted(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    ended: Option<watch::Receiver<bool>>,
    activity: Option<Activity>,
) -> tokio::task::JoinHandle<OutputSummary> {
    let mut out_plan = StreamPlan::new(
        Stream::Stdout,
        &id,
        &sink.stdout_file,
        sink.stdout_console,
        &sink.prefix,
        &sink.filtered_stdout,
        &sink.stdout_filters,
    );
    out_plan.progress = sink.stdout_progress;
    let mut err_plan = StreamPlan::new(
        Stream::Stderr,
        &id,
        &sink.stderr_file,
        sink.stderr_console,
        &sink.prefix,
        &sink.filtered_stderr,
        &sink.stderr_filters,
    );
    err_plan.progress = sink.stderr_progress;
    tokio::spawn(async move {
        let out = pump(
            id.clone(),
            stdout,
            out_plan,
            console.clone(),
            None,
            ended.clone(),
            activity.clone(),
        );
        let err = pump(
            id,
            stderr,
            err_plan,
            console.clone(),
            Some(StderrTracker::default()),
            ended,
            activity,
        );
        let (_, tracker) = tokio::join!(out, err);
        console.flush().await;
        tracker.map(StderrTracker::summary).unwrap_or_default()
    })
}

#[cfg(test)]
#[path = "pump_tests.rs"]
mod tests;
