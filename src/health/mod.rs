//! Node health checks before a node joins a round (issue 28 items 1–2): what is checked, each
//! check's one-line verdict, and the report of one run of them. The checks themselves are in
//! `checks.rs`, the bounded program runner (interpreter, `nvidia-smi`, the site's
//! `--health-check-cmd`) in `command.rs`. What a failed check does to the run (warn, fail fast,
//! retry after a back-off) is the supervisor's (`supervisor/nodes/health_gate.rs`); this module only
//! looks and says what it saw. The network pre-check at rendezvous (item 3) is `network.rs`
//! (pairs and verdict, pure) and `netprobe.rs` (its sockets); the supervisor runs it after each
//! round (`supervisor/nodes/network_check.rs`).
//!
//! Every check is bounded: the ones that run a program by `--health-check-timeout` (the program's
//! process group is killed at the bound and the check fails), the others read the file system or
//! `/proc` once. They run concurrently, so a run of them takes about as long as the slowest.
//! A program is contained like a worker (issue 38.11): in a cgroup of its own below the run's,
//! ended with everything it started when it ends and when the run does; the supervisor hands
//! that in ([`Containment`]), since this module knows no cgroup.

mod checks;
pub mod clock;
mod command;
pub mod memory;
pub mod netprobe;
pub mod network;

use std::fmt;
use std::time::{Duration, Instant};

use crate::config::resilience::{HealthMode, Resilience};

pub use checks::Thresholds;
pub use command::{Cell, Contain, Containment};

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Failed,
    /// Not applicable here (no GPU tool, no `--log-dir`, `--no-python`): the note says why.
    Skipped,
}

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Short stable name (`interpreter`, `log-dir`, `shm`, `memory`, `nofile`, `gpus`, `nics`,
    /// `command`): events, metrics and `--report-json` use it.
    pub check: &'static str,
    pub status: Status,
    /// What was seen, one line (a failed program's last output lines are joined with ` | `).
    pub detail: String,
    pub took: Duration,
}

impl fmt::Display for Verdict {
    /// `ok      interpreter: /usr/bin/python3 starts (41 ms)`, `FAILED  command: ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = match self.status {
            Status::Ok => "ok",
            Status::Failed => "FAILED",
            Status::Skipped => "skipped",
        };
        write!(
            f,
            "{word:<7} {}: {} ({} ms)",
            self.check,
            self.detail,
            self.took.as_millis()
        )
    }
}

/// The verdicts of one run of every check on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// This node's host name (what a requeue script passes to `--exclude`).
    pub node: String,
    pub verdicts: Vec<Verdict>,
    pub took: Duration,
}

impl HealthReport {
    /// The checks that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Verdict> {
        self.verdicts.iter().filter(|v| v.status == Status::Failed)
    }

    pub fn healthy(&self) -> bool {
        self.failed().next().is_none()
    }

    /// `node n1 failed the health check: command: exit 1 | no GPU; interpreter: ...`; `None`
    /// when healthy.
    pub fn failure_line(&self) -> Option<String> {
        let failed: Vec<String> = self
            .failed()
            .map(|v| format!("{}: {}", v.check, v.detail))
            .collect();
        (!failed.is_empty()).then(|| {
            format!(
                "{} failed the health check: {}",
                node_phrase(&self.node),
                failed.join("; ")
            )
        })
    }

    /// Every verdict as JSON (`[{"check", "status", "detail", "ms"}]`): the `health_check`
    /// event's `checks` and the `--print-topology=json` health block's.
    pub fn checks_json(&self) -> serde_json::Value {
        self.verdicts
            .iter()
            .map(|v| {
                serde_json::json!({
                    "check": v.check,
                    "status": match v.status {
                        Status::Ok => "ok",
                        Status::Failed => "failed",
                        Status::Skipped => "skipped",
                    },
                    "detail": v.detail,
                    "ms": v.took.as_millis() as u64,
                })
            })
            .collect()
    }

    /// The block `--dry-run` prints: a title line, then one line per check.
    pub fn render(&self) -> String {
        let mut out = format!(
            "Health checks on {} ({} ms):\n",
            self.node,
            self.took.as_millis()
        );
        for v in &self.verdicts {
            out.push_str(&format!("  {v}\n"));
        }
        out
    }
}

/// What the checks read of the launch: built once by the caller (the supervisor's setup code,
/// from the resolved config; tests by hand), so that the checks never see the whole config.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The worker interpreter of a Python launch; `None` for `--no-python`.
    pub python: Option<std::path::PathBuf>,
    /// Modules the interpreter check imports: under `--health-check on` with warm start on,
    /// the preload list (the template imports them anyway, and a node that cannot is bad);
    /// empty otherwise (`python -c pass`): a script that never imports torch must not make its
    /// node unhealthy, and under `warn` warm start names a failing preload itself, once.
    pub preload: Vec<String>,
    pub log_dir: Option<std::path::PathBuf>,
    /// `--checkpoint-dir`.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    pub nproc: usize,
    /// `NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME` as (variable, value), the ones set.
    pub nics: Vec<(&'static str, String)>,
    /// `CUDA_VISIBLE_DEVICES` when set (the GPUs a worker may use).
    pub cuda_visible: Option<String>,
    /// rdrun's PATH (where `nvidia-smi` is looked for).
    pub path: Option<std::ffi::OsString>,
    pub command: Option<String>,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    /// Where the checks' programs run: the run's containment (`command::Containment`).
    pub contain: Contain,
}

/// Whether checks run at all under `mode`.
pub fn enabled(mode: HealthMode) -> bool {
    mode != HealthMode::Off
}

/// Runs every check once, concurrently, each within its bound.
pub async fn run(inputs: &Inputs) -> HealthReport {
    let t0 = Instant::now();
    let (interp, gpus, cmd) = tokio::join!(
        checks::interpreter(inputs),
        checks::gpus(inputs),
        checks::command(inputs),
    );
    let mut verdicts = vec![interp];
    verdicts.extend(checks::local(inputs));
    verdicts.push(gpus);
    verdicts.extend(cmd);
    HealthReport {
        node: node_name(),
        verdicts,
        took: t0.elapsed(),
    }
}

/// [`run`] outside any async runtime (`--dry-run`; the caller has checked [`enabled`]), the
/// programs contained by `inputs.contain`; `None` when no runtime can be built.
pub fn run_blocking(inputs: &Inputs) -> Option<HealthReport> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    Some(rt.block_on(run(inputs)))
}

/// The `health` block of `--print-topology=json`: the settings of issue 28 (`r`) and, unless
/// `--health-check off`, this node's verdicts (`report`).
pub fn dry_run_json(r: &Resilience, report: Option<&HealthReport>) -> serde_json::Value {
    serde_json::json!({
        "mode": r.health.to_string(),
        "node": report.map_or_else(node_name, |h| h.node.clone()),
        "healthy": report.map(HealthReport::healthy),
        "ms": report.map(|h| h.took.as_millis() as u64),
        "checks": report.map(HealthReport::checks_json),
        "network_check": r.network_check,
        "network_check_threshold": r.network_threshold,
        "max_node_failures": r.max_node_failures,
        "max_same_failures": r.max_same_failures,
    })
}

/// This node's host name (`gethostname`), as a requeue script's `--exclude` would name it.
pub fn node_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// How rdrun's lines name node `name`: `node n1`, but a host name that already says it is a
/// node stands alone (`node2 failed the health check`, not `node node2 …`: issue 38 item 17).
pub fn node_phrase(name: &str) -> String {
    let says_node = name
        .get(..4)
        .is_some_and(|head| head.eq_ignore_ascii_case("node"));
    match says_node {
        true => name.to_string(),
        false => format!("node {name}"),
    }
}

#[cfg(test)]
mod tests;
