//! Worker output: `--log-dir` layout, `-r/--redirects`, `-t/--tee`, `--local-ranks-filter`, line
//! prefixes, duplicate filters, and line-atomic forwarding of every worker's stdout/stderr pipes to
//! the console (spec torchrun-compat.md §5).
//!
//! Contract (the agent calls only these items):
//! - [`RunLogs::new`] once per run, [`RunLogs::attempt`] before each spawn round, [`RunLogs::finish`]
//!   at the end, *after* the failure report was rendered (it removes directories rdrun created that
//!   hold nothing; dropping a [`RunLogs`] does the same).
//! - [`forward`] once per worker with the read ends of its stdout and stderr pipes; the returned
//!   task ends when both reach EOF *and* every line it produced is on the console, and yields the
//!   last stderr lines and the last Python traceback for the failure report.
//!
//! # Layout
//! `<log_dir>/<run_id>_<8 random chars>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}`
//! plus `attempt_<n>/filtered_{stdout,stderr}.log` when duplicate filters are set, as torchrun's
//! `DefaultLogsSpecs`. The run directory is made at the first attempt; an existing attempt
//! directory is removed and made again. `stdout.log` / `stderr.log` exist only for redirected or
//! tee'd streams; `error.json` only if the worker wrote it (PyTorch's `@record`).
//!
//! Differences from torchrun (see docs/compat.md):
//! - Without `--log-dir`, torchrun always creates `mkdtemp("torchelastic_")` and never removes it.
//!   rdrun makes a private `$TMPDIR/rdrun-<run_id>-<8 chars>` (error files must have an existing
//!   directory before the worker starts) and, at [`RunLogs::finish`], removes it, except: when
//!   some stream went only to a file (`-r`, or `-t` outside `--local-ranks-filter`) everything is
//!   kept (its place is logged as a warning at the start); else the `error.json` files of the
//!   last attempt are kept (the failure report names them). Tee'd logs there repeat the console
//!   and are removed.
//! - Empty rank/attempt/run directories that rdrun created under `--log-dir` are removed at the end.
//! - Every stream passes through rdrun, so lines are never split or interleaved mid-line (torchrun
//!   passes untee'd streams through raw, and its tail threads split partial lines).
//!
//! # Line rules
//! A line ends at `\n` (or `\r\n`). A lone `\r` also ends a console segment, written with its `\r`
//! and no added newline, so that progress bars (tqdm) still redraw in place. A line longer than
//! [`MAX_LINE`] (1 MiB) is emitted in pieces of that size, each written whole; on the console each
//! piece gets a newline (and the prefix); this bounds memory at about 1 MiB per stream. A final
//! line without newline at EOF is emitted, with a newline added on the console. Log files receive
//! the bytes exactly as the worker wrote them, written as soon as they are read.
//!
//! # Console writer
//! Console bytes go through one writer thread per [`Console`] (the process-wide one writes to
//! rdrun's stdout/stderr under their std locks, which `tracing` also takes). Each message is a run
//! of whole lines of one worker, written with one `write_all` + `flush`, so ranks never interleave
//! mid-line. The forwarders never block a runtime thread on a slow terminal: they wait (async) on a
//! byte budget ([`CONSOLE_BUDGET`]) that the writer thread returns after each write.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use crate::config::LogConfig;

/// Longest piece of a line kept in memory before it is emitted in pieces.
pub const MAX_LINE: usize = 1 << 20;
/// Number of stderr lines kept for the failure report.
pub const TAIL_LINES: usize = 20;
/// Longest stderr tail or traceback line kept (in bytes, before lossy UTF-8 decoding).
pub const KEPT_LINE_MAX: usize = 4096;
/// Lines kept from the start of a traceback when it is longer than [`TRACEBACK_MAX_LINES`].
const TRACEBACK_HEAD: usize = 40;
/// Most traceback lines kept (head + tail; the middle is replaced by one marker line).
pub const TRACEBACK_MAX_LINES: usize = 200;
/// A traceback is reported only if it ended at most this many stderr lines before EOF (teardown
/// warnings of torch often follow the traceback; an older, handled traceback is not the cause).
pub const TRACEBACK_RECENT_LINES: usize = 50;
/// Console bytes queued (all workers together) before forwarders wait for the terminal.
pub const CONSOLE_BUDGET: usize = 4 << 20;
/// Read size from a worker pipe.
const READ_CHUNK: usize = 64 << 10;

/// Log layout of one run: `<log_dir>/<run_id>_<suffix>/attempt_<n>/<local_rank>/…`, created lazily.
#[derive(Debug)]
pub struct RunLogs {
    log: LogConfig,
    run_id: String,
    mode: Mode,
    /// Run directory, made at the first attempt.
    run_dir: Option<PathBuf>,
    /// Attempt directories made so far, in order (the last one is the current attempt).
    attempts: Vec<PathBuf>,
    /// Some worker stream goes to a file only (redirected, or tee'd but outside
    /// `--local-ranks-filter`): that file is its only copy.
    file_only_streams: bool,
    /// The place of the temporary run directory was logged.
    announced: bool,
    finished: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// `--log-dir /dev/null`: no files at all, TORCHELASTIC_ERROR_FILE="".
    DevNull,
    /// `--log-dir DIR`.
    Dir(PathBuf),
    /// No `--log-dir`: a private directory under $TMPDIR, removed at the end if nothing needs it.
    Temp(PathBuf),
}

/// What one attempt's workers get.
#[derive(Debug, Clone)]
pub struct AttemptLogs {
    /// One entry per local rank.
    pub ranks: Vec<RankLogs>,
    /// `<run dir>/attempt_<n>`; `None` with `--log-dir /dev/null`.
    pub dir: Option<PathBuf>,
}

/// Per-rank log settings for one attempt.
#[derive(Debug, Clone)]
pub struct RankLogs {
    /// Value of TORCHELASTIC_ERROR_FILE for this worker ("" when logs go nowhere).
    pub error_file: String,
    /// Where this worker's streams go; passed back to [`forward`].
    pub sink: RankSink,
}

/// Where one worker's two streams go (console, file, both, nowhere) and the tee prefix.
///
/// A stream that goes both to a file and to the console is tee'd: its console lines get
/// `prefix`, and its lines containing a duplicate filter are also appended (prefixed) to the
/// attempt's filtered log. Console-only streams are written unprefixed.
#[derive(Debug, Clone, Default)]
pub struct RankSink {
    pub stdout_file: Option<PathBuf>,
    pub stderr_file: Option<PathBuf>,
    pub stdout_console: bool,
    pub stderr_console: bool,
    /// Prefix for console lines (tee'd streams only), e.g. `[default0]:`.
    pub prefix: Option<String>,
    /// `attempt_<n>/filtered_stdout.log` when `--duplicate-stdout-filters` is set.
    pub filtered_stdout: Option<PathBuf>,
    pub filtered_stderr: Option<PathBuf>,
    pub stdout_filters: Vec<String>,
    pub stderr_filters: Vec<String>,
}

/// What [`forward`] yields when both streams are closed.
#[derive(Debug, Clone, Default)]
pub struct OutputSummary {
    /// The last (up to [`TAIL_LINES`]) lines the worker wrote to stderr, as printed (lossy UTF-8,
    /// each cut at [`KEPT_LINE_MAX`] bytes).
    pub stderr_tail: Vec<String>,
    /// The last Python traceback on stderr, from `Traceback (most recent call last):` to the
    /// exception line (chained exceptions included), as printed (torch's `[rankN]: ` prefixes
    /// kept); `None` if there is none or it ended more than [`TRACEBACK_RECENT_LINES`] lines before
    /// EOF. At most [`TRACEBACK_MAX_LINES`] lines (the middle is elided with a marker line).
    pub traceback: Option<Vec<String>>,
}

/// Identity of a worker for prefixes and templates.
#[derive(Debug, Clone)]
pub struct RankIdentity {
    pub role: String,
    pub rank: usize,
    pub local_rank: usize,
    pub hostname: String,
}

impl RunLogs {
    pub fn new(log: &LogConfig, run_id: &str) -> Self {
        Self::with_temp_root(log, run_id, std::env::temp_dir())
    }

    /// [`RunLogs::new`] with the directory used instead of `$TMPDIR` when `--log-dir` is unset.
    pub fn with_temp_root(log: &LogConfig, run_id: &str, temp_root: PathBuf) -> Self {
        let mode = match &log.log_dir {
            Some(dir) if dir == Path::new("/dev/null") => Mode::DevNull,
            Some(dir) => Mode::Dir(dir.clone()),
            None => Mode::Temp(temp_root),
        };
        RunLogs {
            log: log.clone(),
            run_id: run_id.to_string(),
            mode,
            run_dir: None,
            attempts: Vec::new(),
            file_only_streams: false,
            announced: false,
            finished: false,
        }
    }

    /// The run directory, once the first attempt made it.
    pub fn run_dir(&self) -> Option<&Path> {
        self.run_dir.as_deref()
    }

    /// The private temporary run directory when nothing in it must outlive rdrun (no
    /// `--log-dir` and no file-only stream): a watchdog that outlives a SIGKILLed rdrun may
    /// remove it. `None` before the first attempt or when the directory holds user logs.
    pub fn disposable_dir(&self) -> Option<&Path> {
        match self.mode {
            Mode::Temp(_) if !self.file_only_streams => self.run_dir.as_deref(),
            _ => None,
        }
    }

    /// Prepares attempt `restart_count` for `ids.len()` workers (index = local rank): makes the
    /// directories and empty log files, and decides every stream's destinations.
    pub fn attempt(
        &mut self,
        restart_count: u32,
        ids: &[RankIdentity],
    ) -> std::io::Result<AttemptLogs> {
        if self.mode == Mode::DevNull {
            // torchrun: redirects, tee and the rank filter are all ignored; plain console output.
            return Ok(AttemptLogs {
                dir: None,
                ranks: ids
                    .iter()
                    .map(|_| RankLogs {
                        error_file: String::new(),
                        sink: RankSink {
                            stdout_console: true,
                            stderr_console: true,
                            ..RankSink::default()
                        },
                    })
                    .collect(),
            });
        }
        let run_dir = self.ensure_run_dir()?;
        let attempt_dir = run_dir.join(format!("attempt_{restart_count}"));
        match fs::remove_dir_all(&attempt_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(with_path(e, "cannot remove", &attempt_dir)),
        }
        fs::create_dir(&attempt_dir).map_err(|e| with_path(e, "cannot create", &attempt_dir))?;
        self.attempts.retain(|d| d != &attempt_dir);
        self.attempts.push(attempt_dir.clone());

        let filtered_stdout = self.filtered_file(&attempt_dir, "filtered_stdout.log", true)?;
        let filtered_stderr = self.filtered_file(&attempt_dir, "filtered_stderr.log", false)?;

        let mut ranks = Vec::with_capacity(ids.len());
        for id in ids {
            let lr = id.local_rank;
            let rank_dir = attempt_dir.join(lr.to_string());
            fs::create_dir(&rank_dir).map_err(|e| with_path(e, "cannot create", &rank_dir))?;
            let tee = self.log.tee.for_rank(lr);
            let redirect = self.log.redirects.for_rank(lr);
            let to_file_out = redirect.stdout() || tee.stdout();
            let to_file_err = redirect.stderr() || tee.stderr();
            let visible = match &self.log.local_ranks_filter {
                Some(list) if !list.is_empty() => list.contains(&lr),
                _ => true,
            };
            let stdout_file = if to_file_out {
                Some(create_log(&rank_dir.join("stdout.log"))?)
            } else {
                None
            };
            let stderr_file = if to_file_err {
                Some(create_log(&rank_dir.join("stderr.log"))?)
            } else {
                None
            };
            // Console: a redirected stream only if tee'd; a plain stream always; neither for a
            // rank outside --local-ranks-filter.
            let stdout_console = visible && (!to_file_out || tee.stdout());
            let stderr_console = visible && (!to_file_err || tee.stderr());
            self.file_only_streams |=
                (to_file_out && !stdout_console) || (to_file_err && !stderr_console);
            let prefix = line_prefix(self.log.prefix_template.as_deref(), id);
            ranks.push(RankLogs {
                error_file: rank_dir.join("error.json").to_string_lossy().into_owned(),
                sink: RankSink {
                    stdout_file,
                    stderr_file,
                    stdout_console,
                    stderr_console,
                    prefix: Some(prefix),
                    filtered_stdout: filtered_stdout.clone(),
                    filtered_stderr: filtered_stderr.clone(),
                    stdout_filters: self.log.duplicate_stdout_filters.clone(),
                    stderr_filters: self.log.duplicate_stderr_filters.clone(),
                },
            });
        }
        if self.file_only_streams && !self.announced && matches!(self.mode, Mode::Temp(_)) {
            // Without --log-dir the files would be hard to find; torchrun says it only at INFO.
            self.announced = true;
            tracing::warn!(
                "no --log-dir given: worker output not shown on the console goes to {}",
                run_dir.display()
            );
        }
        Ok(AttemptLogs {
            ranks,
            dir: Some(attempt_dir),
        })
    }

    /// Ends the run: removes directories rdrun created that hold nothing (and, without
    /// `--log-dir`, the private temporary directory unless it holds the only copy of some worker
    /// output or error files of the last attempt). Call it after the failure report was rendered.
    pub fn finish(mut self) {
        self.cleanup();
    }

    fn cleanup(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let Some(run_dir) = self.run_dir.clone() else {
            return;
        };
        let temp = matches!(self.mode, Mode::Temp(_));
        if temp && !self.file_only_streams {
            // Nothing here is the only copy of worker output (tee'd logs repeat the console):
            // keep only the error files of the last attempt, which the report names.
            let last = self.attempts.last().cloned();
            for dir in &self.attempts {
                if Some(dir) == last.as_ref() {
                    keep_only_error_files(dir);
                } else {
                    remove_tree(dir);
                }
            }
        }
        for dir in &self.attempts {
            remove_empty_children(dir);
            let _ = fs::remove_dir(dir);
        }
        match fs::remove_dir(&run_dir) {
            Ok(()) => {}
            Err(_) if temp => {
                tracing::info!(dir = %run_dir.display(), "worker logs and error files kept");
            }
            Err(_) => {}
        }
    }

    fn ensure_run_dir(&mut self) -> io::Result<PathBuf> {
        if let Some(dir) = &self.run_dir {
            return Ok(dir.clone());
        }
        let safe_id: String = self
            .run_id
            .chars()
            .map(|c| if c == '/' || c == '\0' { '_' } else { c })
            .collect();
        let (root, prefix) = match &self.mode {
            Mode::Dir(root) => {
                if root.exists() && !root.is_dir() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("--log-dir {}: not a directory", root.display()),
                    ));
                }
                fs::create_dir_all(root).map_err(|e| with_path(e, "cannot create", root))?;
                (root.clone(), format!("{safe_id}_"))
            }
            Mode::Temp(root) => (root.clone(), format!("rdrun-{safe_id}-")),
            Mode::DevNull => {
                return Err(io::Error::other(
                    "no run directory with --log-dir /dev/null",
                ))
            }
        };
        let dir = make_unique_dir(&root, &prefix)?;
        self.run_dir = Some(dir.clone());
        Ok(dir)
    }

    fn filtered_file(
        &self,
        attempt_dir: &Path,
        name: &str,
        stdout: bool,
    ) -> io::Result<Option<PathBuf>> {
        let filters = if stdout {
            &self.log.duplicate_stdout_filters
        } else {
            &self.log.duplicate_stderr_filters
        };
        if filters.is_empty() {
            return Ok(None);
        }
        Ok(Some(create_log(&attempt_dir.join(name))?))
    }
}

impl Drop for RunLogs {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

fn create_log(path: &Path) -> io::Result<PathBuf> {
    File::create(path).map_err(|e| with_path(e, "cannot create", path))?;
    Ok(path.to_path_buf())
}

/// Makes `<root>/<prefix><8 random chars>` with mode 0700, as Python's `mkdtemp`.
fn make_unique_dir(root: &Path, prefix: &str) -> io::Result<PathBuf> {
    // Python's tempfile alphabet.
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789_";
    let mut last_err = None;
    for _ in 0..100 {
        let suffix: String = random_bytes()
            .iter()
            .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
            .collect();
        let dir = root.join(format!("{prefix}{suffix}"));
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(with_path(e, "cannot create", &dir)),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("cannot create a unique directory")))
}

fn random_bytes() -> [u8; 8] {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is a valid, writable buffer of `buf.len()` bytes for the whole call.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n != buf.len() as isize {
        // getrandom cannot fail for 8 bytes on Linux ≥ 3.17; fall back to time and pid anyway.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mixed = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
        buf = mixed.to_le_bytes();
    }
    buf
}

fn remove_tree(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot remove");
        }
    }
}

/// Removes everything in an attempt directory but `<local_rank>/error.json`.
fn keep_only_error_files(attempt_dir: &Path) {
    let Ok(entries) = fs::read_dir(attempt_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            let _ = fs::remove_file(&path);
            continue;
        }
        let Ok(files) = fs::read_dir(&path) else {
            continue;
        };
        for file in files.flatten() {
            if file.file_name() != "error.json" {
                let p = file.path();
                if p.is_dir() {
                    remove_tree(&p);
                } else {
                    let _ = fs::remove_file(&p);
                }
            }
        }
    }
}

/// Removes the empty sub-directories of `dir` (rank directories nobody wrote into).
fn remove_empty_children(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            // remove_dir fails on a non-empty directory, which is what we want.
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// The console prefix of a tee'd line: `[<role><local_rank>]:` or the template, substituted.
pub fn line_prefix(template: Option<&str>, id: &RankIdentity) -> String {
    match template {
        Some(t) => substitute_template(t, id),
        None => format!("[{}{}]:", id.role, id.local_rank),
    }
}

/// Python `string.Template.safe_substitute` with `role_name`, `rank`, `local_rank`, `hostname`:
/// `$$` is `$`, `$name` / `${name}` are replaced when known, anything else is kept as written.
pub fn substitute_template(template: &str, id: &RankIdentity) -> String {
    let lookup = |name: &str| -> Option<String> {
        match name {
            "role_name" => Some(id.role.clone()),
            "rank" => Some(id.rank.to_string()),
            "local_rank" => Some(id.local_rank.to_string()),
            "hostname" => Some(id.hostname.clone()),
            _ => None,
        }
    };
    // Python's idpattern `[_a-z][_a-z0-9]*`, matched case-insensitively (ASCII).
    let ident_len = |s: &str| -> usize {
        let b = s.as_bytes();
        if b.is_empty() || !(b[0] == b'_' || b[0].is_ascii_alphabetic()) {
            return 0;
        }
        b.iter()
            .take_while(|c| **c == b'_' || c.is_ascii_alphanumeric())
            .count()
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        if let Some(inner) = after.strip_prefix('{') {
            let n = ident_len(inner);
            if n > 0 && inner[n..].starts_with('}') {
                if let Some(v) = lookup(&inner[..n]) {
                    out.push_str(&v);
                    rest = &inner[n + 1..];
                    continue;
                }
            }
        } else {
            let n = ident_len(after);
            if n > 0 {
                if let Some(v) = lookup(&after[..n]) {
                    out.push_str(&v);
                    rest = &after[n..];
                    continue;
                }
            }
        }
        out.push('$');
        rest = after;
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------------------------------------
// Line splitting

/// How a segment ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// `\n` or `\r\n`.
    Newline,
    /// A lone `\r` (progress bars).
    Return,
    /// The line reached [`MAX_LINE`] bytes; more of it follows.
    Cap,
    /// The stream ended without a final newline.
    Eof,
}

impl End {
    /// Whether the console needs an added `\n` after this segment.
    fn needs_newline(self) -> bool {
        matches!(self, End::Cap | End::Eof)
    }
}

/// Splits a byte stream into segments, holding at most `cap` bytes of an unfinished line.
#[derive(Debug)]
struct Splitter {
    buf: Vec<u8>,
    cap: usize,
}

impl Splitter {
    fn new(cap: usize) -> Self {
        Splitter {
            buf: Vec::new(),
            cap,
        }
    }

    /// Appends `data`; calls `emit(segment, end)` for every finished segment, `segment` including
    /// its terminator bytes as written.
    fn push(&mut self, data: &[u8], emit: &mut dyn FnMut(&[u8], End)) {
        // The held part has no terminator except maybe a final '\r' waiting for a possible '\n'.
        let mut from = self.buf.len().saturating_sub(1);
        self.buf.extend_from_slice(data);
        let mut start = 0;
        while let Some(i) = self.buf[from..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
            .map(|i| i + from)
        {
            let (end, kind) = if self.buf[i] == b'\n' {
                (i + 1, End::Newline)
            } else if i + 1 == self.buf.len() {
                break; // hold a final '\r' until we know whether '\n' follows
            } else if self.buf[i + 1] == b'\n' {
                (i + 2, End::Newline)
            } else {
                (i + 1, End::Return)
            };
            emit_capped(&self.buf[start..end], kind, self.cap, emit);
            start = end;
            from = end;
        }
        // A held final '\r' may still turn out to end the line: it does not count as content.
        let held_cr = usize::from(self.buf.last() == Some(&b'\r'));
        while self.buf.len() - start - held_cr > self.cap {
            emit(&self.buf[start..start + self.cap], End::Cap);
            start += self.cap;
        }
        self.buf.drain(..start);
    }

    /// The stream ended: emits what is held.
    fn finish(&mut self, emit: &mut dyn FnMut(&[u8], End)) {
        if !self.buf.is_empty() {
            let held = std::mem::take(&mut self.buf);
            emit_capped(&held, End::Eof, self.cap, emit);
        }
    }
}

/// Emits `seg`, first as pieces of `cap` content bytes while more than `cap` remain, so that a
/// terminator is never separated from the end of its line.
fn emit_capped(mut seg: &[u8], end: End, cap: usize, emit: &mut dyn FnMut(&[u8], End)) {
    while content(seg, end).len() > cap {
        emit(&seg[..cap], End::Cap);
        seg = &seg[cap..];
    }
    emit(seg, end);
}

/// A segment without its terminator bytes.
fn content(seg: &[u8], end: End) -> &[u8] {
    match end {
        End::Newline => seg
            .strip_suffix(b"\r\n")
            .or_else(|| seg.strip_suffix(b"\n"))
            .unwrap_or(seg),
        End::Return => seg.strip_suffix(b"\r").unwrap_or(seg),
        End::Cap | End::Eof => seg,
    }
}

fn kept_line(bytes: &[u8]) -> String {
    if bytes.len() <= KEPT_LINE_MAX {
        String::from_utf8_lossy(bytes).into_owned()
    } else {
        format!(
            "{}… [{} bytes cut by rdrun]",
            String::from_utf8_lossy(&bytes[..KEPT_LINE_MAX]),
            bytes.len() - KEPT_LINE_MAX
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Stderr tail and Python traceback

/// Keeps the last stderr lines and the last Python traceback of one worker.
#[derive(Debug, Default)]
struct StderrTracker {
    tail: VecDeque<String>,
    /// What a terminal shows of the current line after a lone `\r` (the last redrawn segment).
    redrawn: Option<Vec<u8>>,
    tb: TracebackScanner,
}

impl StderrTracker {
    fn segment(&mut self, seg: &[u8], end: End) {
        let text = content(seg, end);
        match end {
            End::Return => self.redrawn = Some(text.to_vec()),
            End::Newline | End::Cap | End::Eof => {
                let line = match self.redrawn.take() {
                    Some(prev) if text.is_empty() => kept_line(&prev),
                    _ => kept_line(text),
                };
                self.line(line);
            }
        }
    }

    fn finish(&mut self) {
        if let Some(prev) = self.redrawn.take() {
            self.line(kept_line(&prev));
        }
    }

    fn line(&mut self, line: String) {
        self.tb.line(&line);
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    fn summary(mut self) -> OutputSummary {
        self.finish();
        OutputSummary {
            stderr_tail: self.tail.into_iter().collect(),
            traceback: self.tb.result(),
        }
    }
}

/// Lines of a traceback with bounded memory: the first lines, then the last ones.
#[derive(Debug, Default, Clone)]
struct BoundedLines {
    head: Vec<String>,
    tail: VecDeque<String>,
    omitted: usize,
}

impl BoundedLines {
    fn push(&mut self, line: String) {
        if self.head.len() < TRACEBACK_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == TRACEBACK_MAX_LINES - TRACEBACK_HEAD - 1 {
            self.tail.pop_front();
            self.omitted += 1;
        }
        self.tail.push_back(line);
    }

    fn to_vec(&self) -> Vec<String> {
        let mut v = self.head.clone();
        if self.omitted > 0 {
            v.push(format!("  ... [{} lines omitted by rdrun]", self.omitted));
        }
        v.extend(self.tail.iter().cloned());
        v
    }
}

#[derive(Debug, Default)]
enum TbState {
    #[default]
    Idle,
    /// Inside a traceback, before its exception line.
    Frames,
    /// Right after an exception line: a chained-exception separator may follow.
    After {
        pending: Vec<String>,
        saw_separator: bool,
    },
}

/// Finds Python tracebacks in stderr lines (with or without torch's `[rankN]: ` prefix).
#[derive(Debug, Default)]
struct TracebackScanner {
    state: TbState,
    current: BoundedLines,
    /// The last finished traceback and the number of lines seen after it.
    last: Option<(BoundedLines, usize)>,
}

const TB_START: &str = "Traceback (most recent call last):";
const TB_CHAIN: [&str; 2] = [
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
];

/// Strips torch's excepthook prefix `[rank<N>]: ` (spec §5.7), for detection only.
fn strip_rank_prefix(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("[rank") else {
        return line;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return line;
    }
    match rest[digits..].strip_prefix("]:") {
        Some(r) => r.strip_prefix(' ').unwrap_or(r),
        None => line,
    }
}

impl TracebackScanner {
    fn line(&mut self, raw: &str) {
        let line = strip_rank_prefix(raw);
        if let Some((_, after)) = &mut self.last {
            *after += 1;
        }
        let state = std::mem::take(&mut self.state);
        self.state = match state {
            TbState::Idle => {
                if line == TB_START {
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else {
                    TbState::Idle
                }
            }
            TbState::Frames => {
                if line == TB_START {
                    // A new traceback before the previous one ended (interleaved output).
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line.starts_with(' ') || line.starts_with('\t') {
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line.is_empty() {
                    TbState::Idle // not a traceback after all
                } else {
                    self.current.push(raw.to_string());
                    self.last = Some((self.current.clone(), 0));
                    TbState::After {
                        pending: Vec::new(),
                        saw_separator: false,
                    }
                }
            }
            TbState::After {
                mut pending,
                saw_separator,
            } => {
                if line.is_empty() && pending.len() < 3 {
                    pending.push(raw.to_string());
                    TbState::After {
                        pending,
                        saw_separator,
                    }
                } else if !saw_separator && TB_CHAIN.contains(&line) {
                    pending.push(raw.to_string());
                    TbState::After {
                        pending,
                        saw_separator: true,
                    }
                } else if saw_separator && line == TB_START {
                    // Chained exception: keep the whole chain as one traceback.
                    for p in pending {
                        self.current.push(p);
                    }
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else if line == TB_START {
                    self.current = BoundedLines::default();
                    self.current.push(raw.to_string());
                    TbState::Frames
                } else {
                    TbState::Idle
                }
            }
        };
    }

    fn result(&self) -> Option<Vec<String>> {
        match &self.last {
            Some((lines, after)) if *after <= TRACEBACK_RECENT_LINES => Some(lines.to_vec()),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Console writer

/// Which console stream a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

enum ConsoleMsg {
    Data {
        stream: Stream,
        bytes: Vec<u8>,
        _permit: OwnedSemaphorePermit,
    },
    Flush(oneshot::Sender<()>),
}

/// A console: one writer thread owning a stdout and a stderr writer. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    tx: mpsc::UnboundedSender<ConsoleMsg>,
    budget: Arc<Semaphore>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

impl Console {
    /// Starts a writer thread over these writers (tests pass in-memory writers).
    pub fn new(
        mut stdout: Box<dyn Write + Send>,
        mut stderr: Box<dyn Write + Send>,
    ) -> io::Result<Console> {
        let (tx, mut rx) = mpsc::unbounded_channel::<ConsoleMsg>();
        std::thread::Builder::new()
            .name("rdrun-console".into())
            .spawn(move || {
                let mut broken = [false, false];
                while let Some(msg) = rx.blocking_recv() {
                    match msg {
                        ConsoleMsg::Data { stream, bytes, .. } => {
                            let (w, i) = match stream {
                                Stream::Stdout => (&mut stdout, 0),
                                Stream::Stderr => (&mut stderr, 1),
                            };
                            // A closed console (`rdrun … | head`) drops output; workers go on.
                            if let Err(e) = w.write_all(&bytes).and_then(|()| w.flush()) {
                                if !broken[i] {
                                    broken[i] = true;
                                    tracing::debug!(error = %e, "console write failed");
                                }
                            }
                        }
                        ConsoleMsg::Flush(ack) => {
                            let _ = stdout.flush();
                            let _ = stderr.flush();
                            let _ = ack.send(());
                        }
                    }
                }
            })?;
        Ok(Console {
            tx,
            budget: Arc::new(Semaphore::new(CONSOLE_BUDGET)),
        })
    }

    /// The process-wide console: rdrun's own stdout and stderr.
    pub fn global() -> Console {
        static GLOBAL: OnceLock<Console> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                Console::new(Box::new(io::stdout()), Box::new(io::stderr()))
                    .expect("cannot start the console writer thread")
            })
            .clone()
    }

    /// Queues whole lines for `stream`; waits while [`CONSOLE_BUDGET`] bytes are queued.
    pub async fn write(&self, stream: Stream, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let n = bytes.len().clamp(1, CONSOLE_BUDGET) as u32;
        let Ok(permit) = self.budget.clone().acquire_many_owned(n).await else {
            return; // the semaphore is never closed
        };
        let _ = self.tx.send(ConsoleMsg::Data {
            stream,
            bytes,
            _permit: permit,
        });
    }

    /// Waits until everything queued before this call is written and flushed.
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(ConsoleMsg::Flush(ack)).is_ok() {
            let _ = done.await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Forwarding

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

async fn pump(
    id: RankIdentity,
    fd: OwnedFd,
    mut plan: StreamPlan,
    console: Console,
    mut tracker: Option<StderrTracker>,
    mut stop: Option<watch::Receiver<bool>>,
) -> Option<StderrTracker> {
    let mut reader = into_reader(fd);
    let mut splitter = Splitter::new(MAX_LINE);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut stopping = false;
    loop {
        let read = if stopping {
            // Stop requested: take only what is already in the pipe, then end as at EOF.
            match tokio::time::timeout(std::time::Duration::ZERO, reader.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => Ok(0),
            }
        } else if let Some(rx) = &mut stop {
            tokio::select! {
                r = reader.read(&mut buf) => r,
                _ = wait_stop(rx) => {
                    stopping = true;
                    continue;
                }
            }
        } else {
            reader.read(&mut buf).await
        };
        let n = match read {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(local_rank = id.local_rank, error = %e, "cannot read worker output");
                0
            }
        };
        if n > 0 {
            if let Some(f) = &mut plan.file {
                // Bytes exactly as written, as soon as read: a killed worker loses nothing.
                if let Err(e) = f.write_all(&buf[..n]) {
                    tracing::warn!(local_rank = id.local_rank, error = %e, "cannot write worker log");
                    plan.file = None;
                }
            }
        }
        let mut out = Vec::new();
        let mut filtered = Vec::new();
        let mut sink = |seg: &[u8], end: End| {
            let nl: &[u8] = if end.needs_newline() { b"\n" } else { b"" };
            if plan.console {
                out.extend_from_slice(&plan.prefix);
                out.extend_from_slice(seg);
                out.extend_from_slice(nl);
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
        };
        if n > 0 {
            splitter.push(&buf[..n], &mut sink);
        } else {
            splitter.finish(&mut sink);
        }
        if !filtered.is_empty() {
            if let Some((f, _)) = &mut plan.filtered {
                // O_APPEND: one write per batch of whole lines, shared by all ranks.
                let _ = f.write_all(&filtered);
            }
        }
        console.write(plan.stream, out).await;
        if n == 0 {
            return tracker;
        }
    }
}

/// Resolves when `rx` holds `true`; never if its sender is gone without setting it.
async fn wait_stop(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Forwards one worker's stdout and stderr (pipe read ends) line by line according to `sink`.
/// Must be called from within a tokio runtime.
pub fn forward(
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_to(Console::global(), id, sink, stdout, stderr, None)
}

/// [`forward`] that also ends when `stop` becomes `true`: what is already in the pipes is
/// forwarded, then the task ends as at EOF (a partial last line is emitted). For a worker whose
/// descendants escaped its process group and keep the pipes open after it was reaped: the agent
/// sets `stop` after a short wait instead of waiting for an EOF that may never come.
pub fn forward_until(
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<OutputSummary> {
    forward_to(Console::global(), id, sink, stdout, stderr, Some(stop))
}

/// [`forward`] / [`forward_until`] onto a given console (tests use in-memory consoles).
pub fn forward_to(
    console: Console,
    id: RankIdentity,
    sink: RankSink,
    stdout: OwnedFd,
    stderr: OwnedFd,
    stop: Option<watch::Receiver<bool>>,
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
        );
        let err = pump(
            id,
            stderr,
            err_plan,
            console.clone(),
            Some(StderrTracker::default()),
            stop,
        );
        let (_, tracker) = tokio::join!(out, err);
        console.flush().await;
        tracker.map(StderrTracker::summary).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{StdSelect, StdSpec};
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    fn id(local_rank: usize) -> RankIdentity {
        RankIdentity {
            role: "default".into(),
            rank: local_rank + 4,
            local_rank,
            hostname: "vm".into(),
        }
    }

    /// A scratch directory removed on drop.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new() -> Scratch {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rdrun-output-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("scratch dir");
            Scratch(dir)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn list(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).expect("read_dir").flatten() {
                let p = e.path();
                let rel = p.strip_prefix(base).expect("prefix").display().to_string();
                if p.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &p, out);
                } else {
                    out.push(rel);
                }
            }
        }
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    #[test]
    fn template_substitution() {
        let cases = [
            ("[${rank}|${hostname}]", "[4|vm]"),
            ("${role_name}${local_rank}: ", "default0: "),
            ("$rank-$local_rank", "4-0"),
            (
                "$ranks ${ranks} $$rank ${rank",
                "$ranks ${ranks} $rank ${rank",
            ),
            ("$", "$"),
            ("a$1b", "a$1b"),
            ("${ rank}", "${ rank}"),
            ("[${rank}]:", "[4]:"),
        ];
        for (t, want) in cases {
            assert_eq!(substitute_template(t, &id(0)), want, "template {t:?}");
        }
        assert_eq!(line_prefix(None, &id(3)), "[default3]:");
        assert_eq!(line_prefix(Some("<${rank}> "), &id(3)), "<7> ");
    }

    fn split(chunks: &[&[u8]], cap: usize) -> Vec<(String, End)> {
        let mut s = Splitter::new(cap);
        let mut got = Vec::new();
        let mut emit = |seg: &[u8], end: End| {
            got.push((String::from_utf8_lossy(seg).into_owned(), end));
        };
        for c in chunks {
            s.push(c, &mut emit);
        }
        s.finish(&mut emit);
        got
    }

    #[test]
    fn splitter_table() {
        use End::*;
        type Case<'a> = (Vec<&'a [u8]>, usize, Vec<(&'a str, End)>);
        let cases: Vec<Case> = vec![
            (
                vec![b"a\nb\n"],
                100,
                vec![("a\n", Newline), ("b\n", Newline)],
            ),
            (
                vec![b"ab", b"c\nd"],
                100,
                vec![("abc\n", Newline), ("d", Eof)],
            ),
            (
                vec![b"x\r\ny\r"],
                100,
                vec![("x\r\n", Newline), ("y\r", Eof)],
            ),
            (
                vec![b"x\r", b"\ny"],
                100,
                vec![("x\r\n", Newline), ("y", Eof)],
            ),
            (
                vec![b"\r 1%\r 2%", b"\r 3%\n"],
                100,
                vec![
                    ("\r", Return),
                    (" 1%\r", Return),
                    (" 2%\r", Return),
                    (" 3%\n", Newline),
                ],
            ),
            (
                vec![b"abcdefgh", b"ij\n"],
                4,
                vec![("abcd", Cap), ("efgh", Cap), ("ij\n", Newline)],
            ),
            (
                vec![b"abcdefghij\nk"],
                4,
                vec![("abcd", Cap), ("efgh", Cap), ("ij\n", Newline), ("k", Eof)],
            ),
            (vec![b"abcd"], 4, vec![("abcd", Eof)]),
            (vec![b"abcd", b"\r\n"], 4, vec![("abcd\r\n", Newline)]),
            (vec![b"abcd\r", b"\n"], 4, vec![("abcd\r\n", Newline)]),
            (
                vec![b"abcde\r", b"x"],
                4,
                vec![("abcd", Cap), ("e\r", Return), ("x", Eof)],
            ),
            (vec![b""], 4, vec![]),
            (vec![b"\n\n"], 4, vec![("\n", Newline), ("\n", Newline)]),
        ];
        for (chunks, cap, want) in cases {
            let want: Vec<(String, End)> =
                want.into_iter().map(|(s, e)| (s.to_string(), e)).collect();
            assert_eq!(split(&chunks, cap), want, "chunks {chunks:?}");
        }
    }

    #[test]
    fn splitter_holds_at_most_cap() {
        let mut s = Splitter::new(1000);
        let mut n = 0;
        for _ in 0..100 {
            s.push(&[b'x'; 333], &mut |seg, end| {
                assert!(seg.len() <= 1000);
                assert_eq!(end, End::Cap);
                n += seg.len();
            });
            assert!(s.buf.len() <= 1001);
        }
        s.finish(&mut |seg, _| n += seg.len());
        assert_eq!(n, 33_300);
    }

    fn segments(input: &[u8], cuts: &[usize], cap: usize) -> Vec<(Vec<u8>, End)> {
        let mut s = Splitter::new(cap);
        let mut got = Vec::new();
        let mut emit = |seg: &[u8], end: End| got.push((seg.to_vec(), end));
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut at = 0;
        for c in cuts.into_iter().chain([input.len()]) {
            s.push(&input[at..c], &mut emit);
            at = c;
        }
        s.finish(&mut emit);
        got
    }

    proptest::proptest! {
        /// Segments rebuild the input exactly, do not depend on how reads cut the stream,
        /// hold at most `cap` content bytes, and end where the line rules say.
        #[test]
        fn splitter_properties(
            input in proptest::collection::vec(proptest::sample::select(vec![b'a', b'b', b'\n', b'\r']), 0..200),
            cuts in proptest::collection::vec(0usize..1000, 0..20),
            cap in 1usize..8,
        ) {
            let whole = segments(&input, &[], cap);
            let chunked = segments(&input, &cuts, cap);
            proptest::prop_assert_eq!(&whole, &chunked);
            let joined: Vec<u8> = whole.iter().flat_map(|(s, _)| s.clone()).collect();
            proptest::prop_assert_eq!(&joined, &input);
            for (i, (seg, end)) in whole.iter().enumerate() {
                let text = content(seg, *end);
                proptest::prop_assert!(text.len() <= cap);
                proptest::prop_assert!(!seg.is_empty());
                proptest::prop_assert!(!text.contains(&b'\n'));
                match end {
                    End::Newline => proptest::prop_assert!(seg.ends_with(b"\n")),
                    End::Return => proptest::prop_assert!(seg.ends_with(b"\r")),
                    End::Cap => proptest::prop_assert_eq!(text.len(), cap),
                    End::Eof => proptest::prop_assert_eq!(i, whole.len() - 1),
                }
                if *end != End::Eof {
                    proptest::prop_assert!(!text.contains(&b'\r') || *end == End::Cap);
                }
            }
        }
    }

    fn track(text: &str) -> OutputSummary {
        let mut t = StderrTracker::default();
        let mut s = Splitter::new(MAX_LINE);
        s.push(text.as_bytes(), &mut |seg, end| t.segment(seg, end));
        s.finish(&mut |seg, end| t.segment(seg, end));
        t.summary()
    }

    #[test]
    fn stderr_tail_keeps_last_lines() {
        let text: String = (0..30).map(|i| format!("line {i}\n")).collect::<String>() + "last";
        let s = track(&text);
        assert_eq!(s.stderr_tail.len(), TAIL_LINES);
        assert_eq!(s.stderr_tail[0], "line 11");
        assert_eq!(s.stderr_tail[TAIL_LINES - 1], "last");
        assert_eq!(s.traceback, None);
        // Progress bars: the tail keeps what the terminal shows.
        let s = track("\r 10%\r 50%\r100%\ndone\r\n");
        assert_eq!(s.stderr_tail, vec!["100%", "done"]);
        let s = track("a\r\r\n");
        assert_eq!(s.stderr_tail, vec!["a"]);
        let long = "y".repeat(KEPT_LINE_MAX + 10);
        let s = track(&long);
        assert!(s.stderr_tail[0].ends_with("… [10 bytes cut by rdrun]"));
    }

    const TB: &str = "Traceback (most recent call last):
  File \"/tmp/fail.py\", line 9, in <module>
    main()
  File \"/tmp/fail.py\", line 6, in main
    raise ValueError(\"bad value\")
ValueError: bad value
";

    #[test]
    fn traceback_detection() {
        let lines = |s: &str| -> Vec<String> { s.lines().map(String::from).collect() };
        // Plain, with output before and a little after.
        let s = track(&format!("starting\n{TB}warning: teardown\n"));
        assert_eq!(s.traceback, Some(lines(TB)));
        // With torch's excepthook prefix, kept as printed.
        let prefixed: String = TB.lines().map(|l| format!("[rank1]: {l}\n")).collect();
        let s = track(&prefixed);
        assert_eq!(s.traceback, Some(lines(&prefixed)));
        // Chained exceptions are one traceback.
        let chained = format!(
            "{}\nDuring handling of the above exception, another exception occurred:\n\n{}",
            "Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\nKeyError: 'k'",
            TB
        );
        let s = track(&chained);
        assert_eq!(s.traceback, Some(lines(&chained)));
        // Two unrelated tracebacks: the last one.
        let s = track(&format!(
            "Traceback (most recent call last):\n  x\nOSError: e\nmore\n{TB}"
        ));
        assert_eq!(s.traceback, Some(lines(TB)));
        // A traceback long before the end is not the cause.
        let after: String = (0..=TRACEBACK_RECENT_LINES)
            .map(|i| format!("{i}\n"))
            .collect();
        assert_eq!(track(&format!("{TB}{after}")).traceback, None);
        // An unfinished traceback (worker killed while printing) is not reported.
        assert_eq!(
            track("Traceback (most recent call last):\n  File \"a\"\n").traceback,
            None
        );
        // Bounded: the head, a marker, the end.
        let frames: String = (0..1000).map(|i| format!("  frame {i}\n")).collect();
        let s = track(&format!("{TB_START}\n{frames}RecursionError: deep\n"));
        let tb = s.traceback.expect("traceback");
        assert_eq!(tb.len(), TRACEBACK_MAX_LINES);
        assert_eq!(tb[0], TB_START);
        assert_eq!(tb[TRACEBACK_HEAD], "  ... [803 lines omitted by rdrun]");
        assert_eq!(tb[TRACEBACK_MAX_LINES - 1], "RecursionError: deep");
        assert_eq!(strip_rank_prefix("[rank12]: x"), "x");
        assert_eq!(strip_rank_prefix("[rank]: x"), "[rank]: x");
    }

    fn spec(all: StdSelect) -> StdSpec {
        StdSpec {
            all,
            per_rank: BTreeMap::new(),
        }
    }

    #[test]
    fn log_dir_layout_and_sinks() {
        let scratch = Scratch::new();
        let root = scratch.0.join("logs");
        let log = LogConfig {
            log_dir: Some(root.clone()),
            redirects: StdSpec {
                all: StdSelect::None,
                per_rank: BTreeMap::from([(1, StdSelect::Err), (11, StdSelect::All)]),
            },
            tee: StdSpec {
                all: StdSelect::None,
                per_rank: BTreeMap::from([(0, StdSelect::All), (1, StdSelect::Out)]),
            },
            local_ranks_filter: Some(vec![0, 2]),
            prefix_template: None,
            duplicate_stdout_filters: vec!["loss".into()],
            duplicate_stderr_filters: vec![],
        };
        let mut logs = RunLogs::new(&log, "run/1");
        let ids: Vec<RankIdentity> = (0..12).map(id).collect();
        let a0 = logs.attempt(0, &ids).expect("attempt 0");
        let run_dir = logs.run_dir().expect("run dir").to_path_buf();
        let name = run_dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("run_1_") && name.len() == "run_1_".len() + 8,
            "{name}"
        );
        assert_eq!(run_dir.parent(), Some(root.as_path()));
        assert_eq!(a0.dir.as_deref(), Some(run_dir.join("attempt_0").as_path()));
        let r0 = &a0.ranks[0].sink;
        assert!(r0.stdout_file.is_some() && r0.stderr_file.is_some());
        assert!(r0.stdout_console && r0.stderr_console);
        assert_eq!(r0.prefix.as_deref(), Some("[default0]:"));
        assert_eq!(
            r0.filtered_stdout.as_deref(),
            Some(run_dir.join("attempt_0/filtered_stdout.log").as_path())
        );
        assert_eq!(r0.filtered_stderr, None);
        // Rank 1: stdout tee'd, stderr redirected, but filtered out of the console.
        let r1 = &a0.ranks[1].sink;
        assert!(r1.stdout_file.is_some() && r1.stderr_file.is_some());
        assert!(!r1.stdout_console && !r1.stderr_console);
        // Rank 2: nothing redirected, in the filter.
        let r2 = &a0.ranks[2].sink;
        assert!(r2.stdout_file.is_none() && r2.stdout_console && r2.stderr_console);
        // Rank 3: not in the filter: console output dropped.
        assert!(!a0.ranks[3].sink.stdout_console && !a0.ranks[3].sink.stderr_console);
        // Rank 11 (two digits) redirected both.
        assert!(a0.ranks[11].sink.stdout_file.is_some());
        assert_eq!(
            a0.ranks[5].error_file,
            run_dir.join("attempt_0/5/error.json").display().to_string()
        );
        let mut want = vec![
            "attempt_0/".to_string(),
            "attempt_0/filtered_stdout.log".into(),
            "attempt_0/0/stderr.log".into(),
            "attempt_0/0/stdout.log".into(),
            "attempt_0/1/stderr.log".into(),
            "attempt_0/1/stdout.log".into(),
            "attempt_0/11/stderr.log".into(),
            "attempt_0/11/stdout.log".into(),
        ];
        want.extend((0..12).map(|i| format!("attempt_0/{i}/")));
        want.sort();
        assert_eq!(list(&run_dir), want);
        // A rerun of the same attempt number starts from an empty directory.
        fs::write(run_dir.join("attempt_0/3/error.json"), "{}").expect("write");
        let a1 = logs.attempt(1, &ids[..1]).expect("attempt 1");
        assert!(a1.ranks[0].sink.stdout_file.is_some());
        logs.attempt(0, &ids[..1]).expect("attempt 0 again");
        assert!(!run_dir.join("attempt_0/3").exists());
        // finish: empty rank dirs go, logs stay; the --log-dir root stays.
        fs::write(run_dir.join("attempt_1/0/error.json"), "{}").expect("write");
        logs.finish();
        assert!(run_dir.join("attempt_0/0/stdout.log").exists());
        assert!(run_dir.join("attempt_1/0/error.json").exists());
        assert!(root.is_dir());
    }

    #[test]
    fn log_dir_removes_what_holds_nothing() {
        let scratch = Scratch::new();
        let log = LogConfig {
            log_dir: Some(scratch.0.clone()),
            ..LogConfig::default()
        };
        let mut logs = RunLogs::new(&log, "r");
        let a = logs.attempt(0, &[id(0), id(1)]).expect("attempt");
        assert!(Path::new(&a.ranks[1].error_file)
            .parent()
            .expect("dir")
            .is_dir());
        assert!(a.ranks[0].sink.stdout_console && a.ranks[0].sink.stdout_file.is_none());
        logs.finish();
        assert_eq!(list(&scratch.0), Vec::<String>::new());
        // A file as --log-dir is a clear error.
        let file = scratch.0.join("f");
        fs::write(&file, "").expect("write");
        let log = LogConfig {
            log_dir: Some(file),
            ..LogConfig::default()
        };
        let err = RunLogs::new(&log, "r")
            .attempt(0, &[id(0)])
            .expect_err("file");
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn dev_null_means_console_only() {
        let log = LogConfig {
            log_dir: Some("/dev/null".into()),
            tee: spec(StdSelect::All),
            redirects: spec(StdSelect::All),
            local_ranks_filter: Some(vec![1]),
            ..LogConfig::default()
        };
        let mut logs = RunLogs::new(&log, "r");
        let a = logs.attempt(0, &[id(0)]).expect("attempt");
        assert_eq!(a.ranks[0].error_file, "");
        let s = &a.ranks[0].sink;
        assert!(s.stdout_console && s.stderr_console && s.stdout_file.is_none());
        assert!(s.prefix.is_none());
        assert!(logs.run_dir().is_none());
    }

    #[test]
    fn temp_dir_removed_unless_needed() {
        let scratch = Scratch::new();
        let log = LogConfig::default();
        // Nothing written: nothing left.
        let mut logs = RunLogs::with_temp_root(&log, "abc", scratch.0.clone());
        let a = logs.attempt(0, &[id(0), id(1)]).expect("attempt");
        let run_dir = logs.run_dir().expect("run dir").to_path_buf();
        assert!(run_dir
            .file_name()
            .expect("n")
            .to_string_lossy()
            .starts_with("rdrun-abc-"));
        assert!(Path::new(&a.ranks[0].error_file).starts_with(&run_dir));
        assert_eq!(logs.disposable_dir(), Some(run_dir.as_path()));
        logs.finish();
        assert_eq!(list(&scratch.0), Vec::<String>::new());
        // An error file of an earlier attempt only: removed.
        let mut logs = RunLogs::with_temp_root(&log, "abc", scratch.0.clone());
        let a0 = logs.attempt(0, &[id(0)]).expect("attempt");
        fs::write(&a0.ranks[0].error_file, "{}").expect("write");
        logs.attempt(1, &[id(0)]).expect("attempt");
        drop(logs); // dropping cleans up too
        assert_eq!(list(&scratch.0), Vec::<String>::new());
        // An error file of the last attempt: kept for the report.
        let mut logs = RunLogs::with_temp_root(&log, "abc", scratch.0.clone());
        logs.attempt(0, &[id(0)]).expect("attempt");
        let a1 = logs.attempt(1, &[id(0), id(1)]).expect("attempt");
        fs::write(&a1.ranks[1].error_file, "{}").expect("write");
        let run_dir = logs.run_dir().expect("run dir").to_path_buf();
        logs.finish();
        assert!(Path::new(&a1.ranks[1].error_file).exists());
        assert_eq!(
            list(&run_dir),
            vec!["attempt_1/", "attempt_1/1/", "attempt_1/1/error.json"]
        );
        fs::remove_dir_all(&run_dir).expect("cleanup");
        // Tee'd logs repeat the console: removed; the last attempt's error file stays.
        let tee = LogConfig {
            tee: spec(StdSelect::All),
            duplicate_stderr_filters: vec!["x".into()],
            ..LogConfig::default()
        };
        let mut logs = RunLogs::with_temp_root(&tee, "t", scratch.0.clone());
        let a = logs.attempt(0, &[id(0), id(1)]).expect("attempt");
        assert!(a.ranks[0].sink.stdout_file.is_some() && a.ranks[0].sink.stdout_console);
        fs::write(&a.ranks[0].error_file, "{}").expect("write");
        let run_dir = logs.run_dir().expect("run dir").to_path_buf();
        logs.finish();
        assert_eq!(
            list(&run_dir),
            vec!["attempt_0/", "attempt_0/0/", "attempt_0/0/error.json"]
        );
        fs::remove_dir_all(&run_dir).expect("cleanup");
        let mut logs = RunLogs::with_temp_root(&tee, "t", scratch.0.clone());
        logs.attempt(0, &[id(0)]).expect("attempt");
        logs.finish();
        assert_eq!(list(&scratch.0), Vec::<String>::new());
        // Redirected (file-only) output is kept, every attempt of it.
        for log in [
            LogConfig {
                redirects: spec(StdSelect::Err),
                ..LogConfig::default()
            },
            LogConfig {
                tee: spec(StdSelect::Out),
                local_ranks_filter: Some(vec![1]),
                ..LogConfig::default()
            },
        ] {
            let mut logs = RunLogs::with_temp_root(&log, "r", scratch.0.clone());
            logs.attempt(0, &[id(0)]).expect("attempt");
            logs.attempt(1, &[id(0)]).expect("attempt");
            assert_eq!(logs.disposable_dir(), None);
            let run_dir = logs.run_dir().expect("run dir").to_path_buf();
            logs.finish();
            let files = list(&run_dir);
            assert_eq!(files.len(), 6, "{files:?}");
            assert!(
                files.iter().any(|f| f.starts_with("attempt_0/0/std")),
                "{files:?}"
            );
            fs::remove_dir_all(&run_dir).expect("cleanup");
        }
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
}
