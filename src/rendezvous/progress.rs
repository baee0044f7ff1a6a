//! What a rendezvous round waiting for nodes has seen so far (joined N of M, which are missing,
//! the deadline), for the launcher's status line (issue 12: "while waiting for nodes: a status
//! line every few seconds ... not silence for 600 s").
//!
//! A process-wide board rather than a value threaded through every backend: the backends'
//! wait loops publish with one call each ([`publish`]) and the supervisor's status line reads
//! it ([`current`]). One rdrun process runs one rendezvous at a time; library tests that run
//! several in one process only write it (nothing in them reads it).

use std::sync::Mutex;
use std::time::Instant;

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

static BOARD: Mutex<Option<JoinProgress>> = Mutex::new(None);

/// Records what the waiting round sees now.
pub fn publish(p: JoinProgress) {
    *BOARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
}

/// Forgets it (the round completed or failed).
pub fn clear() {
    *BOARD.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// What the waiting round saw last, if one is waiting.
pub fn current() -> Option<JoinProgress> {
    BOARD.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
