//! rdrun's own text on its stdout and stderr: log lines (the writer `tracing` is given), the
//! failure report, lifecycle events on the console, the waiting status line's plain lines, the
//! hang block.
//!
//! One writer owns the terminal: once the agent made the terminal's console
//! ([`super::Console::terminal`]) and [`attach`]ed it here, each text of rdrun's is a message to
//! that console's thread, which ends a worker's open line first (or erases a live bar or the
//! status line), so a line of rdrun's never lands inside a worker's unfinished line, and is
//! written in order with the workers' output. Before that (the binary's usage errors, `--help`,
//! `--dry-run`, the topology banner, log lines before the run starts) no console exists and
//! nothing else writes the terminal: the text is written directly.
//!
//! A write that fails (a closed pipe: `rdrun … 2>&1 | head -1`; a full disk: `2>/dev/full`) is
//! dropped, never a panic: the run's status stays the workers' (issue 24). `eprint!` panics on
//! such an error, so rdrun's code never uses it for its own text.
//!
//! The attached console sits in one process-wide slot (`TERMINAL`) because `tracing`'s writer
//! is process-wide: that slot is how log lines reach the console. The binary calls [`flush`]
//! before it exits, so that nothing queued is lost.

use std::io::{self, Write};
use std::sync::Mutex;

use super::Console;

/// The terminal's console once the agent attached it ([`attach`]); `None` before (text is then
/// written directly). The one process-wide piece of the terminal: `tracing`'s writer has no
/// other way to reach the console.
static TERMINAL: Mutex<Option<Console>> = Mutex::new(None);

/// Which of rdrun's streams a text goes to (a worker's stream is shown on the same one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(super) fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

/// From now on rdrun's own text goes to `console`, the terminal's (the agent's, once per run).
pub fn attach(console: Console) {
    *slot() = Some(console);
}

/// Waits until rdrun's own text and the workers' output queued so far are on the terminal
/// (the binary, before it exits; outside any async runtime).
pub fn flush() {
    let console = slot().clone();
    if let Some(c) = console {
        c.flush_blocking();
    }
}

fn slot() -> std::sync::MutexGuard<'static, Option<Console>> {
    TERMINAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `bytes` to the attached console, else writes them directly (no console exists then).
fn own_bytes(stream: Stream, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // The slot's lock is released before the send or the write: the console thread logs too
    // (a write error), and no writer waits on another while holding it.
    let console = slot().clone();
    match console {
        Some(c) => c.own(stream, bytes.to_vec()),
        None => {
            // Before the console exists only this writes the terminal (see the module doc).
            let _ = match stream {
                Stream::Stdout => {
                    let mut out = io::stdout().lock();
                    out.write_all(bytes).and_then(|()| out.flush())
                }
                Stream::Stderr => io::stderr().lock().write_all(bytes),
            };
        }
    }
}

/// Whether rdrun's `stream` is a terminal (the progress stage draws a live line there).
pub(crate) fn is_terminal(stream: Stream) -> bool {
    use std::io::IsTerminal;
    match stream {
        Stream::Stdout => io::stdout().is_terminal(),
        Stream::Stderr => io::stderr().is_terminal(),
    }
}

/// The width in columns of the terminal rdrun's `stream` is, if it is one.
pub(crate) fn columns(stream: Stream) -> Option<usize> {
    let fd = match stream {
        Stream::Stdout => 1,
        Stream::Stderr => 2,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the zeroed struct we own; a non-terminal fd
    // only returns -1.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// Whether two fds refer to the same file (one terminal, or `2>&1`).
pub(crate) fn same_file(a: i32, b: i32) -> bool {
    let stat = |fd: i32| -> Option<(u64, u64)> {
        // SAFETY: fstat writes into the zeroed struct we own; an invalid fd only returns -1.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
    };
    matches!((stat(a), stat(b)), (Some(x), Some(y)) if x == y)
}

/// Writes rdrun's own `text` to its stderr: after any open worker line is ended, errors dropped.
pub fn stderr(text: &str) {
    stderr_bytes(text.as_bytes());
}

/// [`stderr`] with a newline added (the `eprintln!` of rdrun's own lines).
pub fn stderr_line(text: &str) {
    // One write: a reader of the stream gets the line whole.
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    stderr_bytes(line.as_bytes());
}

fn stderr_bytes(bytes: &[u8]) {
    own_bytes(Stream::Stderr, bytes);
}

/// Writes rdrun's own `text` to its stdout (help, `--dry-run`, CI annotations): errors dropped.
pub fn stdout(text: &str) {
    own_bytes(Stream::Stdout, text.as_bytes());
}

/// The writer `tracing` formats each event into (one `write_all` per event): rdrun's stderr
/// through [`stderr`]; it never reports an error, so `tracing` has nothing to print about one.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        stderr_bytes(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The `MakeWriter` for rdrun's log (`tracing_subscriber::fmt().with_writer(own::log_writer)`).
pub fn log_writer() -> LogWriter {
    LogWriter
}
