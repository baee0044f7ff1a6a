//! The collapse stage of the console writer (`--output collapse`, issue 29): a line that several
//! ranks print identically within the window is written once, prefixed with its ranks
//! (`[0-3,5] epoch 1 loss 0.53`); a line only one rank printed is written as it came.
//!
//! Rules (why each holds):
//! - Identity is the exact bytes of the line after the rank's console prefix, terminator
//!   included, per stream: numbers that differ slightly are different lines.
//! - Every line waits at most the window: each entry is due `window` after its first line came,
//!   and the oldest pending entry is always written first once due (entries it must follow are
//!   written before it, early).
//! - Nothing is lost or duplicated: each line of each rank lands in exactly one entry.
//! - A rank's lines keep their order. Each entry remembers, for each of its ranks, that rank's
//!   previous pending entry, and is written only after those. Entries carry a level (above the
//!   level of every entry they must follow); a rank's line joins the oldest entry of its text
//!   whose level is above the level of the rank's latest entry, or that nothing follows yet (its
//!   level is then raised), so "must follow" never forms a cycle (it would otherwise: rank 0
//!   prints A then B, rank 1 B then A).

//!
//! The writer (`console`) feeds whole-line chunks here and writes what [`Collapser::due`]
//! returns through its usual path (open lines, budget, flushes); chunks that are not plain whole
//! lines (a prompt's open line, its continuation) make it write everything pending first, so
//! nothing of the same source is overtaken.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use tokio::sync::OwnedSemaphorePermit;

use super::chunk::Chunk;
use super::own::Stream;

/// Most bytes the stage holds, and most console budget its pending lines keep: past either the
/// oldest lines are written before their window ends. Half the console budget, so that the
/// stage never makes the forwarders (and so the workers) wait; only a slow terminal does, as
/// without it.
/// (`console` checks that it is half its `CONSOLE_BUDGET`; not imported here, which would make
/// the two files import each other.)
pub(crate) const PENDING_CAP: usize = 2 << 20;

/// One line as the console will write it, and the ranks that printed it.
struct Entry {
    index: u64,
    stream: Stream,
    /// The line as the first rank's chunk had it (its own prefix), written when no other rank
    /// joins: `body[start..end]`, the chunk's body shared by its lines (no copy per line); the
    /// text compared is the part after the prefix (`plen` bytes), terminator included.
    body: Arc<Vec<u8>>,
    start: usize,
    end: usize,
    plen: usize,
    /// The ranks that printed it, in the order they came, as dense ids (`Collapser::rank_of`).
    ranks: SmallVec<[u32; 4]>,
    first: Instant,
    /// Above the level of every entry this one must follow.
    level: u64,
    /// The entries this one must follow (each rank's previous pending entry).
    after: SmallVec<[u64; 2]>,
    /// Budget of the chunks whose last line is this entry (given back once it is written).
    permit: Option<OwnedSemaphorePermit>,
}

impl Entry {
    fn line(&self) -> &[u8] {
        &self.body[self.start..self.end]
    }

    fn text(&self) -> &[u8] {
        &self.body[self.start + self.plen..self.end]
    }
}

/// The pending lines of the collapse window.
pub(crate) struct Collapser {
    window: Duration,
    /// Pending entries by index: `entries[i - base]`; a written one leaves `None` until the
    /// ones before it are written too.
    entries: VecDeque<Option<Entry>>,
    base: u64,
    next: u64,
    /// Bytes of the pending lines, and console budget the pending entries keep.
    bytes: usize,
    budget: usize,
    hasher: RandomState,
    /// The entries of each (stream, text) hash, oldest first; some may have been written
    /// since (see [`Collapser::sweep`]).
    by_text: HashMap<u64, SmallVec<[u64; 2]>, RandomState>,
    /// How many entries are pending.
    pending: usize,
    /// Each global rank's dense id (looked up once per chunk), and back.
    ids: HashMap<usize, u32, RandomState>,
    rank_of: Vec<usize>,
    /// Latest entry index that holds a line of each (dense id, stream index): `id * 2 + stream`.
    /// A vector, not a map: it is read and written for every line.
    last_of_rank: Vec<Option<u64>>,
    /// The last `[ranks] ` prefix written, for the rank set it was made of (most collapsed lines
    /// of a run share one).
    last_set: (SmallVec<[usize; 8]>, Vec<u8>),
    /// How many ranks' output reaches the console.
    ranks: usize,
    /// Entries every rank joined: written without waiting for the window.
    complete: Vec<u64>,
    /// Source ids of the chunks this stage writes, one per stream.
    sources: [u64; 2],
}

impl Collapser {
    /// `ranks`: how many ranks' output reaches this console; an entry that has them all is
    /// written at once instead of at the end of the window (0: never early).
    pub(crate) fn new(window: Duration, ranks: usize, sources: [u64; 2]) -> Collapser {
        Collapser {
            window,
            entries: VecDeque::new(),
            base: 0,
            next: 0,
            bytes: 0,
            budget: 0,
            hasher: RandomState::default(),
            by_text: HashMap::default(),
            pending: 0,
            ids: HashMap::default(),
            rank_of: Vec::new(),
            last_of_rank: Vec::new(),
            last_set: (SmallVec::new(), Vec::new()),
            ranks,
            complete: Vec::new(),
            sources,
        }
    }

    /// Whether this stage takes `chunk`: whole lines of a known rank, nothing open or continued.
    pub(crate) fn takes(chunk: &Chunk) -> bool {
        chunk.rank.is_some()
            && chunk.stream.is_some()
            && !chunk.open
            && !chunk.continues
            && !chunk.line_ends.is_empty()
    }

    fn get(&self, index: u64) -> Option<&Entry> {
        entry(&self.entries, self.base, index)
    }

    fn get_mut(&mut self, index: u64) -> Option<&mut Entry> {
        let i = usize::try_from(index.checked_sub(self.base)?).ok()?;
        self.entries.get_mut(i)?.as_mut()
    }

    /// Files the lines of a chunk that [`Collapser::takes`]; its budget stays with its last
    /// line (a rank's lines are written in order, so that one is written last).
    pub(crate) fn push(
        &mut self,
        chunk: Chunk,
        permit: Option<OwnedSemaphorePermit>,
        now: Instant,
    ) {
        let (Some(global), Some(stream)) = (chunk.rank, chunk.stream) else {
            return;
        };
        let rank = self.id(global);
        let slot = rank as usize * 2 + stream.index();
        let mut start = 0usize;
        let mut last = None;
        let body = Arc::new(chunk.body);
        for &end in &chunk.line_ends {
            let end = end as usize;
            let line_start = start;
            let line = &body[start..end];
            start = end;
            let plen = if line.starts_with(&chunk.prefix) {
                chunk.prefix.len()
            } else {
                0
            };
            let text = &line[plen..];
            let key = self.hasher.hash_one((stream.index(), text));
            // The rank's latest pending entry, and its level (0: none pending).
            let prev = self.last_of_rank[slot];
            let floor = prev
                .and_then(|i| entry(&self.entries, self.base, i))
                .map_or(0, |e| e.level);
            if self.by_text.len() > 2 * self.pending + 64 {
                self.sweep();
            }
            // One hash lookup per line (the table is large at high line rates: each access
            // is a cache miss). Its list may name entries written since: they are skipped
            // and dropped here, or by the sweep.
            let (entries, base, last_of_rank) = (&self.entries, self.base, &self.last_of_rank);
            let list = self.by_text.entry(key).or_default();
            list.retain(|i| entry(entries, base, *i).is_some());
            // The oldest entry of this text that the line may join without a cycle.
            let join = list.iter().copied().find(|&i| {
                entry(entries, base, i).is_some_and(|e| {
                    e.stream == stream && e.text() == text && joinable(e, last_of_rank, rank, floor)
                })
            });
            if join.is_none() {
                list.push(self.next);
            }
            let all = self.ranks;
            let index = match join.and_then(|i| self.get_mut(i)) {
                Some(e) => {
                    e.ranks.push(rank);
                    e.after.extend(prev);
                    e.level = e.level.max(floor + 1);
                    let index = e.index;
                    if e.ranks.len() == all {
                        self.complete.push(index);
                    }
                    index
                }
                None => {
                    let index = self.next;
                    self.next += 1;
                    self.bytes += line.len();
                    self.entries.push_back(Some(Entry {
                        index,
                        stream,
                        body: body.clone(),
                        start: line_start,
                        end,
                        plen,
                        ranks: smallvec::smallvec![rank],
                        first: now,
                        level: floor + 1,
                        after: prev.into_iter().collect(),
                        permit: None,
                    }));
                    self.pending += 1;
                    if all == 1 {
                        self.complete.push(index);
                    }
                    index
                }
            };
            self.last_of_rank[slot] = Some(index);
            last = Some(index);
        }
        if let (Some(p), Some(e)) = (permit, last.and_then(|i| self.get_mut(i))) {
            let n = p.num_permits();
            match &mut e.permit {
                Some(held) => held.merge(p),
                None => e.permit = Some(p),
            }
            self.budget += n;
        }
    }

    /// The dense id of global rank `rank` (its `last_of_rank` slots made on first sight).
    fn id(&mut self, rank: usize) -> u32 {
        if let Some(id) = self.ids.get(&rank) {
            return *id;
        }
        let id = u32::try_from(self.rank_of.len()).unwrap_or(u32::MAX);
        self.ids.insert(rank, id);
        self.rank_of.push(rank);
        self.last_of_rank.extend([None, None]);
        id
    }

    /// The stage holds more than [`PENDING_CAP`] bytes or budget.
    fn over(&self) -> bool {
        self.bytes > PENDING_CAP || self.budget > PENDING_CAP
    }

    /// Once over the cap, lines are written until the stage holds half of it (fewer, larger
    /// writes than one line per arriving chunk).
    fn draining(&self) -> bool {
        self.bytes > PENDING_CAP / 2 || self.budget > PENDING_CAP / 2
    }

    /// Drops written entries from the text index, and texts with none pending (the index is
    /// not updated when an entry is written: that would be one more lookup per line).
    fn sweep(&mut self) {
        let (entries, base) = (&self.entries, self.base);
        self.by_text.retain(|_, list| {
            list.retain(|i| entry(entries, base, *i).is_some());
            !list.is_empty()
        });
    }

    /// When the oldest pending line is due (now when the stage holds too many bytes).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let first = self.oldest().map(|e| e.first + self.window)?;
        Some(if self.over() || !self.complete.is_empty() {
            Instant::now().min(first)
        } else {
            first
        })
    }

    fn oldest(&self) -> Option<&Entry> {
        self.entries.iter().find_map(Option::as_ref)
    }

    /// The index the next entry will get (every pending entry's is lower).
    pub(crate) fn next_index(&self) -> u64 {
        self.next
    }

    /// The index of the oldest pending entry.
    pub(crate) fn oldest_index(&self) -> Option<u64> {
        self.oldest().map(|e| e.index)
    }

    /// The lines due at `now` (all of them when `all`), as chunks in order: consecutive lines
    /// of one stream go in one chunk (one write).
    pub(crate) fn due(
        &mut self,
        now: Instant,
        all: bool,
    ) -> Vec<(Chunk, Option<OwnedSemaphorePermit>)> {
        let mut out: Vec<(Chunk, Option<OwnedSemaphorePermit>)> = Vec::new();
        let mut complete = std::mem::take(&mut self.complete).into_iter();
        let draining = self.over();
        loop {
            // Entries every rank joined (no other rank can join them), then the oldest if due
            // (or if the stage holds too many bytes).
            let next = match complete.next() {
                Some(i) => i,
                None => match self.oldest() {
                    Some(e)
                        if all || (draining && self.draining()) || now >= e.first + self.window =>
                    {
                        e.index
                    }
                    _ => break,
                },
            };
            // After the pending entries it must follow (depth first, no recursion).
            let mut stack: SmallVec<[u64; 8]> = smallvec::smallvec![next];
            while let Some(&i) = stack.last() {
                let before = self
                    .get(i)
                    .and_then(|e| e.after.iter().copied().find(|a| self.get(*a).is_some()));
                match before {
                    Some(a) => stack.push(a),
                    None => {
                        stack.pop();
                        self.write(i, &mut out);
                    }
                }
            }
        }
        out
    }

    /// Moves entry `i` out of the window into `out`.
    fn write(&mut self, i: u64, out: &mut Vec<(Chunk, Option<OwnedSemaphorePermit>)>) {
        let Some(slot) = usize::try_from(i.wrapping_sub(self.base))
            .ok()
            .and_then(|s| self.entries.get_mut(s))
        else {
            return;
        };
        let Some(e) = slot.take() else {
            return;
        };
        while matches!(self.entries.front(), Some(None)) {
            self.entries.pop_front();
            self.base += 1;
        }
        self.bytes -= e.end - e.start;
        self.budget -= e
            .permit
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits);
        self.pending -= 1;
        if self.pending == 0 {
            // Nothing pending: every text in the index is stale.
            self.by_text.clear();
        }
        for r in &e.ranks {
            let slot = &mut self.last_of_rank[*r as usize * 2 + e.stream.index()];
            if *slot == Some(e.index) {
                *slot = None;
            }
        }
        let collapsed = (e.ranks.len() > 1).then(|| {
            let mut ranks: SmallVec<[usize; 8]> =
                e.ranks.iter().map(|r| self.rank_of[*r as usize]).collect();
            ranks.sort_unstable();
            if ranks != self.last_set.0 {
                let text = format!("[{}] ", rank_set(&ranks)).into_bytes();
                self.last_set = (ranks, text);
            }
            &self.last_set.1
        });
        let mut line = Vec::new();
        let append = |to: &mut Vec<u8>| match &collapsed {
            None => to.extend_from_slice(e.line()),
            Some(p) => {
                to.extend_from_slice(p);
                to.extend_from_slice(e.text());
            }
        };
        match out.last_mut() {
            Some((c, permit)) if c.stream == Some(e.stream) => {
                append(&mut c.body);
                match (permit.as_mut(), e.permit) {
                    (Some(p), Some(q)) => p.merge(q),
                    (None, q) => *permit = q,
                    (Some(_), None) => {}
                }
            }
            _ => out.push((
                Chunk {
                    body: {
                        append(&mut line);
                        line
                    },
                    source: self.sources[e.stream.index()],
                    stream: Some(e.stream),
                    ..Chunk::default()
                },
                e.permit,
            )),
        }
    }
}

/// Entry `index` of `entries` (whose first is `base`), if pending.
fn entry(entries: &VecDeque<Option<Entry>>, base: u64, index: u64) -> Option<&Entry> {
    let i = usize::try_from(index.checked_sub(base)?).ok()?;
    entries.get(i)?.as_ref()
}

/// Whether a line of `rank`, whose latest pending entry has level `floor`, may join entry `e`:
/// its level is above it, or nothing must follow the entry yet (it is the latest of each of
/// its ranks), so that its level can be raised above it. An entry that has the rank's line
/// already never takes another (a rank printing a line twice shows it twice).
fn joinable(e: &Entry, last_of_rank: &[Option<u64>], rank: u32, floor: u64) -> bool {
    if e.ranks.contains(&rank) {
        return false;
    }
    e.level > floor
        || e.ranks
            .iter()
            .all(|r| last_of_rank[*r as usize * 2 + e.stream.index()] == Some(e.index))
}

/// `0-3,5,7-8`: sorted ranks, runs of consecutive ranks as ranges.
pub(crate) fn rank_set(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut it = ranks.iter().copied().peekable();
    while let Some(a) = it.next() {
        let mut b = a;
        while it.peek() == Some(&(b + 1)) {
            b += 1;
            it.next();
        }
        parts.push(if a == b {
            a.to_string()
        } else {
            format!("{a}-{b}")
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of whole lines of `rank` with prefix `prefix`.
    fn lines(rank: usize, stream: Stream, prefix: &str, texts: &[&str]) -> Chunk {
        let mut body = Vec::new();
        let mut ends = Vec::new();
        for t in texts {
            body.extend_from_slice(prefix.as_bytes());
            body.extend_from_slice(t.as_bytes());
            ends.push(body.len() as u32);
        }
        Chunk {
            source: 100 + rank as u64,
            stream: Some(stream),
            prefix: prefix.into(),
            body,
            rank: Some(rank),
            line_ends: ends,
            ..Chunk::default()
        }
    }

    fn text(out: &[(Chunk, Option<OwnedSemaphorePermit>)]) -> String {
        out.iter()
            .map(|(c, _)| String::from_utf8_lossy(&c.body).into_owned())
            .collect()
    }

    #[test]
    fn rank_sets() {
        let s = |v: &[usize]| rank_set(v);
        assert_eq!(s(&[0, 1, 2, 3, 5, 7, 8]), "0-3,5,7-8");
        assert_eq!(s(&[4]), "4");
        assert_eq!(s(&[0, 2]), "0,2");
    }

    #[test]
    fn identical_lines_collapse_others_stay_per_rank() {
        use Stream::*;
        let w = Duration::from_millis(500);
        let mut c = Collapser::new(w, 0, [1, 2]);
        let t0 = Instant::now();
        for r in 0..4 {
            let own = format!("rank {r} ready\n");
            c.push(
                lines(r, Stdout, "", &["epoch 1 loss 0.53\n", &own, "done\n"]),
                None,
                t0 + Duration::from_millis(10 * r as u64),
            );
        }
        // A line that differs only in a digit is its own line.
        c.push(lines(4, Stdout, "", &["epoch 1 loss 0.54\n"]), None, t0);
        assert!(c.due(t0 + w - Duration::from_millis(1), false).is_empty());
        assert_eq!(c.deadline(), Some(t0 + w));
        let out = c.due(t0 + w + Duration::from_millis(30), false);
        assert_eq!(
            text(&out),
            "[0-3] epoch 1 loss 0.53\nrank 0 ready\nrank 1 ready\nrank 2 ready\nrank 3 ready\n\
             [0-3] done\nepoch 1 loss 0.54\n"
        );
        assert!(
            c.oldest_index().is_none()
                && c.by_text.is_empty()
                && c.last_of_rank.iter().all(Option::is_none)
        );
    }

    #[test]
    fn a_ranks_order_is_kept_and_repeats_are_not_merged_into_one() {
        use Stream::*;
        let mut c = Collapser::new(Duration::from_secs(1), 0, [1, 2]);
        let t0 = Instant::now();
        c.push(lines(0, Stdout, "[r0]:", &["A\n", "B\n"]), None, t0);
        // Rank 1 prints B then A: its A may not join the entry before its B.
        c.push(lines(1, Stdout, "[r1]:", &["B\n", "A\n"]), None, t0);
        // Rank 0 prints A again: a new line, not a second copy in the first entry.
        c.push(lines(0, Stdout, "[r0]:", &["A\n"]), None, t0);
        // A line printed twice by each of two ranks: two lines, each for both.
        c.push(lines(3, Stdout, "", &["t\n", "t\n"]), None, t0);
        c.push(lines(4, Stdout, "", &["t\n"]), None, t0);
        c.push(lines(4, Stdout, "", &["t\n"]), None, t0);
        // stderr lines never join stdout lines.
        c.push(lines(2, Stderr, "[r2]:", &["A\n"]), None, t0);
        let out = c.due(t0, true);
        assert_eq!(
            text(&out),
            "[r0]:A\n[0-1] B\n[0-1] A\n[3-4] t\n[3-4] t\n[r2]:A\n"
        );
        assert_eq!(out.len(), 2, "one chunk per run of one stream");
        assert_eq!(out[0].0.source, 1);
        assert_eq!(out[1].0.stream, Some(Stderr));
    }

    /// An entry every console rank joined goes out at once, after what it must follow.
    #[test]
    fn complete_lines_do_not_wait_for_the_window() {
        use Stream::*;
        let mut c = Collapser::new(Duration::from_secs(10), 2, [1, 2]);
        let t0 = Instant::now();
        c.push(lines(0, Stdout, "", &["mine\n", "both\n"]), None, t0);
        assert!(c.due(t0, false).is_empty());
        c.push(lines(1, Stdout, "", &["both\n", "later\n"]), None, t0);
        assert_eq!(text(&c.due(t0, false)), "mine\n[0-1] both\n");
        assert_eq!(text(&c.due(t0 + Duration::from_secs(10), false)), "later\n");
    }

    /// Past [`PENDING_CAP`] bytes the oldest lines go out before their window ends, down to
    /// half of it: the stage never holds more (and never makes the forwarders wait).
    #[test]
    fn the_stage_holds_at_most_its_cap() {
        use Stream::*;
        let mut c = Collapser::new(Duration::from_secs(10), 0, [1, 2]);
        let t0 = Instant::now();
        // Distinct 1 KiB lines (identical ones would be one entry).
        let line = |r: usize| format!("{r:01023}\n");
        for r in 0..(PENDING_CAP / 1024 + 10) {
            c.push(lines(r, Stdout, "", &[&line(r)]), None, t0);
        }
        assert!(c.bytes > PENDING_CAP);
        assert!(c.deadline().is_some_and(|d| d <= Instant::now()));
        let out = c.due(t0, false);
        // Down to half the cap, oldest first.
        assert_eq!(c.bytes, PENDING_CAP / 2);
        let n = PENDING_CAP / 2 / 1024 + 10;
        let want: String = (0..n).map(line).collect();
        assert_eq!(text(&out), want, "the oldest, as they came");
        // Under the cap nothing more goes before its window.
        assert!(c.due(t0, false).is_empty());
        // Budget kept by pending lines counts too, and goes back with them.
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(PENDING_CAP + 10));
        let mut c = Collapser::new(Duration::from_secs(10), 0, [1, 2]);
        let p = sem
            .clone()
            .try_acquire_many_owned(PENDING_CAP as u32 + 1)
            .expect("permit");
        c.push(lines(0, Stdout, "", &["a\n", "b\n"]), Some(p), t0);
        assert_eq!(sem.available_permits(), 9);
        let out = c.due(t0, false);
        assert_eq!(text(&out), "a\nb\n");
        drop(out);
        assert_eq!(sem.available_permits(), PENDING_CAP + 10);
    }
}
