//! The etcd rendezvous' keys, all under `<prefix>/<run_id>/` in etcd (`--rdzv-conf
//! prefix=`, default `/rdrun`).

use super::c10d;

/// Keys of one run: `<prefix>/<run_id>/…`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    base: String,
    run_id: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, run_id: &str) -> Keys {
        Keys {
            base: format!("{prefix}/{run_id}/"),
            run_id: run_id.to_string(),
        }
    }
    /// `<prefix>/<run_id>/`: every key of the run (what a watch follows).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }
    pub(crate) fn state(&self) -> String {
        format!("{}state", self.base)
    }
    pub(crate) fn alive_prefix(&self) -> String {
        format!("{}alive/", self.base)
    }
    pub(crate) fn alive(&self, id: &str) -> String {
        format!("{}{id}", self.alive_prefix())
    }
    pub(crate) fn joiners(&self, round: u64) -> String {
        format!("{}joiners/{round}/", self.base)
    }
    /// A node's announcement in `round` (its member record, under its lease).
    pub(crate) fn joiner(&self, round: u64, id: &str) -> String {
        format!("{}{id}", self.joiners(round))
    }
    pub(crate) fn nnodes_prefix(&self) -> String {
        format!("{}nnodes/", self.base)
    }
    /// A node's `--nnodes` (see `plumbing::nnodes_conflict`).
    pub(crate) fn nnodes(&self, id: &str) -> String {
        format!("{}{id}", self.nnodes_prefix())
    }
    pub(crate) fn barrier(&self, round: u64) -> String {
        format!("{}barrier/{round}/", self.base)
    }
    /// A node's arrival at the round's barrier (under its lease).
    pub(crate) fn barrier_entry(&self, round: u64, id: &str) -> String {
        format!("{}{id}", self.barrier(round))
    }
    /// Written (without a lease) by the first agent that saw the round's barrier complete.
    pub(crate) fn barrier_done(&self, round: u64) -> String {
        format!("{}barrier_done/{round}", self.base)
    }
    /// The assignment's `store_prefix` (as c10d's: `rdrun.rendezvous.<run_id>`).
    pub(crate) fn store_prefix(&self) -> String {
        c10d::prefix(&self.run_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix_and_run_id() {
        let k = Keys::new("/rdrun", "job");
        assert_eq!(k.base(), "/rdrun/job/");
        assert_eq!(k.state(), "/rdrun/job/state");
        assert_eq!(k.alive_prefix(), "/rdrun/job/alive/");
        assert_eq!(k.alive("a_1_0"), "/rdrun/job/alive/a_1_0");
        assert_eq!(k.joiners(3), "/rdrun/job/joiners/3/");
        assert_eq!(k.joiner(3, "a_1_0"), "/rdrun/job/joiners/3/a_1_0");
        assert_eq!(k.nnodes_prefix(), "/rdrun/job/nnodes/");
        assert_eq!(k.nnodes("a_1_0"), "/rdrun/job/nnodes/a_1_0");
        assert_eq!(k.barrier(2), "/rdrun/job/barrier/2/");
        assert_eq!(k.barrier_entry(2, "a_1_0"), "/rdrun/job/barrier/2/a_1_0");
        assert_eq!(k.barrier_done(2), "/rdrun/job/barrier_done/2");
        assert_eq!(k.store_prefix(), "rdrun.rendezvous.job");
    }
}
