//! What a worker reads from its environment to join its group, below both the process group
//! (`group`) and the NCCL communicator (`nccl`), so neither imports the other: the backend
//! choice, [`GroupOptions`] (explicit, or from the launcher's environment and `RDRUN_*`), and the
//! store connection (`RDRUN_FILE_STORE` directory store, else the TCP store at
//! MASTER_ADDR:MASTER_PORT).

use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use super::error::{Result, RuntimeError};
use super::groupstore::{FileStore, GroupStore};
use super::shm::DEFAULT_SLOT;
use crate::workerenv::WorkerEnv;

/// Default bound on any single wait (store, peer data, barrier).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// Shared memory when every rank is on this host, TCP otherwise.
    Auto,
    Tcp,
    Shm,
    /// Shared memory inside each host, TCP between host leaders.
    Hier,
    /// NCCL for everything (host slices staged through the device); needs the `nccl` feature, a
    /// CUDA driver, libnccl and a device for every rank.
    Nccl,
}

impl FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(BackendChoice::Auto),
            "tcp" | "gloo" => Ok(BackendChoice::Tcp),
            "shm" => Ok(BackendChoice::Shm),
            "hier" | "shm+tcp" => Ok(BackendChoice::Hier),
            "nccl" => Ok(BackendChoice::Nccl),
            other => Err(format!(
                "unknown backend {other:?} (expected auto, tcp, shm, hier or nccl)"
            )),
        }
    }
}

/// Everything the explicit constructor needs.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    pub rank: usize,
    pub world_size: usize,
    pub run_id: String,
    pub restart_count: u32,
    /// Names the communicator inside a round (several groups may coexist).
    pub tag: String,
    pub backend: BackendChoice,
    /// Bound on every wait; a dead or stuck peer is reported no later than this.
    pub timeout: Duration,
    /// Address to listen on and publish; `None` = the interface that routes to the store.
    pub advertise_ip: Option<IpAddr>,
    /// Host identity override (tests fake multi-host worlds with it).
    pub host_id: Option<String>,
    /// Bytes per shared-memory slot.
    pub shm_slot_bytes: usize,
    /// Local rank: picks the CUDA device for NCCL (see `nccl::device_ordinal`).
    pub local_rank: usize,
    /// `Auto` also brings up an NCCL communicator for device buffers when every rank can
    /// (`RDRUN_AUTO_NCCL=0` turns this off).
    pub auto_nccl: bool,
}

impl GroupOptions {
    pub fn new(rank: usize, world_size: usize, run_id: &str) -> Self {
        GroupOptions {
            rank,
            world_size,
            run_id: run_id.to_string(),
            restart_count: 0,
            tag: "default".to_string(),
            backend: BackendChoice::Auto,
            timeout: DEFAULT_TIMEOUT,
            advertise_ip: None,
            host_id: None,
            shm_slot_bytes: DEFAULT_SLOT,
            local_rank: rank,
            auto_nccl: true,
        }
    }

    /// The process's worker environment (a bad one: an `init` error) and the options from it:
    /// how every `init_from_env` begins (the group's and the NCCL communicator's).
    pub fn from_process_env() -> Result<(WorkerEnv, Self)> {
        let env = WorkerEnv::from_env().map_err(|source| RuntimeError::Env {
            rank: 0,
            op: "init",
            source,
        })?;
        let opts = Self::from_worker_env(&env)?;
        Ok((env, opts))
    }

    /// Options from the launcher's environment plus `RDRUN_BACKEND`, `RDRUN_TIMEOUT_SECS`,
    /// `RDRUN_AUTO_NCCL`, `RDRUN_SHM_SLOT_BYTES`.
    pub fn from_worker_env(env: &WorkerEnv) -> Result<Self> {
        let mut o = GroupOptions::new(env.rank, env.world_size, &env.run_id);
        o.restart_count = env.restart_count;
        o.local_rank = env.local_rank;
        let inv = |msg: String| RuntimeError::Invalid {
            rank: env.rank,
            op: "init",
            msg,
        };
        if let Ok(b) = std::env::var("RDRUN_BACKEND") {
            o.backend = b.parse().map_err(inv)?;
        }
        if let Ok(t) = std::env::var("RDRUN_TIMEOUT_SECS") {
            let secs: f64 = t
                .trim()
                .parse()
                .map_err(|_| inv(format!("RDRUN_TIMEOUT_SECS={t:?} is not a number")))?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(inv(format!("RDRUN_TIMEOUT_SECS={t:?} must be positive")));
            }
            o.timeout = Duration::from_secs_f64(secs);
        }
        if let Ok(v) = std::env::var("RDRUN_AUTO_NCCL") {
            o.auto_nccl = match v.trim() {
                "1" | "true" | "yes" | "" => true,
                "0" | "false" | "no" => false,
                _ => return Err(inv(format!("RDRUN_AUTO_NCCL={v:?}: expected 0 or 1"))),
            };
        }
        if let Ok(s) = std::env::var("RDRUN_SHM_SLOT_BYTES") {
            o.shm_slot_bytes = s
                .trim()
                .parse()
                .map_err(|_| inv(format!("RDRUN_SHM_SLOT_BYTES={s:?} is not a byte count")))?;
        }
        Ok(o)
    }
}

/// Connects to the launcher's TCP store at MASTER_ADDR:MASTER_PORT (blocking client, retrying
/// until `timeout`).
pub fn connect_store(env: &WorkerEnv, timeout: Duration) -> Result<Box<dyn GroupStore>> {
    let c = crate::store::BlockingClient::connect(&env.master_addr, env.master_port, timeout)
        .map_err(|e| RuntimeError::Store {
            rank: env.rank,
            op: "init",
            msg: e.to_string(),
        })?;
    c.set_timeout(timeout);
    Ok(Box::new(c))
}

/// The store a worker's group meets in: the directory store named by `RDRUN_FILE_STORE` when
/// that is set, else the launcher's TCP store (see [`connect_store`]).
pub fn store_from_env(env: &WorkerEnv, timeout: Duration) -> Result<Box<dyn GroupStore>> {
    match std::env::var_os("RDRUN_FILE_STORE") {
        Some(dir) => Ok(Box::new(
            FileStore::new(std::path::PathBuf::from(dir)).map_err(|e| RuntimeError::Store {
                rank: env.rank,
                op: "init",
                msg: e.to_string(),
            })?,
        )),
        None => connect_store(env, timeout),
    }
}
