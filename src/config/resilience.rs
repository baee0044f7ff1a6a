//! What rdrun does about bad nodes and crash loops (issue 28): the health-check mode, the site's
//! own check program and the checks' time bound (`--health-check`, `--health-check-cmd`,
//! `--health-check-timeout`), the stop verdict's `--max-same-failures`, and the failure memory
//! between jobs (`--bad-nodes-file`, `--exclude-nodes-from`: the list read here, once), the
//! network pre-check (`--network-check`, `--network-check-threshold`) and the failure count that
//! leaves a node out (`--max-node-failures`). Resolved
//! here so that a bad value fails before anything starts, with one line naming the flag.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::{invalid, ConfigError};

/// `--health-check off|warn|on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthMode {
    /// No check runs.
    Off,
    /// Checks run; a failed one is only a warning (the default: nothing that used to start
    /// is refused).
    #[default]
    Warn,
    /// A failed check keeps the node out: a static job fails fast ("bad node"), an elastic
    /// node retries after a back-off instead of joining.
    On,
}

impl HealthMode {
    pub const WORDS: &'static [&'static str] = &["off", "warn", "on"];

    fn parse(text: &str) -> Option<HealthMode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "off" => Some(HealthMode::Off),
            "warn" => Some(HealthMode::Warn),
            "on" => Some(HealthMode::On),
            _ => None,
        }
    }
}

impl fmt::Display for HealthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HealthMode::Off => "off",
            HealthMode::Warn => "warn",
            HealthMode::On => "on",
        })
    }
}

/// Default bound of one check (the interpreter start, the site's program).
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(30);
/// `--max-same-failures` default: two attempts in a row with the same root cause.
pub const DEFAULT_MAX_SAME_FAILURES: u32 = 2;
/// `--max-node-failures` default: a node whose workers failed twice in a run is left out of
/// later elastic rounds while spares exist.
pub const DEFAULT_MAX_NODE_FAILURES: u32 = 2;
/// `--network-check-threshold` default: a node is slow when its best measured bandwidth is under
/// this fraction of the median node's (or its latency over the median's divided by it).
pub const DEFAULT_NETWORK_THRESHOLD: f64 = 0.25;

/// The resolved settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Resilience {
    /// `--max-same-failures N` (0: never stop for a repeated failure).
    pub max_same_failures: u32,
    /// `--health-check`.
    pub health: HealthMode,
    /// `--health-check-cmd PROG`: run through `sh -c` (so a site can pass arguments); non-zero
    /// exit or a timeout makes the node unhealthy.
    pub health_cmd: Option<String>,
    /// `--health-check-timeout SECS`: the bound of each check that runs a program.
    pub health_timeout: Duration,
    /// `NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME` (the ones set, non-empty): the NICs the
    /// health check finds up.
    pub socket_ifnames: Vec<(&'static str, String)>,
    /// `--bad-nodes-file PATH`: a node that ends as a bad node appends its name here.
    pub bad_nodes_file: Option<PathBuf>,
    /// `--exclude-nodes-from FILE` and the host names it lists (Slurm hostlists expanded; a
    /// missing file lists none: the first job of a chain has not written it yet).
    pub exclude_from: Option<(PathBuf, Vec<String>)>,
    /// `--network-check on|off` (default: on exactly when `--health-check on`): the pairwise TCP
    /// pre-check after each multi-node round.
    pub network_check: bool,
    /// `--network-check-threshold F` (0 < F < 1).
    pub network_threshold: f64,
    /// `--max-node-failures K` (0: never leave a node out for its failures).
    pub max_node_failures: u32,
    /// `--checkpoint-dir PATH`: the health check's free-space target beside the log directory.
    pub checkpoint_dir: Option<PathBuf>,
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience {
            max_same_failures: DEFAULT_MAX_SAME_FAILURES,
            health: HealthMode::default(),
            health_cmd: None,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            socket_ifnames: Vec::new(),
            bad_nodes_file: None,
            exclude_from: None,
            network_check: false,
            network_threshold: DEFAULT_NETWORK_THRESHOLD,
            max_node_failures: DEFAULT_MAX_NODE_FAILURES,
            checkpoint_dir: None,
        }
    }
}

/// The variables naming the NICs collectives use.
pub const SOCKET_IFNAME_VARS: [&str; 2] = ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"];

/// The flags as parsed (`cli::LaunchArgs`' fields), the NIC variables from `env`.
pub(super) fn resolve(
    max_same_failures: Option<i64>,
    health: Option<&str>,
    cmd: Option<&str>,
    timeout: Option<f64>,
    env: crate::cli::EnvFn<'_>,
) -> Result<Resilience, ConfigError> {
    let mut r = Resilience {
        socket_ifnames: SOCKET_IFNAME_VARS
            .iter()
            .filter_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (*v, s)))
            .collect(),
        ..Resilience::default()
    };
    if let Some(n) = max_same_failures {
        r.max_same_failures = u32::try_from(n).map_err(|_| {
            invalid(
                "--max-same-failures",
                n.to_string(),
                "must be >= 0 (0: never stop for a repeated failure)",
            )
        })?;
    }
    if let Some(text) = health {
        r.health = HealthMode::parse(text)
            .ok_or_else(|| invalid("--health-check", text, "expected one of off, warn, on"))?;
    }
    r.health_cmd = cmd.filter(|c| !c.trim().is_empty()).map(String::from);
    if let Some(secs) = timeout {
        if !(secs > 0.0 && secs.is_finite() && secs <= 86_400.0) {
            return Err(invalid(
                "--health-check-timeout",
                secs.to_string(),
                "must be a number of seconds > 0 (at most a day)",
            ));
        }
        r.health_timeout = Duration::from_secs_f64(secs);
    }
    Ok(r)
}

/// Most hosts an exclude list may name: the largest hostlist range rdrun expands (65,536).
pub const MAX_LISTED_NODES: usize = crate::cluster::hostlist::MAX_RANGE as usize;

/// Most bytes read of a node-list file (`--exclude-nodes-from`, and `--bad-nodes-file` before a
/// name is appended): 256 a host (a DNS name is at most 253 bytes), 16 MiB. A file or device
/// that never ends (`/dev/zero`, `/dev/full`) is not read past it.
pub const MAX_NODE_FILE_BYTES: u64 = MAX_LISTED_NODES as u64 * 256;

/// Reads a node-list file whole, at most [`MAX_NODE_FILE_BYTES`]: `Ok(None)` when it does not
/// exist; `Err`: one line saying why it cannot be a list of hosts (unreadable, longer than the
/// bound, not text).
pub fn read_node_file(path: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking open: a FIFO nobody writes to would block `open` for ever. Blocking reads
    // after it, so that a pipe that has a writer (`<(list-bad-nodes)`) is read to its end.
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read: {e}")),
    };
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on the descriptor `file` owns.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    let mut bytes = Vec::new();
    // One byte past the bound tells a file of exactly the bound from a longer one.
    if let Err(e) = file.take(MAX_NODE_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return Err(format!("cannot read: {e}"));
    }
    if bytes.len() as u64 > MAX_NODE_FILE_BYTES {
        return Err(format!(
            "longer than {} MiB, more than a list of {MAX_LISTED_NODES} hosts holds",
            MAX_NODE_FILE_BYTES >> 20
        ));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        format!(
            "not a text file (invalid UTF-8 at byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Reads an exclude list (`--exclude-nodes-from`): host names or Slurm hostlists
/// (`node[01-04]`), separated by new lines (what `--bad-nodes-file` writes) or commas outside
/// brackets; `#` starts a comment. A missing file lists nothing; at most [`MAX_LISTED_NODES`]
/// hosts, read within [`MAX_NODE_FILE_BYTES`].
pub fn read_exclude_list(path: &Path) -> Result<Vec<String>, ConfigError> {
    let flag = "--exclude-nodes-from";
    let bad = |reason: String| invalid(flag, path.display().to_string(), reason);
    let Some(text) = read_node_file(path).map_err(bad)? else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let hosts = crate::cluster::hostlist::expand(line).map_err(|e| bad(e.to_string()))?;
        names.extend(hosts.into_iter().filter(|h| !h.is_empty()));
        if names.len() > MAX_LISTED_NODES {
            return Err(bad(format!("lists more than {MAX_LISTED_NODES} hosts")));
        }
    }
    Ok(names)
}

/// `--bad-nodes-file`, `--exclude-nodes-from` as parsed (empty value = unset).
pub(super) fn resolve_memory(
    r: &mut Resilience,
    bad_nodes_file: Option<&str>,
    exclude_from: Option<&str>,
) -> Result<(), ConfigError> {
    r.bad_nodes_file = bad_nodes_file.filter(|p| !p.is_empty()).map(PathBuf::from);
    if let Some(path) = exclude_from.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let names = read_exclude_list(&path)?;
        r.exclude_from = Some((path, names));
    }
    Ok(())
}

/// `--network-check`, `--network-check-threshold`, `--max-node-failures` as parsed; after
/// [`resolve`] (the network check follows `--health-check on` unless given).
pub(super) fn resolve_nodes(
    r: &mut Resilience,
    args: &crate::cli::LaunchArgs,
) -> Result<(), ConfigError> {
    r.checkpoint_dir = match args.checkpoint_dir.as_deref() {
        None => None,
        Some("") => return Err(invalid("--checkpoint-dir", "", "expected a directory")),
        Some(p) => Some(PathBuf::from(p)),
    };
    r.network_check = match args.network_check.as_deref() {
        None => r.health == HealthMode::On,
        Some(text) => match text.trim().to_ascii_lowercase().as_str() {
            "on" => true,
            "off" => false,
            _ => return Err(invalid("--network-check", text, "expected on or off")),
        },
    };
    if let Some(f) = args.network_check_threshold {
        if !(f > 0.0 && f < 1.0) {
            return Err(invalid(
                "--network-check-threshold",
                f.to_string(),
                "must be a fraction between 0 and 1 (a node under this share of the median is slow)",
            ));
        }
        r.network_threshold = f;
    }
    if let Some(k) = args.max_node_failures {
        r.max_node_failures = u32::try_from(k).map_err(|_| {
            invalid(
                "--max-node-failures",
                k.to_string(),
                "must be >= 0 (0: never leave a node out for its failures)",
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn nic_variables() {
        let env = |k: &str| match k {
            "NCCL_SOCKET_IFNAME" => Some("eth,=ib0".to_string()),
            "GLOO_SOCKET_IFNAME" => Some(" ".to_string()),
            _ => None,
        };
        let r = resolve(None, None, None, None, &env).unwrap();
        assert_eq!(
            r.socket_ifnames,
            vec![("NCCL_SOCKET_IFNAME", "eth,=ib0".to_string())]
        );
    }

    #[test]
    fn defaults_and_values() {
        let d = resolve(None, None, None, None, &none).unwrap();
        assert_eq!(d, Resilience::default());
        assert_eq!(d.max_same_failures, 2);
        assert_eq!(d.health, HealthMode::Warn);
        let r = resolve(
            Some(0),
            Some("ON"),
            Some("/bin/check --x"),
            Some(1.5),
            &none,
        )
        .unwrap();
        assert_eq!(r.max_same_failures, 0);
        assert_eq!(r.health, HealthMode::On);
        assert_eq!(r.health_cmd.as_deref(), Some("/bin/check --x"));
        assert_eq!(r.health_timeout, Duration::from_millis(1500));
        for w in HealthMode::WORDS {
            assert_eq!(HealthMode::parse(w).unwrap().to_string(), *w);
        }
        assert_eq!(
            resolve(None, None, Some("  "), None, &none)
                .unwrap()
                .health_cmd,
            None
        );
    }

    #[test]
    fn exclude_lists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        std::fs::write(&path, "n1\n# a comment\nn[03-04],gpu7  # trailing\n\n").unwrap();
        assert_eq!(
            read_exclude_list(&path).unwrap(),
            ["n1", "n03", "n04", "gpu7"]
        );
        // Missing: nothing excluded yet.
        assert!(read_exclude_list(&dir.path().join("none"))
            .unwrap()
            .is_empty());
        std::fs::write(&path, "n[1-\n").unwrap();
        let e = read_exclude_list(&path).unwrap_err().to_string();
        assert!(e.contains("--exclude-nodes-from"), "{e}");
        let e = read_exclude_list(dir.path()).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
        let mut r = Resilience::default();
        resolve_memory(&mut r, Some(""), Some(path.to_str().unwrap())).unwrap_err();
        resolve_memory(&mut r, Some("/x/bad"), None).unwrap();
        assert_eq!(r.bad_nodes_file, Some(PathBuf::from("/x/bad")));
        assert_eq!(r.exclude_from, None);
    }

    /// Issue 38.12: what is read of a node list is bounded, in bytes and in hosts; a file that
    /// never ends is one line, not a read without end; a FIFO nobody writes to lists nothing.
    #[test]
    fn exclude_lists_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad");
        let long = |e: ConfigError| e.to_string().contains("longer than 16 MiB");
        // Exactly the bound is read; a byte more is refused.
        let mut text = vec![b'\n'; MAX_NODE_FILE_BYTES as usize - 3];
        text.extend_from_slice(b"n1\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(read_exclude_list(&path).unwrap(), ["n1"]);
        text.insert(0, b'\n');
        std::fs::write(&path, &text).unwrap();
        let e = read_exclude_list(&path).unwrap_err();
        assert!(e.to_string().starts_with("--exclude-nodes-from"), "{e}");
        assert!(long(e));
        let zero = Path::new("/dev/zero");
        if zero.exists() {
            assert!(long(read_exclude_list(zero).unwrap_err()));
        }
        // 65,536 hosts are allowed, one more is not (two ranges of rdrun's largest).
        std::fs::write(&path, "a[0-65535]\n").unwrap();
        assert_eq!(read_exclude_list(&path).unwrap().len(), MAX_LISTED_NODES);
        std::fs::write(&path, "a[0-65535]\nb1\n").unwrap();
        let e = read_exclude_list(&path).unwrap_err().to_string();
        assert!(e.contains("lists more than 65536 hosts"), "{e}");
        std::fs::write(&path, b"n1\n\xff\n").unwrap();
        let e = read_exclude_list(&path).unwrap_err().to_string();
        assert!(e.contains("not a text file"), "{e}");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) of a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_exclude_list(&fifo).unwrap().is_empty());
    }

    #[test]
    fn network_check_and_node_failures() {
        let args = |nc: Option<&str>, thr: Option<f64>, k: Option<i64>| {
            let mut argv = vec!["--nproc-per-node=1".to_string()];
            argv.extend(nc.map(|v| format!("--network-check={v}")));
            argv.extend(thr.map(|v| format!("--network-check-threshold={v}")));
            argv.extend(k.map(|v| format!("--max-node-failures={v}")));
            argv.push("train.py".into());
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            crate::config::testkit::args(&argv)
        };
        let mut r = Resilience::default();
        resolve_nodes(&mut r, &args(None, None, None)).unwrap();
        assert!(!r.network_check);
        assert_eq!(r.network_threshold, DEFAULT_NETWORK_THRESHOLD);
        assert_eq!(r.max_node_failures, 2);
        // On with --health-check on, unless turned off.
        let mut on = Resilience {
            health: HealthMode::On,
            ..Resilience::default()
        };
        resolve_nodes(&mut on, &args(None, None, None)).unwrap();
        assert!(on.network_check);
        resolve_nodes(&mut on, &args(Some("off"), None, None)).unwrap();
        assert!(!on.network_check);
        resolve_nodes(&mut r, &args(Some("ON"), Some(0.5), Some(0))).unwrap();
        assert!(r.network_check);
        assert_eq!(r.network_threshold, 0.5);
        assert_eq!(r.max_node_failures, 0);
        let e = resolve_nodes(&mut r, &args(Some("maybe"), None, None)).unwrap_err();
        assert!(e.to_string().contains("--network-check"), "{e}");
        for bad in [0.0, 1.0, -0.5, f64::NAN] {
            let e = resolve_nodes(&mut r, &args(None, Some(bad), None)).unwrap_err();
            assert!(e.to_string().contains("--network-check-threshold"), "{e}");
        }
        let e = resolve_nodes(&mut r, &args(None, None, Some(-1))).unwrap_err();
        assert!(e.to_string().contains("--max-node-failures"), "{e}");
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = resolve(Some(-1), None, None, None, &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--max-same-failures") && e.contains("-1"), "{e}");
        let e = resolve(None, Some("maybe"), None, None, &none)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--health-check") && e.contains("maybe"), "{e}");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = resolve(None, None, None, Some(bad), &none)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--health-check-timeout"), "{e}");
        }
    }
}
