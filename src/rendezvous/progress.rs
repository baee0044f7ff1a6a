//! What a rendezvous round waiting for nodes has seen so far (joined N of M, which are missing,
//! the deadline), for the launcher's status line (issue 12: "while waiting for nodes: a status
//! line every few seconds ... not silence for 600 s").
//!
//! The caller owns where it goes: it makes a [`Board`] (a watch channel: the last look wins)
//! and runs the round's future inside [`Board::scope`]; the backends' wait loops publish with
//! one call each ([`c10d`], [`look_static`]) to the board of the round they run in, and the
//! caller's status line reads it ([`Board::current`]). A round run outside any scope (library
//! tests, the simulator) publishes nowhere. The board travels with the round's future rather
//! than as an argument through every backend's `next_round`, so the backends keep their
//! signatures; nothing is process-wide, so two rounds in one process never see each other's.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

/// One look at a round that is not complete yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinProgress {
    /// The round (static: the generation; c10d: the state's round).
    pub round: u64,
    /// Nodes that have joined (this one included).
    pub joined: usize,
    /// Nodes needed (static: nnodes; c10d: min nodes).
    pub needed: usize,
    /// The most that can join (static: nnodes; c10d: max nodes).
    pub max: usize,
    /// Who is known to be missing (static: node ranks that have not arrived); empty when the
    /// backend cannot know (c10d: any node may come).
    pub missing: Vec<String>,
    /// When this node gives up (the join timeout).
    pub deadline: Instant,
}

/// Where the waiting round's looks go: made by the caller of a round, read by its status line.
#[derive(Debug, Clone)]
pub struct Board(Arc<watch::Sender<Option<JoinProgress>>>);

impl Default for Board {
    fn default() -> Self {
        Board(Arc::new(watch::Sender::new(None)))
    }
}

impl Board {
    /// Runs `round` (a rendezvous round's future) with its looks published to this board.
    pub async fn scope<F: Future>(&self, round: F) -> F::Output {
        SCOPE.scope(self.clone(), round).await
    }

    /// Records what the waiting round sees now.
    pub fn publish(&self, p: JoinProgress) {
        self.0.send_replace(Some(p));
    }

    /// Forgets it (the round completed or failed).
    pub fn clear(&self) {
        self.0.send_replace(None);
    }

    /// What the waiting round saw last, if one is waiting.
    pub fn current(&self) -> Option<JoinProgress> {
        self.0.borrow().clone()
    }
}

tokio::task_local! {
    /// The board of the round being polled (set by [`Board::scope`] for that future only).
    static SCOPE: Board;
}

/// Records what the waiting round sees now on its caller's board (none: dropped).
fn publish(p: JoinProgress) {
    let _ = SCOPE.try_with(|b| b.publish(p));
}

/// How often a static round re-reads who has arrived (it costs store requests).
const STATIC_LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// Above this many nodes a static round counts arrivals but does not name the missing ones
/// (naming costs one request per node and look).
const NAME_MISSING_UP_TO: usize = 16;

/// A c10d round in its wait step (no store requests: the state is at hand). Who is missing is
/// unknown (any node may join), so only the count is shown.
pub fn c10d(round: u64, joined: usize, min: usize, max: usize, deadline: tokio::time::Instant) {
    publish(JoinProgress {
        round,
        joined,
        needed: min,
        max,
        missing: Vec::new(),
        deadline: deadline.into_std(),
    });
}

/// A static round waiting for its nodes: at most every [`STATIC_LOOK_EVERY`] (`last`), reads
/// the arrival count and which node ranks have not registered (`nproc_keys[r]` is rank r's).
/// Store errors only skip the look: the round's own loop handles them.
pub async fn look_static<S: super::store::RdzvStore>(
    store: &S,
    round: u64,
    arrived_key: &str,
    nproc_keys: &[String],
    deadline: tokio::time::Instant,
    last: &mut Option<tokio::time::Instant>,
) {
    let now = tokio::time::Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < STATIC_LOOK_EVERY) {
        return;
    }
    *last = Some(now);
    let Ok(joined) = store.add(arrived_key, 0).await else {
        return;
    };
    let mut missing = Vec::new();
    if nproc_keys.len() <= NAME_MISSING_UP_TO {
        for (rank, key) in nproc_keys.iter().enumerate() {
            if let Ok(None) = super::store::try_get(store, key).await {
                missing.push(format!("node rank {rank}"));
            }
        }
    }
    publish(JoinProgress {
        round,
        joined: joined.max(0) as usize,
        needed: nproc_keys.len(),
        max: nproc_keys.len(),
        missing,
        deadline: deadline.into_std(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(round: u64) -> JoinProgress {
        JoinProgress {
            round,
            joined: 1,
            needed: 2,
            max: 2,
            missing: Vec::new(),
            deadline: Instant::now(),
        }
    }

    #[tokio::test]
    async fn a_look_reaches_only_the_board_of_its_scope() {
        let a = Board::default();
        let b = Board::default();
        a.scope(async { publish(look(1)) }).await;
        assert_eq!(a.current().map(|p| p.round), Some(1));
        assert_eq!(b.current(), None);
        // Outside any scope: published nowhere.
        publish(look(2));
        assert_eq!(a.current().map(|p| p.round), Some(1));
        a.clear();
        assert_eq!(a.current(), None);
    }
}
