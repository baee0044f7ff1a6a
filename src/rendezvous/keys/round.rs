//! The agent keys of one round, under its `store_prefix` (`Assignment::store_prefix`:
//! `rdrun.rendezvous.<run_id>.<round>` or `rdrun.static.<run_id>.<gen>`): torchrun's exit
//! barrier, and the multi-node hang rule's exchange.

/// torchrun's exit barrier (`torch/distributed/elastic/utils/store.py` `barrier`): the
/// arrival counter and the key the last arriving agent sets.
pub(crate) fn exit_barrier(round_prefix: &str) -> (String, String) {
    let base = format!("{round_prefix}/torchelastic/agent/terminal_state");
    (format!("{base}/num_members"), format!("{base}/last_member"))
}

/// The multi-node hang rule's keys of one round.
#[derive(Debug, Clone)]
pub(crate) struct HangKeys {
    prefix: String,
}

impl HangKeys {
    pub(crate) fn new(round_prefix: &str) -> Self {
        HangKeys {
            prefix: format!("{round_prefix}/rdrun_hang"),
        }
    }
    /// Node `n`'s published state.
    pub(crate) fn node(&self, n: u32) -> String {
        format!("{}/node/{n}", self.prefix)
    }
    /// The round's verdict, set once by whoever decides.
    pub(crate) fn verdict(&self) -> String {
        format!("{}/verdict", self.prefix)
    }
    /// Node `n`'s hang report.
    pub(crate) fn report(&self, n: u32) -> String {
        format!("{}/report/{n}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire spelling (torchrun's for the barrier; rdrun agents of one job share the rest).
    #[test]
    fn keys_are_spelled_as_on_the_wire() {
        let (count, last) = exit_barrier("rdrun.rendezvous.job.1");
        assert_eq!(
            count,
            "rdrun.rendezvous.job.1/torchelastic/agent/terminal_state/num_members"
        );
        assert_eq!(
            last,
            "rdrun.rendezvous.job.1/torchelastic/agent/terminal_state/last_member"
        );
        let h = HangKeys::new("rdrun.static.job.0");
        assert_eq!(h.node(2), "rdrun.static.job.0/rdrun_hang/node/2");
        assert_eq!(h.verdict(), "rdrun.static.job.0/rdrun_hang/verdict");
        assert_eq!(h.report(2), "rdrun.static.job.0/rdrun_hang/report/2");
    }
}
