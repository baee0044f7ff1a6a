//! Hang-detection settings: the mode, the budgets and thresholds, their defaults, and the
//! parsers that the CLI and the `RDRUN_HANG_*` environment variables share.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// What rdrun does when the detector decides the job hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangMode {
    /// No sampling at all.
    Off,
    /// Capture and report, never stop the workers (the default when stdin is a TTY).
    Observe,
    /// Capture, report, then take the normal failure path (stop the group, restart if allowed).
    Kill,
}

impl FromStr for HangMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "false" | "no" => Ok(HangMode::Off),
            "observe" => Ok(HangMode::Observe),
            "kill" | "on" | "1" | "true" | "yes" => Ok(HangMode::Kill),
            other => Err(format!(
                "invalid hang-detect mode {other:?}: expected off, observe or kill"
            )),
        }
    }
}

impl fmt::Display for HangMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HangMode::Off => "off",
            HangMode::Observe => "observe",
            HangMode::Kill => "kill",
        })
    }
}

/// Every knob of hang detection. [`Default`] gives the documented defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct HangSettings {
    /// `--hang-detect` / `RDRUN_HANG_DETECT`.
    pub mode: HangMode,
    /// `--hang-timeout` / `RDRUN_HANG_TIMEOUT`: quiet budget once every rank has shown progress.
    /// 900 s: above NCCL's 10-minute collective timeout, so torch's own abort of a GPU hang
    /// comes first and rdrun only acts on hangs torch does not see.
    pub steady_budget: Duration,
    /// `--hang-startup-timeout` / `RDRUN_HANG_STARTUP_TIMEOUT`: quiet budget from spawn until
    /// every rank has shown progress. 1800 s: model loading, compilation and rendezvous waits
    /// can be silent for a long time.
    pub startup_budget: Duration,
    /// `--hang-exit-skew-timeout` / `RDRUN_HANG_EXIT_SKEW_TIMEOUT`: some rank exited 0 and the
    /// others stayed quiet this long.
    pub exit_skew_budget: Duration,
    /// `--hang-poll-interval` / `RDRUN_HANG_POLL_INTERVAL`: sampling period.
    pub poll_interval: Duration,
    /// `--hang-cpu-idle` / `RDRUN_HANG_CPU_IDLE`: a rank below this percentage of one core
    /// (whole process tree) over an interval counts as CPU-idle.
    pub cpu_idle_pct: f64,
    /// `--hang-io-idle` / `RDRUN_HANG_IO_IDLE`: read+write bytes per interval below this count
    /// as I/O-idle.
    pub io_idle_bytes: u64,
    /// `--hang-capture-timeout` / `RDRUN_HANG_CAPTURE_TIMEOUT`: wall-clock bound of a capture.
    pub capture_timeout: Duration,
    /// Bound of one capture tool (one py-spy run); at most `capture_timeout`.
    pub tool_timeout: Duration,
    /// `--py-spy` / `RDRUN_PY_SPY`: explicit py-spy binary; else PATH, else next to the
    /// worker's python.
    pub py_spy: Option<PathBuf>,
    /// rdrun's `PATH`, where py-spy is looked for after `py_spy` (set with the run's
    /// environment, `runenv.rs`).
    pub search_path: Option<std::ffi::OsString>,
    /// `--debug-rank`: this global rank is exempt for its whole life, as a stopped or traced
    /// one is (a debugger's pause is no hang); set by the agent from the console settings.
    pub debug_rank: Option<u32>,
}

impl Default for HangSettings {
    fn default() -> Self {
        HangSettings {
            mode: HangMode::Kill,
            steady_budget: Duration::from_secs(900),
            startup_budget: Duration::from_secs(1800),
            exit_skew_budget: Duration::from_secs(300),
            poll_interval: Duration::from_secs(5),
            cpu_idle_pct: 5.0,
            io_idle_bytes: 64 * 1024,
            capture_timeout: Duration::from_secs(20),
            tool_timeout: Duration::from_secs(10),
            py_spy: None,
            search_path: None,
            debug_rank: None,
        }
    }
}

/// Parses a duration: a non-negative number of seconds (`900`, `2.5`), optionally with a unit
/// suffix `ms`, `s`, `m` or `h` (`15m`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: expected seconds, e.g. 900 or 15m"))?;
    if !v.is_finite() || v < 0.0 || v * scale > 1e9 {
        return Err(format!(
            "invalid duration {s:?}: must be between 0 and 1e9 seconds"
        ));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

fn parse_positive(name: &str, s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| format!("{name}: {e}"))?;
    if d.is_zero() {
        return Err(format!("{name}: must be greater than 0, got {s:?}"));
    }
    Ok(d)
}

impl HangSettings {
    /// Defaults overridden by `RDRUN_HANG_*` / `RDRUN_PY_SPY` values from `lookup` (pass
    /// `|k| std::env::var(k).ok()` in production). An empty value counts as unset. The CLI can
    /// call [`HangSettings::set`] afterwards for each flag given.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut s = HangSettings::default();
        for (var, key) in [
            ("RDRUN_HANG_DETECT", "hang-detect"),
            ("RDRUN_HANG_TIMEOUT", "hang-timeout"),
            ("RDRUN_HANG_STARTUP_TIMEOUT", "hang-startup-timeout"),
            ("RDRUN_HANG_EXIT_SKEW_TIMEOUT", "hang-exit-skew-timeout"),
            ("RDRUN_HANG_POLL_INTERVAL", "hang-poll-interval"),
            ("RDRUN_HANG_CPU_IDLE", "hang-cpu-idle"),
            ("RDRUN_HANG_IO_IDLE", "hang-io-idle"),
            ("RDRUN_HANG_CAPTURE_TIMEOUT", "hang-capture-timeout"),
            ("RDRUN_PY_SPY", "py-spy"),
        ] {
            if let Some(v) = lookup(var).filter(|v| !v.trim().is_empty()) {
                s.set(key, &v).map_err(|e| format!("{var}: {e}"))?;
            }
        }
        Ok(s)
    }

    /// Sets one value by its flag name (without `--`). Errors name the flag and the value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let flag = format!("--{key}");
        match key {
            "hang-detect" => self.mode = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            "hang-timeout" => self.steady_budget = parse_positive(&flag, value)?,
            "hang-startup-timeout" => self.startup_budget = parse_positive(&flag, value)?,
            "hang-exit-skew-timeout" => self.exit_skew_budget = parse_positive(&flag, value)?,
            "hang-poll-interval" => self.poll_interval = parse_positive(&flag, value)?,
            "hang-capture-timeout" => {
                self.capture_timeout = parse_positive(&flag, value)?;
                self.tool_timeout = self.tool_timeout.min(self.capture_timeout);
            }
            "hang-cpu-idle" => {
                let v: f64 = value.trim().parse().map_err(|_| {
                    format!("{flag}: invalid percentage {value:?}: expected a number, e.g. 5")
                })?;
                if !(0.0..=100_000.0).contains(&v) {
                    return Err(format!("{flag}: percentage {value:?} out of range"));
                }
                self.cpu_idle_pct = v;
            }
            "hang-io-idle" => {
                self.io_idle_bytes = value.trim().parse().map_err(|_| {
                    format!("{flag}: invalid byte count {value:?}: expected an integer")
                })?
            }
            "py-spy" => self.py_spy = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown hang-detection setting {flag}")),
        }
        Ok(())
    }

    /// The mode actually used: `kill` is downgraded to `observe` for an interactive run
    /// (rdrun's stdin is a TTY: a debugger session must not be killed).
    pub fn effective_mode(&self, stdin_is_tty: bool) -> HangMode {
        match self.mode {
            HangMode::Kill if stdin_is_tty => HangMode::Observe,
            m => m,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let s = HangSettings::default();
        assert_eq!(s.mode, HangMode::Kill);
        assert_eq!(s.steady_budget, Duration::from_secs(900));
        assert_eq!(s.startup_budget, Duration::from_secs(1800));
        assert_eq!(s.exit_skew_budget, Duration::from_secs(300));
        assert_eq!(s.poll_interval, Duration::from_secs(5));
        assert_eq!(s.io_idle_bytes, 65536);
        assert_eq!(s.cpu_idle_pct, 5.0);
    }

    #[test]
    fn modes_parse_and_bad_ones_are_named() {
        assert_eq!("off".parse::<HangMode>().unwrap(), HangMode::Off);
        assert_eq!(" Observe ".parse::<HangMode>().unwrap(), HangMode::Observe);
        assert_eq!("kill".parse::<HangMode>().unwrap(), HangMode::Kill);
        let e = "maybe".parse::<HangMode>().unwrap_err();
        assert!(
            e.contains("\"maybe\"") && e.contains("off, observe or kill"),
            "{e}"
        );
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("900").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("7s").unwrap(), Duration::from_secs(7));
        for bad in ["", "-1", "abc", "nan", "inf", "1e30", "5x"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn env_overrides_defaults_and_errors_name_the_variable() {
        let env = |k: &str| match k {
            "RDRUN_HANG_DETECT" => Some("observe".to_string()),
            "RDRUN_HANG_TIMEOUT" => Some("20".to_string()),
            "RDRUN_HANG_STARTUP_TIMEOUT" => Some("".to_string()),
            "RDRUN_PY_SPY" => Some("/opt/py-spy".to_string()),
            _ => None,
        };
        let s = HangSettings::from_env(env).unwrap();
        assert_eq!(s.mode, HangMode::Observe);
        assert_eq!(s.steady_budget, Duration::from_secs(20));
        assert_eq!(s.startup_budget, Duration::from_secs(1800), "empty = unset");
        assert_eq!(s.py_spy, Some(PathBuf::from("/opt/py-spy")));

        let e = HangSettings::from_env(|k| (k == "RDRUN_HANG_TIMEOUT").then(|| "0".into()))
            .unwrap_err();
        assert!(e.starts_with("RDRUN_HANG_TIMEOUT: --hang-timeout"), "{e}");
        let e = HangSettings::from_env(|k| (k == "RDRUN_HANG_IO_IDLE").then(|| "lots".into()))
            .unwrap_err();
        assert!(
            e.contains("RDRUN_HANG_IO_IDLE") && e.contains("\"lots\""),
            "{e}"
        );
        let mut s = HangSettings::default();
        assert!(s
            .set("hang-bogus", "1")
            .unwrap_err()
            .contains("--hang-bogus"));
    }

    #[test]
    fn tty_downgrades_kill_to_observe_only() {
        let mut s = HangSettings::default();
        assert_eq!(s.effective_mode(true), HangMode::Observe);
        assert_eq!(s.effective_mode(false), HangMode::Kill);
        s.mode = HangMode::Off;
        assert_eq!(s.effective_mode(true), HangMode::Off);
    }

    #[test]
    fn capture_timeout_caps_the_tool_timeout() {
        let mut s = HangSettings::default();
        s.set("hang-capture-timeout", "3").unwrap();
        assert_eq!(s.tool_timeout, Duration::from_secs(3));
    }
}
