//! The c10d rendezvous' store keys, all under `rdrun.rendezvous.<run_id>` (torchrun's state
//! is `torch.rendezvous.<run_id>`, so the two never read each other's state).
//!
//! `/state` (the small JSON head every node reads), `/body/<seq>.<nonce>` (the full state,
//! written once per write), `/version` (counter bumped after every write), `/hb/<node id>`,
//! `/suspects/<round>`, `/nnodes/first` and `/nnodes/conflict`, `/joiners/<round>`,
//! `/admit/<round>`, `/node/<round>/<id>`, `/roster/<round>`, `/complete/<round>` and
//! `/closed_acks`; what each holds is said at its constructor and in `c10d.rs`.

/// The namespace of one run's c10d keys; also the etcd rendezvous' assignment `store_prefix`
/// (its agents' round keys live in the c10d namespace of the worker store).
pub(crate) fn prefix(run_id: &str) -> String {
    format!("rdrun.rendezvous.{run_id}")
}

/// Store keys of one run.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    run_id: String,
}

impl Keys {
    pub(crate) fn new(run_id: &str) -> Self {
        Self {
            prefix: prefix(run_id),
            run_id: run_id.to_string(),
        }
    }
    /// `rdrun.rendezvous.<run_id>`: the base of the rounds' `store_prefix`.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }
    pub(crate) fn state(&self) -> String {
        format!("{}/state", self.prefix)
    }
    pub(crate) fn hb(&self, id: &str) -> String {
        format!("{}/hb/{id}", self.prefix)
    }
    /// The round's summary (`state::round_summary`), written last when it completes: what
    /// its participants wait on.
    pub(crate) fn complete(&self, round: u64) -> String {
        format!("{}/complete/{round}", self.prefix)
    }
    /// The round's roster (every participant's id and nproc), written just before its summary.
    pub(crate) fn roster(&self, round: u64) -> String {
        format!("{}/roster/{round}", self.prefix)
    }
    /// torchrun's c10d state key (`torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py`).
    pub(crate) fn torch_state(&self) -> String {
        format!("torch.rendezvous.{}", self.run_id)
    }
    pub(crate) fn joiners(&self, round: u64) -> String {
        format!("{}/joiners/{round}", self.prefix)
    }
    /// Bumped (ADD 1) after every write of the state: monitors read this small counter every
    /// poll and the state document only when it moved.
    pub(crate) fn version(&self) -> String {
        format!("{}/version", self.prefix)
    }
    /// The first agent's `<nnodes> <id>` (see `plumbing::nnodes_conflict`).
    pub(crate) fn nnodes_first(&self) -> String {
        format!("{}/nnodes/first", self.prefix)
    }
    /// The first agent's `<nnodes> <id>` that disagreed with `nnodes_first`.
    pub(crate) fn nnodes_conflict(&self) -> String {
        format!("{}/nnodes/conflict", self.prefix)
    }
    /// Counter of agents suspecting a watched peer of `round` (its heartbeat stalled): read by
    /// agents whose workers failed, which do not watch every peer themselves.
    pub(crate) fn suspects(&self, round: u64) -> String {
        format!("{}/suspects/{round}", self.prefix)
    }
    /// The body of write number `seq` (a random suffix keeps racing writers apart).
    pub(crate) fn body(&self, seq: u64) -> String {
        self.body_with(seq, fastrand::u64(..))
    }
    fn body_with(&self, seq: u64, nonce: u64) -> String {
        format!("{}/body/{seq}.{nonce:016x}", self.prefix)
    }
    /// A node's notice in `round` (its list and watched peers, see `state::notices`).
    pub(crate) fn notice(&self, round: u64, id: &str) -> String {
        format!("{}/node/{round}/{id}", self.prefix)
    }
    /// Who admits the announced joiners of `round` at the current head (`<seq> <id>`).
    pub(crate) fn admit(&self, round: u64) -> String {
        format!("{}/admit/{round}", self.prefix)
    }
    /// Appended `<id>\n` by every agent that learnt the rendezvous is closed.
    pub(crate) fn closed_acks(&self) -> String {
        format!("{}/closed_acks", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire spelling of every key (agents of different builds share one store).
    #[test]
    fn keys_are_spelled_as_on_the_wire() {
        let k = Keys::new("job");
        let id = "10.0.0.1_7_0";
        assert_eq!(prefix("job"), "rdrun.rendezvous.job");
        assert_eq!(k.prefix(), "rdrun.rendezvous.job");
        assert_eq!(k.state(), "rdrun.rendezvous.job/state");
        assert_eq!(k.hb(id), "rdrun.rendezvous.job/hb/10.0.0.1_7_0");
        assert_eq!(k.complete(3), "rdrun.rendezvous.job/complete/3");
        assert_eq!(k.roster(3), "rdrun.rendezvous.job/roster/3");
        assert_eq!(k.torch_state(), "torch.rendezvous.job");
        assert_eq!(k.joiners(3), "rdrun.rendezvous.job/joiners/3");
        assert_eq!(k.version(), "rdrun.rendezvous.job/version");
        assert_eq!(k.nnodes_first(), "rdrun.rendezvous.job/nnodes/first");
        assert_eq!(k.nnodes_conflict(), "rdrun.rendezvous.job/nnodes/conflict");
        assert_eq!(k.suspects(3), "rdrun.rendezvous.job/suspects/3");
        assert_eq!(
            k.body_with(9, 0xab),
            "rdrun.rendezvous.job/body/9.00000000000000ab"
        );
        assert!(k.body(9).starts_with("rdrun.rendezvous.job/body/9."));
        assert_eq!(k.body(9).len(), k.body_with(9, 0).len());
        assert_eq!(k.notice(3, id), "rdrun.rendezvous.job/node/3/10.0.0.1_7_0");
        assert_eq!(k.admit(3), "rdrun.rendezvous.job/admit/3");
        assert_eq!(k.closed_acks(), "rdrun.rendezvous.job/closed_acks");
    }
}
