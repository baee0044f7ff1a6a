//! The `rdrun` binary: block signals -> tracing -> parse -> resolve -> (topology banner; a dry run
//! stops here) -> supervisor -> exit code.
//!
//! Thin on purpose: every decision lives in the library. How the run ended (a
//! `supervisor::RunEnd`) is printed here, once: the failure report, or `rdrun: error: <message
//! and its causes>`; the report's files (`--report-json` on every end, the parent
//! TORCHELASTIC_ERROR_FILE after a failure) are written from the same resolved report, and so
//! are `--report-junit` and, under GitHub Actions, the annotation and step summary
//! (`supervisor::report::ci`); the status is `RunEnd::exit`'s, numbered by `exit::Exit`.

use rdrun::cli::{self, Invocation};
use rdrun::config;
use rdrun::exit::Exit;
use rdrun::supervisor;
use std::path::PathBuf;

/// Runs [`block_early`] before `main`, from the ELF constructors: the earliest code of rdrun's own
/// that runs after exec (only the dynamic loader comes before it).
#[used]
#[link_section = ".init_array"]
static BLOCK_EARLY: extern "C" fn() = block_early;

/// Blocks the handled signals until the supervisor's handlers exist (see
/// `supervisor::group::signals::STARTUP_BLOCKED`): a SIGTERM or SIGUSR1 in rdrun's first milliseconds
/// used to kill it by the default action.
extern "C" fn block_early() {
    rdrun::supervisor::group::signals::block_at_startup();
}

fn main() {
    // Again, in case the constructor did not run (idempotent): before anything else.
    rdrun::supervisor::group::signals::block_at_startup();
    // Before any thread or child: what rdrun inherited beyond stdio reaches no program it runs.
    rdrun::supervisor::group::worker::close_inherited_fds_on_exec();
    init_tracing();
    // OsString end to end: the script's arguments reach the workers byte for byte.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let code = run(&argv);
    // The terminal's console (the run's) writes on its own thread: what it holds first.
    supervisor::output::own::flush();
    std::process::exit(code);
}

fn run(argv: &[std::ffi::OsString]) -> i32 {
    let args = match cli::parse_from(argv, &config::process_env) {
        Ok(Invocation::Launch(args)) => *args,
        Ok(Invocation::Help) => {
            print_out(&cli::help_text_for(help_columns()));
            return Exit::Success.code();
        }
        Ok(Invocation::Print(text)) => {
            print_out(&text);
            return Exit::Success.code();
        }
        Err(e) => {
            print_err(&format!("rdrun: error: {e}\n"));
            return Exit::Usage.code();
        }
    };
    let cfg = match config::resolve(args, &config::process_env) {
        Ok(cfg) => cfg,
        Err(e) => {
            print_err(&format!(
                "rdrun: error: {e}
"
            ));
            return e.exit().code();
        }
    };
    // The resolved topology: `--dry-run`/`--print-topology` print it on stdout and start nothing;
    // a detected cluster run shows it on stderr before spawning (full on node 0).
    if let Some(text) = cfg.cluster.banner() {
        if cfg.cluster.dry_run.is_some() {
            // What this node's health checks say (issue 28), unless --health-check off: a block
            // after the text topology, a `health` member of the JSON one.
            let report = rdrun::supervisor::dry_run_health(&cfg);
            if cfg.cluster.dry_run == Some(config::TopologyFormat::Json) {
                let mut j: serde_json::Value =
                    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
                if let Some(o) = j.as_object_mut() {
                    let health = rdrun::health::dry_run_json(&cfg.resilience, report.as_ref());
                    o.insert("health".into(), health);
                    print_out(&format!("{j}\n"));
                } else {
                    print_out(&text);
                }
            } else {
                print_out(&text);
                if let Some(report) = &report {
                    print_out(&report.render());
                }
            }
            return Exit::Success.code();
        }
        print_err(&text);
    }
    let report_json = cfg.report_json.clone();
    let ci = supervisor::report::ci::Targets {
        github: supervisor::report::ci::GitHub::detect(
            &|k| std::env::var_os(k),
            std::env::current_dir().ok(),
        ),
        junit: cfg.report_junit.clone(),
        job: cfg.command.display_name.clone(),
    };
    let ended = supervisor::run(cfg);
    let end = &ended.end;
    if let Some(report) = end.report() {
        // Nested under a scheduler that gave rdrun its own error file: the root cause goes there.
        let parent = std::env::var_os("TORCHELASTIC_ERROR_FILE")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        supervisor::write_parent_error_file(report, parent.as_deref());
    }
    // On every end, success included: a report left by an earlier run must not be read as this
    // one's.
    supervisor::write_end_json(&ended, report_json.as_deref());
    // Under GitHub Actions: the annotation (stdout, where the runner reads workflow commands) and
    // the step summary; `--report-junit`. Nothing at all elsewhere.
    if let Some(commands) = supervisor::report::ci::write(&ended, &ci) {
        print_out(&commands);
    }
    if let Some(msg) = end.message() {
        print_err(&format!("{msg}\n"));
    }
    end.exit().code()
}

/// The width `--help` wraps to: `COLUMNS` (as Python's argparse reads it), else the terminal on
/// stdout, else 80.
fn help_columns() -> usize {
    let from_env = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&c| c > 0);
    from_env.or_else(stdout_columns).unwrap_or(80)
}

/// The width of the terminal on stdout, if stdout is one.
fn stdout_columns() -> Option<usize> {
    // SAFETY: TIOCGWINSZ writes one winsize into the zeroed struct we own; a non-terminal fd
    // only returns -1.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(usize::from(ws.ws_col))
}

/// rdrun's own text on stdout. A closed pipe (`rdrun --help | true`) or a full disk must not
/// become a panic (exit 101, issue 10): the text is lost, the exit code stays the real one.
fn print_out(text: &str) {
    supervisor::output::own::stdout(text);
}

/// [`print_out`] for stderr (`rdrun: error: …` lines, the failure report; `2>/dev/full` still
/// exits with the real status, not 101), after any worker line left open on the console.
fn print_err(text: &str) {
    supervisor::output::own::stderr(text);
}

/// rdrun's own log on stderr (never inside a worker's open line), each line stamped with its RFC 3339 time: level from RUST_LOG (full filter syntax), else LOGLEVEL (torchrun's
/// variable: DEBUG, INFO, WARNING, ERROR, CRITICAL), else warnings and errors only.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| {
            let level = std::env::var("LOGLEVEL").unwrap_or_default();
            EnvFilter::new(loglevel_directive(&level))
        });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Never a panic on a closed or full stderr (issue 24): the writer drops what cannot be
        // written and reports no error, and tracing's own report of one (an `eprintln!`, which
        // panics on that same stderr) is off.
        .with_writer(supervisor::output::own::log_writer)
        .log_internal_errors(false)
        // Colour codes only on a terminal: logs captured by schedulers and CI stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // RFC 3339 UTC timestamps with microseconds (2026-12-01T11:37:17.123456Z): torchrun's
        // log lines carry their time too, and interleaved logs of several nodes need it.
        .with_timer(tracing_subscriber::fmt::time::SystemTime)
        .with_target(false)
        .try_init();
}

/// Python logging level names to a tracing level.
fn loglevel_directive(level: &str) -> &'static str {
    match level.trim().to_ascii_uppercase().as_str() {
        "DEBUG" | "NOTSET" => "debug",
        "INFO" => "info",
        "ERROR" | "CRITICAL" | "FATAL" => "error",
        _ => "warn",
    }
}

#[cfg(test)]
mod tests {
    use super::loglevel_directive;

    #[test]
    fn python_level_names() {
        for (name, want) in [
            ("DEBUG", "debug"),
            ("info", "info"),
            ("WARNING", "warn"),
            ("", "warn"),
            ("bogus", "warn"),
            ("ERROR", "error"),
            ("CRITICAL", "error"),
        ] {
            assert_eq!(loglevel_directive(name), want, "{name}");
        }
    }
}
