//! The exit barrier: after its workers succeeded, an agent waits for the other agents of the
//! round, so that the store-hosting agent outlives its peers' last store operations.
//!
//! Keys and protocol are torchrun's (`torch/distributed/elastic/utils/store.py` `barrier`, spec
//! torchrun-compat §3.4): `add(<prefix>/torchelastic/agent/terminal_state/num_members, 1)`; the
//! agent that reaches the world size sets `…/last_member`; everyone waits for that key. The timeout
//! is the caller's (`--exit-barrier-timeout`, default 300 s; hard-coded in torchrun).

use std::time::Duration;

use super::error::RendezvousError;
use super::keys::round::exit_barrier as exit_barrier_keys;
use super::store::RdzvStore;

/// Waits until `group_world_size` agents called this with the same `prefix` (the round's
/// [`super::Assignment::store_prefix`]) or `timeout` passes (then `BarrierTimeout`, which the
/// agent only logs: the job's exit code does not change, as in torchrun).
pub async fn exit_barrier<S: RdzvStore>(
    store: &S,
    prefix: &str,
    group_world_size: usize,
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let (count_key, last_key) = exit_barrier_keys(prefix);
    let arrived = store.add(&count_key, 1).await?;
    if arrived == group_world_size as i64 {
        store.set(&last_key, b"1").await?;
    }
    // Wait in slices of at most a second, so the wait ends soon after its deadline. (A WAIT holds
    // its connection: the rendezvous keeper beats on a connection of its own, issue 17.1.)
    let deadline = tokio::time::Instant::now() + timeout;
    let keys = [last_key];
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if store.wait(&keys, left.min(Duration::from_secs(1))).await? {
            return Ok(());
        }
        if left <= Duration::from_secs(1) {
            break;
        }
    }
    let arrived = store.add(&count_key, 0).await.unwrap_or(arrived);
    Err(RendezvousError::BarrierTimeout {
        waited: timeout,
        arrived,
        expected: group_world_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::store::MemStore;

    #[tokio::test(start_paused = true)]
    async fn barrier_releases_all_and_times_out_when_one_is_missing() {
        let store = MemStore::new();
        let t = Duration::from_secs(30);
        let (a, b, c) = (store.handle(), store.handle(), store.handle());
        let (ra, rb, rc) = tokio::join!(
            exit_barrier(&a, "p.0", 3, t),
            exit_barrier(&b, "p.0", 3, t),
            exit_barrier(&c, "p.0", 3, t)
        );
        assert!(ra.is_ok() && rb.is_ok() && rc.is_ok());
        assert_eq!(
            store.peek("p.0/torchelastic/agent/terminal_state/last_member"),
            Some(b"1".to_vec())
        );
        let started = tokio::time::Instant::now();
        let err = exit_barrier(&a, "p.1", 2, Duration::from_secs(7))
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_secs(7));
        assert_eq!(
            err.to_string(),
            "exit barrier timed out after 7s: 1 of 2 node(s) arrived"
        );
    }
}
