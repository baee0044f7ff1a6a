//! A node leaving the c10d rendezvous of its own accord while the others go on (issue 28: its
//! network pre-check found it slow, or its workers failed `--max-node-failures` times): the
//! state change is `state::leave` (pure), written here with compare-and-set.

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
}
