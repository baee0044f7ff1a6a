//! rdrun's own text on its stdout and stderr: log lines (the writer `tracing` is given), the
//! failure report, lifecycle events on the console, the waiting status line, the hang block.
//!
//! Two rules, both about sharing the terminal with worker output:
//! - A write that fails (a closed pipe: `rdrun … 2>&1 | head -1`; a full disk: `2>/dev/full`) is
//!   dropped, never a panic: the run's status stays the workers' (issue 24). `eprint!` panics on
//!   such an error, so rdrun's code never uses it for its own text.
//! - A line of rdrun's never lands inside a worker's unfinished line. The process-wide console
//!   ([`super::console`]) records, under the std locks of stdout and stderr, whether its last
//!   write to each left the cursor mid-line ([`MID_LINE`]); rdrun's own text takes the same locks
//!   and first ends such a line with `\n`. The console then sees that its open line was ended
//!   and writes the worker's continuation as a line of its own.
//!
//! Both locks are always taken in the same order (stdout, then stderr), here and in the console
//! writer, so that on a shared terminal (`2>&1`, a TTY) nothing slips between the check and the
//! write.

use std::io::{self, StderrLock, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

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

/// Per stream (stdout, stderr): the process-wide console's last write to it did not end with a
/// newline (an open prompt, a `\r` progress line, a worker's last line while it is shown).
static MID_LINE: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
/// Per stream: that open line is the progress stage's live bar, erased (`\r\x1b[K`) rather than
/// ended with a newline before rdrun's own text (a snapshot of a bar is no line of anyone's).
static LIVE: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// rdrun's stdout and stderr, both locked (stdout first).
pub(crate) struct Locked {
    pub out: StdoutLock<'static>,
    pub err: StderrLock<'static>,
}

/// Takes both std locks in the one order every writer of rdrun's uses.
pub(crate) fn lock() -> Locked {
    let out = io::stdout().lock();
    let err = io::stderr().lock();
    Locked { out, err }
}

/// Whether the console's last write to `stream` left the cursor mid-line (call with [`lock`]
/// held).
pub(crate) fn mid_line(_held: &Locked, stream: Stream) -> bool {
    MID_LINE[stream.index()].load(Ordering::Relaxed)
}

/// Records where the console's write of `bytes` to `stream` left the cursor (call with [`lock`]
/// held).
pub(crate) fn wrote(_held: &Locked, stream: Stream, bytes: &[u8]) {
    if let Some(last) = bytes.last() {
        // A live bar's erase leaves the cursor at the start of an empty line.
        let mid = *last != b'\n' && !bytes.ends_with(b"\r\x1b[K");
        MID_LINE[stream.index()].store(mid, Ordering::Relaxed);
        LIVE[stream.index()].store(false, Ordering::Relaxed);
    }
}

/// Records that the console's last write to `stream` (after [`wrote`]) was the progress
/// stage's live bar (call with [`lock`] held).
pub(crate) fn wrote_live(_held: &Locked, stream: Stream) {
    LIVE[stream.index()].store(true, Ordering::Relaxed);
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

/// stdout and stderr are one file (a TTY, `2>&1`), so a line left open on either is in the way
/// of rdrun's stderr text. Decided once: rdrun's own fds 1 and 2 do not change during a run.
pub(crate) fn shared_terminal() -> bool {
    static SHARED: OnceLock<bool> = OnceLock::new();
    *SHARED.get_or_init(|| same_file(1, 2))
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

/// Ends the console's open line that `stream`'s text would otherwise be glued onto.
fn end_open_line(l: &mut Locked, stream: Stream) {
    let shared = shared_terminal();
    for s in [Stream::Stdout, Stream::Stderr] {
        if (s == stream || shared) && MID_LINE[s.index()].swap(false, Ordering::Relaxed) {
            let end: &[u8] = if LIVE[s.index()].swap(false, Ordering::Relaxed) {
                b"\r\x1b[K"
            } else {
                b"\n"
            };
            let _ = match s {
                Stream::Stdout => l.out.write_all(end).and_then(|()| l.out.flush()),
                Stream::Stderr => l.err.write_all(end),
            };
        }
    }
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
    if bytes.is_empty() {
        return;
    }
    let mut l = lock();
    end_open_line(&mut l, Stream::Stderr);
    let _ = l.err.write_all(bytes);
}

/// Writes rdrun's own `text` to its stdout (help, `--dry-run`): errors dropped.
pub fn stdout(text: &str) {
    let mut l = lock();
    end_open_line(&mut l, Stream::Stdout);
    let _ = l.out.write_all(text.as_bytes());
    let _ = l.out.flush();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mid_line_is_ended_before_own_text() {
        let l = lock();
        wrote(&l, Stream::Stderr, b"(Pdb) ");
        assert!(mid_line(&l, Stream::Stderr));
        // What rdrun's own text does first (the harness does not capture fd 2: only the one
        // newline that ends the pretended open line reaches the test's stderr).
        let mut l = l;
        end_open_line(&mut l, Stream::Stderr);
        assert!(!mid_line(&l, Stream::Stderr), "open line not ended");
        end_open_line(&mut l, Stream::Stderr);
        wrote(&l, Stream::Stderr, b"done\n");
        assert!(!mid_line(&l, Stream::Stderr));
    }
}
