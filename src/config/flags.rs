//! Per-flag parsers: each turns one flag's text into its typed value, with a one-line error
//! naming the flag and the value (`--nnodes`, `--nproc-per-node`, `-r`/`-t`,
//! `--local-ranks-filter`, the log settings, `--signals-to-handle`, `--shutdown-timeout`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{invalid, ConfigError};
use super::host::gpu_count;
use super::host::{FileKind, Host};
use super::spec::NodeRange;
use super::types::{LogConfig, StdSelect, StdSpec, DEFAULT_SHUTDOWN_TIMEOUT_SECS};
use crate::cli::{python_int, EnvFn, LaunchArgs};

/// `--nnodes`: `N` or `MIN:MAX` with `0 < MIN <= MAX`.
pub fn parse_nnodes(text: &str) -> Result<NodeRange, ConfigError> {
    let bad = |reason: &str| invalid("--nnodes", text, reason);
    let parts: Vec<&str> = text.split(':').collect();
    let num = |s: &str| python_int(s).ok_or_else(|| bad("expected N or MIN:MAX with integers"));
    let (min, max) = match parts.as_slice() {
        [n] => {
            let n = num(n)?;
            (n, n)
        }
        [a, b] => (num(a)?, num(b)?),
        _ => return Err(bad("expected N or MIN:MAX")),
    };
    if !(0 < min && min <= max) {
        return Err(bad("the node counts must satisfy 0 < MIN <= MAX"));
    }
    let to_usize = |v: i64| usize::try_from(v).map_err(|_| bad("node count too large"));
    Ok(NodeRange {
        min: to_usize(min)?,
        max: to_usize(max)?,
    })
}

/// The most workers rdrun starts on one node when given a number: far above any real node
/// (CPU or accelerator count), low enough that a typo (`100000`) fails at once instead of
/// creating that many rank directories before the first spawn fails.
pub const MAX_NPROC_PER_NODE: usize = 4096;

/// `--nproc-per-node`: a positive integer (at most [`MAX_NPROC_PER_NODE`] and what the process
/// limit allows), `cpu`, `gpu` or `auto`.
pub fn resolve_nproc(text: &str, env: EnvFn<'_>, host: &dyn Host) -> Result<usize, ConfigError> {
    let n = match text {
        "cpu" => host.cpu_count(),
        "gpu" => match gpu_count(env, host) {
            Ok(n) => n,
            Err(reason) => {
                return Err(ConfigError::NoDevices {
                    value: text.into(),
                    reason,
                    var: None,
                })
            }
        },
        "auto" => gpu_count(env, host).unwrap_or_else(|_| host.cpu_count()),
        _ => {
            let v = python_int(text).ok_or_else(|| {
                invalid(
                    "--nproc-per-node",
                    text,
                    "expected a positive integer, cpu, gpu or auto",
                )
            })?;
            if v <= 0 {
                return Err(invalid("--nproc-per-node", text, "must be > 0"));
            }
            let n = usize::try_from(v).unwrap_or(usize::MAX);
            if n > MAX_NPROC_PER_NODE {
                return Err(invalid(
                    "--nproc-per-node",
                    text,
                    format!(
                        "more workers than rdrun starts on one node (at most {MAX_NPROC_PER_NODE})"
                    ),
                ));
            }
            if let Some(limit) = host.process_limit().filter(|l| n as u64 >= *l) {
                return Err(ConfigError::ProcessLimit { workers: n, limit });
            }
            return Ok(n);
        }
    };
    if n == 0 {
        return Err(ConfigError::NoDevices {
            value: text.into(),
            reason: "found 0 devices".into(),
            var: None,
        });
    }
    tracing::info!("Using nproc_per_node={text}, setting nproc_per_node to {n}");
    Ok(n)
}

/// `-r`/`-t`: one digit 0–3 for every rank, or a `rank:digit,...` map (ranks of any length).
pub fn parse_std_spec(flag: &'static str, text: &str) -> Result<StdSpec, ConfigError> {
    let digit = |s: &str| match s {
        "0" => Some(StdSelect::None),
        "1" => Some(StdSelect::Out),
        "2" => Some(StdSelect::Err),
        "3" => Some(StdSelect::All),
        _ => None,
    };
    if let Some(all) = digit(text) {
        return Ok(StdSpec {
            all,
            per_rank: BTreeMap::new(),
        });
    }
    let bad = || {
        invalid(
            flag,
            text,
            "expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a map like 0:1,1:2",
        )
    };
    let mut per_rank = BTreeMap::new();
    for item in text.split(',') {
        let (rank, sel) = item.split_once(':').ok_or_else(bad)?;
        if rank.is_empty() || !rank.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let rank: usize = rank.parse().map_err(|_| bad())?;
        per_rank.insert(rank, digit(sel).ok_or_else(bad)?);
    }
    Ok(StdSpec {
        all: StdSelect::None,
        per_rank,
    })
}

/// `--local-ranks-filter`: empty = no filter; else comma-separated local ranks.
pub fn parse_local_ranks_filter(text: &str) -> Result<Option<Vec<usize>>, ConfigError> {
    if text.is_empty() {
        return Ok(None);
    }
    let mut ranks = Vec::new();
    for item in text.split(',') {
        let r = python_int(item)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                invalid(
                    "--local-ranks-filter",
                    text,
                    "must be a comma-separated list of local ranks, e.g. --local-ranks-filter=0,1,2",
                )
            })?;
        ranks.push(r);
    }
    ranks.sort_unstable();
    ranks.dedup();
    Ok(Some(ranks))
}

pub(super) fn resolve_logs(
    args: &LaunchArgs,
    env: EnvFn<'_>,
    host: &dyn Host,
) -> Result<LogConfig, ConfigError> {
    let log_dir = args
        .log_dir
        .as_deref()
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    if let Some(dir) = &log_dir {
        if dir != Path::new("/dev/null") && matches!(host.file(dir), FileKind::File { .. }) {
            return Err(ConfigError::LogDirNotDirectory(dir.display().to_string()));
        }
    }
    let prefix_template = Some(args.log_line_prefix_template.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| env("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
        .filter(|t| !t.is_empty());
    // An empty filter would match every line; torchrun's help promises "an empty filters list
    // won't duplicate any lines", so empty items are dropped.
    let filters = |v: &[String]| v.iter().filter(|f| !f.is_empty()).cloned().collect();
    Ok(LogConfig {
        log_dir,
        redirects: parse_std_spec("--redirects", &args.redirects)?,
        tee: parse_std_spec("--tee", &args.tee)?,
        local_ranks_filter: parse_local_ranks_filter(&args.local_ranks_filter)?,
        prefix_template,
        duplicate_stdout_filters: filters(&args.duplicate_stdout_filters),
        duplicate_stderr_filters: filters(&args.duplicate_stderr_filters),
        // Set from `--output` once the console flags are resolved (`console.rs`).
        collapse: None,
        progress: None,
    })
}

/// `--signals-to-handle`: `SIG*` names to numbers; unknown or uncatchable names are skipped with
/// a warning (torchrun logs "Failed to register signal handler for X" and goes on).
pub fn parse_signals(text: &str) -> Vec<i32> {
    use std::str::FromStr;
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim) {
        match nix::sys::signal::Signal::from_str(name) {
            Ok(nix::sys::signal::Signal::SIGKILL | nix::sys::signal::Signal::SIGSTOP) => {
                tracing::warn!("Failed to register signal handler for {name}: it cannot be caught");
            }
            Ok(sig) => {
                if !out.contains(&(sig as i32)) {
                    out.push(sig as i32);
                }
            }
            Err(_) => {
                tracing::warn!("Failed to register signal handler for {name}: unknown signal")
            }
        }
    }
    out
}

/// `--shutdown-timeout`, else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s; negative is an error.
pub fn resolve_shutdown_timeout(
    flag: Option<i64>,
    env: EnvFn<'_>,
) -> Result<Duration, ConfigError> {
    let secs = match flag {
        Some(v) => u64::try_from(v)
            .map_err(|_| invalid("--shutdown-timeout", v.to_string(), "must be >= 0"))?,
        None => match env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
            None => DEFAULT_SHUTDOWN_TIMEOUT_SECS,
            Some(text) => python_int(&text)
                .and_then(|v| u64::try_from(v).ok())
                .ok_or_else(|| {
                    invalid(
                        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                        text.clone(),
                        "must be a whole number of seconds >= 0",
                    )
                })?,
        },
    };
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn nnodes() {
        let ok_cases = [
            ("1", (1, 1)),
            ("1:1", (1, 1)),
            (" 2 ", (2, 2)),
            ("1:4", (1, 4)),
        ];
        for (text, (min, max)) in ok_cases {
            assert_eq!(
                parse_nnodes(text).unwrap(),
                NodeRange { min, max },
                "{text}"
            );
        }
        for bad in ["0", "2:1", "x", "1:2:3", "", "-1", "0:2", "1:"] {
            let e = parse_nnodes(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
            assert!(
                e.to_string().starts_with(&format!("--nnodes '{bad}': ")),
                "{e}"
            );
        }
    }

    #[test]
    fn nproc() {
        let mut host = FakeHost::new();
        let none = env_of(&[]);
        assert_eq!(resolve_nproc("4", &none, &host).unwrap(), 4);
        assert_eq!(resolve_nproc(" 2 ", &none, &host).unwrap(), 2);
        assert_eq!(resolve_nproc("cpu", &none, &host).unwrap(), 6);
        assert_eq!(resolve_nproc("auto", &none, &host).unwrap(), 6);
        for bad in ["0", "-1", "x", "", "xpu", "2.0"] {
            let e = resolve_nproc(bad, &none, &host).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        // Bounded, with a one-line error naming the count (issue 10: 100000 created as many
        // rank directories before the first spawn failed).
        assert_eq!(
            resolve_nproc(&MAX_NPROC_PER_NODE.to_string(), &none, &host).unwrap(),
            MAX_NPROC_PER_NODE
        );
        for big in ["100000", "4097"] {
            let e = resolve_nproc(big, &none, &host).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{big}");
            assert_eq!(
                e.to_string(),
                format!("--nproc-per-node '{big}': more workers than rdrun starts on one node (at most 4096)")
            );
        }
        host.nproc_limit = Some(64);
        assert_eq!(resolve_nproc("63", &none, &host).unwrap(), 63);
        let e = resolve_nproc("64", &none, &host).unwrap_err();
        assert_eq!(e.exit_code(), crate::exit::LAUNCHER_FAILURE);
        assert_eq!(
            e.to_string(),
            "--nproc-per-node 64: more workers than this user's process limit allows (ulimit -u: 64)"
        );
        host.nproc_limit = None;
        let e = resolve_nproc("gpu", &none, &host).unwrap_err();
        assert_eq!(e.exit_code(), crate::exit::LAUNCHER_FAILURE);
        assert!(
            e.to_string()
                .starts_with("--nproc-per-node gpu: no NVIDIA GPU found"),
            "{e}"
        );

        host.gpus = Some(8);
        assert_eq!(resolve_nproc("gpu", &none, &host).unwrap(), 8);
        assert_eq!(resolve_nproc("auto", &none, &host).unwrap(), 8);
        let cases = [
            ("0,1", Ok(2)),
            ("3", Ok(1)),
            ("0,1,2,3,4,5,6,7,8,9", Ok(8)),
            ("0,-1,2", Ok(1)),
            ("GPU-aaa,MIG-bbb", Ok(2)),
            ("", Err(())),
            ("-1", Err(())),
        ];
        for (cvd, want) in cases {
            let env = env_of(&[("CUDA_VISIBLE_DEVICES", cvd)]);
            let got = resolve_nproc("gpu", &env, &host).map_err(|_| ());
            assert_eq!(got, want, "CUDA_VISIBLE_DEVICES={cvd:?}");
        }
        // auto falls back to CPUs when CUDA_VISIBLE_DEVICES hides every GPU.
        let env = env_of(&[("CUDA_VISIBLE_DEVICES", "")]);
        assert_eq!(resolve_nproc("auto", &env, &host).unwrap(), 6);
        // No driver listing, but CUDA_VISIBLE_DEVICES is trusted.
        host.gpus = None;
        let env = env_of(&[("CUDA_VISIBLE_DEVICES", "0,1,2")]);
        assert_eq!(resolve_nproc("gpu", &env, &host).unwrap(), 3);
    }

    #[test]
    fn std_specs() {
        use StdSelect::*;
        let all = |s| StdSpec {
            all: s,
            per_rank: BTreeMap::new(),
        };
        assert_eq!(parse_std_spec("--tee", "0").unwrap(), all(None));
        assert_eq!(parse_std_spec("--tee", "1").unwrap(), all(Out));
        assert_eq!(parse_std_spec("--tee", "2").unwrap(), all(Err));
        assert_eq!(parse_std_spec("--tee", "3").unwrap(), all(All));
        let m = parse_std_spec("--redirects", "0:1,1:2,12:3,1:0").unwrap();
        assert_eq!(m.for_rank(0), Out);
        assert_eq!(m.for_rank(1), None, "a later entry wins");
        assert_eq!(m.for_rank(12), All, "ranks of several digits");
        assert_eq!(m.for_rank(5), None);
        for bad in ["", "4", "01", "0:4", "a:1", "0:1,", ":1", "0-1", " 1"] {
            let e = parse_std_spec("--tee", bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::exit::USAGE, "{bad}");
        }
        assert!(fail(&["-t", "9", "t.py"])
            .to_string()
            .starts_with("--tee '9': "));
        assert!(fail(&["-r", "x", "t.py"])
            .to_string()
            .starts_with("--redirects 'x': "));
    }

    #[test]
    fn logs() {
        let c = ok(&["t.py"]);
        assert_eq!(c.log, LogConfig::default());
        let c = ok(&["--log-dir", "", "t.py"]);
        assert_eq!(c.log.log_dir, None);
        let c = ok(&[
            "--log-dir",
            "/logs",
            "--local-ranks-filter",
            "2,0,2",
            "t.py",
        ]);
        assert_eq!(c.log.log_dir, Some(PathBuf::from("/logs")));
        assert_eq!(c.log.local_ranks_filter, Some(vec![0, 2]));
        assert!(matches!(
            fail(&["--log-dir", "/logs/file", "t.py"]),
            ConfigError::LogDirNotDirectory(_)
        ));
        assert!(ok(&["--log-dir", "/dev/null", "t.py"])
            .log
            .log_dir
            .is_some());
        for bad in ["x", "-1", "0,,1"] {
            let e = fail(&["--local-ranks-filter", bad, "t.py"]);
            assert!(e.to_string().starts_with("--local-ranks-filter"), "{e}");
        }
        let host = FakeHost::new();
        let env = [("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${rank}]")];
        let c = resolve_env(&["t.py"], &env, &host).unwrap();
        assert_eq!(c.log.prefix_template.as_deref(), Some("[${rank}]"));
        let c = resolve_env(
            &["--log-line-prefix-template", "<${local_rank}>", "t.py"],
            &env,
            &host,
        )
        .unwrap();
        assert_eq!(c.log.prefix_template.as_deref(), Some("<${local_rank}>"));
        let c = ok(&[
            "--duplicate-stdout-filters",
            "a,,b,c",
            "--duplicate-stderr-filters",
            "",
            "t.py",
        ]);
        assert_eq!(c.log.duplicate_stdout_filters, vec!["a,b", "c"]);
        assert!(c.log.duplicate_stderr_filters.is_empty());
    }

    #[test]
    fn signals() {
        use libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        let c = ok(&["t.py"]);
        assert_eq!(
            c.signals_to_handle,
            vec![SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2]
        );
        assert_eq!(
            parse_signals("SIGTERM, BOGUS,SIGKILL,TERM,,SIGINT,SIGTERM"),
            vec![SIGTERM, SIGINT]
        );
    }

    #[test]
    fn shutdown_timeout() {
        let cases: &[(Option<i64>, Option<&str>, Option<u64>)] = &[
            (None, None, Some(30)),
            (Some(5), None, Some(5)),
            (Some(0), Some("9"), Some(0)),
            (None, Some("7"), Some(7)),
            (None, Some(" 8 "), Some(8)),
            (Some(-1), None, None),
            (None, Some("-1"), None),
            (None, Some("soon"), None),
        ];
        for (flag, var, want) in cases {
            let env = match var {
                Some(v) => env_of(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", v)]),
                None => env_of(&[]),
            };
            let got = resolve_shutdown_timeout(*flag, &env)
                .ok()
                .map(|d| d.as_secs());
            assert_eq!(got, *want, "{flag:?} {var:?}");
        }
    }
}
