//! The console writer: one thread per [`Console`] owns rdrun's stdout and stderr (the
//! process-wide one writes to them under their std locks, which `tracing` also takes). The
//! forwarders never block a runtime thread on a slow terminal: they wait (async) on a byte budget
//! ([`CONSOLE_BUDGET`]) that the writer thread returns after each write.
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
//! - rdrun's own text ([`super::own`]) ends an open line of the process-wide console with a `\n`
//!   before it is written; the continuation then starts a line of its own, as above.
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
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub(crate) use super::chunk::Chunk;
use super::collapse::Collapser;
use super::own::{self, Stream};
use super::progress::{Bars, ERASE};
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
}

/// The width of a stream's terminal in columns, when it is one.
type Columns = Box<dyn Fn(Stream) -> Option<usize> + Send>;

/// A console: one writer thread owning a stdout and a stderr writer. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    tx: std_mpsc::Sender<ConsoleMsg>,
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

    fn start(
        mut writer: Writer,
        rx: std_mpsc::Receiver<ConsoleMsg>,
        tx: std_mpsc::Sender<ConsoleMsg>,
        broken: Arc<[watch::Sender<bool>; 2]>,
    ) -> io::Result<Console> {
        writer.real_clock = true;
        std::thread::Builder::new()
            .name("rdrun-console".into())
            .spawn(move || loop {
                let msg = match writer.deadline() {
                    Some(at) => {
                        match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                            Ok(m) => Some(m),
                            Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                            Err(std_mpsc::RecvTimeoutError::Disconnected) => break writer.close(),
                        }
                    }
                    None => match rx.recv() {
                        Ok(m) => Some(m),
                        Err(_) => break writer.close(),
                    },
                };
                let now = Instant::now();
                match msg {
                    Some(ConsoleMsg::Data(chunk, permit)) => writer.accept(chunk, permit, now),
                    Some(ConsoleMsg::Flush(ack)) => writer.flush_request(ack),
                    Some(ConsoleMsg::Collapse(window)) => writer.set_collapse(window, now),
                    Some(ConsoleMsg::Progress(setup)) => writer.set_progress(setup, now),
                    // Only when nothing is queued: the open line's rest may be among the queued
                    // messages (a reader far behind), and ending the line before reading them
                    // would break it.
                    None => writer.tick(now),
                }
            })?;
        Ok(Console {
            tx,
            budget: Arc::new(Semaphore::new(CONSOLE_BUDGET)),
            broken,
        })
    }

    /// The process-wide console: rdrun's own stdout and stderr.
    ///
    /// rdrun's own lines on these streams ([`super::own`]) end the console's open line first;
    /// this console records where its writes leave the cursor for them.
    pub fn global() -> Console {
        static GLOBAL: OnceLock<Console> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let (tx, rx) = std_mpsc::channel::<ConsoleMsg>();
                let broken = Arc::new([watch::channel(false).0, watch::channel(false).0]);
                let mut writer = Writer::new(
                    [Box::new(io::stdout()), Box::new(io::stderr())],
                    own::shared_terminal(),
                    broken.clone(),
                );
                writer.global = true;
                writer.columns = Box::new(own::columns);
                Console::start(writer, rx, tx, broken)
                    .expect("cannot start the console writer thread")
            })
            .clone()
    }

    /// A fresh source id for one stream of one worker.
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
    /// The process-wide console: its writes take both std locks and keep [`own`]'s record of
    /// open lines (rdrun's own text ends them).
    global: bool,
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
            global: false,
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
        // Both std locks for the check and the write: rdrun's own text (`own`) may have ended
        // this source's open line since it was written.
        let locks = self.global.then(own::lock);
        let mut still_open = self.terms[t].open == Some((chunk.source, stream));
        if let Some(l) = &locks {
            still_open &= own::mid_line(l, stream);
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
        drop(locks);
    }

    /// Ends the open line on `stream` with a newline, unless rdrun's own text already did.
    fn end_line(&mut self, stream: Stream) {
        let locks = self.global.then(own::lock);
        if locks.as_ref().is_some_and(|l| !own::mid_line(l, stream)) {
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
        let locks = self.global.then(own::lock);
        if let Some(l) = &locks {
            own::wrote(l, stream, bytes);
            if live {
                own::wrote_live(l, stream);
            }
        }
        let w = &mut self.outs[i];
        let res = w.write_all(bytes).and_then(|()| w.flush());
        drop(locks);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A writer that records bytes, or fails with `fail` once `fail_after` bytes were written.
    #[derive(Clone, Default)]
    struct Rec {
        bytes: Arc<Mutex<Vec<u8>>>,
        fail: Option<(usize, io::ErrorKind)>,
    }
    impl Write for Rec {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let mut v = self.bytes.lock().expect("lock");
            if let Some((after, kind)) = self.fail {
                if v.len() >= after {
                    return Err(io::Error::from(kind));
                }
            }
            v.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Rec {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.bytes.lock().expect("lock")).into_owned()
        }
    }

    fn writer(shared: bool, out: &Rec, err: &Rec) -> (Writer, Arc<Semaphore>) {
        let broken = Arc::new([watch::channel(false).0, watch::channel(false).0]);
        let w = Writer::new(
            [Box::new(out.clone()), Box::new(err.clone())],
            shared,
            broken,
        );
        (w, Arc::new(Semaphore::new(1 << 20)))
    }

    fn permit(s: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        Some(s.clone().try_acquire_owned().expect("permit"))
    }

    fn lines(source: u64, stream: Stream, body: &str) -> Chunk {
        Chunk {
            source,
            stream: Some(stream),
            body: body.into(),
            ..Chunk::default()
        }
    }

    fn partial(source: u64, stream: Stream, prefix: &str, text: &str) -> Chunk {
        Chunk {
            open: true,
            body: format!("{prefix}{text}").into(),
            ..lines(source, stream, "")
        }
    }

    fn cont(source: u64, stream: Stream, prefix: &str, rest: &str, open: bool) -> Chunk {
        Chunk {
            continues: true,
            cont: rest.into(),
            prefix: prefix.into(),
            open,
            ..lines(source, stream, "")
        }
    }

    #[test]
    fn open_line_holds_others_until_it_ends() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(false, &out, &err);
        let t0 = Instant::now();
        w.accept(partial(1, Stdout, "[a]:", "Name? "), permit(&s), t0);
        // Another rank's line and a stderr line (its own terminal here).
        w.accept(lines(2, Stdout, "[b]:hello\n"), permit(&s), t0);
        w.accept(lines(3, Stderr, "warn\n"), permit(&s), t0);
        assert_eq!(out.text(), "[a]:Name? ");
        assert_eq!(err.text(), "warn\n");
        w.tick(t0 + Duration::from_millis(500));
        assert_eq!(out.text(), "[a]:Name? ");
        // The owner extends its line, then ends it: the held line follows.
        w.accept(cont(1, Stdout, "[a]:", "(y/n) ", true), permit(&s), t0);
        w.accept(cont(1, Stdout, "[a]:", "ok\n", false), permit(&s), t0);
        assert_eq!(out.text(), "[a]:Name? (y/n) ok\n[b]:hello\n");
        assert_eq!(w.deadline(), None);
    }

    #[test]
    fn open_line_ended_after_the_hold() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(true, &out, &err);
        let t0 = Instant::now();
        w.accept(partial(1, Stdout, "", "(Pdb) "), permit(&s), t0);
        // Shared terminal: a stderr line waits too.
        w.accept(lines(2, Stderr, "[b]:late\n"), permit(&s), t0);
        assert_eq!((out.text().as_str(), err.text().as_str()), ("(Pdb) ", ""));
        assert_eq!(w.deadline(), Some(t0 + OPEN_LINE_HOLD));
        w.tick(t0 + OPEN_LINE_HOLD);
        assert_eq!(out.text(), "(Pdb) \n");
        assert_eq!(err.text(), "[b]:late\n");
        // The continuation starts a line of its own, with the prefix; a bare terminator is
        // dropped (the writer already ended the line).
        w.accept(cont(1, Stdout, "[a]:", "rest\n", false), permit(&s), t0);
        assert_eq!(out.text(), "(Pdb) \n[a]:rest\n");
        w.accept(partial(1, Stdout, "[a]:", "x"), permit(&s), t0);
        w.accept(lines(2, Stdout, "[b]:y\n"), permit(&s), t0);
        w.tick(t0 + OPEN_LINE_HOLD * 3);
        w.accept(cont(1, Stdout, "[a]:", "\n", false), permit(&s), t0);
        assert_eq!(out.text(), "(Pdb) \n[a]:rest\n[a]:x\n[b]:y\n");
    }

    /// A source whose open chunk and continuation were both held behind another's open line
    /// gets them written together when that line ends, ahead of the chunks that were queued
    /// between them; its later lines come after its continuation, not glued onto its open line
    /// (issue 24: `@0:1:7383@0:1:7398:…`, the rest of 7383 later).
    #[test]
    fn held_open_line_and_its_rest_go_together() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(false, &out, &err);
        let t0 = Instant::now();
        w.accept(partial(1, Stdout, "", "T? "), permit(&s), t0);
        w.accept(partial(2, Stdout, "", "@0:7383"), permit(&s), t0);
        w.accept(lines(3, Stdout, "u1\n"), permit(&s), t0);
        w.accept(cont(2, Stdout, "", ":rest\n@0:7384\n", false), None, t0);
        w.accept(cont(1, Stdout, "", "yes\n", false), None, t0);
        w.accept(lines(2, Stdout, "@0:7385\n"), permit(&s), t0);
        w.accept(lines(3, Stdout, "u2\n"), permit(&s), t0);
        assert_eq!(
            out.text(),
            "T? yes\n@0:7383:rest\n@0:7384\nu1\n@0:7385\nu2\n"
        );
        assert_eq!(w.deadline(), None);
        // An open line made by a held chunk lets its owner's later direct chunks through in order.
        w.accept(partial(1, Stdout, "", "A"), permit(&s), t0);
        w.accept(partial(2, Stdout, "", "B"), permit(&s), t0);
        w.accept(lines(3, Stdout, "u3\n"), permit(&s), t0);
        w.accept(cont(1, Stdout, "", "a\n", false), None, t0);
        w.accept(cont(2, Stdout, "", "b\n", false), None, t0);
        assert_eq!(
            out.text(),
            "T? yes\n@0:7383:rest\n@0:7384\nu1\n@0:7385\nu2\nAa\nBb\nu3\n"
        );
    }

    fn ranked(rank: usize, stream: Stream, body: &str) -> Chunk {
        let mut ends = Vec::new();
        for (i, b) in body.bytes().enumerate() {
            if b == b'\n' {
                ends.push(i as u32 + 1);
            }
        }
        Chunk {
            rank: Some(rank),
            line_ends: ends,
            ..lines(10 + rank as u64, stream, body)
        }
    }

    #[test]
    fn the_collapse_stage_keeps_at_most_half_the_budget() {
        assert_eq!(super::super::collapse::PENDING_CAP, CONSOLE_BUDGET / 2);
    }

    /// `--output collapse` is a stage of this writer: identical lines wait at most the window and
    /// come out once; a prompt (open line) first makes everything pending go out, so a rank's
    /// prompt never overtakes its lines; a flush waits for the pending lines.
    #[test]
    fn collapse_stage_in_the_writer() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(false, &out, &err);
        let t0 = Instant::now();
        let win = Duration::from_millis(500);
        w.set_collapse(Some((win, 4)), t0);
        for r in 0..3 {
            w.accept(ranked(r, Stdout, "step 1\n"), permit(&s), t0);
        }
        assert_eq!(out.text(), "", "held for the window");
        assert_eq!(w.deadline(), Some(t0 + win));
        let (ack, mut done) = oneshot::channel();
        w.flush_request(ack);
        assert!(
            done.try_recv().is_err(),
            "flush acked before pending lines went out"
        );
        w.tick(t0 + win);
        assert_eq!(out.text(), "[0-2] step 1\n");
        assert!(done.try_recv().is_ok());
        // A line from one rank, then its prompt: the line first, then the open prompt.
        w.accept(ranked(1, Stdout, "about to stop\n"), permit(&s), t0 + win);
        w.accept(partial(11, Stdout, "", "(Pdb) "), permit(&s), t0 + win);
        assert_eq!(out.text(), "[0-2] step 1\nabout to stop\n(Pdb) ");
        // Others' lines wait behind the open line as without collapse.
        w.accept(ranked(0, Stdout, "x\n"), permit(&s), t0 + win);
        w.accept(ranked(2, Stdout, "x\n"), permit(&s), t0 + win);
        w.tick(t0 + win * 2);
        assert_eq!(out.text(), "[0-2] step 1\nabout to stop\n(Pdb) ");
        w.accept(cont(11, Stdout, "", "c\n", false), None, t0 + win * 2);
        assert_eq!(
            out.text(),
            "[0-2] step 1\nabout to stop\n(Pdb) c\n[0,2] x\n"
        );
        assert_eq!(s.available_permits(), 1 << 20, "permits returned");
        // Turned off: nothing pending is lost.
        w.accept(ranked(3, Stdout, "last\n"), permit(&s), t0 + win * 2);
        w.set_collapse(None, t0 + win * 2);
        assert!(out.text().ends_with("x\nlast\n"), "{}", out.text());
    }

    fn bar_update(rank: usize, stream: Stream, text: &str) -> Chunk {
        Chunk {
            rank: Some(rank),
            bar: Some(text.into()),
            ..lines(10 + rank as u64, stream, "")
        }
    }

    /// `--progress` on a terminal: one live line for the ranks' bars, erased before any other
    /// write and drawn again once due; never drawn into an open prompt; a rank's final line
    /// ends its bar; at the end each bar left is a line of its own.
    #[test]
    fn progress_stage_draws_one_live_line() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(true, &out, &err);
        let t0 = Instant::now();
        w.set_progress([None, Some((true, Duration::from_secs(5)))], t0);
        for (r, p) in [(0, "50%|a"), (1, "40%|b"), (2, "45%|c")] {
            w.accept(bar_update(r, Stderr, p), permit(&s), t0);
        }
        // The first update draws at once; the next two changed it within 100 ms.
        assert_eq!(err.text(), "\r50%|a\x1b[K");
        assert_eq!(w.deadline(), Some(t0 + Duration::from_millis(100)));
        w.tick(t0 + Duration::from_millis(100));
        assert_eq!(
            err.text(),
            "\r50%|a\x1b[K\r[0-2] 40%|b (slowest rank 1; 40-50%)\x1b[K"
        );
        err.bytes.lock().expect("lock").clear();
        // A line on the same terminal (stdout: shared) erases the bar first; it comes back.
        let t1 = t0 + Duration::from_millis(150);
        w.accept(ranked(3, Stdout, "hello\n"), permit(&s), t1);
        assert_eq!(err.text(), "\r\x1b[K");
        assert_eq!(out.text(), "hello\n");
        w.tick(t0 + Duration::from_millis(200));
        assert_eq!(
            err.text(),
            "\r\x1b[K\r[0-2] 40%|b (slowest rank 1; 40-50%)\x1b[K"
        );
        err.bytes.lock().expect("lock").clear();
        // A prompt: the bar is erased and not drawn into it, whatever changes.
        let t2 = t0 + Duration::from_millis(300);
        w.accept(partial(13, Stdout, "", "(Pdb) "), permit(&s), t2);
        w.accept(bar_update(1, Stderr, "41%|b"), permit(&s), t2);
        w.tick(t2 + Duration::from_millis(500));
        assert_eq!(err.text(), "\r\x1b[K");
        assert!(
            w.deadline().is_none(),
            "no busy wait while the prompt is open"
        );
        w.accept(
            cont(13, Stdout, "", "c\n", false),
            None,
            t2 + Duration::from_millis(600),
        );
        assert!(err
            .text()
            .ends_with("\r[0-2] 41%|b (slowest rank 1; 41-50%)\x1b[K"));
        err.bytes.lock().expect("lock").clear();
        // Rank 1's final line ends its bar (erase, the line, the bar of the others).
        let t3 = t0 + Duration::from_secs(2);
        let mut fin = ranked(1, Stderr, "100%|b\n");
        fin.ends_bar = true;
        w.accept(fin, permit(&s), t3);
        assert_eq!(
            err.text(),
            "\r\x1b[K100%|b\n\r[0,2] 45%|c (slowest rank 2; 45-50%)\x1b[K"
        );
        err.bytes.lock().expect("lock").clear();
        // The end: the live line erased, the bars left written as lines.
        w.close();
        assert_eq!(err.text(), "\r\x1b[K50%|a\n45%|c\n");
        assert_eq!(s.available_permits(), 1 << 20, "permits returned");
    }

    /// `--progress` on a pipe: an ordinary line at most once per interval.
    #[test]
    fn progress_stage_on_a_pipe() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(false, &out, &err);
        let t0 = Instant::now();
        let iv = Duration::from_secs(1);
        w.set_progress([None, Some((false, iv))], t0);
        let mut t = t0;
        for i in 0..250u32 {
            for r in 0..2 {
                let text = format!("{}%|", i * 100 / 250 + r);
                w.accept(bar_update(r as usize, Stderr, &text), permit(&s), t);
            }
            if w.deadline().is_some_and(|d| d <= t) {
                w.tick(t);
            }
            t += Duration::from_millis(10);
        }
        // At t0 only rank 0's first update had come (its bar alone, as written); at 1 s and
        // 2 s rank 0 had just moved to the value rank 1 already had.
        assert_eq!(
            err.text(),
            "0%|\n[0-1] 40%| (all at 40%)\n[0-1] 80%| (all at 80%)\n"
        );
        assert!(!err.text().contains('\r'));
    }

    #[test]
    fn flush_waits_for_held_chunks() {
        use Stream::*;
        let (out, err) = (Rec::default(), Rec::default());
        let (mut w, s) = writer(false, &out, &err);
        let t0 = Instant::now();
        w.accept(partial(1, Stdout, "", "p"), permit(&s), t0);
        w.accept(lines(2, Stdout, "b\n"), permit(&s), t0);
        let (ack, mut done) = oneshot::channel();
        w.flush_request(ack);
        assert!(
            done.try_recv().is_err(),
            "acked before the held line was written"
        );
        w.accept(cont(1, Stdout, "", "\n", false), permit(&s), t0);
        assert!(done.try_recv().is_ok());
        assert_eq!(out.text(), "p\nb\n");
        // A flush with nothing held is acked at once.
        let (ack, mut done) = oneshot::channel();
        w.flush_request(ack);
        assert!(done.try_recv().is_ok());
    }

    #[test]
    fn write_errors_never_panic() {
        use Stream::*;
        // EPIPE on stdout: marked broken, nothing more tried there; stderr goes on.
        let out = Rec {
            fail: Some((3, io::ErrorKind::BrokenPipe)),
            ..Rec::default()
        };
        let err = Rec {
            fail: Some((0, io::ErrorKind::StorageFull)),
            ..Rec::default()
        };
        let (mut w, s) = writer(false, &out, &err);
        let broken = w.broken[0].subscribe();
        let t0 = Instant::now();
        w.accept(lines(1, Stdout, "ab\n"), permit(&s), t0);
        assert!(!*broken.borrow());
        w.accept(partial(1, Stdout, "", "open"), permit(&s), t0);
        assert!(*broken.borrow());
        // The dead stream's open line holds nobody back.
        w.accept(lines(2, Stdout, "c\n"), permit(&s), t0);
        w.tick(t0);
        assert_eq!(w.deadline(), None);
        assert_eq!(out.text(), "ab\n");
        // ENOSPC: dropped, not broken.
        w.accept(lines(1, Stderr, "e\n"), permit(&s), t0);
        assert!(!*w.broken[1].subscribe().borrow());
        assert_eq!(s.available_permits(), 1 << 20, "permits returned");
    }
}
