//! The collapse stage of the console writer (`--output collapse`, issue 29): a line that several
//! ranks print identically within the window is written once, prefixed with its ranks
//! (`[0-3,5] epoch 1 loss 0.53`); a line only one rank printed is written as it came.
//!
//! Rules (why each holds):
//! - Identity is the exact bytes of the line after the rank's console prefix, terminator
//!   included, per stream: numbers that differ slightly are different lines.
//! - Every line waits at most the window: each entry is due `window` after its first line came,
//!   and the oldest pending entry is always written first once due (entries it must follow are
//!   written before it, early). When the oldest is due, those due within the window's last
//!   twentieth ([`SLACK_DIVISOR`]) go with it: one wake-up and one write for them all, and a
//!   deadline that moves about twenty times a window, not once per line (lines that no other
//!   rank prints, at a training log's pace, each woke the console thread once more: +79 % of
//!   `all`'s CPU at 8 ranks × 1000 lines/s).
//! - Nothing is lost or duplicated: each line of each rank lands in exactly one entry.
//! - A rank's lines keep their order. Each entry remembers, for each of its ranks, that rank's
//!   previous pending entry, and is written only after those. Entries carry a level (above the
//!   level of every entry they must follow); a rank's line joins an entry of its text whose
//!   level is above the level of the rank's latest entry, or that nothing follows yet (its
//!   level is then raised), so "must follow" never forms a cycle (it would otherwise: rank 0
//!   prints A then B, rank 1 B then A).
//! - Which entry a line joins: the one right after the entry the rank's previous line went to,
//!   when it has the same text and may be joined (ranks printing the same sequence, the common
//!   case: one compare against an entry just made, no index); otherwise the oldest pending
//!   entry of its text that it may join; otherwise a new entry.
//!
//! Cost (this runs for every line on the one console thread, at millions of lines per second;
//! see the "Console collapse" section of `docs/benchmarks.md`): no allocation per line (entries
//! live in a ring whose slots are reused in place, and point into the chunk bodies they came in,
//! kept in a slab with a count of the entries using each); the text index is an open-addressing
//! table of 8-byte (hash, entry) pairs sized to the pending lines, so it stays in cache, and an
//! entry's text is read only when the full 32-bit hash matches; the index is never updated when
//! a line is written: slots of written entries are recognised from their index alone, reused,
//! and dropped when the table is rebuilt.
//!
//! The writer (`console`) feeds whole-line chunks here and writes what [`Collapser::due`]
//! returns through its usual path (open lines, budget, flushes); chunks that are not plain whole
//! lines (a prompt's open line, its continuation) make it write everything pending first, so
//! nothing of the same source is overtaken.

use std::collections::HashMap;
use std::hash::BuildHasher;
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

/// Lines due within `window / SLACK_DIVISOR` of the one that is due are written with it.
const SLACK_DIVISOR: u32 = 20;

/// No entry (a rank that has not printed yet).
const NONE: u64 = u64::MAX;

/// One line as the console will write it, and the ranks that printed it. A slot of [`Ring`]:
/// reused in place once written (its vectors keep their capacity).
struct Entry {
    index: u64,
    /// Written (its slot waits for the entries before it to be written too).
    written: bool,
    stream: Stream,
    /// The line as the first rank's chunk had it (its own prefix), written when no other rank
    /// joins: `bodies[body][start..end]`, the chunk's body shared by its lines (no copy per
    /// line); the text compared is the part after the prefix (`plen` bytes), terminator
    /// included.
    body: u32,
    start: u32,
    end: u32,
    plen: u32,
    /// The ranks that printed it, in the order they came, as dense ids (`Collapser::rank_of`).
    ranks: SmallVec<[u32; 4]>,
    /// Its text's index hash (stream included), kept for [`Collapser::recent`].
    hash: u32,
    first: Instant,
    /// Above the level of every entry this one must follow.
    level: u64,
    /// The entries this one must follow (each rank's previous pending entry).
    after: SmallVec<[u64; 2]>,
    /// Budget of the chunks whose last line is this entry (given back once it is written).
    permit: Option<OwnedSemaphorePermit>,
}

impl Entry {
    fn blank(at: Instant) -> Entry {
        Entry {
            index: NONE,
            written: true,
            stream: Stream::Stdout,
            body: 0,
            start: 0,
            end: 0,
            plen: 0,
            ranks: SmallVec::new(),
            hash: 0,
            first: at,
            level: 0,
            after: SmallVec::new(),
            permit: None,
        }
    }

    fn line<'a>(&self, bodies: &'a Bodies) -> &'a [u8] {
        &bodies.get(self.body)[self.start as usize..self.end as usize]
    }

    fn text<'a>(&self, bodies: &'a Bodies) -> &'a [u8] {
        &bodies.get(self.body)[(self.start + self.plen) as usize..self.end as usize]
    }
}

/// The entries from the oldest pending one (`base`) to the newest, in a ring of reused slots:
/// no entry is moved in or out, and none is allocated once the ring has grown.
struct Ring {
    slots: Vec<Entry>,
    head: usize,
    len: usize,
    base: u64,
    /// What blank slots hold as their time.
    epoch: Instant,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            slots: Vec::new(),
            head: 0,
            len: 0,
            base: 0,
            epoch: Instant::now(),
        }
    }

    /// The index the next entry will get.
    fn next(&self) -> u64 {
        self.base + self.len as u64
    }

    fn slot(&self, index: u64) -> Option<usize> {
        let off = index.checked_sub(self.base)?;
        (off < self.len as u64).then(|| (self.head + off as usize) & (self.slots.len() - 1))
    }

    /// Entry `index`, if pending.
    fn get(&self, index: u64) -> Option<&Entry> {
        let e = &self.slots[self.slot(index)?];
        (!e.written).then_some(e)
    }

    fn get_mut(&mut self, index: u64) -> Option<&mut Entry> {
        let s = self.slot(index)?;
        let e = &mut self.slots[s];
        (!e.written).then_some(e)
    }

    /// The oldest pending entry (the front is never a written one: see [`Ring::pop_written`]).
    fn front(&self) -> Option<&Entry> {
        (self.len > 0).then(|| &self.slots[self.head])
    }

    /// The slot for entry [`Ring::next`], to be filled in by the caller (its old content is
    /// still there).
    fn push(&mut self) -> &mut Entry {
        if self.len == self.slots.len() {
            // Full: twice the slots, the entries in order from the start.
            let grow = self.slots.len().max(64);
            self.slots.rotate_left(self.head);
            let epoch = self.epoch;
            self.slots.extend((0..grow).map(|_| Entry::blank(epoch)));
            self.head = 0;
        }
        let s = (self.head + self.len) & (self.slots.len() - 1);
        self.len += 1;
        &mut self.slots[s]
    }

    /// Drops written entries from the front.
    fn pop_written(&mut self) {
        while self.len > 0 && self.slots[self.head].written {
            self.head = (self.head + 1) & (self.slots.len() - 1);
            self.len -= 1;
            self.base += 1;
        }
    }
}

/// The chunk bodies that pending entries point into, each with how many entries use it; a body
/// is dropped when its last entry is written (or at once, when every line of it joined older
/// entries).
#[derive(Default)]
struct Bodies {
    slots: Vec<(Vec<u8>, u32)>,
    free: Vec<u32>,
}

impl Bodies {
    fn add(&mut self, body: Vec<u8>) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.slots[id as usize] = (body, 0);
                id
            }
            None => {
                self.slots.push((body, 0));
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        }
    }

    fn get(&self, id: u32) -> &[u8] {
        &self.slots[id as usize].0
    }

    fn hold(&mut self, id: u32) {
        self.slots[id as usize].1 += 1;
    }

    /// One entry less uses body `id` (`held`: it was counted); dropped when none does.
    fn release(&mut self, id: u32, held: bool) {
        let slot = &mut self.slots[id as usize];
        if held {
            slot.1 -= 1;
        }
        if slot.1 == 0 {
            slot.0 = Vec::new();
            self.free.push(id);
        }
    }
}

/// The text index: open addressing with linear probing over (hash, low 32 bits of the entry
/// index) pairs, 8 bytes a slot, sized to the pending entries. A slot whose entry is older than
/// the ring's base is stale: it is reused by the next insert that passes it. The table is
/// rebuilt (live slots only, resized to the pending entries) when too few slots are empty.
struct TextIndex {
    slots: Vec<(u32, u32)>,
    /// Slots not empty (live or stale).
    used: usize,
}

/// Fewest slots of the index (a power of two).
const INDEX_MIN: usize = 1 << 10;

impl TextIndex {
    fn new() -> TextIndex {
        TextIndex {
            slots: vec![(0, 0); INDEX_MIN],
            used: 0,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The entry index a slot names, if it is within the ring (`base..next`; the ring never
    /// spans 2^32 entries: it holds at most a window of lines).
    fn entry_of(idx: u32, base: u64, next: u64) -> Option<u64> {
        let off = u64::from(idx.wrapping_sub(base as u32));
        (off < next - base).then_some(base + off)
    }

    /// Calls `each` with every entry in `base..next` filed under `hash`; returns the slot an
    /// insert of `hash` would take (the first stale one on the way, else the empty one that
    /// ends it).
    fn probe(&self, hash: u32, base: u64, next: u64, mut each: impl FnMut(u64)) -> usize {
        let mask = self.mask();
        let mut pos = hash as usize & mask;
        let mut free = None;
        loop {
            let (h, idx) = self.slots[pos];
            if h == 0 {
                return free.unwrap_or(pos);
            }
            match TextIndex::entry_of(idx, base, next) {
                Some(i) if h == hash => each(i),
                Some(_) => {}
                None => {
                    free.get_or_insert(pos);
                }
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Files entry `index` under `hash` at slot `pos` (from [`TextIndex::probe`]).
    fn insert(&mut self, pos: usize, hash: u32, index: u64) {
        if self.slots[pos].0 == 0 {
            self.used += 1;
        }
        self.slots[pos] = (hash, index as u32);
    }

    /// Too few empty slots left (probes grow long): time for [`TextIndex::rebuild`].
    fn crowded(&self) -> bool {
        self.used * 2 > self.slots.len()
    }

    /// Keeps the slots of entries still in the ring only, in a table of about four slots per
    /// such entry (at least [`INDEX_MIN`]). An entry written out of order (its slot is still in
    /// the ring) is kept until the ring's base passes it: telling it apart would take a read of
    /// the entry, a cache miss per slot.
    fn rebuild(&mut self, ring: &Ring) {
        let (base, next) = (ring.base, ring.next());
        let live =
            |&(h, idx): &(u32, u32)| h != 0 && TextIndex::entry_of(idx, base, next).is_some();
        let n = self.slots.iter().filter(|s| live(s)).count();
        let size = (n * 4).next_power_of_two().max(INDEX_MIN);
        let old = std::mem::replace(&mut self.slots, vec![(0, 0); size]);
        self.used = 0;
        let mask = self.mask();
        for s in old.iter().filter(|s| live(s)) {
            let mut pos = s.0 as usize & mask;
            while self.slots[pos].0 != 0 {
                pos = (pos + 1) & mask;
            }
            self.slots[pos] = *s;
            self.used += 1;
        }
    }
}

/// The pending lines of the collapse window.
pub(crate) struct Collapser {
    window: Duration,
    ring: Ring,
    bodies: Bodies,
    index: TextIndex,
    /// Bytes of the pending lines, and console budget the pending entries keep.
    bytes: usize,
    budget: usize,
    hasher: RandomState,
    /// How many entries are pending.
    pending: usize,
    /// Each global rank's dense id (looked up once per chunk), and back.
    ids: HashMap<usize, u32, RandomState>,
    rank_of: Vec<usize>,
    /// Latest pending entry that holds a line of each (dense id, stream index): `id * 2 +
    /// stream`. A vector, not a map: it is read and written for every line.
    last_of_rank: Vec<Option<u64>>,
    /// The entry each (dense id, stream) last line went to, pending or not ([`NONE`]: none
    /// yet): the next line of that rank tries the entry after it first.
    follow: Vec<u64>,
    /// Whether most lines of each (dense id, stream)'s last chunk found their entry that way
    /// (its next chunk's hashes are then made only for the lines that do not).
    followed: Vec<bool>,
    /// The hashes of the lines of the chunk being filed (a vector kept for its capacity).
    hashes: Vec<u32>,
    /// The last `[ranks] ` prefix written, for the rank set it was made of (most collapsed lines
    /// of a run share one).
    last_set: (SmallVec<[usize; 8]>, Vec<u8>),
    /// How many ranks' output reaches the console.
    ranks: usize,
    /// Entries every rank joined: written without waiting for the window.
    complete: Vec<u64>,
    /// Source ids of the chunks this stage writes, one per stream.
    sources: [u64; 2],
    /// The hashes of texts recently written collapsed (several ranks), direct-mapped by hash:
    /// a line one rank prints after the window of its text's collapsed copy is a late copy and
    /// carries its rank (`[3] epoch 0`), so that it does not read as a duplicate of the line
    /// above (issue 38 item 15). A slot overwritten by another text only loses that label.
    recent: Vec<u32>,
}

/// Slots of [`Collapser::recent`] (a power of two).
const RECENT: usize = 1024;

/// How many bytes of `line` are the rank's console prefix.
fn prefix_len(line: &[u8], prefix: &[u8]) -> usize {
    // Not `starts_with` alone: a compare call per line even for an empty prefix.
    if !prefix.is_empty() && line.starts_with(prefix) {
        prefix.len()
    } else {
        0
    }
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

impl Collapser {
    /// `ranks`: how many ranks' output reaches this console; an entry that has them all is
    /// written at once instead of at the end of the window (0: never early).
    pub(crate) fn new(window: Duration, ranks: usize, sources: [u64; 2]) -> Collapser {
        Collapser {
            window,
            ring: Ring::new(),
            bodies: Bodies::default(),
            index: TextIndex::new(),
            bytes: 0,
            budget: 0,
            hasher: RandomState::default(),
            pending: 0,
            ids: HashMap::default(),
            rank_of: Vec::new(),
            last_of_rank: Vec::new(),
            follow: Vec::new(),
            followed: Vec::new(),
            hashes: Vec::new(),
            last_set: (SmallVec::new(), Vec::new()),
            ranks,
            complete: Vec::new(),
            sources,
            recent: vec![0; RECENT],
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

    /// The index's hash of a line's text: never 0 (an empty slot).
    fn hash(&self, stream: Stream, text: &[u8]) -> u32 {
        ((self.hasher.hash_one((stream.index(), text)) >> 32) as u32).max(1)
    }

    /// The dense id of global rank `rank` (its per-rank slots made on first sight).
    fn id(&mut self, rank: usize) -> u32 {
        if let Some(id) = self.ids.get(&rank) {
            return *id;
        }
        let id = u32::try_from(self.rank_of.len()).unwrap_or(u32::MAX);
        self.ids.insert(rank, id);
        self.rank_of.push(rank);
        self.last_of_rank.extend([None, None]);
        self.follow.extend([NONE, NONE]);
        self.followed.extend([false, false]);
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

    /// When the oldest pending line is due (now when the stage holds too many bytes).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let first = self.ring.front().map(|e| e.first + self.window)?;
        Some(if self.over() || !self.complete.is_empty() {
            Instant::now().min(first)
        } else {
            first
        })
    }

    /// The index the next entry will get (every pending entry's is lower).
    pub(crate) fn next_index(&self) -> u64 {
        self.ring.next()
    }

    /// The index of the oldest pending entry.
    pub(crate) fn oldest_index(&self) -> Option<u64> {
        self.ring.front().map(|e| e.index)
    }

    /// The lines due at `now` (all of them when `all`), as chunks in order: consecutive lines
    /// of one stream go in one chunk (one write).
    pub(crate) fn due(
        &mut self,
        now: Instant,
        all: bool,
    ) -> Vec<(Chunk, Option<OwnedSemaphorePermit>)> {
        let mut out: Vec<(Chunk, Option<OwnedSemaphorePermit>)> = Vec::new();
        let mut complete = std::mem::take(&mut self.complete);
        let draining = self.over();
        // Once the oldest line is due, those due within the slack go with it; before, none
        // goes (so that lines arriving meanwhile do not move the deadline, one at a time).
        let slack = match self.ring.front() {
            Some(e) if now >= e.first + self.window => self.window / SLACK_DIVISOR,
            _ => Duration::ZERO,
        };
        let mut k = 0;
        loop {
            // Entries every rank joined (no other rank can join them), then the oldest if due
            // (or if the stage holds too many bytes).
            let next = match complete.get(k) {
                Some(&i) => {
                    k += 1;
                    i
                }
                None => match self.ring.front() {
                    Some(e)
                        if all
                            || (draining && self.draining())
                            || now + slack >= e.first + self.window =>
                    {
                        e.index
                    }
                    _ => break,
                },
            };
            // After the pending entries it must follow (depth first, no recursion).
            let mut stack: SmallVec<[u64; 8]> = smallvec::smallvec![next];
            while let Some(&i) = stack.last() {
                let before = self.ring.get(i).and_then(|e| {
                    e.after
                        .iter()
                        .copied()
                        .find(|a| self.ring.get(*a).is_some())
                });
                match before {
                    Some(a) => stack.push(a),
                    None => {
                        stack.pop();
                        self.write(i, &mut out);
                    }
                }
            }
        }
        // The vector back, for its capacity.
        complete.clear();
        self.complete = complete;
        out
    }

    /// Moves entry `i` out of the window into `out`.
    fn write(&mut self, i: u64, out: &mut Vec<(Chunk, Option<OwnedSemaphorePermit>)>) {
        let Some(e) = self.ring.get_mut(i) else {
            return;
        };
        e.written = true;
        let permit = e.permit.take();
        self.bytes -= (e.end - e.start) as usize;
        self.budget -= permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        self.pending -= 1;
        let e = &self.ring.slots[self.ring.slot(i).unwrap_or(0)];
        for r in &e.ranks {
            let slot = &mut self.last_of_rank[*r as usize * 2 + e.stream.index()];
            if *slot == Some(e.index) {
                *slot = None;
            }
        }
        let recent = &mut self.recent[e.hash as usize & (RECENT - 1)];
        let late = e.ranks.len() == 1 && e.hash != 0 && *recent == e.hash;
        if e.ranks.len() > 1 {
            *recent = e.hash;
        }
        let collapsed = (e.ranks.len() > 1 || late).then(|| {
            let mut ranks: SmallVec<[usize; 8]> =
                e.ranks.iter().map(|r| self.rank_of[*r as usize]).collect();
            ranks.sort_unstable();
            if ranks != self.last_set.0 {
                let text = format!("[{}] ", rank_set(&ranks)).into_bytes();
                self.last_set = (ranks, text);
            }
            &self.last_set.1
        });
        let bodies = &self.bodies;
        let append = |to: &mut Vec<u8>| match &collapsed {
            None => to.extend_from_slice(e.line(bodies)),
            Some(p) => {
                to.extend_from_slice(p);
                to.extend_from_slice(e.text(bodies));
            }
        };
        match out.last_mut() {
            Some((c, held)) if c.stream == Some(e.stream) => {
                append(&mut c.body);
                match (held.as_mut(), permit) {
                    (Some(p), Some(q)) => p.merge(q),
                    (None, q) => *held = q,
                    (Some(_), None) => {}
                }
            }
            _ => {
                let mut body = Vec::new();
                append(&mut body);
                out.push((
                    Chunk {
                        body,
                        source: self.sources[e.stream.index()],
                        stream: Some(e.stream),
                        ..Chunk::default()
                    },
                    permit,
                ));
            }
        }
        let body = e.body;
        self.bodies.release(body, true);
        self.ring.pop_written();
    }
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

#[path = "collapse_push.rs"]
mod push;

#[cfg(test)]
#[path = "collapse_tests.rs"]
mod tests;
