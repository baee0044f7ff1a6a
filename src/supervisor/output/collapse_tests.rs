//! Unit tests of `collapse.rs` (moved out so that the module fits in a head).

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
            && c.pending == 0
            && c.ring.len == 0
            && c.bodies.slots.iter().all(|(b, n)| b.is_empty() && *n == 0)
            && c.last_of_rank.iter().all(Option::is_none)
    );
}

#[test]
fn a_late_copy_of_a_collapsed_line_carries_its_rank() {
    // Issue 38 item 15: rank 3's copy comes after the window of ranks 0-2's; it was written
    // bare, reading as a duplicate. A line that only one rank ever printed stays as it came.
    use Stream::*;
    let w = Duration::from_millis(500);
    let mut c = Collapser::new(w, 0, [1, 2]);
    let t0 = Instant::now();
    for r in 0..3 {
        c.push(lines(r, Stdout, "", &["epoch 0 loss 0.5\n"]), None, t0);
    }
    c.push(lines(0, Stdout, "", &["only rank 0\n"]), None, t0);
    assert_eq!(
        text(&c.due(t0 + w, false)),
        "[0-2] epoch 0 loss 0.5\nonly rank 0\n"
    );
    let t1 = t0 + 2 * w;
    c.push(lines(3, Stdout, "", &["epoch 0 loss 0.5\n"]), None, t1);
    // The same text on the other stream is another line: not a late copy.
    c.push(lines(3, Stderr, "", &["epoch 0 loss 0.5\n"]), None, t1);
    assert_eq!(
        text(&c.due(t1 + w, false)),
        "[3] epoch 0 loss 0.5\nepoch 0 loss 0.5\n"
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

/// Once the oldest line is due, lines due within the window's last twentieth go with it (one
/// wake-up and one write), later ones wait for their own time.
#[test]
fn lines_due_soon_after_go_with_the_due_one() {
    use Stream::*;
    let w = Duration::from_millis(500);
    let mut c = Collapser::new(w, 0, [1, 2]);
    let t0 = Instant::now();
    c.push(lines(0, Stdout, "", &["a\n"]), None, t0);
    c.push(lines(1, Stdout, "", &["b\n"]), None, t0 + w / 20);
    c.push(
        lines(2, Stdout, "", &["c\n"]),
        None,
        t0 + w / 20 + Duration::from_millis(1),
    );
    assert_eq!(c.deadline(), Some(t0 + w));
    // Before the oldest is due nothing goes, not even lines that would be within the slack.
    assert!(c.due(t0 + w - Duration::from_millis(1), false).is_empty());
    assert_eq!(text(&c.due(t0 + w, false)), "a\nb\n");
    assert_eq!(
        c.deadline(),
        Some(t0 + w + w / 20 + Duration::from_millis(1))
    );
    assert!(c.due(t0 + w, false).is_empty());
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

/// A small deterministic generator (xorshift) for the mixed-output test.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Each rank's lines as the output shows them: a `[set] ` line counts for each rank of the
/// set, a line without one for the rank its `[rN]:` prefix names.
fn per_rank(out: &str, ranks: usize) -> Vec<Vec<String>> {
    let mut got = vec![Vec::new(); ranks];
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("[r") {
            let (r, text) = rest.split_once("]:").expect("own prefix");
            got[r.parse::<usize>().expect("rank")].push(text.to_string());
        } else {
            let (set, text) = line[1..].split_once("] ").expect("rank set");
            for part in set.split(',') {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                let (a, b) = (
                    a.parse::<usize>().expect("a"),
                    b.parse::<usize>().expect("b"),
                );
                for ranks in &mut got[a..=b] {
                    ranks.push(text.to_string());
                }
            }
        }
    }
    got
}

/// Ranks printing the same sequence in chunks of different sizes, some ahead of others:
/// every line once, with all its ranks, in order (the fast path: each rank finds its line
/// right after the one its previous line joined).
#[test]
fn ranks_printing_one_sequence_collapse_it_in_order() {
    use Stream::*;
    let mut c = Collapser::new(Duration::from_secs(10), 4, [1, 2]);
    let t0 = Instant::now();
    let texts: Vec<String> = (0..3000).map(|i| format!("step {i} loss 0.5\n")).collect();
    let mut at = [0usize; 4];
    let mut out = String::new();
    let sizes = [7, 300, 1, 45];
    while at.iter().any(|a| *a < texts.len()) {
        for r in 0..4 {
            let n = sizes[r].min(texts.len() - at[r]);
            if n == 0 {
                continue;
            }
            let chunk: Vec<&str> = texts[at[r]..at[r] + n].iter().map(|s| s.as_str()).collect();
            c.push(lines(r, Stdout, "", &chunk), None, t0);
            at[r] += n;
            out.push_str(&text(&c.due(t0, false)));
        }
    }
    out.push_str(&text(&c.due(t0, true)));
    let want: String = texts.iter().map(|t| format!("[0-3] {t}")).collect();
    assert_eq!(out, want);
    assert!(c.ring.len == 0 && c.pending == 0 && c.bytes == 0);
}

/// Random output of 6 ranks from a small vocabulary (repeats, shared and own lines, both
/// streams), random chunk sizes, the clock moving on: whatever joins what, each rank's lines
/// come out exactly once and in its order, and the index, ring and bodies stay bounded
/// while lines keep being written.
#[test]
fn mixed_output_keeps_each_ranks_lines_once_and_in_order() {
    use Stream::*;
    let ranks = 6;
    let window = Duration::from_millis(50);
    let mut c = Collapser::new(window, ranks, [1, 2]);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let t0 = Instant::now();
    let mut now = t0;
    let mut printed = vec![[Vec::new(), Vec::new()]; ranks];
    let mut out = [String::new(), String::new()];
    let emit = |out: &mut [String; 2], due: Vec<(Chunk, Option<OwnedSemaphorePermit>)>| {
        for (chunk, _) in due {
            let s = chunk.stream.expect("stream").index();
            out[s].push_str(&String::from_utf8_lossy(&chunk.body));
        }
    };
    for round in 0..4000 {
        let r = rng.below(ranks as u64) as usize;
        let stream = if rng.below(8) == 0 { Stderr } else { Stdout };
        let n = 1 + rng.below(12) as usize;
        let mut texts = Vec::new();
        for _ in 0..n {
            let t = match rng.below(4) {
                0 => format!("own {r} {round}\n"),
                _ => format!("shared {}\n", rng.below(40)),
            };
            texts.push(t);
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        c.push(lines(r, stream, &format!("[r{r}]:"), &refs), None, now);
        printed[r][stream.index()].extend(texts.iter().map(|t| t.trim_end().to_string()));
        now += Duration::from_micros(rng.below(2000));
        emit(&mut out, c.due(now, false));
        if let Some(e) = c.ring.front() {
            assert!(now < e.first + window, "a due line was left pending");
        }
    }
    emit(&mut out, c.due(now, true));
    for s in [Stdout, Stderr] {
        let got = per_rank(&out[s.index()], ranks);
        for r in 0..ranks {
            assert_eq!(got[r], printed[r][s.index()], "rank {r} {s:?}");
        }
    }
    assert!(out[0].contains("] shared"), "some lines collapsed");
    assert!(c.ring.len == 0 && c.pending == 0 && c.bytes == 0);
    assert!(c.bodies.slots.iter().all(|(b, n)| b.is_empty() && *n == 0));
    // About 25 ms of lines pending at a time (a few hundred): the index never grew past a
    // few thousand slots, the ring and the body slab past a few thousand.
    assert!(c.index.slots.len() <= 4096, "{}", c.index.slots.len());
    assert!(c.ring.slots.len() <= 4096, "{}", c.ring.slots.len());
    assert!(c.bodies.slots.len() <= 1024, "{}", c.bodies.slots.len());
}

/// Slots of written entries are reused or dropped: 200 000 distinct lines through a short
/// window leave a table of the minimum size.
#[test]
fn the_index_stays_sized_to_the_pending_lines() {
    use Stream::*;
    let window = Duration::from_millis(1);
    let mut c = Collapser::new(window, 2, [1, 2]);
    let t0 = Instant::now();
    let mut written = 0;
    for k in 0..2000u64 {
        let texts: Vec<String> = (0..100).map(|i| format!("{k} {i}\n")).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let now = t0 + Duration::from_millis(k);
        c.push(lines((k % 2) as usize, Stdout, "", &refs), None, now);
        written += c
            .due(now + window, false)
            .iter()
            .map(|(ch, _)| ch.body.iter().filter(|b| **b == b'\n').count())
            .sum::<usize>();
    }
    assert_eq!(written, 200_000);
    assert_eq!(c.index.slots.len(), INDEX_MIN);
    assert!(c.index.used <= INDEX_MIN / 2);
}
