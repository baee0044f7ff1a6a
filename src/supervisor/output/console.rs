//! The console writer: one thread per [`Console`] owns a stdout and a stderr writer. The
//! terminal's console ([`Console::terminal`], made by the agent once per run) is the one writer
//! of rdrun's own stdout and stderr from then on: worker output, rdrun's own text
//! ([`super::own`] sends it here: log lines, lifecycle events, the hang block, the end report)
//! and the waiting status line ([`Console::status`]) are all messages to its thread, so nothing
//! else can write into a line it left open. The forwarders never block a runtime thread on a
//! slow terminal: they wait (async) on a byte budget ([`CONSOLE_BUDGET`]) that the writer thread
//! returns after each write.
//!
//! # Line atomicity with partial lines
//! Each message ([`Chunk`]) comes from one stream of one worker (a *source*) and is written with
//! one `write_all` + `flush`. Usually it is a run of whole lines. A forwarder whose worker left a
//! line unfinished for a short idle time (a prompt: `input()`, `(Pdb) `) sends that partial line
//! as a chunk that leaves the line *open*; the rest of the line comes later as a continuation.
//! The rule, per terminal (stdout and stderr count as one terminal when both are the same file,
//! as with a TTY or `2>&1`; otherwise each is its own):
//! - While a source has a line open, only that source's chunks for that stream are written (its
//!   own waiting chunks first, in order, wherever they wait); every other chunk for the terminal
//!   waits, in order, so nothing is ever written into the open line.
//! - When the source's continuation ends the line, the waiting chunks are written.
//! - A continuation never waits for the byte budget: the chunks waiting behind its line hold
//!   that budget until the line ends.
//! - If chunks have waited [`OPEN_LINE_HOLD`] since the source's last write ended (a prompt
//!   waiting for the user), and no message is queued for the writer (the rest of the line may be
//!   among them), the writer ends the open line with a `\n`, writes the waiting chunks, and the
//!   line is no longer open. The source's continuation then starts a line of its own: with the
//!   stream's prefix (tee'd streams), and nothing at all if it is only the line terminator.
//! - rdrun's own text ([`super::own`]) ends an open line of the terminal's console with a `\n`
//!   before it is written, at once (it never waits for the hold); the continuation then starts a
//!   line of its own, as above. The writer keeps, per stream, whether its last write left the
//!   cursor mid-line, for that.
//!
//! # The status line
//! While rdrun waits (`observe/status.rs`), on a terminal, the writer draws one status line on
//! stderr (a spinner and the text), redrawn in place at each update, only while the terminal is
//! free (no worker line open, nothing held): it is erased before any other write and drawn
//! again at the next update, and erased when the wait ends (`console_own.rs`).
//!
//! # Progress bars (`--progress`)
//! The progress stage ([`super::progress`]) keeps each rank's `\r` bar; on a terminal the writer
//! draws one live line for them, erases it (`\r\x1b[K`) before any other write to that terminal
//! and draws it again once the terminal is free (no open line, nothing held), at most every
//! 100 ms; on a pipe the stage's line is an ordinary chunk. rdrun's own text erases a live line
//! instead of ending it with a newline ([`own`]).
//!
//! # Output that cannot be written
//! A write error never panics and never stops the forwarding of other streams. `EPIPE` (rdrun's
//! stdout or stderr is a closed pipe: `rdrun … | head -1`) marks the stream broken: nothing more
//! is written to it, and [`Console::broken`] tells the forwarders, which then close the read end
//! of every worker pipe that had no other destination than that stream, so the worker's next
//! write fails as it would under torchrun (SIGPIPE, or `EPIPE` where ignored: Python's
//! `BrokenPipeError`). Other errors (`ENOSPC` on `>/dev/full`, `EIO`) drop the output of that
//! write, are logged once per stream, and later writes are tried again.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use super::chunk::Chunk;
use super::collapse::Collapser;
use super::own::{self, Stream};
use super::progress::{Bars, ERASE};
use super::ticker::Ticker;
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};

/// Console bytes queued (all workers together) before forwarders wait for the terminal.
pub const CONSOLE_BUDGET: usize = 4 << 20;
/// Longest time other output waits behind a worker's open (partial) line before that line is
/// ended with a newline.
pub const OPEN_LINE_HOLD: Duration = Duration::from_secs(2);

enum ConsoleMsg {
    /// A chunk and its share of the budget (none for a continuation: see [`Console::send`]).
    Data(Chunk, Option<OwnedSemaphorePermit>),
    Flush(oneshot::Sender<()>),
    /// `--output collapse` (its window and how many ranks reach the console), or `None` for
    /// every line as it comes.
    Collapse(Option<(Duration, usize)>),
    /// `--progress`, per stream: `Some((live, interval))` turns the stage on (`live`: the stream
    /// is a terminal), `None` off.
    Progress([Option<(bool, Duration)>; 2]),
    /// From the alarm thread ([`Ticker`]): a deadline of the writer has come.
    Tick,
    /// rdrun's own text for a stream (see [`super::own`]).
    Own(Stream, Vec<u8>),
    /// The status line's text (`None`: the wait is over, the line is erased).
    Status(Option<String>),
}

/// The width of a stream's terminal in columns, when it is one.
type Columns = Box<dyn Fn(Stream) -> Option<usize> + Send>;

/// A console: one writer thread owning a stdout and a stderr writer. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    /// Shared by the clones, so that the alarm thread can hold it weakly: the writer thread ends
    /// when the last clone is gone.
    tx: Arc<std_mpsc::Sender<ConsoleMsg>>,
    budget: Arc<Semaphore>,
    broken: Arc<[watch::Sender<bool>; 2]>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// Starts a writer thread over these writers, each its own terminal (tests pass in-memory
    /// writers).
    pub fn new(
        stdout: Box<dyn Write + Send>,
        stderr: Box<dyn Write + Send>,
    ) -> io::Result<Console> {
        Console::with_terminal(stdout, stderr, false)
    }

    /// [`Console::new`]; `shared`: stdout and stderr end up on one terminal (a TTY, `2>&1`), so
    /// an open line on one of them holds back the other as well.
    pub fn with_terminal(
        stdout: Box<dyn Write + Send>,
        stderr: Box<dyn Write + Send>,
        shared: bool,
    ) -> io::Result<Console> {
        let (tx, rx) = std_mpsc::channel::<ConsoleMsg>();
        let broken = Arc::new([watch::channel(false).0, watch::channel(false).0]);
        let writer = Writer::new([stdout, stderr], shared, broken.clone());
        Console::start(writer, rx, tx, broken)
    }

    /// The terminal's console: rdrun's own stdout and stderr, written by its thread alone from
    /// now on (rdrun's own text is sent to it, [`super::own::attach`]). The agent makes it once
    /// per run, after the watchdog was forked (the fork needs a single thread).
    pub fn terminal() -> io::Result<Console> {
        let (tx, rx) = std_mpsc::channel::<ConsoleMsg>();
        let broken = Arc::new([watch::channel(false).0, watch::channel(false).0]);
        let mut writer = Writer::new(
            [Box::new(io::stdout()), Box::new(io::stderr())],
            own::same_file(1, 2),
            broken.clone(),
        );
        writer.terminal = true;
        writer.columns = Box::new(own::columns);
        Console::start(writer, rx, tx, broken)
    }

    fn start(
        mut writer: Writer,
        rx: std_mpsc::Receiver<ConsoleMsg>,
        tx: std_mpsc::Sender<ConsoleMsg>,
        broken: Arc<[watch::Sender<bool>; 2]>,
    ) -> io::Result<Console> {
        writer.real_clock = true;
        let tx = Arc::new(tx);
        let weak = Arc::downgrade(&tx);
        let mut ticker = Ticker::start(move || {
            weak.upgrade()
                .is_some_and(|tx| tx.send(ConsoleMsg::Tick).is_ok())
        })?;
        std::thread::Builder::new()
            .name("rdrun-console".into())
            .spawn(move || loop {
                // Waits without a timeout (the alarm thread wakes it at its deadline: see
                // `ticker`). A deadline that has come is acted on only when nothing is queued:
                // an open line's rest may be among the queued messages (a reader far behind),
                // and ending the line before reading them would break it.
                let due = writer.deadline();
                let msg = match due {
                    Some(at) if at <= Instant::now() => match rx.try_recv() {
                        Ok(m) => m,
                        Err(std_mpsc::TryRecvError::Empty) => {
                            writer.tick(Instant::now());
                            continue;
                        }
                        Err(std_mpsc::TryRecvError::Disconnected) => break writer.close(),
                    },
                    _ => {
                        ticker.set(due);
                        match rx.recv() {
                            Ok(m) => m,
                            Err(_) => break writer.close(),
                        }
                    }
                };
                let now = Instant::now();
                match msg {
                    ConsoleMsg::Data(chunk, permit) => writer.accept(chunk, permit, now),
                    ConsoleMsg::Flush(ack) => writer.flush_request(ack),
                    ConsoleMsg::Collapse(window) => writer.set_collapse(window, now),
                    ConsoleMsg::Progress(setup) => writer.set_progress(setup, now),
                    ConsoleMsg::Tick => ticker.woke(),
                    ConsoleMsg::Own(stream, text) => writer.own_text(stream, &text),
                    ConsoleMsg::Status(text) => writer.set_status(text),
                }
            })?;
        Ok(Console {
            tx,
            budget: Arc::new(Semaphore::new(CONSOLE_BUDGET)),
            broken,
        })
    }

    /// A fresh source id for one stream of one worker (process-wide, so that the sources of
    /// every console and stage differ).
    pub(crate) fn source_id() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// Becomes `true` once writing to `stream` failed with `EPIPE`.
    pub fn broken(&self, stream: Stream) -> watch::Receiver<bool> {
        self.broken[stream.index()].subscribe()
    }

    /// Queues a chunk; waits while [`CONSOLE_BUDGET`] bytes are queued.
    ///
    /// A continuation of an open line never waits: the chunks held behind that line keep their
    /// share of the budget until the line ends, so a continuation that waited for budget could
    /// come only after the hold broke the line. What bypasses the budget is bounded: one
    /// continuation per open chunk, each at most a line piece and one read.
    pub(crate) async fn send(&self, chunk: Chunk) {
        if !chunk.continues && chunk.body.is_empty() && chunk.bar.is_none() {
            return;
        }
        let permit = if chunk.continues {
            None
        } else {
            let n = chunk.len().clamp(1, CONSOLE_BUDGET) as u32;
            let Ok(permit) = self.budget.clone().acquire_many_owned(n).await else {
                return; // the semaphore is never closed
            };
            Some(permit)
        };
        let _ = self.tx.send(ConsoleMsg::Data(chunk, permit));
    }

    /// Turns the collapse stage on (`Some((window, ranks))`: `--output collapse`, `ranks` the
    /// number of ranks whose output reaches this console, 0 if unknown) or off; lines pending in
    /// it are written first.
    pub fn set_collapse(&self, collapse: Option<(Duration, usize)>) {
        let _ = self.tx.send(ConsoleMsg::Collapse(collapse));
    }

    /// Turns the progress stage on or off per stream (stdout, stderr): `Some((live, interval))`,
    /// `live` when the stream is a terminal (one live line) else one line per `interval`. Bars
    /// it holds are written as final lines first.
    pub fn set_progress(&self, setup: [Option<(bool, Duration)>; 2]) {
        let _ = self.tx.send(ConsoleMsg::Progress(setup));
    }

    /// Waits until everything queued before this call is written and flushed (chunks held behind
    /// an open line included, so at most [`OPEN_LINE_HOLD`] more).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(ConsoleMsg::Flush(ack)).is_ok() {
            let _ = done.await;
        }
    }

    /// [`Console::flush`] for a thread outside any async runtime (the binary, before it exits).
    pub fn flush_blocking(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(ConsoleMsg::Flush(ack)).is_ok() {
            let _ = done.blocking_recv();
        }
    }

    /// Queues rdrun's own `text` for `stream` (never waits: rdrun's own text is small, and a
    /// log line must not wait for the workers' budget). An open line is ended first.
    pub(crate) fn own(&self, stream: Stream, text: Vec<u8>) {
        if !text.is_empty() {
            let _ = self.tx.send(ConsoleMsg::Own(stream, text));
        }
    }

    /// The status line's text while rdrun waits (`None`: the wait is over). On a terminal only:
    /// elsewhere the observer writes a plain line every interval.
    pub fn status(&self, text: Option<String>) {
        let _ = self.tx.send(ConsoleMsg::Status(text));
    }
}

/// Per-terminal state: which source has a line open, and what waits behind it.
#[derive(Default)]
struct Term {
    open: Option<(u64, Stream)>,
    held: VecDeque<(u64, Chunk, Option<OwnedSemaphorePermit>)>,
    /// When the oldest waiting chunk started to wait behind the current open line.
    held_since: Option<Instant>,
    /// The progress stage's live line of this stream is on the terminal, the cursor after it.
    live: Option<Stream>,
}

/// The status line's state in the writer (see the module doc).
#[derive(Default)]
struct StatusLine {
    /// The text while rdrun waits.
    text: Option<String>,
    /// It is on the terminal (stderr), the cursor after it.
    shown: bool,
    /// The spinner's frame.
    frame: usize,
}

/// The writer thread's state; pure apart from the two writers, so tests drive it with a clock of
/// their own.
struct Writer {
    outs: [Box<dyn Write + Send>; 2],
    shared: bool,
    terms: [Term; 2],
    broken: Arc<[watch::Sender<bool>; 2]>,
    is_broken: [bool; 2],
    /// A non-EPIPE write error was logged for this stream.
    warned: [bool; 2],
    /// Sequence number of the next message (orders flushes against held chunks).
    seq: u64,
    /// Flush requests: their sequence number, the collapse stage's next entry index then, and
    /// the ack (sent once nothing older is held or pending).
    flushes: Vec<(u64, u64, oneshot::Sender<()>)>,
    /// `--output collapse`: the stage every whole-line chunk passes first.
    collapse: Option<Collapser>,
    /// `--progress`: the progress stage of each stream (stdout, stderr).
    bars: [Option<Bars>; 2],
    /// The terminal's width (the live bar is cut to fit).
    columns: Columns,
    hold: Duration,
    /// The terminal's console ([`Console::terminal`]): rdrun's own text comes here and ends the
    /// lines that [`Writer::mid`] says are open.
    terminal: bool,
    /// Per stream (stdout, stderr): the last write left the cursor mid-line (an open prompt, a
    /// `\r` progress line, a worker's last line while it is shown). Kept for the terminal's
    /// console only.
    mid: [bool; 2],
    /// Per stream: that open line is the progress stage's live bar, erased (`\r\x1b[K`) rather
    /// than ended with a newline before rdrun's own text (a snapshot of a bar is no line).
    mid_live: [bool; 2],
    /// The status line while rdrun waits (terminal's console only).
    status: StatusLine,
    /// The hold restarts at the time a write of the owner's ended (the writer thread), not at
    /// the time its message was taken (tests drive a clock of their own): on a slow terminal
    /// the write itself may take longer than the hold.
    real_clock: bool,
}

impl Writer {
    fn new(
        outs: [Box<dyn Write + Send>; 2],
        shared: bool,
        broken: Arc<[watch::Sender<bool>; 2]>,
    ) -> Writer {
        Writer {
            outs,
            shared,
            terms: [Term::default(), Term::default()],
            broken,
            is_broken: [false, false],
            warned: [false, false],
            seq: 0,
            flushes: Vec::new(),
            collapse: None,
            bars: [None, None],
            columns: Box::new(|_| None),
            hold: OPEN_LINE_HOLD,
            terminal: false,
            mid: [false, false],
            mid_live: [false, false],
            status: StatusLine::default(),
            real_clock: false,
        }
    }

    fn term(&self, stream: Stream) -> usize {
        if self.shared {
            0
        } else {
            stream.index()
        }
    }

    fn set_collapse(&mut self, collapse: Option<(Duration, usize)>, now: Instant) {
        self.emit_collapsed(now, true);
        self.collapse = collapse.map(|(window, ranks)| {
            Collapser::new(window, ranks, [Console::source_id(), Console::source_id()])
        });
    }

    fn set_progress(&mut self, setup: [Option<(bool, Duration)>; 2], now: Instant) {
        self.finish_bars(now);
        self.bars = setup.map(|s| {
            s.map(|(live, interval)| Bars::new(live, interval, Console::source_id(), now))
        });
    }

    /// Ends the progress stages: the live line erased, each bar's last state written as a line.
    fn finish_bars(&mut self, now: Instant) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let Some(mut b) = self.bars[stream.index()].take() else {
                continue;
            };
            let t = self.term(stream);
            if self.terms[t].live == Some(stream) {
                self.terms[t].live = None;
                self.write_raw(stream, ERASE);
            }
            let lines = b.finish();
            if !lines.is_empty() {
                let chunk = Chunk {
                    source: b.source,
                    stream: Some(stream),
                    body: lines,
                    ..Chunk::default()
                };
                self.accept_direct(chunk, None, now);
            }
        }
    }

    /// A chunk from a forwarder: a bar update goes to the progress stage; whole lines through
    /// the collapse stage when it is on; anything else first makes the collapse stage write all
    /// it holds, so that nothing of the same source (its prompt after its lines) overtakes what
    /// it sent before.
    fn accept(&mut self, chunk: Chunk, permit: Option<OwnedSemaphorePermit>, now: Instant) {
        self.accept_staged(chunk, permit, now);
        self.draw_bars(now);
    }

    fn accept_staged(
        &mut self,
        mut chunk: Chunk,
        permit: Option<OwnedSemaphorePermit>,
        now: Instant,
    ) {
        if let (Some(stream), Some(rank)) = (chunk.stream, chunk.rank) {
            if let Some(text) = chunk.bar.take() {
                match &mut self.bars[stream.index()] {
                    Some(b) => {
                        b.update(rank, &chunk.prefix, &text);
                        return;
                    }
                    None => {
                        // No stage (never sent so): the bar as its worker wrote it.
                        let mut body = std::mem::take(&mut chunk.prefix);
                        body.extend_from_slice(&text);
                        body.push(b'\r');
                        chunk.body = body;
                    }
                }
            }
            if chunk.ends_bar {
                if let Some(b) = &mut self.bars[stream.index()] {
                    b.end(rank);
                }
            }
        }
        if let Some(c) = &mut self.collapse {
            if Collapser::takes(&chunk) {
                self.seq += 1;
                c.push(chunk, permit, now);
                self.emit_collapsed(now, false);
                self.ack_flushes();
                return;
            }
        }
        self.emit_collapsed(now, true);
        self.accept_direct(chunk, permit, now);
    }

    /// Writes what the collapse stage has due (everything when `all`).
    fn emit_collapsed(&mut self, now: Instant, all: bool) {
        let Some(c) = &mut self.collapse else {
            return;
        };
        for (chunk, permit) in c.due(now, all) {
            self.accept_direct(chunk, permit, now);
        }
    }

    fn accept_direct(&mut self, chunk: Chunk, permit: Option<OwnedSemaphorePermit>, now: Instant) {
        self.seq += 1;
        let Some(stream) = chunk.stream else {
            return;
        };
        let t = self.term(stream);
        let term = &mut self.terms[t];
        let mine = match term.open {
            None => term.held.is_empty(),
            Some(owner) => owner == (chunk.source, stream),
        };
        if mine {
            self.write_chunk(t, chunk);
            drop(permit);
            self.drain(t, now);
        } else {
            if term.held.is_empty() {
                term.held_since = Some(now);
            }
            term.held.push_back((self.seq, chunk, permit));
        }
    }

    fn flush_request(&mut self, ack: oneshot::Sender<()>) {
        self.seq += 1;
        // Lines pending in the collapse stage are not cut short (other ranks may still join
        // them): the flush waits until they are due, at most the window.
        let mark = self.collapse.as_ref().map_or(0, Collapser::next_index);
        self.flushes.push((self.seq, mark, ack));
        self.ack_flushes();
    }

    /// The next time [`Writer::tick`] has something to do.
    fn deadline(&self) -> Option<Instant> {
        self.terms
            .iter()
            .filter_map(|t| t.held_since.map(|s| s + self.hold))
            .chain(self.collapse.as_ref().and_then(Collapser::deadline))
            .chain(
                [Stream::Stdout, Stream::Stderr]
                    .into_iter()
                    .filter(|s| self.may_draw(*s))
                    .filter_map(|s| self.bars[s.index()].as_ref().and_then(Bars::deadline)),
            )
            .min()
    }

    /// Whether the progress stage of `stream` may write now: a pipe's line is an ordinary chunk
    /// (held like any other); a live line only on a terminal with no line open and nothing
    /// waiting (it would be written into a prompt).
    fn may_draw(&self, stream: Stream) -> bool {
        match &self.bars[stream.index()] {
            None => false,
            Some(b) if !b.live() => true,
            Some(_) => {
                let term = &self.terms[self.term(stream)];
                !self.is_broken[stream.index()] && term.open.is_none() && term.held.is_empty()
            }
        }
    }

    /// Shows what the progress stages have due: the live line on a terminal, a line on a pipe.
    fn draw_bars(&mut self, now: Instant) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            if !self.may_draw(stream) {
                continue;
            }
            let width = (self.columns)(stream);
            let Some(b) = &mut self.bars[stream.index()] else {
                continue;
            };
            let (live, source) = (b.live(), b.source);
            let Some(bytes) = b.show(now, width) else {
                continue;
            };
            let on_screen = b.on_screen();
            if live {
                let t = self.term(stream);
                // The draw starts at column 0 of the same line: no erase first.
                if self.terms[t].live == Some(stream) {
                    self.terms[t].live = None;
                }
                self.write_bytes(stream, &bytes, on_screen);
                if on_screen && !self.is_broken[stream.index()] {
                    self.terms[t].live = Some(stream);
                }
            } else {
                let chunk = Chunk {
                    source,
                    stream: Some(stream),
                    body: bytes,
                    ..Chunk::default()
                };
                self.accept_direct(chunk, None, now);
            }
        }
    }

    /// Ends open lines that made others wait [`OPEN_LINE_HOLD`].
    fn tick(&mut self, now: Instant) {
        self.emit_collapsed(now, false);
        self.ack_flushes();
        for t in 0..2 {
            let due = matches!(self.terms[t].held_since, Some(s) if now >= s + self.hold);
            if due {
                if let Some((_, stream)) = self.terms[t].open.take() {
                    self.end_line(stream);
                }
                self.drain(t, now);
            }
        }
        self.draw_bars(now);
    }

    /// All senders are gone: write everything still held.
    fn close(&mut self) {
        self.emit_collapsed(Instant::now(), true);
        self.finish_bars(Instant::now());
        for t in 0..2 {
            if let Some((_, stream)) = self.terms[t].open.take() {
                if !self.terms[t].held.is_empty() {
                    self.end_line(stream);
                }
            }
            while let Some((_, c, _)) = self.terms[t].held.pop_front() {
                self.terms[t].open = None;
                self.write_chunk(t, c);
            }
        }
        self.ack_flushes();
    }

    /// Writes the held chunks that may go now. With no line open that is the queue in order; while
    /// a source has its line open, it is that source's chunks, in their order, wherever they wait
    /// in the queue: they may have been queued behind others' before their line opened (a held
    /// open chunk, its continuation, then others'), and waiting behind chunks that wait for the
    /// line to end would break the line (and let that source's later lines, written directly,
    /// overtake its held ones).
    fn drain(&mut self, t: usize, now: Instant) {
        loop {
            let term = &self.terms[t];
            let next = match term.open {
                None => (!term.held.is_empty()).then_some(0),
                Some(owner) => term
                    .held
                    .iter()
                    .position(|(_, c, _)| c.stream.map(|s| (c.source, s)) == Some(owner)),
            };
            let Some(i) = next else {
                break;
            };
            let (_, chunk, permit) = self.terms[t].held.remove(i).expect("index");
            self.write_chunk(t, chunk);
            drop(permit);
        }
        let now = if self.real_clock { Instant::now() } else { now };
        let term = &mut self.terms[t];
        term.held_since = if term.held.is_empty() {
            None
        } else {
            Some(now)
        };
        self.ack_flushes();
    }

    fn ack_flushes(&mut self) {
        let oldest_held = self
            .terms
            .iter()
            .filter_map(|t| t.held.front().map(|(seq, _, _)| *seq))
            .min();
        let oldest_pending = self.collapse.as_ref().and_then(Collapser::oldest_index);
        let flushes = std::mem::take(&mut self.flushes);
        for (seq, mark, ack) in flushes {
            if oldest_held.is_some_and(|h| h < seq) || oldest_pending.is_some_and(|i| i < mark) {
                self.flushes.push((seq, mark, ack));
            } else {
                for w in &mut self.outs {
                    let _ = w.flush();
                }
                let _ = ack.send(());
            }
        }
    }

    /// Writes a chunk that may go now (terminal `t` has no open line, or it is this chunk's).
    fn write_chunk(&mut self, t: usize, chunk: Chunk) {
        let Some(stream) = chunk.stream else {
            return;
        };
        // rdrun's own text may have ended this source's open line since it was written.
        let mut still_open = self.terms[t].open == Some((chunk.source, stream));
        if self.terminal {
            still_open &= self.mid[stream.index()];
        }
        let mut bytes = Vec::with_capacity(chunk.len());
        if chunk.continues {
            if still_open {
                bytes.extend_from_slice(&chunk.cont);
            } else if !chunk.cont.iter().all(|b| *b == b'\n' || *b == b'\r') {
                // The writer ended this line for others: the rest starts a line of its own.
                bytes.extend_from_slice(&chunk.prefix);
                bytes.extend_from_slice(&chunk.cont);
            }
        }
        bytes.extend_from_slice(&chunk.body);
        self.terms[t].open = chunk.open.then_some((chunk.source, stream));
        self.write_raw(stream, &bytes);
    }

    /// Ends the open line on `stream` with a newline, unless rdrun's own text already did.
    fn end_line(&mut self, stream: Stream) {
        if self.terminal && !self.mid[stream.index()] {
            return;
        }
        self.write_raw(stream, b"\n");
    }

    fn write_raw(&mut self, stream: Stream, bytes: &[u8]) {
        self.write_bytes(stream, bytes, false);
    }

    /// Writes `bytes` to `stream`, after erasing a live progress line on its terminal; `live`:
    /// the bytes are that live line (rdrun's own text then erases it rather than end it).
    fn write_bytes(&mut self, stream: Stream, bytes: &[u8], live: bool) {
        let i = stream.index();
        if bytes.is_empty() || self.is_broken[i] {
            return;
        }
        let t = self.term(stream);
        let mut erased: Vec<u8>;
        let mut bytes = bytes;
        let mut erase_status = false;
        if self.status.shown && t == self.term(Stream::Stderr) {
            self.status.shown = false;
            if stream == Stream::Stderr {
                erase_status = true;
            } else {
                self.write_bytes(Stream::Stderr, ERASE, false);
            }
        }
        if let Some(ls) = self.terms[t].live.take() {
            if let Some(b) = &mut self.bars[ls.index()] {
                b.erased();
            }
            if ls == stream {
                erased = ERASE.to_vec();
                erased.extend_from_slice(bytes);
                bytes = &erased;
            } else {
                self.write_bytes(ls, ERASE, false);
            }
        }
        let status_erased: Vec<u8>;
        if erase_status && !bytes.starts_with(ERASE) {
            status_erased = [ERASE, bytes].concat();
            bytes = &status_erased;
        }
        if self.terminal {
            // A live bar's erase leaves the cursor at the start of an empty line.
            let mid = bytes.last() != Some(&b'\n') && !bytes.ends_with(ERASE);
            self.mid[i] = mid;
            self.mid_live[i] = live;
        }
        let w = &mut self.outs[i];
        let res = w.write_all(bytes).and_then(|()| w.flush());
        match res {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.is_broken[i] = true;
                self.broken[i].send_replace(true);
                tracing::debug!(
                    ?stream,
                    "console is a closed pipe: worker output to it stops"
                );
                // An open line on a dead stream holds nobody back.
                for t in 0..2 {
                    if self.terms[t].open.is_some_and(|(_, s)| s == stream) {
                        self.terms[t].open = None;
                        self.terms[t].held_since = self.terms[t].held_since.map(|_| {
                            Instant::now()
                                .checked_sub(self.hold)
                                .unwrap_or_else(Instant::now)
                        });
                    }
                }
            }
            Err(e) => {
                if !self.warned[i] {
                    self.warned[i] = true;
                    tracing::warn!(?stream, error = %e,
                        "cannot write worker output to rdrun's console; that output is lost \
                         (log files are not affected)");
                }
            }
        }
    }
}

#[path = "console_own.rs"]
mod own_text;

#[cfg(test)]
#[path = "console_tests.rs"]
mod tests;
