//! The variables of rdrun's own environment that the run consults after resolution, read here
//! once and handed down as typed values: the supervisor never reads the environment itself, so a
//! bad value is a one-line error before anything starts and every test can set them by hand.
//!
//! - `RDRUN_CGROUP`: which hierarchies may hold the run's cgroup (`supervisor::group::contain`).
//! - `RDRUN_STATUS_INTERVAL`: seconds between two plain status lines (default 5).
//! - the inherited values the worker environment and the FileTimer server look at
//!   ([`INHERITED`]), e.g. `OMP_NUM_THREADS`, `CUDA_VISIBLE_DEVICES`,
//!   `TORCHELASTIC_ENABLE_FILE_TIMER`.
//! - `PATH` (py-spy search), `LD_LIBRARY_PATH` and the shim cache directory
//!   (`$XDG_CACHE_HOME/rdrun` or `~/.cache/rdrun`) for the pip NCCL shim, as the OS gives them
//!   (not converted to UTF-8).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::error::ConfigError;
use crate::cli::EnvFn;

/// The environment variable that chooses the containment (`auto`, `v2`, `v1`, `off`).
pub const CGROUP_ENV: &str = "RDRUN_CGROUP";

/// Which hierarchies may hold the run's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupMode {
    #[default]
    Auto,
    V2,
    V1,
    Off,
}

impl CgroupMode {
    /// Parses `RDRUN_CGROUP` (unset or empty: `auto`).
    pub fn parse(value: Option<&str>) -> Result<CgroupMode, String> {
        match value.map(str::trim).unwrap_or("") {
            "" | "auto" => Ok(CgroupMode::Auto),
            "v2" | "cgroup2" => Ok(CgroupMode::V2),
            "v1" | "freezer" => Ok(CgroupMode::V1),
            "off" | "none" | "0" => Ok(CgroupMode::Off),
            other => Err(format!(
                "{CGROUP_ENV}={other:?} is not one of auto, v2, v1, off"
            )),
        }
    }
}

/// The inherited variables later steps look up by name: the worker environment's defaults
/// (`supervisor::group::worker::worker_env`) and the FileTimer switch and path.
pub const INHERITED: &[&str] = &[
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "OMP_NUM_THREADS",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
];

/// Default of `RDRUN_STATUS_INTERVAL`.
const STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// What the run reads of rdrun's environment, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunEnv {
    /// `RDRUN_CGROUP`.
    pub cgroup: CgroupMode,
    /// `RDRUN_STATUS_INTERVAL` (a bad or non-positive value: 5 s; at least 50 ms).
    pub status_interval: Duration,
    /// The [`INHERITED`] variables that are set.
    inherited: BTreeMap<&'static str, String>,
    /// `PATH`, where py-spy is searched.
    pub path: Option<OsString>,
    /// `LD_LIBRARY_PATH`, which the pip NCCL shim directory is put in front of.
    pub ld_library_path: Option<OsString>,
    /// The per-user cache directory for shims: `$XDG_CACHE_HOME/rdrun` or `~/.cache/rdrun`.
    pub cache_dir: Option<PathBuf>,
    /// `TMPDIR` when set and not empty (see [`RunEnv::temp_dir`]).
    tmpdir: Option<PathBuf>,
}

impl RunEnv {
    /// Reads the variables through `env`. `PATH`, `LD_LIBRARY_PATH` and the cache directory
    /// come from `env` too; [`RunEnv::read_os`] replaces them with the OS's exact bytes.
    pub fn resolve(env: EnvFn<'_>) -> Result<RunEnv, ConfigError> {
        let cgroup = CgroupMode::parse(env(CGROUP_ENV).as_deref()).map_err(ConfigError::Env)?;
        let status_interval = env("RDRUN_STATUS_INTERVAL")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(STATUS_INTERVAL, |s| Duration::from_secs_f64(s.max(0.05)));
        let inherited = INHERITED
            .iter()
            .filter_map(|k| env(k).map(|v| (*k, v)))
            .collect();
        let mut run = RunEnv {
            cgroup,
            status_interval,
            inherited,
            ..RunEnv::default()
        };
        run.read_os(|k| env(k).map(OsString::from));
        Ok(run)
    }

    /// Sets `PATH`, `LD_LIBRARY_PATH` and the cache directory from `os` (the process's
    /// `var_os` in production: a path need not be UTF-8).
    pub fn read_os(&mut self, os: impl Fn(&str) -> Option<OsString>) {
        self.path = os("PATH");
        self.ld_library_path = os("LD_LIBRARY_PATH");
        self.tmpdir = os("TMPDIR").filter(|v| !v.is_empty()).map(PathBuf::from);
        self.cache_dir = os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("rdrun"));
    }

    /// Where rdrun makes its temporary directories (the hang captures without `--log-dir`, the
    /// FileTimer FIFO's, the warm start's learn reports, log files without `--log-dir`): `TMPDIR`,
    /// else `/tmp`, as `std::env::temp_dir` says, but read once with the rest of the config.
    pub fn temp_dir(&self) -> PathBuf {
        self.tmpdir.clone().unwrap_or_else(|| PathBuf::from("/tmp"))
    }

    /// The value of an [`INHERITED`] variable, `None` when unset.
    pub fn var(&self, name: &str) -> Option<String> {
        debug_assert!(
            INHERITED.contains(&name),
            "{name} is not read at resolution; add it to INHERITED"
        );
        self.inherited.get(name).cloned()
    }

    /// Sets an [`INHERITED`] variable (tests).
    pub fn set_var(&mut self, name: &'static str, value: impl Into<String>) {
        debug_assert!(INHERITED.contains(&name), "{name} is not in INHERITED");
        self.inherited.insert(name, value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)]) -> Result<RunEnv, ConfigError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        RunEnv::resolve(&move |k: &str| map.get(k).cloned())
    }

    #[test]
    fn mode_parsing() {
        assert_eq!(CgroupMode::parse(None), Ok(CgroupMode::Auto));
        assert_eq!(CgroupMode::parse(Some("off")), Ok(CgroupMode::Off));
        assert_eq!(CgroupMode::parse(Some("v1")), Ok(CgroupMode::V1));
        let err = CgroupMode::parse(Some("yes")).unwrap_err();
        assert!(err.contains("RDRUN_CGROUP") && err.contains("yes"), "{err}");
    }

    #[test]
    fn a_bad_cgroup_mode_is_a_one_line_error() {
        let err = with(&[("RDRUN_CGROUP", "yes")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "RDRUN_CGROUP=\"yes\" is not one of auto, v2, v1, off"
        );
        assert_eq!(err.exit_code(), crate::exit::USAGE);
        assert_eq!(
            with(&[("RDRUN_CGROUP", "v2")]).unwrap().cgroup,
            CgroupMode::V2
        );
    }

    #[test]
    fn status_interval() {
        let s = |v: &str| {
            with(&[("RDRUN_STATUS_INTERVAL", v)])
                .unwrap()
                .status_interval
        };
        assert_eq!(with(&[]).unwrap().status_interval, Duration::from_secs(5));
        assert_eq!(s("2"), Duration::from_secs(2));
        assert_eq!(s("0.001"), Duration::from_millis(50));
        assert_eq!(s("-1"), Duration::from_secs(5));
        assert_eq!(s("x"), Duration::from_secs(5));
    }

    /// `TMPDIR` is read once, here; unset or empty means `/tmp` (as `std::env::temp_dir`).
    #[test]
    fn the_temporary_directory() {
        assert_eq!(with(&[]).unwrap().temp_dir(), PathBuf::from("/tmp"));
        assert_eq!(
            with(&[("TMPDIR", "")]).unwrap().temp_dir(),
            PathBuf::from("/tmp")
        );
        let e = with(&[("TMPDIR", "/scratch/u")]).unwrap();
        assert_eq!(e.temp_dir(), PathBuf::from("/scratch/u"));
    }

    #[test]
    fn inherited_values_and_the_cache_dir() {
        let e = with(&[
            ("OMP_NUM_THREADS", "4"),
            ("HOME", "/home/u"),
            ("PATH", "/bin"),
        ])
        .unwrap();
        assert_eq!(e.var("OMP_NUM_THREADS").as_deref(), Some("4"));
        assert_eq!(e.var("CUDA_VISIBLE_DEVICES"), None);
        assert_eq!(e.path, Some(OsString::from("/bin")));
        assert_eq!(e.cache_dir, Some(PathBuf::from("/home/u/.cache/rdrun")));
        let e = with(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/home/u")]).unwrap();
        assert_eq!(e.cache_dir, Some(PathBuf::from("/c/rdrun")));
        let e = with(&[("XDG_CACHE_HOME", ""), ("HOME", "/home/u")]).unwrap();
        assert_eq!(e.cache_dir, Some(PathBuf::from("/home/u/.cache/rdrun")));
    }
}
