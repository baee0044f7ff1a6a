//! Command-line parsing of every torchrun 2.15 flag (both spellings, `PET_*` fallback) into
//! [`LaunchArgs`]. Parse only: no I/O and no resolution against the machine (that is `config.rs`);
//! the environment is read through the accessor the caller passes in.
//!
//! The parser is hand-written rather than clap-derived because torchrun's command line is Python
//! `argparse` (spec torchrun-compat §1.1) and several of its behaviours have no clap equivalent:
//! unique-prefix abbreviation where the two spellings of one flag collide (`--nproc` is ambiguous,
//! `--nproc-per` is not), `REMAINDER` after the script (flags after it belong to the script), the
//! Python 3.11 `--` rules, short-flag chaining (`-mr3`), `-r=3`, argparse's "does this look like a
//! flag" test for values (`--max-restarts -1` is a value, `--rdzv-conf -x` is not), and defaults
//! read from `PET_<DEST>` converted exactly like command-line text.
//!
//! Files: the option table (`options.rs`), the `--help` and `--version` text generated from it
//! (`help.rs`), argparse's rules for one word (`argparse.rs`), and here the parse loop that fills
//! [`LaunchArgs`].
//!
//! Deliberate differences from argparse (recorded in docs/compat.md):
//! - Arguments after the training script are never inspected. argparse classifies them too, so
//!   `torchrun t.py --nproc 2` fails with "ambiguous option"; rdrun passes `--nproc 2` to the script.
//! - rdrun's own flags (`--report-json`, `--exit-barrier-timeout`) must be spelled in full, so
//!   that adding them does not make a torchrun abbreviation (`--re` = `--redirects`) ambiguous.
//! - A non-integer `PET_<FLAG>` for a boolean flag is a usage error naming the variable (torchrun
//!   crashes with a Python traceback).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

mod argparse;
/// `--print-completion` scripts and the `--print-man` page, generated from [`flag_table`].
pub mod completion;
mod help;
mod options;

use argparse::*;
pub(crate) use argparse::{comma_separated_list, python_float, python_int};
pub use help::{help_text, help_text_for, version_text};
use options::*;
pub use options::{
    flag_table, FlagValue, FlagView, Section, CLUSTER_CHOICES, EVENT_HANDLERS, HANG_FLAGS,
    HANG_MODES, LEFTOVER_POLICIES, RDZV_BACKENDS, SHELLS,
};

/// Reads one environment variable; `None` when unset. Tests pass a closure over a map.
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

/// What the user typed, typed as argparse types it, before any resolution.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchArgs {
    /// `--nnodes`: `N` or `MIN:MAX` (text; checked in `config`).
    pub nnodes: String,
    /// `--nproc-per-node`: an integer, `cpu`, `gpu`, `auto` (text; resolved in `config`).
    pub nproc_per_node: String,
    pub rdzv_backend: String,
    pub rdzv_endpoint: String,
    /// `--rdzv-id`; torchrun's literal default is `none`.
    pub rdzv_id: String,
    pub rdzv_conf: String,
    pub standalone: bool,
    pub max_restarts: i64,
    pub monitor_interval: f64,
    /// Accepted for compatibility; meaningless without Python multiprocessing.
    pub start_method: String,
    pub event_log_handler: String,
    pub role: String,
    pub module: bool,
    pub no_python: bool,
    pub run_path: bool,
    pub log_dir: Option<String>,
    pub redirects: String,
    pub tee: String,
    pub log_line_prefix_template: String,
    pub local_ranks_filter: String,
    pub duplicate_stdout_filters: Vec<String>,
    pub duplicate_stderr_filters: Vec<String>,
    pub node_rank: i64,
    pub master_addr: String,
    pub master_port: Option<i64>,
    pub local_addr: Option<String>,
    /// `--logs-specs` (a Python plugin name; rejected by [`parse_from`], kept for later issues).
    pub logs_specs: Option<String>,
    /// `--numa-binding node|socket|exclusive|core-complex` (applied by `config::numa`).
    pub numa_binding: Option<String>,
    /// rdrun's `--cpu-binding`: each local rank gets its own share of the affinity mask.
    pub cpu_binding: bool,
    /// rdrun's `--omp-num-threads cpus|N` (OMP_NUM_THREADS of every worker).
    pub omp_num_threads: Option<String>,
    pub signals_to_handle: String,
    pub shutdown_timeout: Option<i64>,
    pub virtual_local_rank: bool,
    /// rdrun's `--report-json PATH`.
    pub report_json: Option<PathBuf>,
    /// rdrun's `--report-junit PATH`.
    pub report_junit: Option<PathBuf>,
    /// rdrun's `--exit-barrier-timeout SECS` (torchrun hard-codes 300).
    pub exit_barrier_timeout: f64,
    /// rdrun's `--leftovers kill|wait|leave` (else RDRUN_LEFTOVERS, read by `config`).
    pub leftovers: Option<String>,
    /// rdrun's `--cluster auto|none|slurm|k8s|mpi|lsf|hostfile` (else RDRUN_CLUSTER, read by
    /// `config` through `cluster::ClusterChoice::resolve`).
    pub cluster: Option<String>,
    /// rdrun's `--hostfile PATH` (RDRUN_HOSTFILE and Open MPI's variable are read by the
    /// cluster hostfile reader itself).
    pub hostfile: Option<String>,
    /// rdrun's `--include` / `--exclude NODE_SPEC[@NODE_SPEC…]`: DeepSpeed's documented hostfile
    /// filters (applied by the cluster hostfile reader).
    pub include: Option<String>,
    pub exclude: Option<String>,
    /// rdrun's `--dry-run`: resolve and print the topology, start nothing.
    pub dry_run: bool,
    /// rdrun's `--nested` (else RDRUN_NESTED=1, read by `config`): a launch from inside a
    /// torchrun/rdrun worker under a detected scheduler is intended (it forms its own world).
    pub nested: bool,
    /// rdrun's `--print-topology[=json]`: `Some("text")` or `Some("json")`; implies a dry run.
    pub print_topology: Option<String>,
    /// rdrun's `--events PATH|-`: lifecycle events as JSON lines (resolved in `config::observe`).
    pub events: Option<String>,
    /// rdrun's `--warm-start off|on|auto` (else RDRUN_WARM_START, read by `config`).
    pub warm_start: Option<String>,
    /// rdrun's `--preload mod1,mod2` (else RDRUN_PRELOAD, read by `config`).
    pub preload: Vec<String>,
    /// rdrun's `--chaos SPEC`, every one given joined with `;` (else RDRUN_CHAOS, read by
    /// `config`; typed by `supervisor::chaos::spec`).
    pub chaos: Option<String>,
    /// rdrun's `--chaos-progress REGEX` (else RDRUN_CHAOS_PROGRESS).
    pub chaos_progress: Option<String>,
    /// rdrun's `--metrics-addr HOST:PORT` (else RDRUN_METRICS_ADDR, read by `config`).
    pub metrics_addr: Option<String>,
    /// rdrun's `--wrap 'CMD ARGS'` and `--wrap-ranks RANKS` (split and checked in `config`).
    pub wrap: Option<String>,
    pub wrap_ranks: Option<String>,
    /// rdrun's `--stdin RANK|none|all`.
    pub stdin: Option<String>,
    /// rdrun's `--output collapse|all` and `--output-window SECS`.
    pub output: Option<String>,
    pub output_window: Option<String>,
    /// rdrun's `--progress auto|one|all`, `--progress-interval SECS` and `--debug-rank R`.
    pub progress: Option<String>,
    pub progress_interval: Option<String>,
    pub debug_rank: Option<String>,
    /// rdrun's `--max-same-failures N` (checked by `config::resilience`).
    pub max_same_failures: Option<i64>,
    /// rdrun's `--health-check off|warn|on`, `--health-check-cmd PROG`,
    /// `--health-check-timeout SECS` (checked by `config::resilience`).
    pub health_check: Option<String>,
    pub health_check_cmd: Option<String>,
    pub health_check_timeout: Option<f64>,
    /// rdrun's `--checkpoint-dir PATH` (a health check's free-space target).
    pub checkpoint_dir: Option<String>,
    /// rdrun's `--bad-nodes-file PATH`, `--exclude-nodes-from FILE` (read by `config`).
    pub bad_nodes_file: Option<String>,
    pub exclude_nodes_from: Option<String>,
    /// rdrun's `--network-check on|off`, `--network-check-threshold F`, `--max-node-failures K`
    /// (checked by `config::resilience`).
    pub network_check: Option<String>,
    pub network_check_threshold: Option<f64>,
    pub max_node_failures: Option<i64>,
    /// The dests typed on the command line (not defaults, not `PET_*`): the cluster layer's
    /// "flags" win every field, so it must know which values the user actually gave.
    pub cli_given: BTreeSet<&'static str>,
    /// rdrun's hang-detection flags given on the command line, as (name without `--`, value)
    /// in [`HANG_FLAGS`] order; `config` applies them over the `RDRUN_HANG_*` variables.
    pub hang: Vec<(&'static str, String)>,
    /// The script path, module name (`-m`) or program (`--no-python`), as typed (any bytes).
    pub training_script: OsString,
    /// Everything after the training script, byte for byte (after the `--` rules of spec §1.1):
    /// it reaches the workers' `execve` unchanged, UTF-8 or not.
    pub training_script_args: Vec<OsString>,
    /// Values that came from `PET_*` variables: dest (e.g. `nproc_per_node`) -> variable name,
    /// so that an error found later (in `config`) names the variable the user set.
    pub from_env: BTreeMap<String, String>,
}

/// Result of a successful parse.
#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// Launch with these arguments.
    Launch(Box<LaunchArgs>),
    /// `-h`/`--help` was given: print [`help_text_for`] the terminal's width and exit 0.
    Help,
    /// `--print-completion SHELL`, `--print-man` or `--version`: print this text on stdout and
    /// exit 0 (generated from [`OPTIONS`] by [`completion`], or [`version_text`]).
    Print(String),
}

/// A command-line usage error; the binary prints `rdrun: error: <message>` and exits 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("ambiguous option: {option} could match {matches}")]
    Ambiguous { option: String, matches: String },
    #[error("unrecognized arguments: {}", .0.join(" "))]
    Unrecognized(Vec<String>),
    #[error("argument {flag}: expected one argument")]
    ExpectedValue { flag: String },
    #[error("argument {flag}: ignored explicit argument '{value}'")]
    IgnoredExplicit { flag: String, value: String },
    #[error("argument {flag}: the value {value:?} is not valid UTF-8")]
    NotText { flag: String, value: String },
    #[error("argument {flag}: invalid {kind} value: '{value}'{}", from_env(.var))]
    InvalidValue {
        flag: String,
        kind: &'static str,
        value: String,
        /// The `PET_*` variable the value came from, if it did not come from the command line.
        var: Option<String>,
    },
    #[error("argument {flag}: invalid choice: '{value}' (choose from {choices})")]
    InvalidChoice {
        flag: String,
        value: String,
        choices: String,
    },
    #[error("{var}={value:?}: a boolean flag read from the environment must be an integer (0 = off, non-zero = on)")]
    InvalidEnvFlag { var: String, value: String },
    #[error("the following arguments are required: training_script, training_script_args")]
    MissingScript,
    #[error("{flag} is not supported by rdrun: {why}")]
    Unsupported { flag: String, why: &'static str },
}

fn from_env(var: &Option<String>) -> String {
    match var {
        Some(v) => format!(" (from {v})"),
        None => String::new(),
    }
}

/// A value seen for one option, and where it came from.
#[derive(Debug, Clone)]
struct Given {
    text: String,
    /// The `PET_*` variable, when not from the command line.
    var: Option<String>,
}

/// Parses torchrun's command line (without the program name) plus `PET_*` defaults from `env`.
///
/// Words are classified as text (a non-UTF-8 flag value is a usage error naming the flag); the
/// training script and its arguments are kept as the bytes given.
pub fn parse_from<A: AsRef<OsStr>>(raw: &[A], env: EnvFn<'_>) -> Result<Invocation, UsageError> {
    let raw: Vec<&OsStr> = raw.iter().map(AsRef::as_ref).collect();
    let argv: Vec<String> = raw
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut scan = Scan {
        raw: &raw,
        argv: &argv,
        given: vec![None; OPTIONS.len()],
        flags: vec![false; OPTIONS.len()],
        unknown: Vec::new(),
        script: None,
        help: false,
    };
    if let Some(print) = scan.words()? {
        return Ok(print);
    }
    let Some((training_script, training_script_args)) = scan.script else {
        return Err(UsageError::MissingScript);
    };
    if !scan.unknown.is_empty() {
        return Err(UsageError::Unrecognized(scan.unknown));
    }
    let b = Builder {
        given: scan.given,
        flags: scan.flags,
        env,
        from_env: BTreeMap::new(),
    };
    let args = launch_args(b, training_script, training_script_args)?;
    check_supported(&args)?;
    Ok(Invocation::Launch(Box::new(args)))
}

/// The command line read word by word as argparse reads it: the options' values and flags, the
/// unknown words, and the script with its arguments.
struct Scan<'a> {
    raw: &'a [&'a OsStr],
    /// `raw` as text (lossy: a flag's value is checked to be text, see [`Scan::text_word`]).
    argv: &'a [String],
    given: Vec<Option<Given>>,
    flags: Vec<bool>,
    unknown: Vec<String>,
    script: Option<(OsString, Vec<OsString>)>,
    /// argparse runs the actions of one word (e.g. `-mh`) after reading all of it; help exits.
    help: bool,
}

impl<'a> Scan<'a> {
    /// The words from `from` on, as given.
    fn verbatim(&self, from: usize) -> Vec<OsString> {
        self.raw
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|a| a.to_os_string())
            .collect()
    }

    /// A flag's value must be text: the lossy copy of a non-UTF-8 word is not what was typed.
    fn text_word(&self, word: usize, id: OptId, value: &str) -> Result<(), UsageError> {
        match self.raw[word].to_str() {
            Some(_) => Ok(()),
            None => Err(UsageError::NotText {
                flag: display(id),
                value: value.to_string(),
            }),
        }
    }

    /// Reads the words up to the script (kept with its arguments); `Some`: what to print
    /// instead of launching (help, version, man page, a completion script).
    fn words(&mut self) -> Result<Option<Invocation>, UsageError> {
        let argv = self.argv;
        let mut i = 0;
        while i < argv.len() {
            let arg = argv[i].as_str();
            if arg == "--" {
                // A `--` before the script ends option parsing and is dropped; everything after
                // it is the script and its arguments, verbatim (even a second `--`).
                if let Some(s) = self.raw.get(i + 1) {
                    self.script = Some((s.to_os_string(), self.verbatim(i + 2)));
                }
                break;
            }
            match classify(arg)? {
                Class::Positional => {
                    // argparse REMAINDER: the rest belongs to the script; a `--` right after
                    // the script name is dropped (Python 3.11 `(-*A-*)` pattern), a later one
                    // is kept.
                    let mut j = i + 1;
                    if argv.get(j).map(String::as_str) == Some("--") {
                        j += 1;
                    }
                    self.script = Some((self.raw[i].to_os_string(), self.verbatim(j)));
                    break;
                }
                Class::Unknown => {
                    self.unknown.push(arg.to_string());
                    i += 1;
                }
                Class::Option { id, name, explicit } => {
                    if let Some(print) = self.option(&mut i, id, name, explicit)? {
                        return Ok(Some(print));
                    }
                }
            }
        }
        Ok(None)
    }

    /// One option word at `i` (`--flag`, `--flag=v`, `-mr3`, or `--flag v`: `i` moves past
    /// the words it takes); `Some`: what to print instead of launching.
    fn option(
        &mut self,
        i: &mut usize,
        mut id: OptId,
        mut name: &'static str,
        mut explicit: Option<&'a str>,
    ) -> Result<Option<Invocation>, UsageError> {
        let word = *i;
        *i += 1;
        loop {
            let spec = &OPTIONS[id];
            match spec.kind {
                Kind::Man | Kind::Version => {
                    if let Some(e) = explicit {
                        return Err(UsageError::IgnoredExplicit {
                            flag: display(id),
                            value: e.to_string(),
                        });
                    }
                    return Ok(Some(Invocation::Print(match spec.kind {
                        Kind::Man => completion::man_page(),
                        _ => version_text(),
                    })));
                }
                Kind::Help | Kind::Flag => {
                    if spec.kind == Kind::Help {
                        self.help = true;
                    }
                    self.flags[id] = true;
                    let Some(e) = explicit else {
                        break;
                    };
                    (id, name, explicit) = next_short(id, name, e)?;
                }
                Kind::OptionalChoice(choices) => {
                    let value = explicit.unwrap_or(choices[0]);
                    self.text_word(word, id, value)?;
                    if !choices.contains(&value) {
                        return Err(UsageError::InvalidChoice {
                            flag: display(id),
                            value: value.to_string(),
                            choices: quoted(choices),
                        });
                    }
                    self.given[id] = Some(Given {
                        text: value.to_string(),
                        var: None,
                    });
                    break;
                }
                _ => {
                    if let Some(print) = self.value_option(word, i, id, explicit)? {
                        return Ok(Some(print));
                    }
                    break;
                }
            }
        }
        Ok(self.help.then_some(Invocation::Help))
    }

    /// An option that takes a value: `--flag=v`, or the next word when it is not an option;
    /// a completion option prints its script at once (argparse runs the action as it parses).
    fn value_option(
        &mut self,
        word: usize,
        i: &mut usize,
        id: OptId,
        explicit: Option<&str>,
    ) -> Result<Option<Invocation>, UsageError> {
        let spec = &OPTIONS[id];
        let argv = self.argv;
        let value = match explicit {
            Some(v) => {
                self.text_word(word, id, v)?;
                v.to_string()
            }
            None => {
                let next = argv.get(*i).map(String::as_str);
                let ok = match next {
                    None | Some("--") => false,
                    Some(n) => matches!(classify(n)?, Class::Positional),
                };
                if !ok {
                    return Err(UsageError::ExpectedValue { flag: display(id) });
                }
                self.text_word(*i, id, &argv[*i])?;
                *i += 1;
                argv[*i - 1].clone()
            }
        };
        check_cli_value(id, &value)?;
        if spec.kind == Kind::Completion {
            // argparse runs the action as soon as it is parsed: print, exit 0.
            return Ok(Some(Invocation::Print(completion::script(&value))));
        }
        let text = match (&self.given[id], spec.repeat) {
            (Some(prev), true) => format!("{};{value}", prev.text),
            _ => value,
        };
        self.given[id] = Some(Given { text, var: None });
        Ok(None)
    }
}

/// After short flag `name` (its value part `e` given in the same word): `-mr3` is a short flag
/// followed by more short options, the next one `e`'s first letter; anything else is a value
/// the flag ignores (an error).
fn next_short<'e>(
    id: OptId,
    name: &'static str,
    e: &'e str,
) -> Result<(OptId, &'static str, Option<&'e str>), UsageError> {
    let is_short = name.len() == 2 && !name.starts_with("--");
    let next = e.chars().next().map(|c| format!("-{c}"));
    match next
        .as_deref()
        .and_then(exact)
        .filter(|_| is_short && !e.is_empty())
    {
        Some((nid, nname)) => {
            let rest = &e[e.chars().next().map_or(0, char::len_utf8)..];
            Ok((nid, nname, (!rest.is_empty()).then_some(rest)))
        }
        None => Err(UsageError::IgnoredExplicit {
            flag: display(id),
            value: e.to_string(),
        }),
    }
}

/// The typed arguments: each option's value from the command line, else its `PET_*` variable.
fn launch_args(
    mut b: Builder<'_>,
    training_script: OsString,
    training_script_args: Vec<OsString>,
) -> Result<LaunchArgs, UsageError> {
    let cli_given: BTreeSet<&'static str> = OPTIONS
        .iter()
        .enumerate()
        .filter(|(id, _)| b.given[*id].is_some() || b.flags[*id])
        .map(|(_, o)| o.dest)
        .collect();
    let mut args = LaunchArgs {
        nnodes: b.string("nnodes")?,
        nproc_per_node: b.string("nproc_per_node")?,
        rdzv_backend: b.string("rdzv_backend")?,
        rdzv_endpoint: b.string("rdzv_endpoint")?,
        rdzv_id: b.string("rdzv_id")?,
        rdzv_conf: b.string("rdzv_conf")?,
        standalone: b.flag("standalone")?,
        max_restarts: b.int("max_restarts")?.unwrap_or(0),
        monitor_interval: b.float("monitor_interval")?.unwrap_or(0.1),
        start_method: b.string("start_method")?,
        event_log_handler: b.string("event_log_handler")?,
        role: b.string("role")?,
        module: b.flag("module")?,
        no_python: b.flag("no_python")?,
        run_path: b.flag("run_path")?,
        log_dir: b.opt_string("log_dir")?,
        redirects: b.string("redirects")?,
        tee: b.string("tee")?,
        log_line_prefix_template: b.string("log_line_prefix_template")?,
        local_ranks_filter: b.string("local_ranks_filter")?,
        duplicate_stdout_filters: b.list("duplicate_stdout_filters")?,
        duplicate_stderr_filters: b.list("duplicate_stderr_filters")?,
        node_rank: b.int("node_rank")?.unwrap_or(0),
        master_addr: b.string("master_addr")?,
        master_port: b.int("master_port")?,
        local_addr: b.opt_string("local_addr")?,
        logs_specs: b.opt_string("logs_specs")?,
        numa_binding: b.opt_string("numa_binding")?,
        cpu_binding: b.flags[Builder::id("cpu_binding")],
        omp_num_threads: b.opt_string("omp_num_threads")?,
        signals_to_handle: b.string("signals_to_handle")?,
        shutdown_timeout: b.int("shutdown_timeout")?,
        virtual_local_rank: b.flag("virtual_local_rank")?,
        report_json: b.opt_string("report_json")?.map(PathBuf::from),
        report_junit: b.opt_string("report_junit")?.map(PathBuf::from),
        exit_barrier_timeout: b.float("exit_barrier_timeout")?.unwrap_or(300.0),
        leftovers: b.opt_string("leftovers")?,
        cluster: b.opt_string("cluster")?,
        hostfile: b.opt_string("hostfile")?,
        include: b.opt_string("include")?,
        exclude: b.opt_string("exclude")?,
        dry_run: b.flags[Builder::id("dry_run")],
        nested: b.flags[Builder::id("nested")],
        print_topology: b.opt_string("print_topology")?,
        events: b.opt_string("events")?,
        warm_start: b.opt_string("warm_start")?,
        preload: b.list("preload")?,
        chaos: b.opt_string("chaos")?,
        chaos_progress: b.opt_string("chaos_progress")?,
        metrics_addr: b.opt_string("metrics_addr")?,
        wrap: b.opt_string("wrap")?,
        wrap_ranks: b.opt_string("wrap_ranks")?,
        stdin: b.opt_string("stdin")?,
        output: b.opt_string("output")?,
        output_window: b.opt_string("output_window")?,
        progress: b.opt_string("progress")?,
        progress_interval: b.opt_string("progress_interval")?,
        debug_rank: b.opt_string("debug_rank")?,
        max_same_failures: b.int("max_same_failures")?,
        health_check: b.opt_string("health_check")?,
        health_check_cmd: b.opt_string("health_check_cmd")?,
        health_check_timeout: b.float("health_check_timeout")?,
        checkpoint_dir: b.opt_string("checkpoint_dir")?,
        bad_nodes_file: b.opt_string("bad_nodes_file")?,
        exclude_nodes_from: b.opt_string("exclude_nodes_from")?,
        network_check: b.opt_string("network_check")?,
        network_check_threshold: b.float("network_check_threshold")?,
        max_node_failures: b.int("max_node_failures")?,
        cli_given,
        hang: {
            let mut given = Vec::new();
            for (dest, name) in HANG_FLAGS {
                if let Some(v) = b.opt_string(dest)? {
                    given.push((*name, v));
                }
            }
            given
        },
        training_script,
        training_script_args,
        from_env: BTreeMap::new(),
    };
    args.from_env = b.from_env;
    Ok(args)
}

/// Type and choice checks argparse applies to a command-line value as soon as it is read.
fn check_cli_value(id: OptId, value: &str) -> Result<(), UsageError> {
    let invalid = |kind| UsageError::InvalidValue {
        flag: display(id),
        kind,
        value: value.to_string(),
        var: None,
    };
    let choices = match OPTIONS[id].kind {
        Kind::Int if python_int(value).is_none() => return Err(invalid("int")),
        Kind::Float if python_float(value).is_none() => return Err(invalid("float")),
        Kind::Choice(c) => c,
        Kind::Completion => SHELLS,
        _ => return Ok(()),
    };
    if choices.contains(&value) {
        return Ok(());
    }
    Err(UsageError::InvalidChoice {
        flag: display(id),
        value: value.to_string(),
        choices: quoted(choices),
    })
}

/// `'a', 'b'` as argparse lists choices.
fn quoted(choices: &[&str]) -> String {
    choices
        .iter()
        .map(|c| format!("'{c}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Flags that only make sense as Python plugins or are not built yet: rejected, never ignored.
fn check_supported(args: &LaunchArgs) -> Result<(), UsageError> {
    if args.logs_specs.is_some() {
        return Err(UsageError::Unsupported {
            flag: "--logs-specs".into(),
            why: "it loads a Python plugin (torchrun.logs_specs entry point)",
        });
    }
    if let (Some(mode), true) = (&args.numa_binding, args.cpu_binding) {
        return Err(UsageError::Unsupported {
            flag: format!("--cpu-binding with --numa-binding {mode}"),
            why: "choose one: --numa-binding binds to the accelerator's CPUs, --cpu-binding shares the affinity mask",
        });
    }
    if !matches!(args.event_log_handler.as_str(), "null" | "console") {
        return Err(UsageError::Unsupported {
            flag: format!("--event-log-handler {}", args.event_log_handler),
            why: "only the null and console handlers exist outside Python",
        });
    }
    Ok(())
}

/// Final values: command line, else `PET_<DEST>`, else the default; typed like argparse does.
struct Builder<'e> {
    given: Vec<Option<Given>>,
    flags: Vec<bool>,
    env: EnvFn<'e>,
    /// dest -> `PET_*` variable, for every value taken from the environment.
    from_env: BTreeMap<String, String>,
}

impl Builder<'_> {
    fn id(dest: &str) -> OptId {
        OPTIONS
            .iter()
            .position(|o| o.dest == dest)
            .expect("every dest used by the builder is in OPTIONS")
    }

    fn pet_name(dest: &str) -> String {
        format!("PET_{}", dest.to_ascii_uppercase())
    }

    /// The value from the command line or `PET_*`; `None` = use the default.
    fn raw(&mut self, dest: &str) -> Option<Given> {
        let id = Self::id(dest);
        if let Some(g) = self.given[id].take() {
            return Some(g);
        }
        if !OPTIONS[id].pet {
            return None;
        }
        let var = Self::pet_name(dest);
        let text = (self.env)(&var)?;
        self.from_env.insert(dest.to_string(), var.clone());
        Some(Given {
            text,
            var: Some(var),
        })
    }

    fn string(&mut self, dest: &str) -> Result<String, UsageError> {
        let default = OPTIONS[Self::id(dest)].default;
        Ok(self
            .raw(dest)
            .map_or_else(|| default.to_string(), |g| g.text))
    }

    fn opt_string(&mut self, dest: &str) -> Result<Option<String>, UsageError> {
        Ok(self.raw(dest).map(|g| g.text))
    }

    fn list(&mut self, dest: &str) -> Result<Vec<String>, UsageError> {
        Ok(self
            .raw(dest)
            .map(|g| comma_separated_list(&g.text))
            .unwrap_or_default())
    }

    fn int(&mut self, dest: &str) -> Result<Option<i64>, UsageError> {
        let id = Self::id(dest);
        match self.raw(dest) {
            None => Ok(None),
            Some(g) => python_int(&g.text)
                .map(Some)
                .ok_or_else(|| UsageError::InvalidValue {
                    flag: display(id),
                    kind: "int",
                    value: g.text,
                    var: g.var,
                }),
        }
    }

    fn float(&mut self, dest: &str) -> Result<Option<f64>, UsageError> {
        let id = Self::id(dest);
        match self.raw(dest) {
            None => Ok(None),
            Some(g) => python_float(&g.text)
                .map(Some)
                .ok_or_else(|| UsageError::InvalidValue {
                    flag: display(id),
                    kind: "float",
                    value: g.text,
                    var: g.var,
                }),
        }
    }

    /// torchrun's `check_env`: on when given, else `bool(int(PET_X))`, else off. One deliberate
    /// difference: an empty `PET_STANDALONE` is on, because the PyTorchJob operator sets it so
    /// for a one-replica job and the cluster reader reads it the same way (docs/compat.md).
    fn flag(&mut self, dest: &str) -> Result<bool, UsageError> {
        let id = Self::id(dest);
        if self.flags[id] {
            return Ok(true);
        }
        let var = Self::pet_name(dest);
        let Some(text) = (self.env)(&var) else {
            return Ok(false);
        };
        // The flag's value came from the variable: the dry run names it as the origin, as it
        // does for every other value (issue 38 item 16: it said `default`).
        self.from_env.insert(dest.to_string(), var.clone());
        if dest == "standalone" && text.trim().is_empty() {
            return Ok(true);
        }
        match python_int(&text) {
            Some(v) => Ok(v != 0),
            None => Err(UsageError::InvalidEnvFlag { var, value: text }),
        }
    }
}

#[cfg(test)]
mod tests;
