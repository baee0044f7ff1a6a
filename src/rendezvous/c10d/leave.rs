//! A node leaving the c10d rendezvous of its own accord while the others go on (issue 28: its
//! network pre-check found it slow, or its workers failed `--max-node-failures` times): the
//! state change is `state::leave` (pure), written here with compare-and-set. Also what a node
//! that stays out (an unhealthy node, issue 38.5) reads to know that the run is over.

use super::io::{load_state, write_state, ReadError, Wrote};
use super::*;

impl<S: RdzvStore> C10dRendezvous<S> {
    /// Takes this node out of the rendezvous (a complete round it runs is bumped without it for
    /// `reason`, see `state::leave`), within `close_timeout`. `Ok(false)`: it may not (the
    /// others would be fewer than MIN, or it is not listed): it stays.
    pub async fn leave(&mut self, reason: RoundReason) -> Result<bool, RendezvousError> {
        let deadline = Instant::now() + self.settings.close_timeout;
        let (min, max) = (self.settings.min_nodes, self.settings.max_nodes);
        loop {
            let (text, st) = match load_state(&*self.store, &self.keys).await {
                Ok(v) => v,
                Err(ReadError::State(e)) => return Err(RendezvousError::State(e)),
                Err(ReadError::Store(e)) if Instant::now() >= deadline => {
                    return Err(RendezvousError::Store(e))
                }
                Err(ReadError::Store(_)) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(new) = state::leave(&st, &self.me.id, reason, min, max) else {
                return Ok(false);
            };
            match write_state(&*self.store, &self.keys, &text, Some(&st), &new).await {
                Ok(Wrote::Won(_)) => {
                    // Its keeper stops watching the round it left.
                    lock(&self.shared).running = None;
                    return Ok(true);
                }
                Ok(Wrote::Lost(_)) => continue,
                Err(e) if Instant::now() >= deadline => return Err(RendezvousError::Store(e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Whether the rendezvous is closed, read by a node that has not joined it (issue 38.5):
    /// `Some(why)` once it is (`None` inside: the job finished). Reads the small head only, and
    /// never creates it.
    pub async fn closed_from_outside(&self) -> Result<Option<Option<String>>, StoreOpError> {
        let Some(text) = try_get(&*self.store, &self.keys.state()).await? else {
            return Ok(None);
        };
        Ok(match Head::decode(&text) {
            Ok(Some(head)) if head.closed => Some(head.closed_reason),
            _ => None,
        })
    }
}
