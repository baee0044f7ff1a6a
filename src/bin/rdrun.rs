//! The `rdrun` binary: tracing -> parse -> resolve -> supervisor -> exit code.
//!
//! Thin on purpose: every decision lives in the library. How the run ended (a
//! `supervisor::RunEnd`) is printed here, once: the failure report, or `rdrun: error: <message
//! and its causes>`; the report's files (`--report-json`, the parent TORCHELASTIC_ERROR_FILE) are
//! written from the same resolved report; the status is `exit::for_run_end`'s.

use rdrun::cli::{self, Invocation};
use rdrun::config;
use rdrun::exit;
use rdrun::supervisor;
use std::path::PathBuf;

fn main() {
    init_tracing();
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    std::process::exit(run(&argv));
}

fn run(argv: &[String]) -> i32 {
    let args = match cli::parse_from(argv, &cli::process_env) {
        Ok(Invocation::Launch(args)) => *args,
        Ok(Invocation::Help) => {
            print!("{}", cli::help_text());
            return exit::SUCCESS;
        }
        Err(e) => {
            eprintln!("rdrun: error: {e}");
            return exit::USAGE;
        }
    };
    let cfg = match config::resolve(args, &cli::process_env) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("rdrun: error: {e}");
            return e.exit_code();
        }
    };
    let report_json = cfg.report_json.clone();
    let end = supervisor::run(cfg);
    if let Some(report) = end.report() {
        // Nested under a scheduler that gave rdrun its own error file: the root cause goes there.
        let parent = std::env::var_os("TORCHELASTIC_ERROR_FILE")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        supervisor::write_report_files(report, report_json.as_deref(), parent.as_deref());
    }
    if let Some(msg) = end.message() {
        eprintln!("{msg}");
    }
    exit::for_run_end(&end)
}

/// rdrun's own log on stderr: level from RUST_LOG (full filter syntax), else LOGLEVEL (torchrun's
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
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs captured by schedulers and CI stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
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
