//! The static rendezvous' store keys, all under `rdrun.static.<run_id>`.

/// Store keys of one run.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(run_id: &str) -> Self {
        Self {
            prefix: format!("rdrun.static.{run_id}"),
        }
    }
    /// `rdrun.static.<run_id>`: the run's own keys (kept by the worker reset).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The agent keys of restart generation `gen` (`Assignment::store_prefix`).
    pub(crate) fn round_prefix(&self, gen: u64) -> String {
        format!("{}.{gen}", self.prefix)
    }
    pub(crate) fn nproc(&self, rank: usize) -> String {
        format!("{}/nproc/{rank}", self.prefix)
    }
    /// This agent's host name: the node identity of in-place ranks (`Assignment::nodes`).
    pub(crate) fn host(&self, rank: usize) -> String {
        format!("{}/host/{rank}", self.prefix)
    }
    /// Appended `<nnodes> <who>` by every agent (see `plumbing::nnodes_disagreement`).
    pub(crate) fn nnodes(&self) -> String {
        format!("{}/nnodes", self.prefix)
    }
    /// Who claimed a node rank (`<host> (pid P, agent N)`): one agent per rank.
    pub(crate) fn owner(&self, rank: usize) -> String {
        format!("{}/owner/{rank}", self.prefix)
    }
    pub(crate) fn hb(&self, rank: usize) -> String {
        format!("{}/hb/{rank}", self.prefix)
    }
    pub(crate) fn gen(&self) -> String {
        format!("{}/gen", self.prefix)
    }
    /// `1` when the job finished, `failed on node N` when a node gave up.
    pub(crate) fn closed(&self) -> String {
        format!("{}/closed", self.prefix)
    }
    /// Appended `<rank>\n` by every agent that learnt the job is closed.
    pub(crate) fn closed_acks(&self) -> String {
        format!("{}/closed_acks", self.prefix)
    }
    pub(crate) fn arrived(&self, gen: u64) -> String {
        format!("{}/round/{gen}/arrived", self.prefix)
    }
    /// Set by the last agent to arrive in a round; node 0 waits on it, resets the workers'
    /// namespace, then sets [`Keys::go`].
    pub(crate) fn all_in(&self, gen: u64) -> String {
        format!("{}/round/{gen}/all", self.prefix)
    }
    pub(crate) fn go(&self, gen: u64) -> String {
        format!("{}/round/{gen}/go", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire spelling of every key (agents of different builds share one store).
    #[test]
    fn keys_are_spelled_as_on_the_wire() {
        let k = Keys::new("job");
        assert_eq!(k.round_prefix(2), "rdrun.static.job.2");
        assert_eq!(k.nproc(1), "rdrun.static.job/nproc/1");
        assert_eq!(k.host(1), "rdrun.static.job/host/1");
        assert_eq!(k.nnodes(), "rdrun.static.job/nnodes");
        assert_eq!(k.owner(1), "rdrun.static.job/owner/1");
        assert_eq!(k.hb(1), "rdrun.static.job/hb/1");
        assert_eq!(k.gen(), "rdrun.static.job/gen");
        assert_eq!(k.closed(), "rdrun.static.job/closed");
        assert_eq!(k.closed_acks(), "rdrun.static.job/closed_acks");
        assert_eq!(k.arrived(2), "rdrun.static.job/round/2/arrived");
        assert_eq!(k.all_in(2), "rdrun.static.job/round/2/all");
        assert_eq!(k.go(2), "rdrun.static.job/round/2/go");
    }
}
