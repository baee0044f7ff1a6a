//! The progress stage of the console writer (`--progress one`, issue 29): the carriage-return
//! progress lines of several ranks (tqdm, Lightning's bar: `\r 45%|████ | 45/100 ...`) become
//! one line, the slowest rank's bar with its ranks and the spread:
//! `[0-3]  45%|████      | 45/100 [00:04<00:05] (slowest rank 2; 45-52%)`.
//!
//! Why the slowest rank: in data-parallel training every rank waits for the slowest at each
//! collective, so its bar is the job's real progress, and a straggler is what a user looks for;
//! the spread says how far the others are ahead. A bar without a percentage (`45it [00:04]`)
//! cannot be ranked: the lowest rank's is shown.
//!
//! What reaches the stage (the forwarder, `pump`, decides per segment): a rank's bar *update*
//! (the text after the last `\r` of its line, sent as it is read, never held as a prompt), and
//! the *end* of its bar (the newline that ends a `\r` line: tqdm's `close()`; or the worker's
//! end). The line that ends a bar is the bar's final state and is written as an ordinary line
//! of that rank (through collapse when it is on): intermediate states are dropped, the last
//! state of each bar never is. Lines without `\r` never come here. Log files get every byte
//! before the console sees any (`pump`).
//!
//! Two ways to show it:
//! - On a terminal, one *live* line: drawn as `\r<line>\x1b[K` without a newline, redrawn at
//!   most every [`LIVE_INTERVAL`]; the writer erases it (`\r\x1b[K`) before any other write to
//!   that terminal and draws it again after, and never draws it while a prompt is open.
//! - On a pipe, an ordinary line (`<line>\n`) at most once per `--progress-interval`, and only
//!   when some bar changed since the last one.
//!
//! The stage is pure (a clock passed in): `console` owns the terminal and the writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::collapse::rank_set;

/// How often a live bar on a terminal is redrawn at most (tqdm's own `mininterval`).
pub(crate) const LIVE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest bar text kept per rank (a bar is one terminal line; the rest of a longer one is cut
/// from the console's bar, never from a log file or a final line).
pub(crate) const MAX_BAR: usize = 4096;
/// Erases the terminal line the cursor is on: back to column 0, clear to the end.
pub(crate) const ERASE: &[u8] = b"\r\x1b[K";

/// One rank's bar.
struct Bar {
    /// The rank's console prefix (tee'd streams), shown when it is the only bar.
    prefix: Vec<u8>,
    text: Vec<u8>,
}

/// The live bars of one stream of the console.
pub(crate) struct Bars {
    /// A terminal: one live line; else one ordinary line per interval.
    live: bool,
    interval: Duration,
    bars: BTreeMap<usize, Bar>,
    /// Some bar changed since the line was last shown.
    changed: bool,
    /// Live: the line is on the terminal (drawn and not erased since).
    on_screen: bool,
    /// When the line was last shown; the stage's start before that.
    last_shown: Option<Instant>,
    started: Instant,
    /// Source id of the chunks this stage writes (pipe lines, final lines at the end).
    pub(crate) source: u64,
}

impl Bars {
    pub(crate) fn new(live: bool, interval: Duration, source: u64, now: Instant) -> Bars {
        Bars {
            live,
            interval: if live { LIVE_INTERVAL } else { interval },
            bars: BTreeMap::new(),
            changed: false,
            on_screen: false,
            last_shown: None,
            started: now,
            source,
        }
    }

    pub(crate) fn live(&self) -> bool {
        self.live
    }

    /// `rank`'s bar now reads `text` (whitespace only: the bar was cleared, as tqdm's
    /// `leave=False` and `tqdm.write` do).
    pub(crate) fn update(&mut self, rank: usize, prefix: &[u8], text: &[u8]) {
        if text.iter().all(u8::is_ascii_whitespace) {
            self.end(rank);
            return;
        }
        let text = &text[..text.len().min(MAX_BAR)];
        match self.bars.get_mut(&rank) {
            Some(b) if b.text == text => {}
            Some(b) => {
                b.text.clear();
                b.text.extend_from_slice(text);
                self.changed = true;
            }
            None => {
                self.bars.insert(
                    rank,
                    Bar {
                        prefix: prefix.to_vec(),
                        text: text.to_vec(),
                    },
                );
                self.changed = true;
            }
        }
    }

    /// `rank`'s bar ended (its final state comes as an ordinary line).
    pub(crate) fn end(&mut self, rank: usize) {
        if self.bars.remove(&rank).is_some() {
            self.changed = true;
        }
    }

    /// The writer erased the live line (to write something else on the terminal).
    pub(crate) fn erased(&mut self) {
        self.on_screen = false;
    }

    /// When the stage next has something to show (`None`: nothing). Erasing a live line whose
    /// bars all ended is due at once.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        let next = self.last_shown.map_or(self.started, |t| t + self.interval);
        if self.bars.is_empty() {
            return (self.live && self.on_screen).then_some(self.started);
        }
        let stale = self.changed || (self.live && !self.on_screen);
        stale.then_some(next)
    }

    /// What to write now if the stage is due at `now`: the live line (`\r<line>\x1b[K`, or
    /// [`ERASE`] when no bar is left) or the pipe line (`<line>\n`). Marks it shown. `width`:
    /// the terminal's columns, the live line is cut to fit (a wrapped line could not be
    /// erased).
    pub(crate) fn show(&mut self, now: Instant, width: Option<usize>) -> Option<Vec<u8>> {
        if self.deadline().map_or(true, |d| d > now) {
            return None;
        }
        self.changed = false;
        if self.bars.is_empty() {
            self.on_screen = false;
            return Some(ERASE.to_vec());
        }
        self.last_shown = Some(now);
        let line = self.render(if self.live { width } else { None });
        let mut out = Vec::with_capacity(line.len() + 4);
        if self.live {
            out.push(b'\r');
            out.extend_from_slice(&line);
            out.extend_from_slice(b"\x1b[K");
            self.on_screen = true;
        } else {
            out.extend_from_slice(&line);
            out.push(b'\n');
        }
        Some(out)
    }

    /// Whether the live line is on the terminal.
    pub(crate) fn on_screen(&self) -> bool {
        self.on_screen
    }

    /// The one line: a single rank's bar as it would be shown without the stage (its prefix
    /// and text); several: `[ranks] <slowest bar> (slowest rank R; lo-hi%)`.
    pub(crate) fn render(&self, width: Option<usize>) -> Vec<u8> {
        let (head, text, tail): (Vec<u8>, &[u8], String) = if self.bars.len() == 1 {
            let b = self.bars.values().next().expect("one bar");
            (b.prefix.clone(), &b.text, String::new())
        } else {
            let ranks: Vec<usize> = self.bars.keys().copied().collect();
            let head = format!("[{}] ", rank_set(&ranks)).into_bytes();
            let pcts: Vec<(usize, f64, String)> = self
                .bars
                .iter()
                .filter_map(|(r, b)| percent(&b.text).map(|(v, s)| (*r, v, s)))
                .collect();
            let slowest = pcts
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            match slowest {
                Some((rank, _, lo)) => {
                    let hi = pcts
                        .iter()
                        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
                        .map_or(lo, |m| &m.2);
                    let tail = if lo == hi {
                        format!(" (all at {lo}%)")
                    } else {
                        format!(" (slowest rank {rank}; {lo}-{hi}%)")
                    };
                    (head, &self.bars[rank].text, tail)
                }
                None => {
                    let (rank, b) = self.bars.iter().next().expect("bars");
                    (head, &b.text, format!(" (rank {rank}'s bar)"))
                }
            }
        };
        let mut out = head;
        match width {
            Some(w) => {
                // Columns counted as characters (bars are ASCII and block characters).
                let used = String::from_utf8_lossy(&out).chars().count() + tail.chars().count();
                let room = w.saturating_sub(1 + used);
                let text = String::from_utf8_lossy(text);
                let keep: String = text.chars().take(room).collect();
                out.extend_from_slice(keep.as_bytes());
            }
            None => out.extend_from_slice(text),
        }
        out.extend_from_slice(tail.as_bytes());
        out
    }

    /// Each rank's last bar state as a line of its own (prefixed as its lines are), and the
    /// stage forgets them: at the end nothing a bar showed last is lost.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        for b in std::mem::take(&mut self.bars).into_values() {
            out.extend_from_slice(&b.prefix);
            out.extend_from_slice(&b.text);
            out.push(b'\n');
        }
        self.changed = false;
        out
    }
}

/// The first percentage in a bar (`45%`, `45.5%`): its value and its text.
fn percent(text: &[u8]) -> Option<(f64, String)> {
    for (i, &b) in text.iter().enumerate() {
        if b != b'%' {
            continue;
        }
        let mut j = i;
        while j > 0 && (text[j - 1].is_ascii_digit() || text[j - 1] == b'.') {
            j -= 1;
        }
        if j == i {
            continue;
        }
        let s = std::str::from_utf8(&text[j..i]).ok()?;
        if let Ok(v) = s.parse::<f64>() {
            return Some((v, s.to_string()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn bar(pct: u32) -> String {
        let n = (pct / 10) as usize;
        format!(
            "{pct:3}%|{}{}| {pct}/100",
            "#".repeat(n),
            " ".repeat(10 - n)
        )
    }

    fn shown(b: &mut Bars, now: Instant, width: Option<usize>) -> Option<String> {
        b.show(now, width)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    }

    #[test]
    fn percentages() {
        assert_eq!(percent(b" 45%|####").map(|p| p.0), Some(45.0));
        assert_eq!(percent(b"Epoch 0:  7.5%|").map(|p| p.1), Some("7.5".into()));
        assert_eq!(percent(b"100%|").map(|p| p.0), Some(100.0));
        assert_eq!(percent(b"45it [00:01, 40%]x"), Some((40.0, "40".into())));
        assert_eq!(percent(b"% 12it"), None);
    }

    /// Four ranks' bars: one live line, the slowest rank's bar with the spread; redrawn at most
    /// every 100 ms; when every bar ended the line is erased.
    #[test]
    fn one_live_line_for_many_ranks() {
        let t0 = Instant::now();
        let mut b = Bars::new(true, Duration::from_secs(1), 7, t0);
        assert_eq!(b.deadline(), None, "nothing to show");
        for (r, p) in [(0, 52), (1, 45), (2, 50), (3, 48)] {
            b.update(r, b"", bar(p).as_bytes());
        }
        assert_eq!(b.deadline(), Some(t0));
        let want = format!("\r[0-3] {} (slowest rank 1; 45-52%)\x1b[K", bar(45));
        assert_eq!(shown(&mut b, t0, None).as_deref(), Some(want.as_str()));
        // Changed within the interval: waits for it.
        b.update(1, b"", bar(60).as_bytes());
        assert_eq!(b.deadline(), Some(t0 + LIVE_INTERVAL));
        assert_eq!(shown(&mut b, t0 + 50 * MS, None), None);
        let want = format!("\r[0-3] {} (slowest rank 3; 48-60%)\x1b[K", bar(48));
        assert_eq!(
            shown(&mut b, t0 + LIVE_INTERVAL, None).as_deref(),
            Some(want.as_str())
        );
        // Unchanged and on screen: nothing due; erased by another write: drawn again.
        assert_eq!(b.deadline(), None);
        b.erased();
        assert!(shown(&mut b, t0 + LIVE_INTERVAL * 2, None).is_some());
        // Cut to the terminal's width (one column spare: the cursor never wraps).
        b.erased();
        let cut = shown(&mut b, t0 + LIVE_INTERVAL * 3, Some(40)).expect("drawn");
        let visible = cut.trim_start_matches('\r').trim_end_matches("\x1b[K");
        assert_eq!(visible.chars().count(), 39, "{visible:?}");
        assert!(
            visible.starts_with("[0-3]  48%|") && visible.ends_with("(slowest rank 3; 48-60%)")
        );
        // Bars end one by one; the last end erases the line at once.
        for r in 0..3 {
            b.end(r);
        }
        let one = shown(&mut b, t0 + LIVE_INTERVAL * 4, None).expect("drawn");
        assert_eq!(
            one,
            format!("\r{}\x1b[K", bar(48)),
            "one bar: as the rank wrote it"
        );
        b.end(3);
        assert_eq!(
            shown(&mut b, t0 + LIVE_INTERVAL * 4 + MS, None).as_deref(),
            Some("\r\x1b[K")
        );
        assert_eq!(b.deadline(), None);
        assert!(b.finish().is_empty());
    }

    /// On a pipe: at most one line per interval, only after a change, newline-terminated; a
    /// cleared bar (whitespace) is gone; at the end each rank's last state is a line.
    #[test]
    fn pipe_lines_at_most_once_per_interval() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(1);
        let mut b = Bars::new(false, iv, 7, t0);
        let mut lines = Vec::new();
        let mut t = t0;
        // 4 ranks updating every 10 ms for 3.5 s.
        for step in 0..350u32 {
            for r in 0..4usize {
                b.update(r, b"[p]:", bar((step * 100 / 350) + r as u32).as_bytes());
            }
            if let Some(l) = shown(&mut b, t, None) {
                lines.push((t, l));
            }
            t += 10 * MS;
        }
        assert_eq!(lines.len(), 4, "t=0, 1, 2, 3 s: {lines:?}");
        for w in lines.windows(2) {
            assert!(w[1].0 - w[0].0 >= iv);
        }
        assert!(lines
            .iter()
            .all(|(_, l)| l.starts_with("[0-3] ") && l.ends_with("%)\n")));
        // The changes after the last line, once; then, with no change, nothing more.
        let last = shown(&mut b, t + iv * 4, None).expect("changed since");
        assert!(last.contains(" 99%|"), "{last}");
        assert_eq!(shown(&mut b, t + iv * 5, None), None);
        // Cleared bars leave; one bar left is shown with its own prefix.
        b.update(1, b"[p]:", b"    ");
        b.update(2, b"[p]:", b"");
        b.end(3);
        let l = shown(&mut b, t + iv * 6, None).expect("changed");
        assert_eq!(l, format!("[p]:{}\n", bar(99)));
        assert_eq!(
            String::from_utf8_lossy(&b.finish()),
            format!("[p]:{}\n", bar(99))
        );
    }

    /// Bars without a percentage cannot be ranked: the lowest rank's is shown, said so.
    #[test]
    fn bars_without_percent_show_the_lowest_rank() {
        let t0 = Instant::now();
        let mut b = Bars::new(false, Duration::from_secs(1), 7, t0);
        b.update(5, b"", b"17it [00:01, 9.9it/s]");
        b.update(2, b"", b"12it [00:01, 9.9it/s]");
        assert_eq!(
            shown(&mut b, t0, None).as_deref(),
            Some("[2,5] 12it [00:01, 9.9it/s] (rank 2's bar)\n")
        );
        // Equal percentages: no spread to show.
        let mut b = Bars::new(false, Duration::from_secs(1), 7, t0);
        b.update(0, b"", b"50%|x");
        b.update(1, b"", b"50%|y");
        assert_eq!(
            shown(&mut b, t0, None).as_deref(),
            Some("[0-1] 50%|x (all at 50%)\n")
        );
    }
}
