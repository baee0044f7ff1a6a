//! Per-rank control and the console's shape (issue 29): `--wrap`/`--wrap-ranks` (a wrapper
//! program such as `nsys profile` or `strace -f` in front of chosen ranks' command), `--stdin`
//! (which rank reads rdrun's stdin), `--output`/`--output-window` (identical lines of several
//! ranks collapsed into one), `--progress`/`--progress-interval` (carriage-return progress bars
//! of several ranks shown as one) and `--debug-rank` (one rank waits for a debugger). Resolved
//! here so that a bad value fails before anything starts, with one line naming the flag.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::error::{invalid, ConfigError};
use super::host::Host;
use crate::cli::EnvFn;

/// Default `--output-window`: long enough for ranks printing the same step to meet, short
/// enough that a line never feels late.
pub const DEFAULT_OUTPUT_WINDOW: Duration = Duration::from_millis(500);
/// Longest `--output-window` accepted: a line is delayed up to the window.
pub const MAX_OUTPUT_WINDOW: Duration = Duration::from_secs(10);

/// Default `--progress-interval`: on a pipe, at most one progress line a second (the console of
/// a terminal redraws its live bar at most every 100 ms, whatever this is).
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// Longest `--progress-interval` accepted.
pub const MAX_PROGRESS_INTERVAL: Duration = Duration::from_secs(600);

/// `--wrap 'CMD ARGS'`: a program run in front of the worker command of chosen ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrap {
    /// The wrapper program, found on PATH as `execvp` would.
    pub program: PathBuf,
    /// Its arguments, split as a POSIX shell would (quotes, backslashes), before `%` expansion.
    pub args: Vec<String>,
    /// `--wrap-ranks`: the global ranks wrapped; `None` = every rank.
    pub ranks: Option<BTreeSet<usize>>,
}

impl Wrap {
    /// Whether global rank `rank` runs under the wrapper.
    pub fn applies(&self, rank: usize) -> bool {
        self.ranks.as_ref().map_or(true, |r| r.contains(&rank))
    }

    /// The wrapper's arguments for one rank: `%r` → rank, `%l` → local rank, `%n` → node rank
    /// (group rank). Any other `%` sequence passes through unchanged: wrappers such as nsys
    /// expand their own (`%p`, `%h`, `%q{VAR}`).
    pub fn args_for(&self, rank: usize, local_rank: usize, node_rank: usize) -> Vec<OsString> {
        self.args
            .iter()
            .map(|a| OsString::from(expand(a, rank, local_rank, node_rank)))
            .collect()
    }
}

/// Wrappers known to exit with a status of their own rather than the wrapped program's, by
/// program name and first argument (issue 38 item 18): what rdrun says of them at start.
/// `py-spy record` exits 0 once it has written its profile, whatever the program did. Only
/// wrappers seen doing so are listed (strace, tested as a wrapper, passes the status through).
const STATUS_SWALLOWERS: &[(&str, &str, &str)] = &[(
    "py-spy",
    "record",
    "py-spy record exits 0 whatever the profiled rank did",
)];

/// Why a `--wrap` program hides the wrapped rank's exit status, when it is one rdrun knows.
pub fn swallows_exit_status(program: &std::path::Path, args: &[String]) -> Option<&'static str> {
    let name = program.file_name()?.to_str()?;
    STATUS_SWALLOWERS
        .iter()
        .find(|(p, sub, _)| name == *p && args.first().is_some_and(|a| a == sub))
        .map(|(_, _, why)| *why)
}

/// `%r`, `%l`, `%n` of one word (see [`Wrap::args_for`]).
fn expand(word: &str, rank: usize, local_rank: usize, node_rank: usize) -> String {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        let value = match (c, chars.peek()) {
            ('%', Some('r')) => Some(rank),
            ('%', Some('l')) => Some(local_rank),
            ('%', Some('n')) => Some(node_rank),
            _ => None,
        };
        match value {
            Some(v) => {
                chars.next();
                out.push_str(&v.to_string());
            }
            None => out.push(c),
        }
    }
    out
}

/// `--stdin`: which worker reads rdrun's stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StdinTarget {
    /// Every worker inherits rdrun's stdin (torchrun's behaviour, the default).
    #[default]
    All,
    /// Every worker gets `/dev/null`.
    None,
    /// This global rank inherits rdrun's stdin, the others get `/dev/null`.
    Rank(usize),
}

impl StdinTarget {
    /// Whether the worker of global rank `rank` reads rdrun's stdin.
    pub fn reads(self, rank: usize) -> bool {
        match self {
            StdinTarget::All => true,
            StdinTarget::None => false,
            StdinTarget::Rank(r) => r == rank,
        }
    }
}

/// `--output`: how worker lines reach the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputMode {
    /// Every rank's line as it comes (today's behaviour, torchrun's).
    #[default]
    All,
    /// Identical lines of several ranks within the window are shown once, with their ranks.
    Collapse,
}

/// What the console's collapse stage needs (`--output collapse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collapse {
    /// `--output-window`.
    pub window: Duration,
    /// How many local ranks' output reaches the console (`--local-ranks-filter` counted): a line
    /// that all of them printed is shown at once.
    pub ranks: usize,
}

/// `--progress`: how carriage-return progress lines (tqdm, Lightning's bar) of several ranks
/// reach the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// `one` on a stream that is a terminal when more than one rank reaches the console, `all`
    /// otherwise (a pipe keeps torchrun's bytes unless asked).
    #[default]
    Auto,
    /// One progress line for all ranks: a live line on a terminal, at most one line per
    /// `--progress-interval` on a pipe.
    One,
    /// Every rank's `\r` segments as they come (torchrun's behaviour).
    All,
}

/// What the console's progress stage needs (`--progress auto|one`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// `--progress one`: on whatever the stream is; else (`auto`) only on a terminal, and only
    /// when `ranks` > 1.
    pub forced: bool,
    /// `--progress-interval`: on a pipe, at most one progress line per interval.
    pub interval: Duration,
    /// How many local ranks' output reaches the console (`--local-ranks-filter` counted).
    pub ranks: usize,
}

/// The resolved console and per-rank settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSettings {
    pub wrap: Option<Wrap>,
    pub stdin: StdinTarget,
    pub output: OutputMode,
    /// `--output-window`: how long a line waits for the same line of other ranks.
    pub output_window: Duration,
    /// `--progress`.
    pub progress: ProgressMode,
    /// `--progress-interval`.
    pub progress_interval: Duration,
    /// `--debug-rank`: this global rank starts under debugpy (or with an attach hint), its
    /// pauses are not a hang, and it reads rdrun's stdin unless `--stdin` says otherwise.
    pub debug_rank: Option<usize>,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        ConsoleSettings {
            wrap: None,
            stdin: StdinTarget::All,
            output: OutputMode::All,
            output_window: DEFAULT_OUTPUT_WINDOW,
            progress: ProgressMode::Auto,
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            debug_rank: None,
        }
    }
}

impl ConsoleSettings {
    /// What the console's collapse stage needs (`None` for `--output all`): the window, and how
    /// many of the `nproc` local ranks reach the console (`--local-ranks-filter`), so that a line
    /// all of them printed need not wait for the window.
    pub fn collapse_for(&self, nproc: usize, filter: Option<&[usize]>) -> Option<Collapse> {
        (self.output == OutputMode::Collapse).then(|| Collapse {
            window: self.output_window,
            ranks: console_ranks(nproc, filter),
        })
    }

    /// What the console's progress stage needs (`None` for `--progress all`, and for `auto`
    /// when at most one rank reaches the console: one bar needs no merging); whether `auto` is
    /// on for a stream (a terminal) is decided where the console is.
    pub fn progress_for(&self, nproc: usize, filter: Option<&[usize]>) -> Option<Progress> {
        let ranks = console_ranks(nproc, filter);
        let on = match self.progress {
            ProgressMode::All => false,
            ProgressMode::Auto => ranks > 1,
            ProgressMode::One => true,
        };
        on.then(|| Progress {
            forced: self.progress == ProgressMode::One,
            interval: self.progress_interval,
            ranks,
        })
    }
}

/// How many of the `nproc` local ranks reach the console (`--local-ranks-filter`).
fn console_ranks(nproc: usize, filter: Option<&[usize]>) -> usize {
    filter.map_or(nproc, |f| f.iter().filter(|r| **r < nproc).count())
}

/// The flags' text as given (`None`: not given).
#[derive(Debug, Default, Clone, Copy)]
pub struct ConsoleFlags<'a> {
    pub wrap: Option<&'a str>,
    pub wrap_ranks: Option<&'a str>,
    pub stdin: Option<&'a str>,
    pub output: Option<&'a str>,
    pub output_window: Option<&'a str>,
    pub progress: Option<&'a str>,
    pub progress_interval: Option<&'a str>,
    pub debug_rank: Option<&'a str>,
}

/// Resolves the settings; the wrapper program is looked up on PATH now. `max_world`: the most
/// ranks the run can have (`--nproc-per-node` × the most nodes): a rank named at or above it
/// can never exist, a typo that would leave pdb without input or profile nothing.
pub fn resolve(
    flags: ConsoleFlags<'_>,
    max_world: usize,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<ConsoleSettings, ConfigError> {
    let wrap = resolve_wrap(flags, max_world, env, host)?;
    let debug_rank = flags
        .debug_rank
        .map(|t| {
            let r: usize = t.trim().parse().map_err(|_| {
                invalid("--debug-rank", t, "must be a rank (a non-negative integer)")
            })?;
            if r >= max_world {
                return Err(beyond("--debug-rank", t, r, max_world));
            }
            Ok(r)
        })
        .transpose()?;
    let stdin = resolve_stdin(flags.stdin, debug_rank, max_world)?;
    let (output, output_window) = resolve_output(flags)?;
    let (progress, progress_interval) = resolve_progress(flags)?;
    Ok(ConsoleSettings {
        wrap,
        stdin,
        output,
        output_window,
        progress,
        progress_interval,
        debug_rank,
    })
}

/// A rank named at or above `max_world`: it can never exist.
fn beyond(flag: &'static str, text: &str, rank: usize, max_world: usize) -> ConfigError {
    invalid(
        flag,
        text,
        format!(
            "rank {rank} does not exist (at most {max_world} ranks: 0-{})",
            max_world.saturating_sub(1)
        ),
    )
}

/// `--wrap` (its program looked up now) and `--wrap-ranks` (which needs it).
fn resolve_wrap(
    flags: ConsoleFlags<'_>,
    max_world: usize,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<Option<Wrap>, ConfigError> {
    let ranks = flags
        .wrap_ranks
        .map(|t| parse_ranks(t).map_err(|why| invalid("--wrap-ranks", t, why)))
        .transpose()?;
    if let (Some(t), Some(r)) = (flags.wrap_ranks, ranks.as_ref().and_then(|r| r.last())) {
        if *r >= max_world {
            return Err(beyond("--wrap-ranks", t, *r, max_world));
        }
    }
    let Some(text) = flags.wrap else {
        if let Some(t) = flags.wrap_ranks {
            return Err(invalid("--wrap-ranks", t, "needs --wrap"));
        }
        return Ok(None);
    };
    let words = shlex::split(text)
        .ok_or_else(|| invalid("--wrap", text, "unbalanced quotes or a trailing backslash"))?;
    let Some((first, rest)) = words.split_first() else {
        return Err(invalid("--wrap", text, "must name a program"));
    };
    let program = super::command::find_program(first, env, host).ok_or_else(|| {
        invalid(
            "--wrap",
            text,
            format!("program '{first}' not found (no such file, and not an executable on PATH)"),
        )
    })?;
    Ok(Some(Wrap {
        program,
        args: rest.to_vec(),
        ranks,
    }))
}

/// `--stdin` (`--debug-rank R` alone: rank R reads the terminal).
fn resolve_stdin(
    text: Option<&str>,
    debug_rank: Option<usize>,
    max_world: usize,
) -> Result<StdinTarget, ConfigError> {
    let stdin = match text.map(str::trim) {
        // `--debug-rank R` alone: rank R reads the terminal (pdb, `input()` while debugging),
        // as with `--stdin R`.
        None if debug_rank.is_some() => StdinTarget::Rank(debug_rank.unwrap_or_default()),
        None | Some("all") => StdinTarget::All,
        Some("none") => StdinTarget::None,
        Some(t) => StdinTarget::Rank(t.parse().map_err(|_| {
            invalid(
                "--stdin",
                t,
                "must be a rank (a non-negative integer), none or all",
            )
        })?),
    };
    if let (StdinTarget::Rank(r), Some(t)) = (stdin, text) {
        if r >= max_world {
            return Err(beyond("--stdin", t, r, max_world));
        }
    }
    Ok(stdin)
}

/// `--output` and `--output-window`.
fn resolve_output(flags: ConsoleFlags<'_>) -> Result<(OutputMode, Duration), ConfigError> {
    let output = match flags.output.map(str::trim) {
        None | Some("all") => OutputMode::All,
        Some("collapse") => OutputMode::Collapse,
        Some(t) => return Err(invalid("--output", t, "must be collapse or all")),
    };
    let output_window = match flags.output_window {
        None => DEFAULT_OUTPUT_WINDOW,
        Some(t) => parse_seconds(t).ok_or_else(|| {
            invalid(
                "--output-window",
                t,
                format!(
                    "must be seconds (0.5, or 500ms), more than 0 and at most {}",
                    MAX_OUTPUT_WINDOW.as_secs()
                ),
            )
        })?,
    };
    Ok((output, output_window))
}

/// `--progress` and `--progress-interval`.
fn resolve_progress(flags: ConsoleFlags<'_>) -> Result<(ProgressMode, Duration), ConfigError> {
    let progress = match flags.progress.map(str::trim) {
        None | Some("auto") => ProgressMode::Auto,
        Some("one") => ProgressMode::One,
        Some("all") => ProgressMode::All,
        Some(t) => return Err(invalid("--progress", t, "must be auto, one or all")),
    };
    let progress_interval = match flags.progress_interval {
        None => DEFAULT_PROGRESS_INTERVAL,
        Some(t) => parse_seconds_upto(t, MAX_PROGRESS_INTERVAL).ok_or_else(|| {
            invalid(
                "--progress-interval",
                t,
                format!(
                    "must be seconds (1, or 500ms), more than 0 and at most {}",
                    MAX_PROGRESS_INTERVAL.as_secs()
                ),
            )
        })?,
    };
    Ok((progress, progress_interval))
}

/// `0.5` (seconds) or a humantime duration (`500ms`), in (0, [`MAX_OUTPUT_WINDOW`]].
fn parse_seconds(text: &str) -> Option<Duration> {
    parse_seconds_upto(text, MAX_OUTPUT_WINDOW)
}

/// `0.5` (seconds) or a humantime duration (`500ms`), in (0, `max`].
fn parse_seconds_upto(text: &str, max: Duration) -> Option<Duration> {
    let t = text.trim();
    let d = match t.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= max.as_secs_f64() => Duration::from_secs_f64(s),
        Ok(_) => return None,
        Err(_) => humantime::parse_duration(t).ok()?,
    };
    (!d.is_zero() && d <= max).then_some(d)
}

/// `0,2`, `0-3,8`: a set of global ranks.
fn parse_ranks(text: &str) -> Result<BTreeSet<usize>, String> {
    let mut out = BTreeSet::new();
    for part in text.split(',').map(str::trim) {
        let num = |s: &str| {
            s.trim().parse::<usize>().map_err(|_| {
                format!("'{s}' is not a rank (comma-separated ranks or ranges like 0-3)")
            })
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range '{part}' is empty"));
                }
                if b - a > 1 << 20 {
                    return Err(format!("range '{part}' is too large"));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(part)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    fn settings(flags: ConsoleFlags<'_>) -> Result<ConsoleSettings, String> {
        resolve(flags, 4096, &env_of(&[]), &FakeHost::new()).map_err(|e| e.to_string())
    }

    #[test]
    fn wrappers_that_hide_the_exit_status_are_known() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = std::path::Path::new("/venv/bin/py-spy");
        assert!(swallows_exit_status(p, &args(&["record", "-o", "x.svg", "--"])).is_some());
        assert!(swallows_exit_status(p, &args(&["dump", "--pid", "1"])).is_none());
        let nsys = std::path::Path::new("/usr/bin/nsys");
        assert!(swallows_exit_status(nsys, &args(&["profile"])).is_none());
    }

    #[test]
    fn wrap_is_split_found_and_expanded() {
        let s = settings(ConsoleFlags {
            wrap: Some("true -o 'trace %r.%l' --node=%n %p 100%"),
            wrap_ranks: Some("0, 2,4-5"),
            ..Default::default()
        })
        .expect("settings");
        let w = s.wrap.expect("wrap");
        assert_eq!(w.program, PathBuf::from("/bin/true"));
        assert_eq!(
            w.args_for(9, 1, 2),
            ["-o", "trace 9.1", "--node=2", "%p", "100%"].map(OsString::from)
        );
        assert_eq!(
            w.ranks,
            Some(BTreeSet::from([0, 2, 4, 5])),
            "ranks and ranges"
        );
        assert!(w.applies(4) && !w.applies(1) && !w.applies(3));
        let all = settings(ConsoleFlags {
            wrap: Some("true"),
            ..Default::default()
        })
        .expect("settings")
        .wrap
        .expect("wrap");
        assert!(all.applies(0) && all.applies(4095));
    }

    #[test]
    fn console_flags_defaults() {
        let s = settings(ConsoleFlags::default()).expect("settings");
        assert_eq!(s, ConsoleSettings::default());
        assert_eq!(
            s.stdin,
            StdinTarget::All,
            "torchrun: stdin inherited by all"
        );
        assert!(s.stdin.reads(3));
        let s = settings(ConsoleFlags {
            stdin: Some("1"),
            output: Some("collapse"),
            output_window: Some("250ms"),
            ..Default::default()
        })
        .expect("settings");
        assert!(s.stdin.reads(1) && !s.stdin.reads(0));
        assert_eq!(s.output, OutputMode::Collapse);
        assert_eq!(s.output_window, Duration::from_millis(250));
        let c = |f: Option<&[usize]>| s.collapse_for(4, f).map(|c| (c.window, c.ranks));
        let w = Duration::from_millis(250);
        assert_eq!(c(None), Some((w, 4)));
        assert_eq!(
            c(Some(&[0, 2, 9])),
            Some((w, 2)),
            "rank 9 is not on this node"
        );
        assert_eq!(ConsoleSettings::default().collapse_for(4, None), None);
        let none = settings(ConsoleFlags {
            stdin: Some("none"),
            output_window: Some("2"),
            ..Default::default()
        })
        .expect("settings");
        assert!(!none.stdin.reads(0));
        assert_eq!(none.output_window, Duration::from_secs(2));
    }

    #[test]
    fn progress_and_debug_rank_flags() {
        let s = settings(ConsoleFlags::default()).expect("settings");
        assert_eq!(s.progress, ProgressMode::Auto, "auto by default");
        let p = s.progress_for(4, Some(&[0, 1])).expect("auto is a stage");
        assert_eq!(
            (p.forced, p.interval, p.ranks),
            (false, DEFAULT_PROGRESS_INTERVAL, 2)
        );
        assert_eq!(
            s.progress_for(4, Some(&[3])),
            None,
            "auto: one rank, no merging"
        );
        assert_eq!(s.progress_for(1, None), None);
        let s = settings(ConsoleFlags {
            progress: Some("one"),
            progress_interval: Some("250ms"),
            ..Default::default()
        })
        .expect("settings");
        let p = s.progress_for(8, None).expect("one");
        assert_eq!(
            (p.forced, p.interval, p.ranks),
            (true, Duration::from_millis(250), 8)
        );
        assert!(s.progress_for(1, None).is_some(), "one: even for one rank");
        let s = settings(ConsoleFlags {
            progress: Some("all"),
            ..Default::default()
        })
        .expect("settings");
        assert_eq!(s.progress_for(8, None), None);
        // --debug-rank alone gives that rank stdin; an explicit --stdin wins.
        let s = settings(ConsoleFlags {
            debug_rank: Some("3"),
            ..Default::default()
        })
        .expect("settings");
        assert_eq!((s.debug_rank, s.stdin), (Some(3), StdinTarget::Rank(3)));
        let s = settings(ConsoleFlags {
            debug_rank: Some("3"),
            stdin: Some("none"),
            ..Default::default()
        })
        .expect("settings");
        assert_eq!((s.debug_rank, s.stdin), (Some(3), StdinTarget::None));
        let err = |f: ConsoleFlags<'_>| {
            resolve(f, 4, &env_of(&[]), &FakeHost::new()).map_err(|e| e.to_string())
        };
        assert_eq!(
            err(ConsoleFlags {
                progress: Some("bars"),
                ..Default::default()
            })
            .unwrap_err(),
            "--progress 'bars': must be auto, one or all"
        );
        assert_eq!(
            err(ConsoleFlags {
                progress_interval: Some("0"),
                ..Default::default()
            })
            .unwrap_err(),
            "--progress-interval '0': must be seconds (1, or 500ms), more than 0 and at most 600"
        );
        assert_eq!(
            err(ConsoleFlags {
                debug_rank: Some("x"),
                ..Default::default()
            })
            .unwrap_err(),
            "--debug-rank 'x': must be a rank (a non-negative integer)"
        );
        assert_eq!(
            err(ConsoleFlags {
                debug_rank: Some("4"),
                ..Default::default()
            })
            .unwrap_err(),
            "--debug-rank '4': rank 4 does not exist (at most 4 ranks: 0-3)"
        );
    }

    #[test]
    fn console_flag_errors() {
        let cases: &[(ConsoleFlags, &str)] = &[
            (
                ConsoleFlags { wrap: Some(""), ..Default::default() },
                "--wrap '': must name a program",
            ),
            (
                ConsoleFlags { wrap: Some("nsys 'profile"), ..Default::default() },
                "--wrap 'nsys 'profile': unbalanced quotes or a trailing backslash",
            ),
            (
                ConsoleFlags { wrap: Some("no-such-wrapper -x"), ..Default::default() },
                "--wrap 'no-such-wrapper -x': program 'no-such-wrapper' not found (no such file, and not an executable on PATH)",
            ),
            (
                ConsoleFlags { wrap_ranks: Some("0"), ..Default::default() },
                "--wrap-ranks '0': needs --wrap",
            ),
            (
                ConsoleFlags { wrap: Some("true"), wrap_ranks: Some("0,x"), ..Default::default() },
                "--wrap-ranks '0,x': 'x' is not a rank (comma-separated ranks or ranges like 0-3)",
            ),
            (
                ConsoleFlags { wrap: Some("true"), wrap_ranks: Some("3-1"), ..Default::default() },
                "--wrap-ranks '3-1': range '3-1' is empty",
            ),
            (
                ConsoleFlags { stdin: Some("-1"), ..Default::default() },
                "--stdin '-1': must be a rank (a non-negative integer), none or all",
            ),
            (
                ConsoleFlags { output: Some("some"), ..Default::default() },
                "--output 'some': must be collapse or all",
            ),
            (
                ConsoleFlags { output_window: Some("0"), ..Default::default() },
                "--output-window '0': must be seconds (0.5, or 500ms), more than 0 and at most 10",
            ),
            (
                ConsoleFlags { output_window: Some("1h"), ..Default::default() },
                "--output-window '1h': must be seconds (0.5, or 500ms), more than 0 and at most 10",
            ),
        ];
        for (flags, want) in cases {
            assert_eq!(settings(*flags).unwrap_err(), *want);
        }
        // Ranks that cannot exist in the run (4 ranks at most here).
        let small = |f: ConsoleFlags<'_>| {
            resolve(f, 4, &env_of(&[]), &FakeHost::new()).map_err(|e| e.to_string())
        };
        assert_eq!(
            small(ConsoleFlags {
                stdin: Some("4"),
                ..Default::default()
            })
            .unwrap_err(),
            "--stdin '4': rank 4 does not exist (at most 4 ranks: 0-3)"
        );
        assert_eq!(
            small(ConsoleFlags {
                wrap: Some("true"),
                wrap_ranks: Some("0,7"),
                ..Default::default()
            })
            .unwrap_err(),
            "--wrap-ranks '0,7': rank 7 does not exist (at most 4 ranks: 0-3)"
        );
        assert!(small(ConsoleFlags {
            stdin: Some("3"),
            wrap: Some("true"),
            wrap_ranks: Some("3"),
            ..Default::default()
        })
        .is_ok());
    }
}
