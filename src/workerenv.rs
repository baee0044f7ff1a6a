//! The launcher <-> worker contract: the environment variables every worker gets.
//!
//! The supervisor builds one [`WorkerEnv`] per local rank and applies [`WorkerEnv::to_pairs`] on
//! top of the inherited environment; the worker runtime reads it back with
//! [`WorkerEnv::from_env`]. Values and spellings copy torchrun 2.15 (spec torchrun-compat §2).
//!
//! The pure launcher-side rules applied per worker at spawn time live here too:
//! [`substitute_local_rank`] (the `${local_rank}` argument macro), [`should_set_omp_num_threads`],
//! [`virtual_local_rank_devices`] and [`signal_names`] (TORCHELASTIC_SIGNALS_TO_HANDLE).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};

/// The names [`WorkerEnv::to_pairs`] sets: per rank or per attempt, so a warm-start template
/// (started once per node) gets none of them.
pub const CONTRACT_VARS: &[&str] = &[
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
];

/// rdrun's own environment with `overlay` applied: the whole environment a spawned worker gets
/// (a cold worker inherits rdrun's and gets the overlay on top; a warm one is sent it whole).
pub fn inherited_env_with(overlay: &[(String, String)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !overlay.iter().any(|(o, _)| OsStr::new(o) == k))
        .collect();
    env.extend(
        overlay
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v))),
    );
    env
}

/// Per-worker values set by the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    pub group_rank: usize,
    pub group_world_size: usize,
    pub role_rank: usize,
    pub role_world_size: usize,
    pub role_name: String,
    pub master_addr: String,
    pub master_port: u16,
    pub restart_count: u32,
    pub max_restarts: u32,
    pub run_id: String,
    /// `TORCHELASTIC_USE_AGENT_STORE`: true when the launcher hosts the store at MASTER_ADDR:PORT.
    pub use_agent_store: bool,
    /// `TORCHELASTIC_ERROR_FILE`; empty string when logs go nowhere (`--log-dir /dev/null`).
    pub error_file: String,
}

/// Why the environment could not be read back by a worker.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorkerEnvError {
    #[error("environment variable {0} is not set (is this process started by rdrun or torchrun?)")]
    Missing(&'static str),
    #[error("environment variable {name} has invalid value {value:?}")]
    Invalid { name: &'static str, value: String },
}

impl WorkerEnv {
    /// The variables as (name, value) pairs, in a stable order.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RANK", self.rank.to_string()),
            ("LOCAL_RANK", self.local_rank.to_string()),
            ("WORLD_SIZE", self.world_size.to_string()),
            ("LOCAL_WORLD_SIZE", self.local_world_size.to_string()),
            ("GROUP_RANK", self.group_rank.to_string()),
            ("GROUP_WORLD_SIZE", self.group_world_size.to_string()),
            ("ROLE_RANK", self.role_rank.to_string()),
            ("ROLE_WORLD_SIZE", self.role_world_size.to_string()),
            ("ROLE_NAME", self.role_name.clone()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", self.master_port.to_string()),
            ("TORCHELASTIC_RESTART_COUNT", self.restart_count.to_string()),
            ("TORCHELASTIC_MAX_RESTARTS", self.max_restarts.to_string()),
            ("TORCHELASTIC_RUN_ID", self.run_id.clone()),
            // Python bool text, as torchrun writes it and `env://` compares it.
            (
                "TORCHELASTIC_USE_AGENT_STORE",
                if self.use_agent_store {
                    "True"
                } else {
                    "False"
                }
                .to_string(),
            ),
            ("TORCHELASTIC_ERROR_FILE", self.error_file.clone()),
        ]
    }

    /// Reads the contract back from the current process environment.
    pub fn from_env() -> Result<Self, WorkerEnvError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::from_map(&vars)
    }

    /// Reads the contract from any map (testable without touching the process environment).
    ///
    /// Only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required, so that a program started
    /// by hand or by another launcher (torchrun, `mpirun` wrappers) still works; the rest default
    /// to the single-node values torchrun would give.
    pub fn from_map(vars: &HashMap<String, String>) -> Result<Self, WorkerEnvError> {
        fn req<'a>(
            vars: &'a HashMap<String, String>,
            name: &'static str,
        ) -> Result<&'a str, WorkerEnvError> {
            vars.get(name)
                .map(String::as_str)
                .ok_or(WorkerEnvError::Missing(name))
        }
        fn num<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, WorkerEnvError> {
            v.trim().parse().map_err(|_| WorkerEnvError::Invalid {
                name,
                value: v.to_string(),
            })
        }
        fn opt<T: std::str::FromStr>(
            vars: &HashMap<String, String>,
            name: &'static str,
            default: T,
        ) -> Result<T, WorkerEnvError> {
            match vars.get(name) {
                Some(v) => num(name, v),
                None => Ok(default),
            }
        }
        let rank: usize = num("RANK", req(vars, "RANK")?)?;
        let world_size: usize = num("WORLD_SIZE", req(vars, "WORLD_SIZE")?)?;
        if world_size == 0 || rank >= world_size {
            return Err(WorkerEnvError::Invalid {
                name: "RANK",
                value: format!("{rank} (WORLD_SIZE={world_size})"),
            });
        }
        let local_rank = opt(vars, "LOCAL_RANK", rank)?;
        let local_world_size = opt(vars, "LOCAL_WORLD_SIZE", world_size)?;
        Ok(WorkerEnv {
            rank,
            local_rank,
            world_size,
            local_world_size,
            group_rank: opt(vars, "GROUP_RANK", 0)?,
            group_world_size: opt(vars, "GROUP_WORLD_SIZE", 1)?,
            role_rank: opt(vars, "ROLE_RANK", rank)?,
            role_world_size: opt(vars, "ROLE_WORLD_SIZE", world_size)?,
            role_name: vars
                .get("ROLE_NAME")
                .cloned()
                .unwrap_or_else(|| "default".to_string()),
            master_addr: req(vars, "MASTER_ADDR")?.to_string(),
            master_port: num("MASTER_PORT", req(vars, "MASTER_PORT")?)?,
            restart_count: opt(vars, "TORCHELASTIC_RESTART_COUNT", 0)?,
            max_restarts: opt(vars, "TORCHELASTIC_MAX_RESTARTS", 0)?,
            run_id: vars
                .get("TORCHELASTIC_RUN_ID")
                .cloned()
                .unwrap_or_else(|| "none".to_string()),
            use_agent_store: vars
                .get("TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v == "True"),
            error_file: vars
                .get("TORCHELASTIC_ERROR_FILE")
                .cloned()
                .unwrap_or_default(),
        })
    }
}

/// Where the runtime's shared-memory segments live.
pub const SHM_DIR: &str = "/dev/shm";

// Shared-memory segment names are part of the launcher <-> worker contract: the runtime creates
// them (`runtime::shm`) and the launcher removes what a crashed run left behind.

/// Makes a run id safe for a file name (`[A-Za-z0-9_-]`, at most 48 characters).
pub fn sanitize_run_id(run_id: &str) -> String {
    run_id
        .chars()
        .take(48)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// FNV-1a 64 (stable across builds, unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The file-name prefix every segment of `run_id` starts with; '.' cannot occur in the
/// sanitized id, so no other run's prefix matches.
pub fn run_shm_prefix(run_id: &str) -> String {
    format!(
        "rdrun-{}.{:08x}.",
        sanitize_run_id(run_id),
        fnv1a(run_id.as_bytes()) as u32
    )
}

/// Removes every shared-memory segment a run left behind (launcher side: after the worker
/// group exits or before a restart). Returns how many files were removed.
pub fn cleanup_run_shm(run_id: &str) -> std::io::Result<usize> {
    cleanup_run_shm_in(std::path::Path::new(SHM_DIR), run_id)
}

/// [`cleanup_run_shm`] in any directory (testable).
pub fn cleanup_run_shm_in(dir: &std::path::Path, run_id: &str) -> std::io::Result<usize> {
    let prefix = run_shm_prefix(run_id);
    let mut removed = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            match std::fs::remove_file(e.path()) {
                Ok(()) => removed += 1,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(removed)
}

// ---------------------------------------------------------------------------------------------
// Launcher-side rules applied per worker at spawn time (torchrun-compat §1.3, §2).

/// `--virtual-local-rank` with fewer visible devices than local ranks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--virtual-local-rank: local_rank {local_rank} exceeds available GPUs in {var}={value}")]
pub struct VirtualDevicesError {
    pub local_rank: usize,
    pub var: &'static str,
    pub value: String,
}

/// Whether rdrun must set OMP_NUM_THREADS=1 for the workers: only when the user has not set it
/// (any value, even empty, is passed through) and more than one worker shares the node.
pub fn should_set_omp_num_threads(existing: Option<&str>, nproc_per_node: usize) -> bool {
    existing.is_none() && nproc_per_node > 1
}

/// `--virtual-local-rank`: the variables one worker gets so that it sees only its own GPU, as
/// torchrun: the `local_rank`-th entry of the parent's HIP_VISIBLE_DEVICES (then both HIP_ and
/// CUDA_VISIBLE_DEVICES are set) or CUDA_VISIBLE_DEVICES, else the local rank itself.
pub fn virtual_local_rank_devices(
    local_rank: usize,
    hip_visible_devices: Option<&str>,
    cuda_visible_devices: Option<&str>,
) -> Result<Vec<(&'static str, String)>, VirtualDevicesError> {
    let hip = hip_visible_devices.filter(|h| !h.is_empty());
    let (var, parent) = match hip {
        Some(h) => ("HIP_VISIBLE_DEVICES", Some(h)),
        None => ("CUDA_VISIBLE_DEVICES", cuda_visible_devices),
    };
    let device = match parent {
        Some(list) => list
            .split(',')
            .nth(local_rank)
            .map(|d| d.trim().to_string())
            .ok_or_else(|| VirtualDevicesError {
                local_rank,
                var,
                value: list.to_string(),
            })?,
        None => local_rank.to_string(),
    };
    let mut vars = vec![("CUDA_VISIBLE_DEVICES", device.clone())];
    if hip.is_some() {
        vars.push(("HIP_VISIBLE_DEVICES", device));
    }
    Ok(vars)
}

/// torchrun's arg macro: `${local_rank}` and `$local_rank` become the local rank. Unlike
/// Python's `string.Template`, `$$` is not collapsed to `$` (it is kept, and `$$local_rank` stays
/// literal), and every other `$` is kept as typed.
pub fn substitute_local_rank(arg: &OsStr, local_rank: usize) -> OsString {
    // On bytes: an argument need not be UTF-8, and is passed on byte for byte.
    const NAME: &[u8] = b"local_rank";
    let rank = local_rank.to_string();
    let mut out: Vec<u8> = Vec::with_capacity(arg.len());
    let mut rest = arg.as_bytes();
    while let Some(pos) = rest.iter().position(|&b| b == b'$') {
        out.extend_from_slice(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix(b"$") {
            out.extend_from_slice(b"$$");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix(b"{local_rank}") {
            out.extend_from_slice(rank.as_bytes());
            rest = tail;
        } else if let Some(tail) = after.strip_prefix(NAME).filter(|t| {
            // `$local_rankX` is the identifier `local_rankX`, not this macro.
            !t.first()
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        }) {
            out.extend_from_slice(rank.as_bytes());
            rest = tail;
        } else {
            out.push(b'$');
            rest = after;
        }
    }
    out.extend_from_slice(rest);
    OsString::from_vec(out)
}

/// Signal numbers back to their `SIG*` names, comma-joined (the TORCHELASTIC_SIGNALS_TO_HANDLE
/// text torchrun exports to workers).
pub fn signal_names(signals: &[i32]) -> String {
    signals
        .iter()
        .filter_map(|s| nix::sys::signal::Signal::try_from(*s).ok())
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_vars_are_the_pairs_names() {
        let names: Vec<&str> = sample().to_pairs().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, CONTRACT_VARS);
    }

    #[test]
    fn inherited_env_applies_the_overlay_once() {
        let env =
            inherited_env_with(&[("PATH".into(), "/x".into()), ("RDRUN_T".into(), "1".into())]);
        let paths: Vec<_> = env.iter().filter(|(k, _)| k == "PATH").collect();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0].1, "/x");
        assert!(env.iter().any(|(k, v)| k == "RDRUN_T" && v == "1"));
    }

    fn sample() -> WorkerEnv {
        WorkerEnv {
            rank: 3,
            local_rank: 1,
            world_size: 4,
            local_world_size: 2,
            group_rank: 1,
            group_world_size: 2,
            role_rank: 3,
            role_world_size: 4,
            role_name: "default".into(),
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            restart_count: 2,
            max_restarts: 3,
            run_id: "job".into(),
            use_agent_store: true,
            error_file: "/tmp/x/error.json".into(),
        }
    }

    #[test]
    fn round_trip() {
        let env = sample();
        let map: HashMap<String, String> = env
            .to_pairs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(WorkerEnv::from_map(&map).unwrap(), env);
        assert_eq!(map["TORCHELASTIC_USE_AGENT_STORE"], "True");
    }

    #[test]
    fn missing_and_invalid() {
        let mut map = HashMap::new();
        assert_eq!(
            WorkerEnv::from_map(&map),
            Err(WorkerEnvError::Missing("RANK"))
        );
        map.insert("RANK".into(), "x".into());
        assert!(matches!(
            WorkerEnv::from_map(&map),
            Err(WorkerEnvError::Invalid { name: "RANK", .. })
        ));
        map.insert("RANK".into(), "2".into());
        map.insert("WORLD_SIZE".into(), "2".into());
        assert!(matches!(
            WorkerEnv::from_map(&map),
            Err(WorkerEnvError::Invalid { name: "RANK", .. })
        ));
    }

    #[test]
    fn omp_num_threads() {
        assert!(should_set_omp_num_threads(None, 2));
        assert!(!should_set_omp_num_threads(None, 1));
        assert!(!should_set_omp_num_threads(Some("4"), 8));
        assert!(!should_set_omp_num_threads(Some(""), 8));
    }

    #[test]
    fn virtual_devices() {
        let v = |lr, hip, cuda| virtual_local_rank_devices(lr, hip, cuda);
        assert_eq!(
            v(2, None, None).unwrap(),
            vec![("CUDA_VISIBLE_DEVICES", "2".to_string())]
        );
        assert_eq!(
            v(1, None, Some("4, 5")).unwrap(),
            vec![("CUDA_VISIBLE_DEVICES", "5".to_string())]
        );
        assert_eq!(
            v(0, Some("7,6"), Some("0,1")).unwrap(),
            vec![
                ("CUDA_VISIBLE_DEVICES", "7".to_string()),
                ("HIP_VISIBLE_DEVICES", "7".to_string())
            ]
        );
        assert_eq!(
            v(2, None, Some("0,1")).unwrap_err().to_string(),
            "--virtual-local-rank: local_rank 2 exceeds available GPUs in CUDA_VISIBLE_DEVICES=0,1"
        );
    }

    #[test]
    fn local_rank_macro() {
        let cases = [
            ("${local_rank}", "3"),
            ("$local_rank", "3"),
            ("--out=/x/$local_rank.log", "--out=/x/3.log"),
            ("${local_rank}${local_rank}", "33"),
            ("$local_rankx", "$local_rankx"),
            ("$local_rank_1", "$local_rank_1"),
            ("$$", "$$"),
            ("a$$b", "a$$b"),
            ("$$local_rank", "$$local_rank"),
            ("$$$local_rank", "$$3"),
            ("$other ${other}", "$other ${other}"),
            ("${local_rank", "${local_rank"),
            ("$", "$"),
            ("x$", "x$"),
            ("plain", "plain"),
            ("é$local_rankü", "é3ü"),
        ];
        for (arg, want) in cases {
            assert_eq!(substitute_local_rank(OsStr::new(arg), 3), want, "{arg}");
        }
        // Bytes that are not UTF-8 pass through untouched, around a substituted macro too.
        let arg = OsString::from_vec(b"\xff${local_rank}\xfe$".to_vec());
        assert_eq!(
            substitute_local_rank(&arg, 3).as_bytes(),
            b"\xff3\xfe$".as_slice()
        );
    }

    #[test]
    fn signal_list_text() {
        use libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
        assert_eq!(
            signal_names(&[SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2]),
            "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
        );
    }
}
