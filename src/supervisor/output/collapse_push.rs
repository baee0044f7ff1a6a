//! Filing a chunk's lines into the collapse stage's entries ([`Collapser::push`]): each line
//! finds the entry it joins (the one after its rank's previous line's, else the oldest joinable
//! one of its text through the index) or starts a new one; the chunk's console budget stays
//! with its last line. Split from `collapse.rs` by job; the rules are in its module docs.

use super::*;

/// Where one line of a pushed chunk lies, and whose it is.
#[derive(Clone, Copy)]
struct LineAt {
    stream: Stream,
    /// The dense rank id, and its slot per stream in the per-rank tables.
    rank: u32,
    slot: usize,
    body: u32,
    start: u32,
    end: u32,
    /// The prefix's length at the line's start (0 without one).
    plen: usize,
}

impl Collapser {
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
        let prefix = chunk.prefix;
        let body = self.bodies.add(chunk.body);
        let mut hashes = std::mem::take(&mut self.hashes);
        hashes.clear();
        if !self.followed[slot] {
            self.prefetch(stream, body, &chunk.line_ends, &prefix, &mut hashes);
        }
        let mut followed = 0usize;
        let mut start = 0u32;
        let mut last = NONE;
        for (n, &end) in chunk.line_ends.iter().enumerate() {
            let line_start = start;
            start = end;
            let line = &self.bodies.get(body)[line_start as usize..end as usize];
            let at = LineAt {
                stream,
                rank,
                slot,
                body,
                start: line_start,
                end,
                plen: prefix_len(line, &prefix),
            };
            // The rank's latest pending entry, and its level (0: none pending).
            let prev = self.last_of_rank[slot];
            let floor = prev.and_then(|i| self.ring.get(i)).map_or(0, |e| e.level);
            let (join, hash, pos) = match self.followed_entry(at, floor) {
                Some(i) => {
                    followed += 1;
                    (Some(i), 0, 0)
                }
                None => self.oldest_joinable(at, floor, hashes.get(n).copied()),
            };
            let index = match join.and_then(|i| self.join_entry(i, rank, prev, floor)) {
                Some(index) => index,
                None => self.new_entry(at, (pos, hash), prev, floor, now),
            };
            self.last_of_rank[slot] = Some(index);
            self.follow[slot] = index;
            last = index;
        }
        // Every line joined older entries: nothing points into this body.
        self.bodies.release(body, false);
        self.followed[slot] = followed * 2 > chunk.line_ends.len();
        self.hashes = hashes;
        self.keep_permit(permit, last);
    }

    /// A rank whose last chunk did not follow other ranks' lines: its lines will go to the
    /// index. Their hashes first, then one load of each line's index slot: loads that do not
    /// wait for each other, so the CPU overlaps their cache misses (the table outgrows the
    /// cache at high line rates); the line loop then finds the slots in cache.
    #[inline]
    fn prefetch(
        &self,
        stream: Stream,
        body: u32,
        line_ends: &[u32],
        prefix: &[u8],
        hashes: &mut Vec<u32>,
    ) {
        let bytes = self.bodies.get(body);
        let mut start = 0usize;
        for &end in line_ends {
            let line = &bytes[start..end as usize];
            start = end as usize;
            hashes.push(self.hash(stream, &line[prefix_len(line, prefix)..]));
        }
        let mask = self.index.mask();
        let touch = hashes
            .iter()
            .fold(0u32, |acc, h| acc ^ self.index.slots[*h as usize & mask].0);
        std::hint::black_box(touch);
    }

    /// The line's text (after its prefix).
    #[inline]
    fn text_of(&self, at: LineAt) -> &[u8] {
        &self.bodies.get(at.body)[at.start as usize + at.plen..at.end as usize]
    }

    /// The entry after the one this rank's previous line went to, when the line may join it:
    /// ranks printing the same sequence find their line there (one compare, no hash, no index).
    #[inline]
    fn followed_entry(&self, at: LineAt, floor: u64) -> Option<u64> {
        let follow = self.follow[at.slot];
        let text = self.text_of(at);
        (follow != NONE)
            .then(|| self.ring.get(follow + 1))
            .flatten()
            .filter(|e| {
                e.stream == at.stream
                    && e.text(&self.bodies) == text
                    && joinable(e, &self.last_of_rank, at.rank, floor)
            })
            .map(|e| e.index)
    }

    /// The oldest entry of the line's text that it may join, through the index (`hashed`: its
    /// hash when computed already); also the hash and the index position a new entry takes.
    #[inline]
    fn oldest_joinable(
        &self,
        at: LineAt,
        floor: u64,
        hashed: Option<u32>,
    ) -> (Option<u64>, u32, usize) {
        let text = self.text_of(at);
        let hash = match hashed {
            Some(h) => h,
            None => self.hash(at.stream, text),
        };
        let mut join = None;
        let (ring, bodies, lor) = (&self.ring, &self.bodies, &self.last_of_rank);
        let pos = self.index.probe(hash, ring.base, ring.next(), |i| {
            if join.is_some_and(|j| j < i) {
                return;
            }
            if let Some(e) = ring.get(i) {
                if e.stream == at.stream
                    && e.text(bodies) == text
                    && joinable(e, lor, at.rank, floor)
                {
                    join = Some(i);
                }
            }
        });
        (join, hash, pos)
    }

    /// Adds `rank`'s line to entry `i` (its level raised above the rank's `floor`); `None` when
    /// the entry is no longer in the ring.
    #[inline]
    fn join_entry(&mut self, i: u64, rank: u32, prev: Option<u64>, floor: u64) -> Option<u64> {
        let all = self.ranks;
        let e = self.ring.get_mut(i)?;
        e.ranks.push(rank);
        if let Some(p) = prev {
            if !e.after.contains(&p) {
                e.after.push(p);
            }
        }
        e.level = e.level.max(floor + 1);
        if e.ranks.len() == all {
            self.complete.push(e.index);
        }
        Some(e.index)
    }

    /// A new entry for the line, at index position `pos` with `hash`.
    #[inline]
    fn new_entry(
        &mut self,
        at: LineAt,
        (pos, hash): (usize, u32),
        prev: Option<u64>,
        floor: u64,
        now: Instant,
    ) -> u64 {
        let index = self.ring.next();
        self.index.insert(pos, hash, index);
        self.bytes += (at.end - at.start) as usize;
        self.bodies.hold(at.body);
        let e = self.ring.push();
        e.index = index;
        e.written = false;
        e.stream = at.stream;
        e.body = at.body;
        e.start = at.start;
        e.end = at.end;
        e.plen = at.plen as u32;
        e.ranks.clear();
        e.ranks.push(at.rank);
        e.hash = hash;
        e.first = now;
        e.level = floor + 1;
        e.after.clear();
        e.after.extend(prev);
        e.permit = None;
        self.pending += 1;
        if self.ranks == 1 {
            self.complete.push(index);
        }
        if self.index.crowded() {
            self.index.rebuild(&self.ring);
        }
        index
    }

    /// The chunk's console budget goes with its last line's entry.
    #[inline]
    fn keep_permit(&mut self, permit: Option<OwnedSemaphorePermit>, last: u64) {
        if let (Some(p), Some(e)) = (permit, self.ring.get_mut(last)) {
            let n = p.num_permits();
            match &mut e.permit {
                Some(held) => held.merge(p),
                None => e.permit = Some(p),
            }
            self.budget += n;
        }
    }
}
