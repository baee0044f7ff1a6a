//! torch elastic agent variables rdrun honours (docs/compat.md, "Environment variables rdrun
//! reads"), read once at resolution:
//! - `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` (exactly `1`, as torch): with a dynamic rendezvous
//!   (standalone, c10d, etcd) workers do not use the agent's store: TORCHELASTIC_USE_AGENT_STORE
//!   is `False` and MASTER_PORT a free port the rank-0 worker binds itself (torch's
//!   `RendezvousStoreInfo.build` with `get_free_port`). The static backend always shares its
//!   store, as torch's `StaticTCPRendezvous.use_agent_store`.
//! - `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=SECS`: a worker process in uninterruptible
//!   sleep (state `D` in `/proc/<pid>/stat`) continuously for this long fails the group and
//!   disables further restarts (torch's `LocalElasticAgent._check_uninterruptible_state_timeout`).
//!   Unset, empty, unparsable or <= 0: off, as torch.
//! - `TORCH_ELASTIC_WORKER_IDENTICAL=1` (exactly `1`): torch's fast path of rank assignment,
//!   RANK = GROUP_RANK × nproc + LOCAL_RANK and WORLD_SIZE = GROUP_WORLD_SIZE × nproc, the user's
//!   promise that every node runs the same number of workers.

use std::time::Duration;

use super::spec::RdzvBackend;
use crate::cli::EnvFn;

/// What the torch agent variables ask for.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TorchAgentEnv {
    /// `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` with a dynamic rendezvous.
    pub own_worker_store: bool,
    /// `TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT`, when > 0.
    pub uninterruptible_timeout: Option<Duration>,
    /// `TORCH_ELASTIC_WORKER_IDENTICAL=1`.
    pub worker_identical: bool,
}

/// Reads the variables; `standalone`/`backend` decide whether the store opt-out applies.
pub fn resolve(env: EnvFn<'_>, standalone: bool, backend: RdzvBackend) -> TorchAgentEnv {
    let dynamic = standalone || backend != RdzvBackend::Static;
    let disabled = env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE").as_deref() == Some("1");
    if disabled && !dynamic {
        tracing::info!(
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 has no effect with the static rendezvous: workers use its store (as torchrun)"
        );
    }
    TorchAgentEnv {
        own_worker_store: disabled && dynamic,
        uninterruptible_timeout: env("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT")
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64),
        worker_identical: env("TORCH_ELASTIC_WORKER_IDENTICAL").as_deref() == Some("1"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pairs: &[(&str, &str)], standalone: bool, backend: RdzvBackend) -> TorchAgentEnv {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(&move |k: &str| map.get(k).cloned(), standalone, backend)
    }

    #[test]
    fn torch_readings() {
        assert_eq!(with(&[], true, RdzvBackend::C10d), TorchAgentEnv::default());
        let d = [("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")];
        assert!(with(&d, true, RdzvBackend::Static).own_worker_store);
        assert!(with(&d, false, RdzvBackend::C10d).own_worker_store);
        assert!(!with(&d, false, RdzvBackend::Static).own_worker_store);
        let t = [("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "true")];
        assert!(!with(&t, true, RdzvBackend::C10d).own_worker_store);
        for (text, want) in [
            ("2.5", Some(Duration::from_millis(2500))),
            (" 3 ", Some(Duration::from_secs(3))),
            ("0", None),
            ("-1", None),
            ("x", None),
            ("", None),
            ("inf", None),
        ] {
            let e = with(
                &[("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT", text)],
                false,
                RdzvBackend::Static,
            );
            assert_eq!(e.uninterruptible_timeout, want, "{text:?}");
        }
        assert!(
            with(
                &[("TORCH_ELASTIC_WORKER_IDENTICAL", "1")],
                false,
                RdzvBackend::Static
            )
            .worker_identical
        );
        assert!(
            !with(
                &[("TORCH_ELASTIC_WORKER_IDENTICAL", "yes")],
                false,
                RdzvBackend::Static
            )
            .worker_identical
        );
    }
}
