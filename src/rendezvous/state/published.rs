//! What a round's state publishes in store keys of its own (issue 16: no node reads the O(n)
//! body to run), and the [`Assignment`] each node builds from them: the small [`Head`] every node
//! polls, each node's [`Notice`] (its list and watched peers), a complete round's [`roster`] and
//! its summary ([`round_summary`]). Pure functions of [`RdzvState`], like the rest of `state`.

use serde::{Deserialize, Serialize};
use std::collections::HashSet;

use super::{watch_lists, RdzvState, RoundReason, StateError, NO_STATE, STATE_FORMAT, WATCHERS};

/// What one agent runs with in a completed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub round: u64,
    /// GROUP_RANK.
    pub group_rank: usize,
    /// GROUP_WORLD_SIZE.
    pub group_world_size: usize,
    /// LOCAL_WORLD_SIZE of this node.
    pub local_world_size: usize,
    /// RANK of local rank 0: the sum of the nproc of lower group ranks.
    pub base_rank: usize,
    /// WORLD_SIZE: the sum of every node's nproc.
    pub world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    /// TORCHELASTIC_RESTART_COUNT, equal on every node (job-wide).
    pub restart_count: u32,
    /// Why this round started.
    pub reason: RoundReason,
    /// Store key prefix for this round's agent keys (exit barrier), without trailing "/".
    pub store_prefix: String,
    /// `(addr, nproc)` of every node in group-rank order, or empty where the rendezvous does
    /// not read every node's entry: c10d rounds above [`ROSTER_EAGER_MAX`] nodes (issue 16: a
    /// 10,000-node roster read by every node is 2 GB through the store) and single-node runs.
    pub nodes: Vec<(String, usize)>,
    /// Every node runs the same number of workers (known even when `nodes` is empty).
    pub uniform_nproc: bool,
}

/// c10d participants of a round of up to this many nodes read its whole roster (and fill
/// [`Assignment::nodes`]); above, each reads the round's summary and its own notice only
/// (O(1) bytes per node), and the roster only where a loss needs the peers' ids.
pub const ROSTER_EAGER_MAX: usize = 256;

/// Ranks from per-node nproc in group-rank order: `(base_rank, world_size)` for `group_rank`.
pub fn base_rank(nprocs: &[usize], group_rank: usize) -> (usize, usize) {
    (
        nprocs[..group_rank.min(nprocs.len())].iter().sum(),
        nprocs.iter().sum(),
    )
}

/// The assignment of `id` in a complete state, or `None` if it is not a participant.
pub fn assignment(state: &RdzvState, id: &str, store_prefix: &str) -> Option<Assignment> {
    if !state.complete {
        return None;
    }
    let group_rank = state.participants.iter().position(|m| m.id == id)?;
    let nprocs: Vec<usize> = state.participants.iter().map(|m| m.nproc).collect();
    let (base, world) = base_rank(&nprocs, group_rank);
    let master = &state.participants[0];
    Some(Assignment {
        round: state.round,
        group_rank,
        group_world_size: state.participants.len(),
        local_world_size: state.participants[group_rank].nproc,
        base_rank: base,
        world_size: world,
        master_addr: master.addr.clone(),
        master_port: master.master_port,
        restart_count: state.restart_count,
        reason: state.reason,
        store_prefix: format!("{store_prefix}.{}", state.round),
        nodes: state
            .participants
            .iter()
            .map(|m| (m.addr.clone(), m.nproc))
            .collect(),
        uniform_nproc: nprocs.iter().all(|n| *n == nprocs[0]),
    })
}

/// How many members one writer's notices cover per `multi_set` (keeps a request well under the
/// store's limits at any size).
pub const NOTICE_CHUNK: usize = 512;

/// The small key every agent reads (`<prefix>/state`): the summary of the current state and
/// where its body (the full [`RdzvState`], O(n) bytes) is. Writes compare-and-set this head, so
/// a lost race costs a few hundred bytes instead of the whole state (issue 16); the body key is
/// written once, before the head that names it, and never changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub format: u32,
    /// Incremented by every write (the body key is unique per write).
    pub seq: u64,
    /// The body's key, relative to the run's prefix.
    pub body: String,
    pub round: u64,
    pub complete: bool,
    pub closed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_reason: Option<String>,
    pub reason: RoundReason,
    pub restart_count: u32,
    pub participants: usize,
    pub waiting: usize,
    pub redundant: usize,
    pub last_call_seq: u64,
}

impl Head {
    /// The head of `state` written as write number `seq` with its body at `body`.
    pub fn of(state: &RdzvState, seq: u64, body: &str) -> Self {
        Self {
            format: STATE_FORMAT,
            seq,
            body: body.to_string(),
            round: state.round,
            complete: state.complete,
            closed: state.closed,
            closed_reason: state.closed_reason.clone(),
            reason: state.reason,
            restart_count: state.restart_count,
            participants: state.participants.len(),
            waiting: state.wait_list.len(),
            redundant: state.redundancy_list.len(),
            last_call_seq: state.last_call_seq,
        }
    }

    /// Parses the head key's text: `None` for [`NO_STATE`] (nothing written yet).
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, StateError> {
        if bytes == NO_STATE {
            return Ok(None);
        }
        #[derive(Deserialize)]
        struct Probe {
            format: u32,
        }
        let probe: Probe =
            serde_json::from_slice(bytes).map_err(|e| StateError::Foreign(e.to_string()))?;
        if probe.format != STATE_FORMAT {
            return Err(StateError::Format {
                found: probe.format,
            });
        }
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| StateError::Foreign(e.to_string()))
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("head is plain data and always serializes")
    }
}

/// [`watch_targets`](super::watch_targets) of every known node at once, in O(n) (a writer publishes them all).
pub fn all_watch_targets(state: &RdzvState) -> Vec<(String, Vec<String>)> {
    let (parts, others) = watch_lists(state);
    fn push(out: &mut Vec<String>, me: &str, id: &str) {
        if id != me && !out.iter().any(|o| o == id) {
            out.push(id.to_string());
        }
    }
    let n = parts.len();
    let mut pt: Vec<Vec<String>> = vec![Vec::new(); n];
    for (i, t) in pt.iter_mut().enumerate() {
        for d in 1..=WATCHERS.min(n.saturating_sub(1)) {
            push(t, parts[i], parts[(i + d) % n]);
        }
    }
    let m = others.len();
    let mut ot: Vec<Vec<String>> = vec![Vec::new(); m];
    for (j, o) in others.iter().enumerate() {
        if n > 0 {
            for d in 0..WATCHERS {
                let i = (j + d) % n;
                push(&mut pt[i], parts[i], o);
            }
            for d in 0..WATCHERS.min(n) {
                push(&mut ot[j], o, parts[(j + d) % n]);
            }
        } else {
            for d in 1..=WATCHERS.min(m - 1) {
                push(&mut ot[j], o, others[(j + d) % m]);
            }
        }
    }
    parts
        .iter()
        .map(|p| p.to_string())
        .zip(pt)
        .chain(others.iter().map(|o| o.to_string()).zip(ot))
        .collect()
}

/// What a node's notice key says about it in one round: which list it is on (`p` participant,
/// `e` expected but not rejoined, `w` wait list, `r` redundancy list, `x` no longer in any) and
/// the peers it watches.
/// A participant's notice in a complete round also carries its group rank and base rank
/// (encoded `p=<group_rank>,<base_rank> <targets>`): with the round's summary
/// ([`round_summary`]) that is its whole assignment, without reading the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub status: char,
    /// `(group_rank, base_rank)`: a participant of a complete round.
    pub rank: Option<(usize, usize)>,
    pub targets: Vec<String>,
}

impl Notice {
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::from(self.status);
        if let Some((g, b)) = self.rank {
            s.push_str(&format!("={g},{b}"));
        }
        for t in &self.targets {
            s.push(' ');
            s.push_str(t);
        }
        s.into_bytes()
    }
    pub fn decode(v: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(v).ok()?;
        let mut it = text.split(' ');
        let first = it.next()?;
        let mut chars = first.chars();
        let status = chars.next()?;
        let rest = chars.as_str();
        let rank = match rest.strip_prefix('=') {
            None if rest.is_empty() => None,
            None => return None,
            Some(r) => {
                let (g, b) = r.split_once(',')?;
                Some((g.parse().ok()?, b.parse().ok()?))
            }
        };
        Some(Self {
            status,
            rank,
            targets: it.filter(|t| !t.is_empty()).map(str::to_string).collect(),
        })
    }
}

/// Every known node's notice in `state`.
fn all_notices(state: &RdzvState) -> Vec<(String, Notice)> {
    let parts: HashSet<&str> = state.participants.iter().map(|m| m.id.as_str()).collect();
    let wait: HashSet<&str> = state.wait_list.iter().map(|m| m.id.as_str()).collect();
    let red: HashSet<&str> = state
        .redundancy_list
        .iter()
        .map(|m| m.id.as_str())
        .collect();
    // A complete round's participants learn their ranks from their notices.
    let mut ranks: std::collections::HashMap<&str, (usize, usize)> = Default::default();
    if state.complete {
        let mut base = 0;
        for (g, m) in state.participants.iter().enumerate() {
            ranks.insert(m.id.as_str(), (g, base));
            base += m.nproc;
        }
    }
    let mut out = Vec::new();
    for (id, targets) in all_watch_targets(state) {
        let rank = ranks.get(id.as_str()).copied();
        let status = if parts.contains(id.as_str()) {
            'p'
        } else if wait.contains(id.as_str()) {
            'w'
        } else if red.contains(id.as_str()) {
            'r'
        } else {
            // Expected, not rejoined: no key (it waits to be admitted; participants watch it).
            continue;
        };
        out.push((
            id,
            Notice {
                status,
                rank,
                targets,
            },
        ));
    }
    out
}

/// The notices a writer publishes after replacing `old` with `new` (issue 16): nodes wait on
/// their own small key instead of reading the O(n) state. Within one round only the nodes
/// whose notice changed (and `x` for the ones dropped); for a new round (or no `old`) every
/// node of it. A closed state needs none (the head says so).
pub fn notices(old: Option<&RdzvState>, new: &RdzvState) -> Vec<(String, Notice)> {
    if new.closed {
        return Vec::new();
    }
    let fresh = all_notices(new);
    let Some(old) = old.filter(|o| o.round == new.round && !o.closed) else {
        return fresh;
    };
    let before: std::collections::HashMap<String, Notice> = all_notices(old).into_iter().collect();
    let now: std::collections::HashSet<&str> = fresh.iter().map(|(id, _)| id.as_str()).collect();
    let mut gone: Vec<(String, Notice)> = before
        .keys()
        .filter(|id| !now.contains(id.as_str()))
        .map(|id| {
            (
                id.clone(),
                Notice {
                    status: 'x',
                    rank: None,
                    targets: Vec::new(),
                },
            )
        })
        .collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    fresh
        .into_iter()
        .filter(|(id, n)| before.get(id) != Some(n))
        .chain(gone)
        .collect()
}

/// The compact roster of a complete round (issue 16): a header line
/// `rdrun-roster <round> <restart_count> <reason> <master_port>` and one `<id> <nproc>` line per
/// participant in group-rank order. Written once when the round completes; every participant
/// reads it once and builds its [`Assignment`] from it ([`roster_assignment`]).
pub fn roster(state: &RdzvState) -> Vec<u8> {
    let port = state.participants.first().map_or(0, |m| m.master_port);
    let mut out = format!(
        "rdrun-roster {} {} {} {port}\n",
        state.round,
        state.restart_count,
        state.reason.name()
    );
    for m in &state.participants {
        out.push_str(&m.id);
        out.push(' ');
        out.push_str(&m.nproc.to_string());
        out.push('\n');
    }
    out.into_bytes()
}

/// The address part of a node id (`<addr>_<pid>_<local_id>`).
pub fn id_addr(id: &str) -> &str {
    id.rsplitn(3, '_').nth(2).unwrap_or(id)
}

/// The roster's participant ids, in group-rank order (`None`: not a roster).
pub fn roster_ids(roster: &[u8]) -> Option<Vec<String>> {
    let text = std::str::from_utf8(roster).ok()?;
    let mut lines = text.lines();
    lines.next()?.strip_prefix("rdrun-roster ")?;
    lines
        .map(|l| l.split(' ').next().map(str::to_string))
        .collect()
}

/// `id`'s assignment from a roster ([`roster`]); `None` if it is not in it or the roster is bad.
/// Equal to [`assignment`] on the state the roster was made from.
pub fn roster_assignment(roster: &[u8], id: &str, store_prefix: &str) -> Option<Assignment> {
    let text = std::str::from_utf8(roster).ok()?;
    let nl = text.find('\n').unwrap_or(text.len());
    let head: Vec<&str> = text[..nl].split(' ').collect();
    if head.len() != 5 || head[0] != "rdrun-roster" {
        return None;
    }
    let round: u64 = head[1].parse().ok()?;
    let restart_count: u32 = head[2].parse().ok()?;
    let reason = RoundReason::from_name(head[3])?;
    let master_port: u16 = head[4].parse().ok()?;
    // One pass over bytes: every participant reads this once per round, and a round of 10,000
    // nodes has 10,000 lines (issue 16: the per-node cost of a join).
    let rest = text.get(nl + 1..).unwrap_or("").as_bytes();
    let mut nodes: Vec<(String, usize)> = Vec::with_capacity(rest.len() / 16 + 1);
    let mut group_rank = None;
    let mut first = None;
    for line in rest.split(|b| *b == b'\n') {
        if line.is_empty() {
            continue;
        }
        let sp = line.iter().rposition(|b| *b == b' ')?;
        let (nid, nproc) = (&line[..sp], &line[sp + 1..]);
        let mut np: usize = 0;
        for d in nproc {
            if !d.is_ascii_digit() {
                return None;
            }
            np = np.checked_mul(10)?.checked_add(usize::from(d - b'0'))?;
        }
        if nid == id.as_bytes() {
            group_rank = Some(nodes.len());
        }
        let nid = std::str::from_utf8(nid).ok()?;
        if first.is_none() {
            first = Some(nid);
        }
        nodes.push((id_addr(nid).to_string(), np));
    }
    let group_rank = group_rank?;
    let nprocs: Vec<usize> = nodes.iter().map(|n| n.1).collect();
    let (base, world) = base_rank(&nprocs, group_rank);
    Some(Assignment {
        round,
        group_rank,
        group_world_size: nodes.len(),
        local_world_size: nodes[group_rank].1,
        base_rank: base,
        world_size: world,
        master_addr: id_addr(first?).to_string(),
        master_port,
        restart_count,
        reason,
        store_prefix: format!("{store_prefix}.{round}"),
        uniform_nproc: nprocs.iter().all(|n| *n == nprocs[0]),
        nodes,
    })
}

/// The small summary of a complete round (issue 16), the key its participants wait on:
/// `rdrun-round <round> <restart_count> <reason> <master_port> <group_world_size> <world_size>
/// <nproc | mixed> <master id>`. With its own notice's ranks it is a node's whole assignment
/// ([`summary_assignment`]); the roster ([`roster`]) is read only by rounds up to
/// [`ROSTER_EAGER_MAX`] nodes, and after a failure.
pub fn round_summary(state: &RdzvState) -> Vec<u8> {
    let ps = &state.participants;
    let port = ps.first().map_or(0, |m| m.master_port);
    let world: usize = ps.iter().map(|m| m.nproc).sum();
    let nproc = match ps.first() {
        Some(f) if ps.iter().all(|m| m.nproc == f.nproc) => f.nproc.to_string(),
        _ => "mixed".to_string(),
    };
    format!(
        "rdrun-round {} {} {} {port} {} {world} {nproc} {}",
        state.round,
        state.restart_count,
        state.reason.name(),
        ps.len(),
        ps.first().map_or("", |m| m.id.as_str()),
    )
    .into_bytes()
}

/// A round summary's fields ([`round_summary`]).
struct Summary<'a> {
    round: u64,
    restart_count: u32,
    reason: RoundReason,
    master_port: u16,
    group_world_size: usize,
    world_size: usize,
    uniform: bool,
    master_id: &'a str,
}

fn parse_summary(summary: &[u8]) -> Option<Summary<'_>> {
    let f: Vec<&str> = std::str::from_utf8(summary).ok()?.split(' ').collect();
    if f.len() != 9 || f[0] != "rdrun-round" {
        return None;
    }
    Some(Summary {
        round: f[1].parse().ok()?,
        restart_count: f[2].parse().ok()?,
        reason: RoundReason::from_name(f[3])?,
        master_port: f[4].parse().ok()?,
        group_world_size: f[5].parse().ok()?,
        world_size: f[6].parse().ok()?,
        uniform: f[7] != "mixed",
        master_id: f[8],
    })
}

/// The number of nodes of a round summary (`None`: not a summary).
pub fn summary_size(summary: &[u8]) -> Option<usize> {
    parse_summary(summary).map(|s| s.group_world_size)
}

/// The assignment of a participant running `nproc` workers from the round's summary and its
/// own notice (which carries its group and base rank), with [`Assignment::nodes`] empty; `None`
/// if they do not fit together (another round, no ranks, out of range). Equal to
/// [`assignment`] on the state they were made from, but for `nodes`.
pub fn summary_assignment(
    summary: &[u8],
    notice: &Notice,
    nproc: usize,
    store_prefix: &str,
) -> Option<Assignment> {
    let s = parse_summary(summary)?;
    let (group_rank, base_rank) = notice.rank.filter(|_| notice.status == 'p')?;
    if group_rank >= s.group_world_size || base_rank + nproc > s.world_size {
        return None;
    }
    Some(Assignment {
        round: s.round,
        group_rank,
        group_world_size: s.group_world_size,
        local_world_size: nproc,
        base_rank,
        world_size: s.world_size,
        master_addr: id_addr(s.master_id).to_string(),
        master_port: s.master_port,
        restart_count: s.restart_count,
        reason: s.reason,
        store_prefix: format!("{store_prefix}.{}", s.round),
        nodes: Vec::new(),
        uniform_nproc: s.uniform,
    })
}
