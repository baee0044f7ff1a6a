//! A node leaving the etcd rendezvous of its own accord while the others go on (issue 28: its
//! network pre-check found it slow, or its workers failed `--max-node-failures` times), as on
//! c10d (`rendezvous/c10d/leave.rs`): the state change is `state::leave` (pure), written with a
//! compare-and-set on the state key's `mod_revision`. Also what a node that stays out (an
//! unhealthy node, issue 38.5) reads to know that the run is over, and the run's key-value
//! exchange on etcd (`rendezvous/exchange.rs`), which needs this driver's client and keys.

use super::*;
use crate::rendezvous::exchange::EtcdKv;

impl EtcdRendezvous {
    /// Takes this node out of the rendezvous (a complete round it runs is bumped without it for
    /// `reason`, see `state::leave`) within `close_timeout`, then revokes its lease (its alive
    /// key goes at once; nothing of it is watched any more). `Ok(false)`: it may not (the others
    /// would be fewer than MIN, or it is not listed): it stays.
    pub async fn leave(&mut self, reason: RoundReason) -> Result<bool, RendezvousError> {
        let deadline = Instant::now() + self.settings.rounds.close_timeout;
        let (min, max) = (
            self.settings.rounds.min_nodes,
            self.settings.rounds.max_nodes,
        );
        let key = self.keys.state();
        loop {
            let (st, seen, _) = self
                .retry(deadline, || read_state(&self.etcd, &self.keys))
                .await?;
            let Some(new) = state::leave(&st, &self.me.id, reason, min, max) else {
                return Ok(false);
            };
            match self.etcd.compare_and_set(&key, seen, new.encode()).await {
                Ok(true) => {
                    lock(&self.shared).running = None;
                    if let Some(k) = self.keeper.take() {
                        k.abort();
                    }
                    self.etcd.revoke(self.lease).await;
                    return Ok(true);
                }
                // Another writer came first: read again.
                Ok(false) => {}
                Err(e) if Instant::now() >= deadline => return Err(RendezvousError::Store(e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Whether the rendezvous is closed, read by a node that has not joined it (issue 38.5):
    /// `Some(why)` once it is (`None` inside: the job finished).
    pub async fn closed_from_outside(&self) -> Result<Option<Option<String>>, RendezvousError> {
        let (st, _, _) = read_state(&self.etcd, &self.keys).await?;
        Ok(st.closed.then_some(st.closed_reason))
    }

    /// The run's key-value exchange: keys under `<prefix>/<run_id>/kv/`.
    pub(crate) fn exchange(&self) -> EtcdKv {
        EtcdKv {
            etcd: self.etcd.clone(),
            base: format!("{}kv/", self.keys.base()),
        }
    }
}
