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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::chunk::Chunk;
use super::own::Stream;

/// One line as the console will write it, and the ranks that printed it.
struct Entry {
    index: u64,
    stream: Stream,
    /// The line after the rank's prefix, terminator included.
    text: Vec<u8>,
    /// The line as the first rank's chunk had it (its own prefix), written when no other rank
    /// joins.
    original: Vec<u8>,
    ranks: BTreeSet<usize>,
    first: Instant,
    /// Above the level of every entry this one must follow.
    level: u64,
    /// The entries this one must follow (each rank's previous pending entry).
    after: Vec<u64>,
    /// Budget of the chunks whose last line is this entry (released once written).
    permits: Vec<OwnedSemaphorePermit>,
}

/// The pending lines of the collapse window.
pub(crate) struct Collapser {
    window: Duration,
    entries: BTreeMap<u64, Entry>,
    next: u64,
    /// The pending entries of each (stream index, text), oldest first.
    by_text: HashMap<(usize, Vec<u8>), Vec<u64>>,
    /// Latest entry index that holds a line of each (rank, stream).
    last_of_rank: HashMap<(usize, usize), u64>,
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
            ranks,
            complete: Vec::new(),
            entries: BTreeMap::new(),
            next: 0,
            by_text: HashMap::new(),
            last_of_rank: HashMap::new(),
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

    /// Files the lines of a chunk that [`Collapser::takes`].
    pub(crate) fn push(
        &mut self,
        chunk: Chunk,
        permit: Option<OwnedSemaphorePermit>,
        now: Instant,
    ) {
        let (Some(rank), Some(stream)) = (chunk.rank, chunk.stream) else {
            return;
        };
        let plen = chunk.prefix.len();
        let mut start = 0usize;
        let mut last_index = None;
        for &end in &chunk.line_ends {
            let end = end as usize;
            let line = &chunk.body[start..end];
            start = end;
            let text = if line.starts_with(&chunk.prefix) {
                &line[plen..]
            } else {
                line
            };
            // The rank's latest pending entry, and its level (0: none pending).
            let prev = self.last_of_rank.get(&(rank, stream.index())).copied();
            let floor = prev
                .and_then(|i| self.entries.get(&i))
                .map_or(0, |e| e.level);
            // The oldest entry of this text that the line may join without a cycle.
            let join = self
                .by_text
                .get(&(stream.index(), text.to_vec()))
                .and_then(|list| {
                    list.iter()
                        .copied()
                        .find(|i| self.joinable(*i, rank, floor))
                });
            let index = match join.and_then(|i| self.entries.get_mut(&i)) {
                Some(e) => {
                    e.ranks.insert(rank);
                    e.after.extend(prev);
                    e.level = e.level.max(floor + 1);
                    if e.ranks.len() == self.ranks {
                        self.complete.push(e.index);
                    }
                    e.index
                }
                None => {
                    let index = self.next;
                    self.next += 1;
                    self.entries.insert(
                        index,
                        Entry {
                            index,
                            stream,
                            text: text.to_vec(),
                            original: line.to_vec(),
                            ranks: BTreeSet::from([rank]),
                            first: now,
                            level: floor + 1,
                            after: prev.into_iter().collect(),
                            permits: Vec::new(),
                        },
                    );
                    self.by_text
                        .entry((stream.index(), text.to_vec()))
                        .or_default()
                        .push(index);
                    if self.ranks == 1 {
                        self.complete.push(index);
                    }
                    index
                }
            };
            self.last_of_rank.insert((rank, stream.index()), index);
            last_index = Some(index);
        }
        // The chunk's lines are in its rank's order, so its last line's entry is written last.
        if let (Some(p), Some(i)) = (permit, last_index) {
            if let Some(e) = self.entries.get_mut(&i) {
                e.permits.push(p);
            }
        }
    }

    /// Whether a line of a rank whose latest pending entry has level `floor` may join entry
    /// `i`: the entry's level is above it, or nothing must follow the entry yet (it is the
    /// latest of each of its ranks), so that its level can be raised above it.
    /// An entry that has the rank's line already never takes another (a rank printing a line
    /// twice shows it twice).
    fn joinable(&self, i: u64, rank: usize, floor: u64) -> bool {
        let Some(e) = self.entries.get(&i) else {
            return false;
        };
        if e.ranks.contains(&rank) {
            return false;
        }
        e.level > floor
            || e.ranks
                .iter()
                .all(|r| self.last_of_rank.get(&(*r, e.stream.index())) == Some(&i))
    }

    /// When the oldest pending line is due.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        // Entries are made in time order: the lowest index is the oldest.
        self.entries.values().next().map(|e| e.first + self.window)
    }

    /// The index the next entry will get (every pending entry's is lower).
    pub(crate) fn next_index(&self) -> u64 {
        self.next
    }

    /// The index of the oldest pending entry.
    pub(crate) fn oldest_index(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// The lines due at `now` (all of them when `all`), as chunks in order: consecutive lines
    /// of one stream go in one chunk (one write).
    pub(crate) fn due(
        &mut self,
        now: Instant,
        all: bool,
    ) -> Vec<(Chunk, Vec<OwnedSemaphorePermit>)> {
        let mut out: Vec<(Chunk, Vec<OwnedSemaphorePermit>)> = Vec::new();
        let mut complete = std::mem::take(&mut self.complete).into_iter();
        loop {
            // Entries every rank joined (no other rank can join them), then the oldest if due.
            let next = match complete.next() {
                Some(i) => i,
                None => match self.entries.values().next() {
                    Some(e) if all || now >= e.first + self.window => e.index,
                    _ => break,
                },
            };
            // After the pending entries it must follow (depth first, no recursion).
            let mut stack = vec![next];
            while let Some(&i) = stack.last() {
                let before = self.entries.get(&i).and_then(|e| {
                    e.after
                        .iter()
                        .copied()
                        .find(|a| self.entries.contains_key(a))
                });
                match before {
                    Some(a) => stack.push(a),
                    None => {
                        stack.pop();
                        if let Some(e) = self.entries.remove(&i) {
                            self.write(e, &mut out);
                        }
                    }
                }
            }
        }
        out
    }

    /// Moves one entry out of the window into `out`.
    fn write(&mut self, e: Entry, out: &mut Vec<(Chunk, Vec<OwnedSemaphorePermit>)>) {
        let key = (e.stream.index(), e.text);
        if let Some(list) = self.by_text.get_mut(&key) {
            list.retain(|i| *i != e.index);
            if list.is_empty() {
                self.by_text.remove(&key);
            }
        }
        let text = key.1;
        for r in &e.ranks {
            if self.last_of_rank.get(&(*r, e.stream.index())) == Some(&e.index) {
                self.last_of_rank.remove(&(*r, e.stream.index()));
            }
        }
        let line = if e.ranks.len() == 1 {
            e.original
        } else {
            let mut l = format!("[{}] ", rank_set(&e.ranks)).into_bytes();
            l.extend_from_slice(&text);
            l
        };
        match out.last_mut() {
            Some((c, permits)) if c.stream == Some(e.stream) => {
                c.body.extend_from_slice(&line);
                permits.extend(e.permits);
            }
            _ => out.push((
                Chunk {
                    source: self.sources[e.stream.index()],
                    stream: Some(e.stream),
                    body: line,
                    ..Chunk::default()
                },
                e.permits,
            )),
        }
    }
}

/// `0-3,5,7-8`: sorted ranks, runs of consecutive ranks as ranges.
pub(crate) fn rank_set(ranks: &BTreeSet<usize>) -> String {
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

    fn text(out: &[(Chunk, Vec<OwnedSemaphorePermit>)]) -> String {
        out.iter()
            .map(|(c, _)| String::from_utf8_lossy(&c.body).into_owned())
            .collect()
    }

    #[test]
    fn rank_sets() {
        let s = |v: &[usize]| rank_set(&v.iter().copied().collect());
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
        assert!(c.oldest_index().is_none() && c.by_text.is_empty() && c.last_of_rank.is_empty());
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

    #[test]
    fn permits_are_released_with_the_chunks_last_line() {
        use Stream::*;
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(10));
        let mut c = Collapser::new(Duration::from_millis(100), 0, [1, 2]);
        let t0 = Instant::now();
        let p = sem.clone().try_acquire_many_owned(3).expect("permit");
        c.push(lines(0, Stdout, "", &["x\n", "y\n"]), Some(p), t0);
        assert_eq!(sem.available_permits(), 7);
        let out = c.due(t0 + Duration::from_millis(100), false);
        assert_eq!(out[0].1.len(), 1);
        drop(out);
        assert_eq!(sem.available_permits(), 10);
    }
}
