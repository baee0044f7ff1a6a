//! The `--log-dir` tree of a run and where each worker stream goes: `-r/--redirects`, `-t/--tee`,
//! `--local-ranks-filter`, duplicate filters, `TORCHELASTIC_ERROR_FILE` paths, and the clean-up
//! at the end (spec torchrun-compat.md §5). It decides destinations; [`super::pump`] moves bytes.
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

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::own::Stream;
use super::prefix::{line_prefix, RankIdentity};
use crate::config::LogConfig;

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
    /// `--progress` on for stdout, stderr (decided once per run in [`RunLogs::new`]).
    progress: [bool; 2],
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
    /// Where this worker's streams go; passed back to [`super::forward_until`].
    pub sink: RankSink,
}

/// Where one worker's two streams go (console, file, both, nowhere) and the tee prefix.
///
/// The progress stage per stream (stdout, stderr): `auto` on a terminal with more than one
/// rank on the console, `one` everywhere; `Some((live, interval))`, `live` on a terminal.
fn progress_setup(log: &LogConfig) -> [Option<(bool, std::time::Duration)>; 2] {
    [Stream::Stdout, Stream::Stderr].map(|s| {
        let tty = super::own::is_terminal(s);
        log.progress
            .filter(|p| p.forced || (tty && p.ranks > 1))
            .map(|p| (tty, p.interval))
    })
}

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
    /// `--progress`: the stream's `\r` bars go to the console's progress stage.
    pub stdout_progress: bool,
    pub stderr_progress: bool,
}

impl RunLogs {
    /// The run's log layout (the agent makes one `RunLogs` per run, before any worker output);
    /// [`RunLogs::show_on`] then sets up the console its output goes to.
    pub fn new(log: &LogConfig, run_id: &str, temp_dir: PathBuf) -> Self {
        let mut logs = Self::with_temp_root(log, run_id, temp_dir);
        logs.progress = progress_setup(log).map(|s| s.is_some());
        logs
    }

    /// Sets `console`'s (the terminal's) collapse stage (`--output`) and progress stage
    /// (`--progress`) for the run, before any worker output.
    pub fn show_on(&self, console: &super::Console) {
        console.set_collapse(self.log.collapse.map(|c| (c.window, c.ranks)));
        console.set_progress(progress_setup(&self.log));
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
            progress: [false, false],
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
                            stdout_progress: self.progress[0],
                            stderr_progress: self.progress[1],
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
                    stdout_progress: self.progress[0],
                    stderr_progress: self.progress[1],
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
        // Uniqueness comes from create() failing on an existing name, not from the generator.
        let suffix: String = (0..8)
            .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
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

#[cfg(test)]
mod tests {
    use super::super::testutil::{id, list, Scratch};
    use super::*;
    use crate::config::{StdSelect, StdSpec};
    use std::collections::BTreeMap;

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
            collapse: None,
            progress: None,
        };
        let mut logs = RunLogs::new(&log, "run/1", std::env::temp_dir());
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
        let mut logs = RunLogs::new(&log, "r", std::env::temp_dir());
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
        let err = RunLogs::new(&log, "r", std::env::temp_dir())
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
        let mut logs = RunLogs::new(&log, "r", std::env::temp_dir());
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
}
