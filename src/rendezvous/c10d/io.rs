//! The c10d driver's store I/O: the state (head, body, version) read and written with
//! compare-and-set, the per-node keys a write publishes, notices, heartbeats and the joiners list.

use super::*;

/// A read of the rendezvous state that failed: the store, or a state that is not rdrun's.
#[derive(Debug)]
pub(super) enum ReadError {
    Store(StoreOpError),
    State(StateError),
}

impl From<StoreOpError> for ReadError {
    fn from(e: StoreOpError) -> Self {
        Self::Store(e)
    }
}

impl From<StateError> for ReadError {
    fn from(e: StateError) -> Self {
        Self::State(e)
    }
}

impl From<ReadError> for RendezvousError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Store(e) => RendezvousError::Store(e),
            ReadError::State(e) => RendezvousError::State(e),
        }
    }
}

/// Reads the head text without blocking and without changing an existing state (creates the
/// [`NO_STATE`] sentinel on a fresh store).
pub(super) async fn read_head<S: RdzvStore>(
    store: &S,
    keys: &Keys,
) -> Result<Vec<u8>, StoreOpError> {
    store.compare_set(&keys.state(), b"", NO_STATE).await
}

/// The body a head names (`Ok(None)`: gone, a newer write replaced it; read the head again).
pub(super) async fn read_body<S: RdzvStore>(
    store: &S,
    head: Option<&Head>,
) -> Result<Option<RdzvState>, ReadError> {
    let Some(h) = head else {
        return Ok(Some(RdzvState::default()));
    };
    match try_get(store, &h.body).await? {
        None => Ok(None),
        Some(b) => Ok(Some(RdzvState::decode(&b)?)),
    }
}

/// The current head text and the full state it names: O(n) bytes, read only by writers and on
/// rare paths (issue 16).
pub(super) async fn load_state<S: RdzvStore>(
    store: &S,
    keys: &Keys,
) -> Result<(Vec<u8>, RdzvState), ReadError> {
    for _ in 0..100 {
        let text = read_head(store, keys).await?;
        let head = Head::decode(&text)?;
        if let Some(st) = read_body(store, head.as_ref()).await? {
            return Ok((text, st));
        }
    }
    Err(ReadError::Store(StoreOpError(
        "the rendezvous state kept changing while being read".into(),
    )))
}

/// The state's version counter (empty before the first write).
pub(super) async fn read_version<S: RdzvStore>(
    store: &S,
    keys: &Keys,
) -> Result<Vec<u8>, StoreOpError> {
    Ok(try_get(store, &keys.version()).await?.unwrap_or_default())
}

/// What a write did: the head now stored, ours or another writer's.
pub(super) enum Wrote {
    Won(Vec<u8>),
    Lost(Vec<u8>),
}

/// Writes `new` (computed from `old`, read at head text `expected`): its body under a key of its
/// own, then the head with compare-and-set against `expected`. When it went through, publishes
/// what the nodes wait on instead of reading the state ([`publish`]), removes the previous
/// body and bumps the version so that every monitor reads the new head.
pub(super) async fn write_state<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    expected: &[u8],
    old: Option<&RdzvState>,
    new: &RdzvState,
) -> Result<Wrote, StoreOpError> {
    let prev = Head::decode(expected).ok().flatten();
    let seq = prev.as_ref().map_or(1, |h| h.seq + 1);
    let body = keys.body(seq);
    store.set(&body, &new.encode()).await?;
    let desired = Head::of(new, seq, &body).encode();
    let got = match store.compare_set(&keys.state(), expected, &desired).await {
        Ok(g) => g,
        Err(e) => {
            let _ = store.delete(&body).await;
            return Err(e);
        }
    };
    if got != desired {
        let _ = store.delete(&body).await;
        return Ok(Wrote::Lost(got));
    }
    publish(store, keys, old, new).await;
    if let Some(p) = prev {
        let _ = store.delete(&p.body).await;
    }
    if let Err(e) = store.add(&keys.version(), 1).await {
        // Monitors see this write with the next one (or the next version bump).
        tracing::debug!(error = %e, "bumping the rendezvous state version failed");
    }
    Ok(Wrote::Won(desired))
}

/// After a write: every node whose place or watched peers changed gets its notice key (one
/// `multi_set` per [`state::NOTICE_CHUNK`] nodes; a participant's notice carries its ranks once
/// the round is complete), and a round that just completed gets its roster and then its
/// summary (what the participants wait on). Best effort: a node that misses its notice finds
/// its place in the state when its wait runs out.
pub(super) async fn publish<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    old: Option<&RdzvState>,
    new: &RdzvState,
) {
    let notes = state::notices(old, new);
    for chunk in notes.chunks(state::NOTICE_CHUNK) {
        let pairs: Vec<(String, Vec<u8>)> = chunk
            .iter()
            .map(|(id, n)| (keys.notice(new.round, id), n.encode()))
            .collect();
        if let Err(e) = store.multi_set(&pairs).await {
            tracing::debug!(error = %e, "publishing rendezvous notices failed");
        }
    }
    let newly_complete = old.map_or(true, |o| o.round != new.round || !o.complete);
    if new.complete && !new.closed && newly_complete {
        let written = store
            .multi_set(&[
                (keys.roster(new.round), state::roster(new)),
                (keys.complete(new.round), state::round_summary(new)),
            ])
            .await;
        if let Err(e) = written {
            tracing::debug!(error = %e, "writing the round's roster and summary failed");
        }
    }
}

/// This node's own notice in `round`, if one was published.
pub(super) async fn read_notice<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    round: u64,
    id: &str,
) -> Result<Option<Notice>, StoreOpError> {
    Ok(try_get(store, &keys.notice(round, id))
        .await?
        .and_then(|v| Notice::decode(&v)))
}

/// `id`'s notice as the state itself says (after reading the state).
pub(super) fn own_notice(state: &RdzvState, id: &str) -> Option<Notice> {
    let status = if state.is_participant(id) {
        'p'
    } else if state.in_wait_list(id) {
        'w'
    } else if state.in_redundancy_list(id) {
        'r'
    } else {
        return None;
    };
    let rank = if status == 'p' && state.complete {
        let g = state.participants.iter().position(|m| m.id == id)?;
        Some((g, state.participants[..g].iter().map(|m| m.nproc).sum()))
    } else {
        None
    };
    Some(Notice {
        status,
        rank,
        targets: watch_targets(state, id),
    })
}

/// A decimal counter's value (0 when it is not one).
pub(super) fn parse_count(v: &[u8]) -> i64 {
    std::str::from_utf8(v)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The heartbeat counters of `ids` (each key exists: a node beats before it joins any list).
pub(super) async fn read_beats<S: RdzvStore>(
    store: &S,
    keys: &Keys,
    ids: Vec<String>,
) -> Result<Vec<(String, Vec<u8>)>, StoreOpError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let hb_keys: Vec<String> = ids.iter().map(|id| keys.hb(id)).collect();
    let values = store.multi_get(&hb_keys).await?;
    Ok(ids.into_iter().zip(values).collect())
}

/// The announced joiners of a round: one JSON member per line, first announcement per id kept.
pub(super) fn parse_joiners(list: &[u8]) -> Vec<Member> {
    let mut out: Vec<Member> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for line in list.split(|b| *b == b'\n') {
        if let Ok(m) = serde_json::from_slice::<Member>(line) {
            if seen.insert(m.id.clone()) {
                out.push(m);
            }
        }
    }
    out
}

/// The head of a store nobody wrote yet.
pub(super) fn empty_head() -> Head {
    Head::of(&RdzvState::default(), 0, "")
}

/// The participants of the round an agent runs: the roster it read, the ids from the state, or
/// the round whose roster it did not read (above [`state::ROSTER_EAGER_MAX`] nodes).
pub(super) enum RoundPeers {
    Roster(Vec<u8>),
    Ids(Vec<String>),
    Unread(u64),
}

impl RoundPeers {
    /// The other participants' ids (the roster read now if it was not before; empty if that
    /// fails).
    pub(super) async fn ids<S: RdzvStore>(&self, store: &S, keys: &Keys, me: &str) -> Vec<String> {
        let all = match self {
            Self::Roster(r) => state::roster_ids(r).unwrap_or_default(),
            Self::Ids(ids) => ids.clone(),
            Self::Unread(round) => match try_get(store, &keys.roster(*round)).await {
                Ok(Some(r)) => state::roster_ids(&r).unwrap_or_default(),
                _ => Vec::new(),
            },
        };
        all.into_iter().filter(|p| p != me).collect()
    }
}
