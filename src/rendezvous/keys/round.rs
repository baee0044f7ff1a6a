//! The agent keys of one round, under its `store_prefix` (`Assignment::store_prefix`:
//! `rdrun.rendezvous.<run_id>.<round>` or `rdrun.static.<run_id>.<gen>`): torchrun's exit
//! barrier, the multi-node hang rule's exchange, and the network pre-check's (issue 28); and,
//! under the run's prefix instead (they add up over rounds), every node's failure counts.

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

/// The network pre-check's keys of one round (`supervisor/nodes/network_check.rs`).
#[derive(Debug, Clone)]
pub(crate) struct NetKeys {
    prefix: String,
}

impl NetKeys {
    pub(crate) fn new(round_prefix: &str) -> Self {
        NetKeys {
            prefix: format!("{round_prefix}/rdrun_net"),
        }
    }
    /// Group rank `n`'s probe listener and host name: `<host> <port> <hostname> <0|1>` (1: it
    /// serves the rendezvous store).
    pub(crate) fn addr(&self, n: usize) -> String {
        format!("{}/addr/{n}", self.prefix)
    }
    /// What the client of pair (`client`, `server`) measured: `<latency µs> <down B/s>`, or
    /// `fail`.
    pub(crate) fn client(&self, client: usize, server: usize) -> String {
        format!("{}/pair/{client}-{server}/client", self.prefix)
    }
    /// What the server of the pair received: `<up B/s>`, or `fail`.
    pub(crate) fn server(&self, client: usize, server: usize) -> String {
        format!("{}/pair/{client}-{server}/server", self.prefix)
    }
    /// Set by a slow node once it left the rendezvous: the others join the next round after it.
    pub(crate) fn left(&self, n: usize) -> String {
        format!("{}/left/{n}", self.prefix)
    }
}

/// Every node's failure counts in the run (issue 28 item 4, `supervisor/nodes/failure_counts.rs`), under
/// the run's prefix (`Rendezvous::run_prefix`), not a round's: they add up over rounds.
#[derive(Debug, Clone)]
pub(crate) struct FailureKeys {
    prefix: String,
}

impl FailureKeys {
    pub(crate) fn new(run_prefix: &str) -> Self {
        FailureKeys {
            prefix: format!("{run_prefix}/rdrun_failures"),
        }
    }
    /// How many nodes published counts: a node takes slot `add(slots, 1)` once, at its first
    /// failure.
    pub(crate) fn slots(&self) -> String {
        format!("{}/slots", self.prefix)
    }
    /// The counts a node published in its slot (`{"node", "count", "causes"}`, JSON), rewritten
    /// after each of its failures.
    pub(crate) fn node(&self, slot: i64) -> String {
        format!("{}/node/{slot}", self.prefix)
    }
}

/// Each node's root cause of one attempt (issue 28 item 5, `supervisor/nodes/root_cause.rs`), so that
/// every node judges "the same failure" on the run's root cause, not on its own workers' (which
/// may only have seen a peer go away): under the run's prefix, one directory per attempt.
#[derive(Debug, Clone)]
pub(crate) struct RootKeys {
    prefix: String,
}

impl RootKeys {
    /// The keys of the attempt that ran in `round` with `restart_count` (both: a static job's
    /// rounds and a c10d regroup's each name an attempt only together with the other).
    pub(crate) fn new(run_prefix: &str, round: u64, restart_count: u32) -> Self {
        RootKeys {
            prefix: format!("{run_prefix}/rdrun_root/{round}.{restart_count}"),
        }
    }
    /// What the node of group rank `n` saw end the attempt (JSON, `nodes::root_cause::Entry`).
    pub(crate) fn node(&self, n: usize) -> String {
        format!("{}/{n}", self.prefix)
    }
    /// Set by a node that closed the job after this attempt before it knew whether the stop
    /// verdict applies (issue 38 item 7): the nodes its close stopped publish their entry and
    /// wait for [`RootKeys::close_reason`].
    pub(crate) fn pending(&self) -> String {
        format!("{}/close/pending", self.prefix)
    }
    /// That node's close reason once judged (`failed on node N (addr): <verdict or root cause>`).
    pub(crate) fn close_reason(&self) -> String {
        format!("{}/close/reason", self.prefix)
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
        let n = NetKeys::new("rdrun.rendezvous.job.1");
        assert_eq!(n.addr(2), "rdrun.rendezvous.job.1/rdrun_net/addr/2");
        assert_eq!(
            n.client(0, 1),
            "rdrun.rendezvous.job.1/rdrun_net/pair/0-1/client"
        );
        assert_eq!(
            n.server(0, 1),
            "rdrun.rendezvous.job.1/rdrun_net/pair/0-1/server"
        );
        assert_eq!(n.left(2), "rdrun.rendezvous.job.1/rdrun_net/left/2");
        let f = FailureKeys::new("rdrun.static.job");
        assert_eq!(f.slots(), "rdrun.static.job/rdrun_failures/slots");
        assert_eq!(f.node(3), "rdrun.static.job/rdrun_failures/node/3");
        let r = RootKeys::new("rdrun.static.job", 2, 1);
        assert_eq!(r.node(0), "rdrun.static.job/rdrun_root/2.1/0");
        assert_eq!(r.pending(), "rdrun.static.job/rdrun_root/2.1/close/pending");
        assert_eq!(
            r.close_reason(),
            "rdrun.static.job/rdrun_root/2.1/close/reason"
        );
    }
}
